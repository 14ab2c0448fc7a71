//! gpuslice's memory quota judged through real clients, on every path a program reaches the driver by
//! (linked, dlopen + dlsym, cuGetProcAddress_v2, the CUDA 11.3 cuGetProcAddress, NVIDIA's cuda-bindings,
//! nvidia-ml-py) and every way it allocates device memory. Each client is its own process with
//! `libgpuslice.so` preloaded; its printed figures are asserted exactly, and simgpu's shared state
//! (`simgpu-stat`) is the judge of what really reached the device. Also: the shim is transparent when
//! nothing is configured, answers cuGetProcAddress like NVIDIA's real driver, and its dlsym interposer
//! leaves every other lookup as glibc answers it.

use gpuslice_testkit as common;

use common::libgpuslice as shim;
use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The tenant's quota.
const QUOTA: u64 = 1536 * MIB;
/// simgpu's own per-context memory (SIMGPU_CONTEXT_MEMORY default).
const SIM_CONTEXT: u64 = 300 * MIB;
/// What the shim charges per context: what the driver spent on it (measured).
const SHIM_CONTEXT: u64 = SIM_CONTEXT;
/// Longest any client may take: a hang (e.g. a deadlocked interposer) fails the test instead.
const TIMEOUT: Duration = Duration::from_secs(120);

/// The allocation kinds of tests/clients/quota_paths.c and their (A, B) sizes: A fits the quota
/// (1 GiB left after the context), B does not while A is held.
const KINDS: [(&str, u64, u64); 10] = [
    ("alloc", 768 * MIB, 512 * MIB),
    ("pitch", 768 * MIB, 512 * MIB),
    ("managed", 768 * MIB, 512 * MIB),
    ("async", 768 * MIB, 512 * MIB),
    ("async_ptsz", 768 * MIB, 512 * MIB),
    ("pool", 768 * MIB, 512 * MIB),
    ("vmm", 768 * MIB, 512 * MIB),
    ("array", 768 * MIB, 512 * MIB),
    ("array3d", 768 * MIB, 512 * MIB),
    // 8192 x 4096 float4, 2 levels: 512 + 128 MiB.
    ("mipmap", 640 * MIB, 640 * MIB),
];

/// Steps a kind prints between freeing A and `a_freed`, with A still counted.
fn held_steps(kind: &str) -> &'static [&'static str] {
    match kind {
        // A stream-ordered free leaves the block in its pool until the pool releases it.
        "async" | "async_ptsz" => &["free_async"],
        // The own pool keeps everything through synchronization (threshold = max) until trimmed.
        "pool" => &["free_async", "synced"],
        // Released but still mapped: still device memory.
        "vmm" => &["released"],
        _ => &[],
    }
}

// ---- builds ----

/// The interception paths: (name, build, leading arguments).
const PATHS: [(&str, CBuild, &[&str]); 6] = [
    ("linked", PATHS_LINKED, &[]),
    ("dlsym", PATHS_DLSYM, &["dlsym"]),
    ("procaddress_v2", PATHS_PROCADDR, &["v2"]),
    ("procaddress_v1", PATHS_PROCADDR, &["v1"]),
    // A CUDA 13 program on a CUDA 13 driver: built against cuda.h 13.x, resolving at version 13000.
    ("cuda13_linked", PATHS_LINKED_CU13, &[]),
    ("cuda13_procaddress_v2", PATHS_PROCADDR, &["v2"]),
];

/// A private directory for one test's ledgers and builds.
fn scratch(tag: &str) -> PathBuf {
    scratch_dir("shim_paths", tag)
}

/// Runs `cmd` with `input` on stdin, killed (and the test failed) after [`TIMEOUT`].
fn run_with_timeout(cmd: &mut Command, input: &str) -> Run {
    let desc = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {desc}: {e}"));
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_string();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let _ = stdin.write_all(input.as_bytes());
    });
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(TIMEOUT) {
        Ok(out) => out.expect("wait for client"),
        Err(_) => {
            // Our own child, by its pid.
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("{desc} did not finish within {TIMEOUT:?} (hung; killed)");
        }
    };
    waiter.join().unwrap();
    writer.join().unwrap();
    Run::new(desc, out)
}

