//! The README's main command, `scripts/demo` / `gpuslice demo`, on simgpu: it works as the very first
//! command of a fresh clone (an empty target directory), one tenant is stopped at its quota, the
//! compute shares show, and it leaves nothing behind, also when interrupted.

use gpuslice_testkit as common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Entries of /dev/shm whose name mentions `pid` (the demo names its directory after its pid).
fn shm_leftovers(pid: u32) -> Vec<PathBuf> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().contains(&format!("-{pid}")))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn demo_command(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("GPUSLICE_SIMGPU", common::simgpu_lib_dir())
        .env("GPUSLICE_DEMO_SIMGPU", "1")
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("SIMGPU_") || (k.starts_with("GPUSLICE_") && k != "GPUSLICE_SIMGPU") {
            cmd.env_remove(k.as_ref());
        }
    }
    cmd
}

/// What every demo run prints: the memory table (alpha stopped at its quota, beta served in full),
/// the refusal's log line, and the compute table (the 70% tenant ahead of the 30% one; the precise
/// split is a benchmark figure, scripts/bench.sh, not a pass/fail threshold here).
fn check_demo_output(text: &str, report: &str) {
    let line = |tenant: &str, what: &str| {
        text.lines()
            .find(|l| l.starts_with(tenant) && l.contains(what))
            .unwrap_or_else(|| panic!("no `{tenant} .. {what}` line\n{report}"))
            .to_owned()
    };
    assert!(
        line("alpha", "2 GiB").contains("stopped at its quota: CUDA_ERROR_OUT_OF_MEMORY"),
        "{report}"
    );
    assert!(
        line("beta", "3 GiB").contains("got all it asked for"),
        "{report}"
    );
    assert!(
        text.contains("gpuslice: warn: tenant alpha: cuMemAlloc of 256 MiB"),
        "{report}"
    );
    // Compute: "alpha      30%    0.87 s (30.7%)".
    let got = |tenant: &str| -> f64 {
        let l = line(tenant, "%)");
        let pct = l.rsplit('(').next().unwrap().trim_end_matches("%)").trim();
        pct.parse().unwrap_or_else(|_| panic!("share in {l:?}"))
    };
    let (a, b) = (got("alpha"), got("beta"));
    assert!(b > a, "shares 30/70 gave {a}/{b}\n{report}");
}

#[test]
fn demo_runs_on_simgpu_and_leaves_nothing_behind() {
    let child = demo_command(&common::gpuslice_bin())
        .arg("demo")
        .spawn()
        .expect("gpuslice demo starts");
    let pid = child.id();
    let out = child.wait_with_output().expect("gpuslice demo runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let report = format!(
        "{text}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{report}");
    check_demo_output(&text, &report);
    assert_eq!(shm_leftovers(pid), Vec::<PathBuf>::new(), "{report}");
}

#[test]
fn interrupted_demo_leaves_nothing_behind() {
    use std::os::unix::process::CommandExt;
    // Its own process group, as a shell gives a foreground job: Ctrl-C reaches the demo and its
    // workloads alike.
    let child = demo_command(&common::gpuslice_bin())
        .arg("demo")
        .process_group(0)
        .spawn()
        .expect("gpuslice demo starts");
    let pid = child.id();
    let scratch = PathBuf::from(format!("/dev/shm/gpuslice-demo-{pid}"));
    // Interrupt once the simulated GPU exists (its state file is the last thing a run would leave).
    let deadline = Instant::now() + Duration::from_secs(60);
    while !scratch.join("simgpu-state").exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        scratch.exists(),
        "the demo never created {}",
        scratch.display()
    );
    // SAFETY: kill(2) on the child's process group, which this test created.
    assert_eq!(unsafe { libc::kill(-(pid as i32), libc::SIGINT) }, 0);
    let out = child.wait_with_output().expect("gpuslice demo ends");
    let report = format!(
        "{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "interrupted, yet exit 0\n{report}");
    assert_eq!(shm_leftovers(pid), Vec::<PathBuf>::new(), "{report}");
}

/// `scripts/demo` as the first command of a fresh clone: an empty target directory, nothing built.
#[test]
fn demo_script_works_from_an_empty_target_directory() {
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("demo-fresh-target");
    let _ = std::fs::remove_dir_all(&target);
    let mut cmd = demo_command(&common::root().join("scripts/demo"));
    cmd.env_remove("GPUSLICE_SIMGPU")
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(common::root());
    let out = cmd.output().expect("scripts/demo runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let report = format!(
        "{text}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&target);
    assert!(out.status.success(), "{report}");
    check_demo_output(&text, &report);
}
