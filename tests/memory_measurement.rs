//! Measuring a context's cost beside other processes: in their own PID namespaces and in containers
//! (pods), while another process frees, and when a process is killed while it measures. Judged by
//! simgpu's own counters through tests/clients/quota_overhead.c.

use gpuslice_testkit as common;

use common::memory::*;
use common::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// [`client`] run as pid 1 of a PID namespace of its own (a container's): a real driver, and simgpu,
/// list it in NVML under its host PID, so it never finds its own `getpid()` there.
fn client_in_pid_namespace(sim: &Sim, dir: &Path, tenant: &str, args: &[&str]) -> Command {
    let mut inner = vec!["--pid", "--fork", "--kill-child"];
    let program = compile(&QUOTA_OVERHEAD);
    inner.push(program.to_str().unwrap());
    inner.extend_from_slice(args);
    unshared(sim, dir, tenant, &inner)
}

/// `unshare inner...` as a process of `tenant` ([`tenant_command`], preloaded).
fn unshared(sim: &Sim, dir: &Path, tenant: &str, inner: &[&str]) -> Command {
    tenant_command(
        PathBuf::from("unshare"),
        sim,
        Deploy::Preload,
        dir,
        tenant,
        inner,
    )
}

/// Programs in their own PID namespaces cannot find themselves in NVML's process lists (simgpu
/// lists host PIDs, as a real driver does); their contexts are measured from the device's used
/// memory under the device's measurement lock. Three first contexts created at once are each
/// charged what simgpu spent on them, and the rest of the quota is usable.
#[test]
fn contexts_in_their_own_pid_namespaces_are_charged_what_they_cost() {
    const N: usize = 3;
    let dir = scratch("pid-namespace");
    // Each context takes 100 ms to create: started together, their creations overlap unless the
    // measurement lock serialises them (each would then see the others' contexts appear).
    let sim = sim("overhead-pidns").env("SIMGPU_CONTEXT_CREATE_US", "100000");
    let mut holders: Vec<_> = (0..N)
        .map(|_| sim.spawn(&mut client_in_pid_namespace(&sim, &dir, "ns", &["hold"])))
        .collect();
    for h in &mut holders {
        let kv = wait_for_key(h, "ready");
        assert_eq!(kv["pid"], "1", "the client is its namespace's init: {kv:?}");
    }
    let stat = sim.stat();
    let Json::Array(procs) = stat.at("processes") else {
        panic!("simgpu-stat: no processes in {stat}")
    };
    assert_eq!(procs.len(), N, "{stat}");
    for p in procs {
        assert_ne!(p.u64("pid"), 1, "simgpu lists host PIDs: {stat}");
        assert_eq!(p.u64("used.0"), SIM_CONTEXT, "{stat}");
    }
    // Each process published its context's cost as its driver overhead.
    let snapshot = gpuslice::ledger::Ledger::open_readonly(&dir.join("ns.ledger"))
        .expect("the tenant's ledger")
        .snapshot();
    let overheads: Vec<u64> = snapshot
        .processes
        .iter()
        .map(|p| p.overhead.iter().map(|(_, b)| b).sum())
        .collect();
    assert_eq!(overheads.len(), N, "{snapshot:?}");
    for o in &overheads {
        assert!(
            near(*o, SIM_CONTEXT),
            "each context charged its {SIM_CONTEXT} bytes: {overheads:?}"
        );
    }
    // The rest of the quota is usable, and never more than it.
    let mut filled = 0;
    for h in &mut holders {
        h.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        let kv = wait_for_key(h, "fill_bytes");
        filled += kv["fill_bytes"].parse::<u64>().unwrap();
    }
    let want = QUOTA - N as u64 * SIM_CONTEXT;
    assert!(
        filled <= want && filled + N as u64 * GRANULE >= want,
        "{filled} allocated by {N} processes, want {want} (each context charged 300 MiB)"
    );
    assert!(group_peak_on(&sim.stat(), "ns", 0) <= QUOTA);
    for h in holders {
        let run = finish(h, "holder");
        run.assert_success();
        assert!(
            !run.stderr.contains("stayed locked"),
            "measured under the lock\n{}",
            run.report()
        );
    }
}