/// Environment of a tenant with a quota: its own ledger in `dir`.
fn with_quota(cmd: &mut Command, dir: &Path, tenant: &str) {
    cmd.env("LD_PRELOAD", shim())
        .env("GPUSLICE_MEMORY_LIMIT", "1536MiB")
        .env("GPUSLICE_TENANT", tenant)
        .env("GPUSLICE_LEDGER", dir.join(format!("{tenant}.ledger")));
}

/// gpuslice's size format (`512 MiB`, `1.25 GiB`), as the warnings print sizes.
fn human(bytes: u64) -> String {
    for (name, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        let unit = 1u64 << shift;
        if bytes >= unit {
            let (whole, hundredths) = (bytes / unit, (bytes % unit) * 100 / unit);
            return match hundredths {
                0 => format!("{whole} {name}"),
                h if h % 10 == 0 => format!("{whole}.{} {name}", h / 10),
                h => format!("{whole}.{h:02} {name}"),
            };
        }
    }
    format!("{bytes} B")
}

/// Whether a warning names `bytes`, in gpuslice's format or as a plain number.
fn names_size(line: &str, bytes: u64) -> bool {
    line.contains(&human(bytes)) || line.contains(&bytes.to_string())
}

/// The gpuslice lines of stderr between `quota_paths: begin KIND` and `... end KIND`.
fn warnings_per_kind(stderr: &str) -> (BTreeMap<String, Vec<String>>, Vec<String>) {
    let mut per_kind: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut outside = Vec::new();
    let mut current: Option<String> = None;
    for line in stderr.lines() {
        if let Some(k) = line.strip_prefix("quota_paths: begin ") {
            current = Some(k.to_string());
            per_kind.entry(k.to_string()).or_default();
        } else if line.starts_with("quota_paths: end ") {
            current = None;
        } else if line.starts_with("gpuslice") {
            match &current {
                Some(k) => per_kind.get_mut(k).unwrap().push(line.to_string()),
                None => outside.push(line.to_string()),
            }
        }
    }
    (per_kind, outside)
}

/// Checks the `matrix` steps of `kinds` printed by a client run under a 1536 MiB quota.
fn assert_matrix(run: &Run, tenant: &str, kinds: &[(&str, u64, u64)], held: fn(&str) -> &[&str]) {
    let kv = run.kv();
    let report = run.report();
    let uuid = run.get("device_uuid");
    let mut failures = Vec::new();
    let mut expect = |key: String, want: u64| match kv.get(&key) {
        Some(v) if v == &want.to_string() => {}
        Some(v) => failures.push(format!("{key}: expected {want}, got {v}")),
        None => failures.push(format!("{key}: expected {want}, not printed")),
    };
    for &(kind, a, b) in kinds {
        let free_with = |held: u64| QUOTA - SHIM_CONTEXT - held;
        let mut steps: Vec<(String, u64, u64)> = vec![
            ("start".into(), 0, free_with(0)),
            ("a".into(), 0, free_with(a)),
            ("b".into(), 2, free_with(a)),
        ];
        for s in held(kind) {
            steps.push((s.to_string(), 0, free_with(a)));
        }
        steps.extend([
            ("a_freed".into(), 0, free_with(0)),
            ("b2".into(), 0, free_with(b)),
            ("end".into(), 0, free_with(0)),
        ]);
        for (step, rc, free) in steps {
            expect(format!("{kind}.{step}.rc"), rc);
            expect(format!("{kind}.{step}.free"), free);
            expect(format!("{kind}.{step}.total"), QUOTA);
        }
    }
    // Warnings: exactly one per refused allocation, naming tenant, device, request, use and limit.
    let (per_kind, outside) = warnings_per_kind(&run.stderr);
    for &(kind, a, b) in kinds {
        let lines = per_kind.get(kind).cloned().unwrap_or_default();
        if lines.len() != 1 {
            failures.push(format!(
                "{kind}: expected one gpuslice warning for the refused allocation, got {lines:?}"
            ));
            continue;
        }
        let line = &lines[0];
        let used = SHIM_CONTEXT + a;
        if !(line.starts_with("gpuslice: warn: ")
            && line.contains(tenant)
            && line.contains(&uuid)
            && names_size(line, b)
            && names_size(line, used)
            && names_size(line, QUOTA))
        {
            failures.push(format!(
                "{kind}: the warning must name tenant {tenant}, device {uuid}, requested {}, used {} \
                 and limit {}: {line}",
                human(b),
                human(used),
                human(QUOTA)
            ));
        }
    }
    if !outside.is_empty() {
        failures.push(format!("unexpected gpuslice output: {outside:?}"));
    }
    assert!(
        failures.is_empty(),
        "{} wrong figures:\n  {}\n{report}",
        failures.len(),
        failures.join("\n  ")
    );
}

