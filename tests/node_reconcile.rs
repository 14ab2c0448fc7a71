//! Driver memory reconciled through the node (`gpuslice node reconcile`), and GPU memory used under
//! no tenant reported (docs/MEMORY.md "Reconciled by the node", docs/OBSERVABILITY.md). Judged by
//! simgpu's own counters: a process in a container (its own PID namespace and `/proc`) cannot find
//! itself in NVML's lists (simgpu lists host PIDs, as a driver does), so only the node, which sees
//! host PIDs, can tell it what the driver holds for it.

use gpuslice_testkit as common;

use common::memory::{container_args, host_proc};
use common::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const QUOTA: u64 = GIB;
/// The driver reserves device memory in 2 MiB pages: reconciled charges are exact to one.
const GRANULE: u64 = 2 * MIB;
/// simgpu's default context cost.
const SIM_CONTEXT: u64 = 300 * MIB;
/// The module the tenant loads (PTX text), and what simgpu makes it cost (`SIMGPU_MODULE_SCALE`):
/// more than its image says, which a measurement from the device's used memory never charges.
const MODULE_MIB: u64 = 20;
const MODULE_SCALE: u64 = 3;

fn scratch(tag: &str) -> PathBuf {
    let dir = scratch_dir("node_reconcile", tag);
    std::fs::create_dir_all(dir.join("state")).unwrap();
    dir
}

/// A child killed (and reaped) when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The client as a process of `tenant` (quota 1 GiB, ledger and device directory in `dir`) in a
/// container of its own, as a pod runs it (`common::memory::container_args`).
fn client_in_container(
    sim: &Sim,
    dir: &Path,
    tenant: &str,
    client: &CBuild,
    args: &[&str],
) -> Command {
    let host_proc = host_proc(dir, tenant);
    let mut cmd = sim.command("unshare");
    cmd.args(container_args(&compile(client), args))
        .env("LD_PRELOAD", libgpuslice())
        .env("GPUSLICE_MEMORY_LIMIT", "1GiB")
        .env("GPUSLICE_TENANT", tenant)
        .env("GPUSLICE_LEDGER", dir.join(format!("{tenant}.ledger")))
        .env("GPUSLICE_DEVICE_DIR", dir.join("devices"))
        .env("SIMGPU_GROUP", tenant)
        .env("SIMGPU_HOST_PROC", &host_proc);
    cmd
}