/// Whether another process holds the `flock` lock on `path` (a measurement lock).
fn locked_by_another(path: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    // SAFETY: flock on a descriptor this function owns; LOCK_NB never blocks.
    let taken = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    // Closing `file` drops the lock if it was taken.
    !taken
}

/// A process killed while it holds a device's measurement lock (in the middle of creating its
/// context, which simgpu makes last a minute) does not hold up the next process's measurement: the
/// lock dies with its holder, and the next context is measured under it and charged what it cost.
#[test]
fn a_process_killed_while_measuring_does_not_hold_up_the_others() {
    let dir = scratch("killed-measurer");
    let sim = sim("overhead-killed");
    let mut victim = client(&sim, Deploy::Preload, &dir, "k", &["hold"]);
    let mut victim = sim.spawn(victim.env("SIMGPU_CONTEXT_CREATE_US", "60000000"));
    // Wait until it holds the lock of device 0 (it does for the minute its context takes).
    let devices = dir.join("devices");
    let waiting = std::time::Instant::now();
    let lock = loop {
        let found = std::fs::read_dir(&devices).ok().and_then(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|x| x == "measure") && locked_by_another(p))
        });
        if let Some(lock) = found {
            break lock;
        }
        assert!(
            victim.try_wait().unwrap().is_none(),
            "the victim ended before it measured"
        );
        assert!(
            waiting.elapsed() < std::time::Duration::from_secs(50),
            "no measurement lock held in {} while the victim created its context",
            devices.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    victim.kill().unwrap();
    victim.wait().unwrap();
    assert!(!locked_by_another(&lock), "the lock died with its holder");

    let mut next = sim.spawn(&mut client(&sim, Deploy::Preload, &dir, "k", &["hold"]));
    wait_for_key(&mut next, "ready");
    next.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let kv = wait_for_key(&mut next, "fill_bytes");
    let fill: u64 = kv["fill_bytes"].parse().unwrap();
    let run = finish(next, "next");
    run.assert_success();
    assert!(
        !run.stderr.contains("stayed locked") && !run.stderr.contains("without the device lock"),
        "measured under the lock\n{}",
        run.report()
    );
    assert!(
        fill <= QUOTA - SIM_CONTEXT && fill + GRANULE >= QUOTA - SIM_CONTEXT,
        "{fill} allocated: the context charged its {SIM_CONTEXT} bytes\n{}",
        run.report()
    );
}

