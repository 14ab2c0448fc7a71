//! The README's main command, `gpuslice demo`, on simgpu: it runs, one tenant is stopped at its quota,
//! and the compute shares show.

mod common;

use std::process::Command;

#[test]
fn demo_runs_on_simgpu() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .arg("demo")
        .env("GPUSLICE_SIMGPU", common::simgpu_lib_dir())
        .env("GPUSLICE_DEMO_SIMGPU", "1")
        .env_remove("LD_PRELOAD")
        .output()
        .expect("gpuslice demo runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let report = format!(
        "{text}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{report}");
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
    assert!(
        (a - 30.0).abs() <= 5.0 && (b - 70.0).abs() <= 5.0,
        "shares {a}/{b}\n{report}"
    );
}