/// Whether another process holds the `flock` lock on `path` (a measurement lock).
fn locked_by_another(path: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    // SAFETY: flock on a descriptor this function owns; LOCK_NB never blocks.
    let taken = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    !taken
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "{what}: not within 120 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A simgpu group's (a tenant's or an outsider's) one process: (host PID, used on device 0).
fn group_process(stat: &Json, group: &str) -> (u64, u64) {
    let Json::Array(procs) = stat.at("processes") else {
        panic!("simgpu-stat: no processes in {stat}")
    };
    let p = procs
        .iter()
        .find(|p| p.at("group") == &Json::String(group.to_string()))
        .unwrap_or_else(|| panic!("no process of {group} in {stat}"));
    (p.u64("pid"), p.u64("used.0"))
}

/// `gpuslice node reconcile` every 100 ms on `dir`'s ledgers.
fn node(sim: &Sim, dir: &Path) -> Killed {
    let child = sim
        .command(gpuslice_bin())
        .args(["node", "reconcile", "--interval-ms", "100", "--ledger-dir"])
        .arg(dir)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--device-dir")
        .arg(dir.join("devices"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start gpuslice node reconcile");
    Killed(child)
}

/// What one run in a container shows.
struct PodRun {
    /// The pod process's charge in its ledger, and what simgpu says it uses.
    charged: u64,
    real: u64,
    fill: u64,
    /// `gpuslice status --json --ledger ...` then.
    status: Json,
    /// The host PIDs of the pod's process and of the outsider (a process outside gpuslice).
    pod_pid: u64,
    outsider: (u64, u64),
    peak: u64,
}

/// A tenant process in a container creates its context (5 s) while a process outside gpuslice
/// starts on the GPU (so the process cannot tell itself from the newcomer in NVML's list), loads a
/// module simgpu makes cost 3x its image (measured from the device's used memory, it is charged at
/// most what its image takes), then fills its quota; with or without the node reconciling.
fn pod_run(tag: &str, with_node: bool, dir: &Path) -> PodRun {
    let sim = Sim::new(tag)
        .env("SIMGPU_MEMORY", "4GiB")
        .env("SIMGPU_MODULE_SCALE", &MODULE_SCALE.to_string());
    let _node = with_node.then(|| node(&sim, dir));
    let module = MODULE_MIB.to_string();
    let mut pod = client_in_container(
        &sim,
        dir,
        "pod",
        &QUOTA_OVERHEAD,
        &["hold", &module, "8", "1024"],
    );
    let mut pod = sim.spawn(pod.env("SIMGPU_CONTEXT_CREATE_US", "5000000"));
    // Its context is being created (under the device's measurement lock): another process appears.
    let devices = dir.join("devices");
    wait_until("the pod's measurement", || {
        std::fs::read_dir(&devices).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                e.path().extension().is_some_and(|x| x == "measure") && locked_by_another(&e.path())
            })
        })
    });
    let mut outsider = sim.command(compile(&QUOTA_OVERHEAD));
    outsider
        .args(["leave", "64", "wait"])
        .env("SIMGPU_GROUP", "outsider");
    let mut outsider = Killed(sim.spawn(&mut outsider));
    wait_for_key(&mut outsider.0, "ready");
    let measuring = std::fs::read_dir(&devices).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            e.path().extension().is_some_and(|x| x == "measure") && locked_by_another(&e.path())
        })
    });
    assert!(
        measuring,
        "the outsider's context came after the pod's was measured (5 s): the machine is too \
         loaded for this test's premise"
    );
    wait_for_key(&mut pod, "ready");
    let ready_ms = unix_ms();
    let ledger = dir.join("pod.ledger");
    let snapshot = || {
        gpuslice::ledger::Ledger::open_readonly(&ledger)
            .expect("the pod's ledger")
            .snapshot()
    };
    if with_node {
        // A word the node read after the module was loaded.
        wait_until("the node's word", || {
            snapshot()
                .processes
                .iter()
                .any(|p| p.node.is_some_and(|(_, ms)| ms > ready_ms))
        });
    }
    pod.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let fill: u64 = wait_for_key(&mut pod, "fill_bytes")["fill_bytes"]
        .parse()
        .unwrap();
    let stat = sim.stat();
    let (pod_pid, real) = group_process(&stat, "pod");
    let outsider_seen = group_process(&stat, "outsider");
    let s = snapshot();
    assert_eq!(s.processes.len(), 1, "{s:?}");
    let charged = s.processes[0].used.iter().map(|(_, b)| b).sum();
    let mut cmd = Command::new(gpuslice_bin());
    cmd.args(["status", "--json", "--ledger"])
        .arg(&ledger)
        .env("GPUSLICE_DEVICE_DIR", &devices);
    let run = sim.run_cmd(&mut cmd);
    run.assert_success();
    let status = parse_json(&run.stdout).unwrap_or_else(|e| panic!("{e}\n{}", run.report()));
    let peak = group(&sim.stat(), "pod").u64("peak.0");
    finish(pod, "pod").assert_success();
    PodRun {
        charged,
        real,
        fill,
        status,
        pod_pid,
        outsider: outsider_seen,
        peak,
    }
}

/// A process in a container whose driver memory grows beyond what any measurement can see (code the
/// driver makes larger than its image, measured from the device's used memory while another
/// process started beside it) is charged what simgpu says it uses, to a granule, once the node
/// reconciles; without the node the two differ, and `gpuslice status` says so.
#[test]
fn driver_memory_of_a_process_in_a_container_is_reconciled_through_the_node() {
    let spent = SIM_CONTEXT + MODULE_SCALE * MODULE_MIB * MIB;
    let image = MODULE_MIB * MIB;

    // Without the node: the module is charged its image, and nothing corrects it.
    let dir = scratch("without");
    let alone = pod_run("reconcile-without", false, &dir);
    assert_eq!(alone.real, spent + alone.fill, "simgpu's figure");
    assert!(
        alone.real - alone.charged > GRANULE,
        "without the node, the charge ({}) misses what the driver spent beyond the image ({} in \
         all): the test shows nothing otherwise",
        alone.charged,
        alone.real
    );
    assert!(
        alone.charged.abs_diff(SIM_CONTEXT + image + alone.fill) <= GRANULE,
        "charged {}: the context and the module's image",
        alone.charged
    );
    let p = &alone.status.arr("memory.processes")[0];
    assert_eq!(p.str("driver_memory"), "estimated", "{}", alone.status);

    // With the node: the charge is what simgpu says the process uses.
    let dir = scratch("with");
    let run = pod_run("reconcile-with", true, &dir);
    assert_eq!(run.real, spent + run.fill, "simgpu's figure");
    assert!(
        run.charged.abs_diff(run.real) <= GRANULE,
        "with the node, charged {} and simgpu's {} agree to a granule: {}",
        run.charged,
        run.real,
        run.status
    );
    assert!(
        run.fill + spent <= QUOTA && run.fill + spent + GRANULE >= QUOTA,
        "the quota filled, never passed: {} beside {spent}",
        run.fill
    );
    assert!(run.peak <= QUOTA, "simgpu's peak {} for the pod", run.peak);
    let p = &run.status.arr("memory.processes")[0];
    assert_eq!(p.str("driver_memory"), "node", "{}", run.status);
    assert_eq!(p.u64("host_pid"), run.pod_pid, "{}", run.status);
    // The process outside gpuslice was reported as unmanaged, the pod's not.
    let (_, list) = gpuslice_observe_report(&dir.join("state"));
    assert!(
        list.iter()
            .any(|(pid, used)| *pid == run.outsider.0 && *used == run.outsider.1),
        "the outsider {:?} in {list:?}",
        run.outsider
    );
    assert!(!list.iter().any(|(pid, _)| *pid == run.pod_pid), "{list:?}");
}

