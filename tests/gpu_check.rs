//! The real-GPU check (`scripts/gpu-check`, docs/REAL-GPU.md) on simgpu: packed here, the packed folder
//! copied to a fresh directory and run there as on a GPU machine -- `PATH` and `LD_LIBRARY_PATH`
//! holding only the system's directories (no compiler or build tree needed), simgpu given as the driver
//! explicitly. Every probe of the check must be in the report with a figure or its reason for skipping;
//! the probes whose answer on simgpu is certain must pass; nothing it started may outlive it.
//!
//! The pack builds the release libraries (`cargo build --release`, which `scripts/test` runs before the
//! tests, so that here it has nothing left to do) in the target directory of this test run.

use gpuslice_testkit as common;

use common::{parse_json, Json, JsonExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every probe the check must report (docs/REAL-GPU.md lists what each validates).
const PROBES: &[&str] = &[
    "driver",
    "resolution",
    "resolution_dropin",
    "events_no_context",
    "memory_context",
    "module_loading_lazy",
    "module_loading_eager",
    "modules_500",
    "local_memory",
    "context_limits",
    "graph_memory",
    "ipc_importer",
    "fd_importer",
    "pid_namespace",
    "launch_cost",
    "kernel_chain",
    "torch_quota",
    "torch_quota_expandable",
    "jax_prealloc",
    "cupy_pool",
    "nvidia_smi",
    "shares_30_70",
    "shares_10_90",
    "torch_shares_30_70",
    "torch_shares_10_90",
    "torch_graph_shares",
    "priority_p99",
    "timeslice",
];

/// Probes that run on simgpu whatever the machine's load (no NVIDIA hardware, no framework).
const RUN_ON_SIMGPU: &[&str] = &[
    "driver",
    "resolution",
    "resolution_dropin",
    "events_no_context",
    "memory_context",
    "module_loading_lazy",
    "module_loading_eager",
    "modules_500",
    "local_memory",
    "context_limits",
    "graph_memory",
    "launch_cost",
    "kernel_chain",
    "shares_30_70",
    "shares_10_90",
    "priority_p99",
    "timeslice",
];

/// Probes whose answer on simgpu is certain (simgpu models what they check, no timing involved).
const PASS_ON_SIMGPU: &[&str] = &[
    "driver",
    "resolution",
    "resolution_dropin",
    "events_no_context",
    "memory_context",
    "module_loading_lazy",
    "module_loading_eager",
    "modules_500",
    "context_limits",
    "graph_memory",
];

/// Processes whose command line mentions `dir`.
fn processes_under(dir: &Path) -> Vec<String> {
    let needle = dir.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmd.contains(&needle) {
            found.push(format!("{}: {cmd}", e.file_name().to_string_lossy()));
        }
    }
    found
}

fn shm_entries() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/dev/shm")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("simgpu-gpu-check-") || n.starts_with("gpu-check-"))
        .collect();
    v.sort();
    v
}

fn copy_dir(from: &Path, to: &Path) {
    let st = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("run cp");
    assert!(st.success(), "cp -a {} {}", from.display(), to.display());
}

fn field<'a>(probe: &'a Json, key: &str) -> Option<&'a str> {
    match probe {
        Json::Object(o) => o.get(key).and_then(|v| match v {
            Json::String(s) => Some(s.as_str()),
            _ => None,
        }),
        _ => None,
    }
}

#[test]
fn packed_check_runs_on_simgpu_from_a_fresh_directory() {
    let simgpu = common::simgpu_lib_dir();
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("gpu-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();

    // Pack, in this run's target directory (the release build is already there under scripts/test).
    let packed = work.join("packed");
    let out = common::clean_command(common::root().join("scripts/gpu-check"))
        .arg("--pack")
        .arg(&packed)
        .env("CARGO_TARGET_DIR", common::target_dir())
        .output()
        .expect("run scripts/gpu-check --pack");
    assert!(
        out.status.success(),
        "scripts/gpu-check --pack failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let size: u64 = walk_size(&packed);
    assert!(
        size < 30 << 20,
        "the packed folder is {size} bytes, not well under 30 MiB"
    );

    // A fresh directory, as on the GPU machine: nothing of the build tree on any path.
    let fresh = work.join("fresh");
    copy_dir(&packed, &fresh);
    std::fs::remove_dir_all(&packed).unwrap();
    let reports = work.join("reports");
    let shm_before = shm_entries();
    let mut cmd = Command::new(fresh.join("gpu-check"));
    cmd.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        .env("HOME", &work)
        .current_dir(&work)
        .arg("--simgpu")
        .arg(&simgpu)
        .arg("--out")
        .arg(&reports);
    let run = common::run_command(&mut cmd);
    run.assert_success();
    let left = processes_under(&fresh);
    assert!(
        left.is_empty(),
        "the check left processes running: {left:?}"
    );
    assert_eq!(
        shm_entries(),
        shm_before,
        "the check left files in /dev/shm"
    );

    let text = std::fs::read_to_string(reports.join("report.json")).expect("report.json");
    let doc =
        parse_json(&text).unwrap_or_else(|e| panic!("report.json is not JSON ({e}):\n{text}"));
    let md = std::fs::read_to_string(reports.join("report.md")).expect("report.md");
    let probes = doc.arr("probes");
    let ids: Vec<&str> = probes.iter().filter_map(|p| field(p, "id")).collect();
    for want in PROBES {
        assert!(
            ids.contains(want),
            "probe {want} is not in the report: {ids:?}\n{}",
            run.report()
        );
    }
    for p in probes {
        let id = field(p, "id").unwrap();
        let status = field(p, "status").unwrap_or("");
        let figure = field(p, "figure").unwrap_or("");
        let reason = field(p, "reason").unwrap_or("");
        let where_ = field(p, "where").unwrap_or("");
        assert!(
            !where_.is_empty() && !field(p, "validates").unwrap_or("").is_empty(),
            "{id}: no assumption or place in the code"
        );
        assert!(
            md.contains(&format!("| {id} | {status} |")),
            "{id} is not in report.md:\n{md}"
        );
        match status {
            "pass" | "fail" | "info" => {
                assert!(!figure.is_empty(), "{id}: {status} without a figure")
            }
            "skip" => assert!(
                reason.starts_with("skipped: "),
                "{id}: a skip without its reason: {reason:?}"
            ),
            _ => panic!("{id}: {status}: {reason}\n{}", run.report()),
        }
        if RUN_ON_SIMGPU.contains(&id) {
            assert_ne!(status, "skip", "{id} did not run on simgpu: {reason}");
        }
        if PASS_ON_SIMGPU.contains(&id) {
            assert_eq!(
                status,
                "pass",
                "{id} on simgpu: {figure} -- {}",
                field(p, "contradiction").unwrap_or("")
            );
        }
        if status == "fail" {
            let said = field(p, "contradiction").unwrap_or("");
            assert!(
                !said.is_empty() && md.contains(id),
                "{id} failed without saying which assumption"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&work);
}

fn walk_size(dir: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let m = e.path().symlink_metadata().unwrap();
        if m.is_dir() {
            n += walk_size(&e.path());
        } else {
            n += m.len();
        }
    }
    n
}
