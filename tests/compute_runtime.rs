//! The compute scheduler's runtime in a process (docs/COMPUTE.md, "As built"): a process that has
//! nothing configured runs no thread of ours; a process with both the preloaded library and the
//! drop-in libcuda takes part once (one slot, one gate per launch), through the drop-in.

use gpuslice_testkit as common;

use common::*;
use gpuslice::scheduling::shm::{Layout, SlotEntry, MAX_SLOTS, SLOT_ACTIVE};
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn private_dir(tag: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("compute-runtime-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The names of a process's threads.
fn thread_names(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
                .map(|n| n.trim().to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn hold(sim: &Sim, dir: &Path, env: &[(&str, &str)]) -> std::process::Child {
    let mut cmd = sim.command(compile(&COMPUTE));
    cmd.env("LD_PRELOAD", profile_dir().join("libgpuslice.so"))
        .env("GPUSLICE_LEDGER", dir.join("t.ledger"))
        .env("GPUSLICE_DEVICE_DIR", dir.join("devices"))
        .envs(env.iter().copied())
        .args(["hold", "200"]);
    sim.spawn(&mut cmd)
}

#[test]
fn a_process_with_nothing_configured_runs_no_thread() {
    let sim = Sim::new("compute-runtime-threads");
    let dir = private_dir("threads");
    let mut bare = hold(&sim, &dir, &[]);
    wait_for_key(&mut bare, "ready");
    let pid = bare.id();
    std::thread::sleep(Duration::from_millis(300));
    let names = thread_names(pid);
    drop(bare.stdin.take());
    finish(bare, "nothing configured").assert_success();
    assert!(
        !names.iter().any(|n| n.starts_with("gpuslice")),
        "threads of a process with nothing configured: {names:?}"
    );
    // The same client with a share has its device's scheduler thread (the check above can fail).
    let mut shared = hold(&sim, &dir, &[("GPUSLICE_COMPUTE_SHARE", "50")]);
    wait_for_key(&mut shared, "ready");
    let pid = shared.id();
    std::thread::sleep(Duration::from_millis(300));
    let names = thread_names(pid);
    drop(shared.stdin.take());
    finish(shared, "share 50").assert_success();
    assert!(
        names.iter().any(|n| n == "gpuslice-sched0"),
        "threads of a process with a share: {names:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Live slots of the device ledger in `devices` held by process `pid`.
fn slots_of(devices: &Path, pid: u32) -> usize {
    let path = std::fs::read_dir(devices)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "dev"))
        .expect("a device ledger");
    let bytes = std::fs::read(path).unwrap();
    let word = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap());
    (0..MAX_SLOTS)
        .map(|i| offset_of!(Layout, slots) + i * size_of::<SlotEntry>())
        .filter(|&at| {
            word(at + offset_of!(SlotEntry, state)) == SLOT_ACTIVE
                && word(at + offset_of!(SlotEntry, pid)) == pid
        })
        .count()
}

#[test]
fn preload_plus_dropin_gates_each_launch_once() {
    let sim = Sim::new("compute-runtime-dropin");
    let dir = private_dir("dropin");
    let lib = common::dropin_dir();
    let simgpu = simgpu_lib_dir();
    let command = |tenant: &str, preload: bool| {
        let mut cmd = sim.command_with_driver(compile(&COMPUTE), &lib);
        cmd.env(
            "LD_LIBRARY_PATH",
            format!("{}:{}", lib.display(), simgpu.display()),
        )
        .env("GPUSLICE_REAL_LIBCUDA", simgpu.join("libcuda.so.1"))
        .env("GPUSLICE_REAL_NVML", simgpu.join("libnvidia-ml.so.1"))
        .env("GPUSLICE_LEDGER", dir.join(format!("{tenant}.ledger")))
        .env("GPUSLICE_DEVICE_DIR", dir.join("devices"))
        .env("GPUSLICE_COMPUTE_SHARE", "50")
        .env("SIMGPU_GROUP", tenant);
        if preload {
            cmd.env("LD_PRELOAD", profile_dir().join("libgpuslice.so"));
        }
        cmd
    };
    let mut both = sim.spawn(command("both", true).args(["hold", "200"]));
    wait_for_key(&mut both, "ready");
    let pid = both.id();
    let start = (SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
        + Duration::from_millis(300))
    .as_nanos()
    .to_string();
    let other = sim.spawn(command("other", false).args(["spin", &start, "1500", "200"]));
    std::thread::sleep(Duration::from_millis(1000));
    let slots = slots_of(&dir.join("devices"), pid);
    finish(other, "other").assert_success();
    drop(both.stdin.take());
    let run = finish(both, "preload + drop-in");
    run.assert_success();
    let stat = sim.stat();
    assert_eq!(
        slots, 1,
        "process {pid} with the preloaded library and the drop-in holds {slots} slots (one per gate)"
    );
    assert!(group(&stat, "both").u64("busy_ns.0") > 0, "{stat}");
    assert!(group(&stat, "other").u64("busy_ns.0") > 0, "{stat}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// One thread of a program captures graphs in `CU_STREAM_CAPTURE_MODE_GLOBAL` while another launches
/// on a contended device (so the shim's flow control queries and synchronises events from that
/// thread): every capture succeeds, without gpuslice and with it. simgpu invalidates a global-mode
/// capture on the calls the documentation prohibits (tests/simgpu/README.md).
#[test]
fn captures_in_global_mode_survive_contended_launches() {
    for gpuslice in [false, true] {
        let sim = Sim::new(&format!("compute-runtime-capture-{gpuslice}"));
        let dir = private_dir(&format!("capture-{gpuslice}"));
        let start = (SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
            + Duration::from_millis(500))
        .as_nanos()
        .to_string();
        let spawn = |tenant: &str, args: &[&str]| {
            let mut cmd = sim.command(compile(&COMPUTE));
            cmd.env("SIMGPU_GROUP", tenant).args(args);
            if gpuslice {
                cmd.env("LD_PRELOAD", profile_dir().join("libgpuslice.so"))
                    .env("GPUSLICE_LEDGER", dir.join(format!("{tenant}.ledger")))
                    .env("GPUSLICE_DEVICE_DIR", dir.join("devices"))
                    .env("GPUSLICE_COMPUTE_SHARE", "50");
            }
            sim.spawn(&mut cmd)
        };
        let a = spawn("a", &["capture", &start, "1000", "100"]);
        let b = spawn("b", &["spin", &start, "1000", "200"]);
        let ra = finish(a, "capturing tenant");
        finish(b, "other tenant").assert_success();
        ra.assert_success();
        assert!(ra.get_u64("captures") > 0, "{}", ra.report());
        assert_eq!(
            ra.get_u64("capture_failures"),
            0,
            "gpuslice {gpuslice}: {}",
            ra.report()
        );
        if gpuslice {
            // The launching thread really took the contended path: it joined a device ledger.
            let device_ledgers = std::fs::read_dir(dir.join("devices"))
                .map(|d| {
                    d.flatten()
                        .filter(|e| e.path().extension().is_some_and(|x| x == "dev"))
                        .count()
                })
                .unwrap_or(0);
            assert!(device_ledgers > 0, "no device ledger in {}", dir.display());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