/// Measured from the device's used memory (a PID namespace of its own), a context created while
/// another process frees 1 GiB would appear to give memory back: a new object cannot, so the figure
/// is not believed and the context is charged the estimate (`GPUSLICE_CONTEXT_RESERVE`'s default),
/// never less than it cost: the quota does not loosen.
#[test]
fn a_context_measured_while_another_process_frees_is_not_charged_less_than_it_cost() {
    let dir = scratch("disturbed");
    let sim = sim("overhead-disturbed");
    // Another tenant holds its context and fills its quota.
    let mut other = sim.spawn(&mut client(&sim, Deploy::Preload, &dir, "other", &["hold"]));
    wait_for_key(&mut other, "ready");
    other.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    wait_for_key(&mut other, "fill_bytes");
    // This one's context takes 3 s to create; the other exits (freeing 1 GiB) meanwhile.
    let mut cmd = client_in_pid_namespace(&sim, &dir, "ns", &["hold"]);
    let mut measured = sim.spawn(cmd.env("SIMGPU_CONTEXT_CREATE_US", "3000000"));
    let devices = dir.join("devices");
    let waiting = std::time::Instant::now();
    while !std::fs::read_dir(&devices).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            e.path().extension().is_some_and(|x| x == "measure") && locked_by_another(&e.path())
        })
    }) {
        assert!(measured.try_wait().unwrap().is_none(), "the client ended");
        if waiting.elapsed() > std::time::Duration::from_secs(60) {
            measured.kill().unwrap();
            panic!(
                "no measurement lock held in {} while the client created its context\n{}",
                devices.display(),
                finish(measured, "measured").report()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    finish(other, "other").assert_success();
    wait_for_key(&mut measured, "ready");
    measured.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let fill: u64 = wait_for_key(&mut measured, "fill_bytes")["fill_bytes"]
        .parse()
        .unwrap();
    let run = finish(measured, "measured");
    run.assert_success();
    assert!(
        fill + SIM_CONTEXT <= QUOTA,
        "{fill} allocated beside a {SIM_CONTEXT}-byte context under a {QUOTA}-byte quota\n{}",
        run.report()
    );
}

/// [`client`] in a container of its own, as a Kubernetes pod runs it ([`container_args`]).
fn client_in_container(sim: &Sim, dir: &Path, tenant: &str, args: &[&str]) -> Command {
    let host_proc = host_proc(dir, tenant);
    let inner = container_args(&compile(&QUOTA_OVERHEAD), args);
    let inner: Vec<&str> = inner.iter().map(String::as_str).collect();
    let mut cmd = unshared(sim, dir, tenant, &inner);
    cmd.env("SIMGPU_HOST_PROC", &host_proc);
    cmd
}

/// A context created in a container (its own PID namespace and `/proc`: the process cannot find
/// itself in NVML's lists by its PID) while another tenant allocates 1 GiB every 10 ms: the
/// device's used memory grows by gigabytes during the 300 ms the context takes, none of which is
/// this context's. It is charged what simgpu spent on it, to one granule, and its first
/// allocations fail only at its quota.
#[test]
fn a_context_created_in_a_container_is_not_charged_a_neighbours_allocations() {
    let dir = scratch("container-neighbour");
    let sim = Sim::new("overhead-container")
        .env("SIMGPU_MEMORY", "64GiB")
        .env("SIMGPU_CONTEXT_CREATE_US", "300000");
    let mut neighbour = client(
        &sim,
        Deploy::Preload,
        &dir,
        "neighbour",
        &["churn", "1024", "10"],
    );
    let mut neighbour = sim.spawn(neighbour.env("GPUSLICE_MEMORY_LIMIT", "48GiB"));
    wait_for_key(&mut neighbour, "churning");
    let before = sim.stat();
    let mut pod = sim.spawn(&mut client_in_container(&sim, &dir, "pod", &["hold"]));
    let ready = wait_for_key(&mut pod, "ready");
    assert_eq!(
        ready["pid"], "1",
        "the client is its container's init: {ready:?}"
    );
    let after = sim.stat();
    let Json::Array(procs) = after.at("processes") else {
        panic!("simgpu-stat: no processes in {after}")
    };
    let ours = procs
        .iter()
        .find(|p| p.at("group") == &Json::String("pod".to_string()))
        .unwrap_or_else(|| panic!("the pod's process in {after}"));
    assert_ne!(ours.u64("pid"), 1, "simgpu lists its host PID: {after}");
    assert_eq!(ours.u64("used.0"), SIM_CONTEXT, "{after}");
    let moved = after.u64("devices.0.used") as i128 - before.u64("devices.0.used") as i128;
    let pid = ours.u64("pid").to_string();
    let overhead = gpuslice::ledger::Ledger::open_readonly(&dir.join("pod.ledger"))
        .expect("the pod's ledger")
        .snapshot()
        .processes
        .iter()
        .map(|p| p.overhead.iter().map(|(_, b)| b).sum::<u64>())
        .sum::<u64>();
    assert!(
        near(overhead, SIM_CONTEXT),
        "the context charged {overhead} bytes, it cost {SIM_CONTEXT} (process {pid}; the device's \
         used memory moved {moved} bytes meanwhile)"
    );
    pod.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let fill: u64 = wait_for_key(&mut pod, "fill_bytes")["fill_bytes"]
        .parse()
        .unwrap();
    let _ = neighbour.kill();
    let _ = neighbour.wait();
    let run = finish(pod, "pod");
    run.assert_success();
    assert!(
        fill <= QUOTA - SIM_CONTEXT && fill + GRANULE >= QUOTA - SIM_CONTEXT,
        "{fill} allocated beside a {SIM_CONTEXT}-byte context under a {QUOTA}-byte quota\n{}",
        run.report()
    );
    assert!(
        group_peak_on(&sim.stat(), "pod", 0) <= QUOTA,
        "{}",
        run.report()
    );
}