/// Hooked entry points (the `hook` column of the API table, without `call`).
fn hooked_symbols() -> Vec<String> {
    let table = std::fs::read_to_string(root().join("src/api/driver_entry_points.tsv")).unwrap();
    table
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split('\t').collect::<Vec<_>>())
        .filter(|c| c[6] != "-" && c[6] != "call")
        .map(|c| c[0].to_string())
        .collect()
}

/// The client's function table: field -> the exported symbol it must be bound to.
const BOUND: [(&str, &str); 39] = [
    ("init", "cuInit"),
    ("getErrorName", "cuGetErrorName"),
    ("deviceGet", "cuDeviceGet"),
    ("deviceGetUuid", "cuDeviceGetUuid*"),
    ("deviceTotalMem", "cuDeviceTotalMem_v2"),
    ("primaryRetain", "cuDevicePrimaryCtxRetain"),
    ("primaryRelease", "cuDevicePrimaryCtxRelease_v2"),
    ("ctxSetCurrent", "cuCtxSetCurrent"),
    ("memGetInfo", "cuMemGetInfo_v2"),
    ("memAlloc", "cuMemAlloc_v2"),
    ("memFree", "cuMemFree_v2"),
    ("memAllocPitch", "cuMemAllocPitch_v2"),
    ("memAllocManaged", "cuMemAllocManaged"),
    ("streamCreate", "cuStreamCreate"),
    ("streamDestroy", "cuStreamDestroy_v2"),
    ("streamSynchronize", "cuStreamSynchronize"),
    ("memAllocAsync", "cuMemAllocAsync"),
    ("memFreeAsync", "cuMemFreeAsync"),
    ("streamSynchronizePtsz", "cuStreamSynchronize_ptsz"),
    ("memAllocAsyncPtsz", "cuMemAllocAsync_ptsz"),
    ("memFreeAsyncPtsz", "cuMemFreeAsync_ptsz"),
    ("memAllocFromPoolAsync", "cuMemAllocFromPoolAsync"),
    ("memPoolCreate", "cuMemPoolCreate"),
    ("memPoolDestroy", "cuMemPoolDestroy"),
    ("memPoolTrimTo", "cuMemPoolTrimTo"),
    ("memPoolSetAttribute", "cuMemPoolSetAttribute"),
    (
        "memGetAllocationGranularity",
        "cuMemGetAllocationGranularity",
    ),
    ("memCreate", "cuMemCreate"),
    ("memRelease", "cuMemRelease"),
    ("memAddressReserve", "cuMemAddressReserve"),
    ("memAddressFree", "cuMemAddressFree"),
    ("memMap", "cuMemMap"),
    ("memUnmap", "cuMemUnmap"),
    ("memSetAccess", "cuMemSetAccess"),
    ("arrayCreate", "cuArrayCreate_v2"),
    ("array3DCreate", "cuArray3DCreate_v2"),
    ("arrayDestroy", "cuArrayDestroy"),
    ("mipmappedArrayCreate", "cuMipmappedArrayCreate"),
    ("mipmappedArrayDestroy", "cuMipmappedArrayDestroy"),
];