/// A pod's process spends driver memory step by step with the node reconciling: code a lazily
/// loaded library's kernel loads at its first launch, the local memory a kernel with a 2 KiB frame
/// grows (1 KiB a thread beyond the default stack), graph launches whose allocation stays in the
/// graph memory pool's cache, the quota filled with allocations beside all of it, and the pool's
/// trim that returns its cache (the fills freed). After each step, the tenant's charge
/// and simgpu's per-process used memory agree within one granule (once the node's pass after the
/// step is in the ledger: the charge must not lag), and simgpu never saw the tenant above its
/// quota (driver memory left uncharged would let the fill pass it). The IPC importer keeping a
/// mapping the exporter freed is `an_ipc_mapping_kept_after_the_exporters_free_stays_charged`.
#[test]
fn a_pods_driver_memory_agrees_with_simgpu_after_each_step() {
    const LIB_MIB: u64 = 24;
    const GRAPH_MIB: u64 = 64;
    let dir = scratch("steps");
    let sim = Sim::new("reconcile-steps")
        .env("SIMGPU_MEMORY", "4GiB")
        .env("CUDA_MODULE_LOADING", "LAZY");
    let _node = node(&sim, &dir);
    let (lib, graph) = (LIB_MIB.to_string(), GRAPH_MIB.to_string());
    let mut cmd = client_in_container(&sim, &dir, "steps", &POD_MEMORY, &[&lib, "2048", &graph]);
    let mut pod = sim.spawn(cmd.env("CUDA_MODULE_LOADING", "LAZY"));
    let ledger = dir.join("steps.ledger");
    let charge = || {
        let s = gpuslice::ledger::Ledger::open_readonly(&ledger)
            .expect("the pod's ledger")
            .snapshot();
        assert_eq!(s.processes.len(), 1, "{s:?}");
        let p = &s.processes[0];
        (
            p.used.iter().map(|(_, b)| b).sum::<u64>(),
            p.node.map(|(_, ms)| ms),
        )
    };
    // After a step: a node pass after it, then the charge and simgpu's figure within a granule.
    let agree = |step: &str| -> u64 {
        let done = unix_ms();
        wait_until(&format!("{step}: the node's pass"), || {
            charge().1.is_some_and(|ms| ms > done)
        });
        let (charged, _) = charge();
        let stat = sim.stat();
        let (_, real) = group_process(&stat, "steps");
        let peak = group(&stat, "steps").u64("peak.0");
        assert!(
            charged.abs_diff(real) <= GRANULE,
            "{step}: charged {charged}, simgpu holds {real}"
        );
        assert!(peak <= QUOTA, "{step}: simgpu's peak {peak} for the tenant");
        real
    };
    wait_for_key(&mut pod, "ready");
    let mut step = |key: &str, results: &[&str]| {
        pod.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        let kv = wait_for_key(&mut pod, key);
        for r in results {
            assert_eq!(kv.get(*r).map(String::as_str), Some("0"), "{r}: {kv:?}");
        }
    };
    let ready = agree("the primary context");
    assert!(ready >= SIM_CONTEXT, "simgpu's context: {ready}");
    step("lazy", &["lazy_rc"]);
    let lazy = agree("a lazily loaded library's first launch");
    assert!(
        lazy >= ready + LIB_MIB * MIB,
        "simgpu loaded the code at the first launch: {ready} -> {lazy}"
    );
    step("local", &["local_rc", "local2_rc"]);
    let local = agree("a local-memory-heavy kernel");
    assert!(
        local >= lazy + 1024 * 132 * 2048,
        "simgpu grew the local memory: {lazy} -> {local}"
    );
    step("graph", &["graph_rc", "graph2_rc"]);
    let graph = agree("graph launches");
    assert!(
        graph >= local + GRAPH_MIB * MIB,
        "the graph memory pool caches the graph's allocation: {local} -> {graph}"
    );
    step("filled", &[]);
    let filled = agree("the quota filled");
    assert!(
        filled + GRANULE >= QUOTA,
        "the tenant filled its quota by simgpu's counters: {filled}"
    );
    step("trimmed", &["trim_rc"]);
    let trimmed = agree("the graph memory pool trimmed");
    assert!(
        trimmed + GRAPH_MIB * MIB <= graph,
        "the trim gave the cache back: {graph} -> {trimmed}"
    );
    pod.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    finish(pod, "pod steps").assert_success();
}

