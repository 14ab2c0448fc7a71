//! `gpuslice doctor` in the three ways of deploying gpuslice (LD_PRELOAD, /etc/ld.so.preload, drop-in
//! libraries on the library path), preload + drop-in together, and misconfigured environments: what it
//! says, and its exit code (0 only when a CUDA program started there would have its quota enforced).

use gpuslice_testkit as common;

use common::*;
use std::path::PathBuf;
use std::process::Command;

fn tmp(name: &str) -> PathBuf {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("doctor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// `gpuslice doctor` with a quota and simgpu on the library path; `setup` adds the deployment.
fn doctor(setup: impl FnOnce(&mut Command)) -> Run {
    let sim = Sim::new("doctor");
    let mut cmd = sim.command(common::gpuslice_bin());
    cmd.arg("doctor")
        .env("GPUSLICE_MEMORY_LIMIT", "1GiB")
        .env("GPUSLICE_LEDGER", tmp("x.ledger"));
    setup(&mut cmd);
    sim.run_cmd(&mut cmd)
}

fn assert_verdict(run: &Run, active: bool, needle: &str) {
    let code = run.status.code();
    if active {
        assert_eq!(code, Some(0), "doctor should pass\n{}", run.report());
    } else {
        assert_eq!(code, Some(1), "doctor should fail\n{}", run.report());
    }
    assert!(
        run.stdout.contains(needle),
        "doctor should say {needle:?}\n{}",
        run.report()
    );
}

#[test]
fn ld_preload() {
    let run = doctor(|c| {
        c.env("LD_PRELOAD", profile_dir().join("libgpuslice.so"));
    });
    assert_verdict(&run, true, "enforcement: ACTIVE via preloaded library");
    assert!(run.stdout.contains("libgpuslice.so"), "{}", run.report());
    assert!(
        run.stdout.contains("memory quota: 1 GiB"),
        "{}",
        run.report()
    );
}

#[test]
fn etc_ld_so_preload() {
    // /etc/ld.so.preload, as an image would have it: a private mount namespace with an overlay on /etc
    // (needs root, as writing /etc does).
    let upper = tmp("etc-upper");
    let work = tmp("etc-work");
    std::fs::create_dir_all(&upper).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(
        upper.join("ld.so.preload"),
        format!("{}\n", profile_dir().join("libgpuslice.so").display()),
    )
    .unwrap();
    let sim = Sim::new("doctor-etc");
    let mut cmd = sim.command("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t overlay overlay -o lowerdir=/etc,upperdir={},workdir={} /etc && exec \"$0\" doctor",
            upper.display(),
            work.display()
        ))
        .arg(common::gpuslice_bin())
        .env("GPUSLICE_MEMORY_LIMIT", "1GiB")
        .env("GPUSLICE_LEDGER", tmp("etc.ledger"));
    let run = sim.run_cmd(&mut cmd);
    assert!(
        !run.stderr.contains("Operation not permitted") && !run.stderr.contains("unshare failed"),
        "this test needs root (a mount namespace and an overlay on /etc)\n{}",
        run.report()
    );
    assert_verdict(&run, true, "enforcement: ACTIVE via preloaded library");
}

#[test]
fn dropin_on_the_library_path() {
    let simgpu = simgpu_lib_dir();
    let run = doctor(|c| {
        c.env(
            "LD_LIBRARY_PATH",
            format!("{}:{}", common::dropin_dir().display(), simgpu.display()),
        )
        .env("GPUSLICE_REAL_LIBCUDA", simgpu.join("libcuda.so.1"))
        .env("GPUSLICE_REAL_NVML", simgpu.join("libnvidia-ml.so.1"));
    });
    assert_verdict(&run, true, "enforcement: ACTIVE via drop-in libcuda.so.1");
    assert!(
        run.stdout.contains(&format!(
            "real CUDA driver: {}",
            simgpu.join("libcuda.so.1").display()
        )),
        "{}",
        run.report()
    );
}

#[test]
fn preload_and_dropin() {
    let simgpu = simgpu_lib_dir();
    let run = doctor(|c| {
        c.env("LD_LIBRARY_PATH", common::dropin_dir())
            .env("LD_PRELOAD", profile_dir().join("libgpuslice.so"))
            .env("GPUSLICE_REAL_LIBCUDA", simgpu.join("libcuda.so.1"));
    });
    assert_verdict(&run, true, "preloaded library defers to it");
}

#[test]
fn misconfigured() {
    // Nothing preloaded, the real driver first on the path.
    let run = doctor(|_| {});
    assert_verdict(&run, false, "enforcement: NOT ACTIVE");
    assert!(
        run.stdout.contains("is the real driver"),
        "{}",
        run.report()
    );

    // A preload that is not there, and a bad limit.
    let run = doctor(|c| {
        c.env("LD_PRELOAD", "/nonexistent/libgpuslice.so")
            .env("GPUSLICE_MEMORY_LIMIT", "lots");
    });
    assert_verdict(&run, false, "LD_PRELOAD names /nonexistent/libgpuslice.so");
    assert!(
        run.stdout.contains("GPUSLICE_MEMORY_LIMIT"),
        "{}",
        run.report()
    );

    // Preloaded, but the ledger is corrupt.
    let corrupt = tmp("corrupt.ledger");
    std::fs::write(&corrupt, b"not a ledger").unwrap();
    let run = doctor(|c| {
        c.env("LD_PRELOAD", profile_dir().join("libgpuslice.so"))
            .env("GPUSLICE_LEDGER", &corrupt);
    });
    assert_verdict(&run, false, "problem:");
    assert!(run.stdout.contains("corrupt.ledger"), "{}", run.report());

    // Preloaded, but no quota anywhere: transparent.
    let run = doctor(|c| {
        c.env("LD_PRELOAD", profile_dir().join("libgpuslice.so"))
            .env_remove("GPUSLICE_MEMORY_LIMIT")
            .env("GPUSLICE_LEDGER", tmp("none.ledger"));
    });
    assert_verdict(&run, false, "no quota is configured");

    // A drop-in whose real driver is itself.
    let run = doctor(|c| {
        c.env("LD_LIBRARY_PATH", common::dropin_dir()).env(
            "GPUSLICE_REAL_LIBCUDA",
            common::dropin_dir().join("libcuda.so.1"),
        );
    });
    assert_verdict(&run, false, "found no real CUDA driver");
    assert!(
        run.stdout.contains("GPUSLICE_REAL_LIBCUDA"),
        "{}",
        run.report()
    );
}