/// Every function the client obtained is the hook (in libgpuslice.so, under the same exported name)
/// exactly when the entry point is hooked, and the driver's own function otherwise.
fn assert_bound(run: &Run) {
    let hooked = hooked_symbols();
    let mut failures = Vec::new();
    for (field, symbol) in BOUND {
        let got = run.get(&format!("bound.{field}"));
        let (object, name) = got.split_once('!').unwrap_or((&got, ""));
        let name_ok = match symbol.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == symbol,
        };
        let want_object = if hooked.iter().any(|h| h == name) {
            "libgpuslice.so"
        } else {
            "libcuda.so.1"
        };
        if !name_ok || object != want_object {
            failures.push(format!(
                "{field}: expected {want_object}!{symbol}, got {got}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "functions bound wrongly:\n  {}\n{}",
        failures.join("\n  "),
        run.report()
    );
}

/// simgpu's judgement after a matrix run: nothing left, and no refused allocation ever reached the
/// device (the peak is the context plus the largest A).
fn assert_device_judged(sim: &Sim) {
    let stat = sim.stat();
    assert_eq!(
        stat.u64("devices.0.used"),
        0,
        "memory left on the device: {stat}"
    );
    let peak = stat.u64("groups.0.peak.0");
    assert_eq!(
        peak,
        SIM_CONTEXT + 768 * MIB,
        "device peak: simgpu's context + A (768 MiB); a larger peak means a refused allocation \
         reached the driver: {stat}"
    );
}

fn quota_matrix(path: &str) {
    let (_, build, args) = PATHS.iter().find(|p| p.0 == path).unwrap();
    let client = compile(build);
    let dir = scratch(path);
    let tenant = format!("paths-{}", path.replace('_', "-"));

    let mut sim = Sim::new(&format!("quota-{path}")).env("SIMGPU_MEMORY", "4GiB");
    let cuda13 = path.starts_with("cuda13");
    if cuda13 {
        sim = sim.env("SIMGPU_DRIVER_VERSION", "13000");
    }
    let mut cmd = sim.command(&client);
    cmd.args(*args).arg("matrix");
    if cuda13 {
        cmd.env("QUOTA_CUDA_VERSION", "13000");
    }
    with_quota(&mut cmd, &dir, &tenant);
    let run = run_with_timeout(&mut cmd, "");
    run.assert_success();
    assert_eq!(run.get("done"), "1", "{}", run.report());
    assert_eq!(
        run.get_u64("total_mem"),
        QUOTA,
        "cuDeviceTotalMem_v2 = quota\n{}",
        run.report()
    );
    assert_bound(&run);
    assert_matrix(&run, &tenant, &KINDS, held_steps);
    assert_device_judged(&sim);

    // Allocating 64 MiB at a time stops exactly at the quota, on every kind.
    let mut cmd = sim.command(&client);
    cmd.args(*args).arg("fill");
    if cuda13 {
        cmd.env("QUOTA_CUDA_VERSION", "13000");
    }
    with_quota(&mut cmd, &dir, &tenant);
    let fill = run_with_timeout(&mut cmd, "");
    fill.assert_success();
    let mut failures = Vec::new();
    for (kind, _, _) in KINDS {
        let want = [
            ("fill_count", (QUOTA - SHIM_CONTEXT) / (64 * MIB)),
            ("fill_rc", 2),
            ("fill_free_after", QUOTA - SHIM_CONTEXT),
            ("fill_total_after", QUOTA),
        ];
        for (k, v) in want {
            let got = fill.kv().get(&format!("{kind}.{k}")).cloned();
            if got.as_deref() != Some(&v.to_string()) {
                failures.push(format!("{kind}.{k}: expected {v}, got {got:?}"));
            }
        }
    }
    let warnings = fill
        .stderr
        .lines()
        .filter(|l| l.starts_with("gpuslice"))
        .count();
    if warnings != KINDS.len() {
        failures.push(format!(
            "expected {} gpuslice warnings (one per refused allocation), got {warnings}",
            KINDS.len()
        ));
    }
    assert!(
        failures.is_empty(),
        "allocating until the quota:\n  {}\n{}",
        failures.join("\n  "),
        fill.report()
    );
    let stat = sim.stat();
    assert!(
        stat.u64("groups.0.peak.0") <= SIM_CONTEXT + QUOTA - SHIM_CONTEXT,
        "the device held more than the quota allows: {stat}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn quota_every_allocation_kind_linked() {
    quota_matrix("linked");
}

#[test]
fn quota_every_allocation_kind_cuda13_linked() {
    quota_matrix("cuda13_linked");
}

#[test]
fn quota_every_allocation_kind_cuda13_procaddress_v2() {
    quota_matrix("cuda13_procaddress_v2");
}

#[test]
fn quota_every_allocation_kind_dlsym() {
    quota_matrix("dlsym");
}

#[test]
fn quota_every_allocation_kind_procaddress_v2() {
    quota_matrix("procaddress_v2");
}

#[test]
fn quota_every_allocation_kind_procaddress_v1() {
    quota_matrix("procaddress_v1");
}

/// A pool's freed block is handed out again before any synchronisation without growing the pool: the
/// quota lets it through; a block that makes the pool grow past the quota is refused, and the pool is
/// left holding what it held.
#[test]
fn pool_reuse_before_synchronisation() {
    let (_, build, args) = PATHS.iter().find(|p| p.0 == "linked").unwrap();
    let client = compile(build);
    let dir = scratch("reuse");
    let sim = Sim::new("quota-reuse").env("SIMGPU_MEMORY", "4GiB");
    let mut cmd = sim.command(&client);
    cmd.args(*args).arg("reuse");
    with_quota(&mut cmd, &dir, "paths-reuse");
    let run = run_with_timeout(&mut cmd, "");
    run.assert_success();
    assert_eq!(run.get("done"), "1", "{}", run.report());
    assert_eq!(run.get("reuse.first"), "0", "{}", run.report());
    assert_eq!(
        run.get("reuse.again"),
        "0",
        "reusing the freed block\n{}",
        run.report()
    );
    assert_eq!(
        run.get("reuse.beside"),
        "2",
        "growing past the quota\n{}",
        run.report()
    );
    assert_eq!(
        run.get_u64("reuse.free_after"),
        QUOTA - SHIM_CONTEXT,
        "everything returned after the synchronisation\n{}",
        run.report()
    );
    assert_device_judged(&sim);
}

#[test]
fn quota_through_cuda_bindings() {
    let dir = scratch("bindings");
    let sim = Sim::new("quota-bindings").env("SIMGPU_MEMORY", "4GiB");
    let mut cmd = sim.command(venv_python());
    cmd.arg(client_source("quota_bindings.py"));
    with_quota(&mut cmd, &dir, "paths-bindings");
    let run = run_with_timeout(&mut cmd, "");
    run.assert_success();
    assert_eq!(run.get("done"), "1", "{}", run.report());
    assert_eq!(run.get_u64("total_mem"), QUOTA, "{}", run.report());
    let kinds = [
        ("alloc", 768 * MIB, 512 * MIB),
        ("async", 768 * MIB, 512 * MIB),
    ];
    fn held(kind: &str) -> &'static [&'static str] {
        if kind == "async" {
            &["free_async"]
        } else {
            &[]
        }
    }
    assert_matrix(&run, "paths-bindings", &kinds, held);
    assert_device_judged(&sim);
}

#[test]
fn nvml_shows_the_tenants_quota_and_usage() {
    let dir = scratch("nvml");
    let sim = Sim::new("quota-nvml").env("SIMGPU_MEMORY", "4GiB");
    let tenant = "paths-nvml";
    // A CUDA process of the tenant holds A (768 MiB) plus its context charge.
    let mut cmd = sim.command(compile(&PATHS_LINKED));
    cmd.arg("hold");
    with_quota(&mut cmd, &dir, tenant);
    let mut holder = sim.spawn(&mut cmd);
    let ready = wait_for_key(&mut holder, "ready");
    assert_eq!(ready.get("ready").map(String::as_str), Some("1"));

    let mut cmd = sim.command(venv_python());
    cmd.arg(client_source("nvml_client.py"));
    with_quota(&mut cmd, &dir, tenant);
    let run = run_with_timeout(&mut cmd, "");
    let held = finish(holder, "holder");
    held.assert_success();
    run.assert_success();
    let used = SHIM_CONTEXT + 768 * MIB;
    let report = run.report();
    for (key, want) in [
        ("device0_mem_total", QUOTA),
        ("device0_mem_used", used),
        ("device0_mem_free", QUOTA - used),
        ("device0_mem2_total", QUOTA),
        ("device0_mem2_used", used),
        ("device0_mem2_free", QUOTA - used),
    ] {
        assert_eq!(
            run.get_u64(key),
            want,
            "{key}: NVML must show the quota as the card and the tenant's usage\n{report}"
        );
    }
    assert_eq!(
        run.get("device0_uuid"),
        ready.get("device_uuid").cloned().unwrap_or_default(),
        "NVML and CUDA name the same device\n{report}"
    );
    assert!(
        !run.stderr.contains("gpuslice"),
        "gpuslice complained:\n{report}"
    );
}

/// The stdout of a client without the `bound.*` lines (which name the hooks when the shim is there).
fn figures(run: &Run) -> String {
    run.stdout
        .lines()
        .filter(|l| !l.starts_with("bound."))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn transparent_without_configuration() {
    // Nothing configured: no variable (the harness strips GPUSLICE_* and points the ledger
    // directory at a private one, where no ledger exists), no quota file.
    assert!(
        !Path::new("/etc/gpuslice/quota.toml").exists(),
        "/etc/gpuslice/quota.toml exists on this machine: the shim is not unconfigured here"
    );
    let mut differences = Vec::new();
    for (path, build, args) in PATHS {
        let client = compile(&build);
        for mode in ["matrix", "fill"] {
            let mut outputs = Vec::new();
            for preload in [false, true] {
                // A fresh device each time: both runs start from the same state.
                let sim = Sim::new(&format!("transparent-{path}")).env("SIMGPU_MEMORY", "2GiB");
                let mut cmd = sim.command(&client);
                cmd.args(args).arg(mode);
                if preload {
                    cmd.env("LD_PRELOAD", shim());
                }
                let run = run_with_timeout(&mut cmd, "");
                run.assert_success();
                outputs.push(run);
            }
            let (plain, shimmed) = (&outputs[0], &outputs[1]);
            if figures(plain) != figures(shimmed) || plain.stderr != shimmed.stderr {
                differences.push(format!(
                    "{path} {mode}:\n--- without the shim ---\n{}\n--- with the shim ---\n{}",
                    plain.report(),
                    shimmed.report()
                ));
            }
        }
    }
    assert!(
        differences.is_empty(),
        "the unconfigured shim changed what the program sees:\n{}",
        differences.join("\n")
    );
}

/// The cuGetProcAddress questions of the oracle test: every base name the real 535 driver exports.
fn procaddress_questions() -> String {
    let table = std::fs::read_to_string(root().join("src/api/driver_entry_points.tsv")).unwrap();
    let mut bases = std::collections::BTreeSet::new();
    for line in table
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let f: Vec<&str> = line.split('\t').collect();
        if f[5] == "1" && f[2].parse::<u32>().unwrap() > 0 {
            bases.insert(f[1].to_string());
        }
    }
    assert!(bases.len() > 300, "only {} bases in the table", bases.len());
    let mut input = String::new();
    for base in &bases {
        for version in [3000, 3020, 11030, 12000, 12020, -1] {
            for flags in [0, 2] {
                input.push_str(&format!("{base}\t{version}\t{flags}\n"));
            }
        }
    }
    input
}

#[test]
fn procaddress_answers_like_the_real_driver() {
    let client = compile(&PROCADDRESS);
    let oracle = compile(&QUOTA_ORACLE);
    let input = procaddress_questions();
    let sim = Sim::new("shim-oracle");
    let dir = scratch("oracle");
    let driver = nvidia_driver_dir();

    let configs: [(&str, bool, bool); 3] = [
        ("without the shim", false, false),
        ("with the shim, nothing configured", true, false),
        ("with the shim and a quota", true, true),
    ];
    let mut answers = Vec::new();
    for (what, preload, quota) in configs {
        let mut runs = Vec::new();
        for (program, stdin) in [(&client, input.as_str()), (&oracle, "")] {
            let mut cmd = sim.command_with_driver(program, &driver);
            if preload {
                cmd.env("LD_PRELOAD", shim());
            }
            if quota {
                with_quota(&mut cmd, &dir, "paths-oracle");
            }
            let run = run_with_timeout(&mut cmd, stdin);
            run.assert_success();
            runs.push(run);
        }
        answers.push((what, runs));
    }
    let (_, reference) = &answers[0];
    // The oracle itself answers: the real driver resolves, and has no device here.
    assert!(
        reference[0]
            .stdout
            .lines()
            .any(|l| l.starts_with("cuMemAlloc 3020 0 | v1 0 cuMemAlloc_v2 ")),
        "the real driver's answers look wrong:\n{}",
        reference[0].report()
    );
    assert_eq!(
        reference[1].get("init.rc"),
        "100",
        "{}",
        reference[1].report()
    );
    assert_eq!(
        reference[1].get("driver_version"),
        "12020",
        "{}",
        reference[1].report()
    );
    for (what, runs) in &answers[1..] {
        for (i, name) in ["procaddress", "driver answers"].iter().enumerate() {
            let want: Vec<&str> = reference[i].stdout.lines().collect();
            let got: Vec<&str> = runs[i].stdout.lines().collect();
            let diffs: Vec<String> = want
                .iter()
                .zip(got.iter().map(Some).chain(std::iter::repeat(None)))
                .filter(|(w, g)| Some(**w) != g.copied())
                .map(|(w, g)| format!("  driver: {w}\n  shim:   {}", g.unwrap_or(&"<none>")))
                .collect();
            assert!(
                diffs.is_empty() && want.len() == got.len(),
                "{name} {what}: {} of {} answers differ ({} vs {} lines); first:\n{}\nstderr:\n{}",
                diffs.len(),
                want.len(),
                want.len(),
                got.len(),
                diffs
                    .iter()
                    .take(20)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("\n"),
                runs[i].stderr
            );
            assert!(
                !runs[i].stderr.contains("gpuslice"),
                "{name} {what}: gpuslice printed:\n{}",
                runs[i].stderr
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dlsym_interposer_leaves_other_lookups_alone() {
    let dir = scratch("hygiene");
    let client = compile(&QUOTA_HYGIENE);
    let wrap = compile(&QUOTA_MALLOCWRAP);
    let sim = Sim::new("hygiene");
    let preload = |with_shim: bool| -> String {
        if with_shim {
            format!("{} {}", shim().display(), wrap.display())
        } else {
            wrap.display().to_string()
        }
    };
    // Without the shim, with it unconfigured, with a quota: the same answers, except that a lookup of
    // a hooked driver function in the driver answers the hook.
    let mut runs = Vec::new();
    for (with_shim, quota) in [(false, false), (true, false), (true, true)] {
        let mut cmd = sim.command(&client);
        cmd.arg("lookups");
        if quota {
            with_quota(&mut cmd, &dir, "paths-hygiene");
        }
        cmd.env("LD_PRELOAD", preload(with_shim));
        let run = run_with_timeout(&mut cmd, "");
        run.assert_success();
        assert_eq!(run.get("done"), "1", "{}", run.report());
        runs.push(run);
    }
    let reference = runs[0].kv();
    let report = runs[0].report();
    // The reference itself is what glibc answers.
    for (key, want) in [
        ("puts.default", "libc.so.6!puts+0"),
        ("puts.next", "libc.so.6!puts+0"),
        ("malloc.default", "libquota_mallocwrap.so!malloc+0"),
        ("mallocwrap.next_malloc", "libc.so.6!malloc+0"),
        ("mallocwrap.used", "1"),
        ("own.default", "quota_hygiene!quota_hygiene_own_symbol+0"),
        ("cuda.dlsym.cuMemAlloc_v2", "libcuda.so.1!cuMemAlloc_v2+0"),
    ] {
        assert_eq!(
            reference.get(key).map(String::as_str),
            Some(want),
            "{key} without the shim\n{report}"
        );
    }
    for run in &runs[1..] {
        let mut got = run.kv();
        assert_eq!(
            got.remove("cuda.dlsym.cuMemAlloc_v2").as_deref(),
            Some("libgpuslice.so!cuMemAlloc_v2+0"),
            "dlsym(libcuda, cuMemAlloc_v2) must answer the hook\n{}",
            run.report()
        );
        let mut want = reference.clone();
        want.remove("cuda.dlsym.cuMemAlloc_v2");
        let diffs: Vec<String> = want
            .iter()
            .filter(|(k, v)| got.get(*k) != Some(v))
            .map(|(k, v)| format!("{k}: without the shim {v}, with it {:?}", got.get(k)))
            .collect();
        assert!(
            diffs.is_empty() && got.len() == want.len(),
            "lookups changed by the shim:\n  {}\n{}",
            diffs.join("\n  "),
            run.report()
        );
        assert!(
            !run.stderr.contains("gpuslice"),
            "gpuslice printed:\n{}",
            run.report()
        );
    }

    // Processes that never touch CUDA, or find no driver at all: clean exit, not a word from gpuslice.
    let empty = dir.join("empty-lib-dir");
    std::fs::create_dir_all(&empty).unwrap();
    let mut quiet: Vec<(String, Command)> = Vec::new();
    for quota in [false, true] {
        for (name, program, args) in [
            ("/bin/true", PathBuf::from("/bin/true"), vec![]),
            ("python3 -c 1", PathBuf::from("python3"), vec!["-c", "1"]),
            ("no libcuda.so.1", client.clone(), vec!["nolib"]),
        ] {
            let mut cmd = sim.command_with_driver(&program, &empty);
            cmd.args(&args).env("LD_PRELOAD", shim());
            if quota {
                with_quota(&mut cmd, &dir, "paths-quiet");
            }
            quiet.push((format!("{name} (quota: {quota})"), cmd));
        }
    }
    for (name, mut cmd) in quiet {
        let run = run_with_timeout(&mut cmd, "");
        assert!(
            run.status.success()
                && !run.stderr.contains("gpuslice")
                && !run.stdout.contains("gpuslice"),
            "{name}: expected exit 0 and no gpuslice output\n{}",
            run.report()
        );
        if name.starts_with("no libcuda") {
            assert_eq!(run.get("libcuda.loaded"), "0", "{}", run.report());
            assert_eq!(run.get("done"), "1", "{}", run.report());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