/// An IPC exporter and importer of one tenant in one pod (the processes of one job share buffers
/// so: vLLM's custom all-reduce, UCX; processes of two pods cannot, without sharing a PID
/// namespace), with the node reconciling: export, import, the exporter's free, the importer keeping
/// its mapping (and the exporter filling the quota beside it), the importer's close. After each step
/// each process's charge and simgpu's per-process used memory agree within one granule (once the
/// node's pass after the step is in the ledger), and simgpu never saw the tenant above its quota:
/// the memory the importer keeps after the exporter's free is simgpu's figure for the importer.
#[test]
fn an_ipc_mapping_kept_after_the_exporters_free_stays_charged() {
    const SHARED_MIB: u64 = 128;
    let dir = scratch("ipc");
    let sim = Sim::new("reconcile-ipc").env("SIMGPU_MEMORY", "4GiB");
    let _node = node(&sim, &dir);
    let shared = SHARED_MIB.to_string();
    let mut cmd = client_in_container(&sim, &dir, "ipc", &IPC_POD, &[&shared]);
    let mut pod = sim.spawn(&mut cmd);
    let ledger = dir.join("ipc.ledger");
    let ids = wait_for_key(&mut pod, "ready");
    let id = |k: &str| -> u64 { ids[k].parse().unwrap_or_else(|_| panic!("{k}: {ids:?}")) };
    // (namespace PID in the ledger, host PID in simgpu) of the exporter and the importer.
    let procs = [
        ("exporter", id("pid"), id("host_pid")),
        ("importer", id("child_pid"), id("child_host_pid")),
    ];
    let charges = || {
        let s = gpuslice::ledger::Ledger::open_readonly(&ledger)
            .expect("the pod's ledger")
            .snapshot();
        let of = |pid: u64| -> u64 {
            s.processes
                .iter()
                .filter(|p| u64::from(p.pid) == pid)
                .flat_map(|p| p.used.iter().map(|(_, b)| b))
                .sum()
        };
        let node_ms = s
            .processes
            .iter()
            .filter_map(|p| p.node.map(|(_, ms)| ms))
            .min();
        (procs.map(|(_, pid, _)| of(pid)), node_ms)
    };
    let agree = |step: &str| -> [u64; 2] {
        let done = unix_ms();
        wait_until(&format!("{step}: the node's pass"), || {
            charges().1.is_some_and(|ms| ms > done)
        });
        let (charged, _) = charges();
        let stat = sim.stat();
        let Json::Array(list) = stat.at("processes") else {
            panic!("simgpu-stat: no processes in {stat}")
        };
        let real = procs.map(|(_, _, host)| {
            list.iter()
                .find(|p| p.u64("pid") == host)
                .map_or(0, |p| p.u64("used.0"))
        });
        for (i, (who, _, _)) in procs.iter().enumerate() {
            assert!(
                charged[i].abs_diff(real[i]) <= GRANULE,
                "{step}: the {who} is charged {}, simgpu holds {} for it",
                charged[i],
                real[i]
            );
        }
        let peak = group(&stat, "ipc").u64("peak.0");
        assert!(peak <= QUOTA, "{step}: simgpu's peak {peak} for the tenant");
        real
    };
    let mut step = |key: &str, results: &[(&str, &str)]| {
        pod.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        let kv = wait_for_key(&mut pod, key);
        for (r, want) in results {
            assert_eq!(kv.get(*r).map(String::as_str), Some(*want), "{r}: {kv:?}");
        }
        kv
    };
    let shared = SHARED_MIB * MIB;
    let [exporter, importer] = agree("two contexts");
    assert!(
        exporter >= SIM_CONTEXT && importer >= SIM_CONTEXT,
        "{exporter} {importer}"
    );
    // A driver refuses an open in the exporting process and a flag it does not know.
    step(
        "exported",
        &[("export_rc", "0"), ("self_rc", "201"), ("badflag_rc", "1")],
    );
    let exported = agree("exported");
    assert!(exported[0] >= exporter + shared, "{exported:?}");
    step("imported", &[("import_rc", "0")]);
    let imported = agree("imported");
    assert_eq!(
        imported[1], importer,
        "an import costs the importer nothing while exported"
    );
    step("freed", &[("free_rc", "0")]);
    let freed = agree("the exporter's free");
    assert_eq!(
        (freed[0], freed[1]),
        (exported[0] - shared, importer + shared),
        "simgpu counts the memory the importer keeps against it"
    );
    let kv = step("kept", &[("kept_rc", "0")]);
    let fill: u64 = kv["fill_mib"].parse().unwrap();
    agree("the importer keeps it while the exporter fills the quota");
    assert!(
        (fill * MIB + freed[0] + freed[1]).abs_diff(QUOTA) <= 2 * GRANULE,
        "the exporter filled what the quota left beside the kept mapping: {fill} MiB"
    );
    step("closed", &[("close_rc", "0")]);
    let closed = agree("the importer's close");
    assert_eq!(closed[1], importer, "the last mapping gone, the memory is");
    pod.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    finish(pod, "ipc pod").assert_success();
}

/// The node's report (`<state>/reconcile/unmanaged`): when, and (pid, bytes) lines.
fn gpuslice_observe_report(state: &Path) -> (u64, Vec<(u64, u64)>) {
    let text = std::fs::read_to_string(state.join("reconcile/unmanaged")).expect("the report");
    let mut lines = text.lines();
    let when = lines
        .next()
        .and_then(|l| l.strip_prefix("# "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("report: {text}"));
    let list = lines
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (f[1].parse().unwrap(), f[2].parse().unwrap_or(0))
        })
        .collect();
    (when, list)
}

/// A process using simgpu without gpuslice, beside a tenant's, is shown by `gpuslice status` and
/// exported as unmanaged memory; the tenant's is not.
#[test]
fn a_process_using_the_gpu_without_gpuslice_is_reported_unmanaged() {
    let dir = scratch("unmanaged");
    let sim = Sim::new("reconcile-unmanaged").env("SIMGPU_MEMORY", "4GiB");
    let mut tenant = sim.command(compile(&QUOTA_OVERHEAD));
    tenant
        .args(["hold"])
        .env("LD_PRELOAD", libgpuslice())
        .env("GPUSLICE_MEMORY_LIMIT", "1GiB")
        .env("GPUSLICE_TENANT", "t")
        .env("GPUSLICE_LEDGER", dir.join("t.ledger"))
        .env("GPUSLICE_DEVICE_DIR", dir.join("devices"))
        .env("SIMGPU_GROUP", "t");
    let mut tenant = Killed(sim.spawn(&mut tenant));
    wait_for_key(&mut tenant.0, "ready");
    let mut outsider = sim.command(compile(&QUOTA_OVERHEAD));
    outsider
        .args(["leave", "64", "wait"])
        .env("SIMGPU_GROUP", "outsider");
    let mut outsider = Killed(sim.spawn(&mut outsider));
    wait_for_key(&mut outsider.0, "ready");
    let stat = sim.stat();
    let (outsider_pid, outsider_used) = group_process(&stat, "outsider");
    let (tenant_pid, _) = group_process(&stat, "t");
    let state = dir.join("state");
    let status = || {
        let run = sim.run_cmd(
            Command::new(gpuslice_bin())
                .args(["status", "--json", "--compute", "--state-dir"])
                .arg(&state),
        );
        parse_json(&run.stdout).unwrap_or_else(|e| panic!("{e}\n{}", run.report()))
    };
    assert_eq!(
        status().at("unmanaged"),
        &Json::Null,
        "no report before the node ran"
    );
    let _node = node(&sim, &dir);
    wait_until("the node's report", || {
        state.join("reconcile/unmanaged").exists()
    });
    let doc = status();
    let list = doc.arr("unmanaged");
    assert_eq!(list.len(), 1, "{doc}");
    assert_eq!(list[0].u64("pid"), outsider_pid, "{doc}");
    assert_eq!(list[0].u64("used"), outsider_used, "{doc}");
    assert_ne!(list[0].u64("pid"), tenant_pid);
    // The table says it too.
    let run = sim.run_cmd(
        Command::new(gpuslice_bin())
            .args(["status", "--compute", "--state-dir"])
            .arg(&state),
    );
    assert!(
        run.stdout.contains("under no tenant")
            && run.stdout.contains(&format!("pid {outsider_pid}")),
        "{}",
        run.report()
    );
    // The exporter exports it.
    let mut exporter = sim
        .command(gpuslice_bin())
        .args(["exporter", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(&state)
        .arg("--ledger-dir")
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start gpuslice exporter");
    let addr = exporter_address(&mut exporter);
    let exporter = Killed(exporter);
    let text = scrape_metrics(&addr);
    let series = text
        .lines()
        .find(|l| l.starts_with("gpuslice_unmanaged_memory_bytes{"))
        .unwrap_or_else(|| panic!("no unmanaged memory exported:\n{text}"));
    assert!(
        series.contains(&format!("pid=\"{outsider_pid}\""))
            && series.contains("gpu=\"0\"")
            && series.ends_with(&format!(" {outsider_used}")),
        "{series}"
    );
    assert!(
        !text.contains(&format!("pid=\"{tenant_pid}\"")),
        "the tenant's process is not unmanaged:\n{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("gpuslice_unmanaged_processes{") && l.ends_with(" 1")),
        "{text}"
    );
    drop(exporter);
}

/// `gpuslice doctor` says how a program started in its environment knows its driver memory: from
/// its own NVML figure in the host's PID namespace; in a container (its own PID namespace and
/// `/proc`), estimated and not reconciled until a node's pass went through the tenant's ledger, then
/// reconciled by the node.
#[test]
fn doctor_says_whether_driver_memory_is_reconciled() {
    let dir = scratch("doctor");
    let sim = Sim::new("reconcile-doctor").env("SIMGPU_MEMORY", "4GiB");
    let ledger = dir.join("d.ledger");
    // A tenant process makes the ledger (and holds a slot the node reconciles).
    let mut tenant = sim.command(compile(&QUOTA_OVERHEAD));
    tenant
        .args(["hold"])
        .env("LD_PRELOAD", libgpuslice())
        .env("GPUSLICE_MEMORY_LIMIT", "1GiB")
        .env("GPUSLICE_LEDGER", &ledger)
        .env("GPUSLICE_DEVICE_DIR", dir.join("devices"));
    let mut tenant = Killed(sim.spawn(&mut tenant));
    wait_for_key(&mut tenant.0, "ready");
    let doctor = |container: bool| {
        let mut cmd = if container {
            let mut c = sim.command("unshare");
            c.args(["--pid", "--fork", "--kill-child", "--mount-proc"])
                .arg(gpuslice_bin());
            c
        } else {
            sim.command(gpuslice_bin())
        };
        cmd.arg("doctor")
            .env("LD_PRELOAD", libgpuslice())
            .env("GPUSLICE_MEMORY_LIMIT", "1GiB")
            .env("GPUSLICE_LEDGER", &ledger)
            .env("GPUSLICE_DEVICE_DIR", dir.join("devices"));
        let run = sim.run_cmd(&mut cmd);
        let line = run
            .stdout
            .lines()
            .find(|l| l.trim_start().starts_with("driver memory:"))
            .unwrap_or_else(|| panic!("no driver memory line\n{}", run.report()))
            .to_string();
        (line, run)
    };
    let (line, run) = doctor(false);
    assert!(line.contains("own NVML figure"), "{}", run.report());
    let (line, run) = doctor(true);
    assert!(
        line.contains("estimated, not reconciled"),
        "{}",
        run.report()
    );
    assert!(
        run.stdout
            .contains("note: driver memory is estimated, not reconciled"),
        "{}",
        run.report()
    );
    let once = sim.run_cmd(
        sim.command(gpuslice_bin())
            .args(["node", "reconcile", "--once", "--ledger-dir"])
            .arg(&dir)
            .arg("--state-dir")
            .arg(dir.join("state")),
    );
    once.assert_success();
    let (line, run) = doctor(true);
    assert!(line.contains("reconciled by the node"), "{}", run.report());
}
