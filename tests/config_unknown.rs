//! A `GPUSLICE_*` variable gpuslice does not know is named on stderr, once, with the closest known
//! setting (docs/CONFIGURATION.md, "Unknown variables"). A near miss of a limit that is not set
//! otherwise fails closed exactly as that limit's bad value does: `GPUSLICE_COMPUTE_CAP=30` caps the
//! tenant at 1% (as `GPUSLICE_COMPUTE_LIMIT=banana` would), a mistyped memory limit refuses
//! allocations. Real clients on simgpu with the shim preloaded; the judges are simgpu's busy counter
//! and the driver's return codes.

use gpuslice_testkit as common;

use common::libgpuslice as shim;
use common::*;
use std::path::PathBuf;

fn private_dir(tag: &str) -> PathBuf {
    scratch_dir("config-unknown", tag)
}

/// The log lines of `stderr` about `var` (`gpuslice: <level>: VAR="..."...`; a refused call's line
/// quotes the reason after its own words): exactly one is expected.
fn lines_naming<'a>(stderr: &'a str, var: &str) -> Vec<&'a str> {
    let quoted = format!("{var}=");
    let about = |l: &str| {
        let rest = l
            .strip_prefix("gpuslice: ")
            .and_then(|r| r.split_once(": "));
        rest.is_some_and(|(_, r)| r.starts_with(&quoted))
    };
    stderr.lines().filter(|l| about(l)).collect()
}

/// `GPUSLICE_COMPUTE_CAP=30` (the setting is `GPUSLICE_COMPUTE_LIMIT`): one error line names the
/// variable and the setting meant, and the tenant, alone on the GPU, is held to the strictest cap
/// a bad `GPUSLICE_COMPUTE_LIMIT` gets (1%) instead of running uncapped (nearly 100% busy).
#[test]
fn a_mistyped_compute_cap_is_named_and_enforced_as_a_bad_cap() {
    let sim = Sim::new("cap-typo");
    let dir = private_dir("cap");
    let (run, frac) = spin_alone(&sim, &dir, &[("GPUSLICE_COMPUTE_CAP", "30")], 2000);
    println!("GPUSLICE_COMPUTE_CAP=30: {:.1}% busy", frac * 100.0);
    // Generous: a cap of 1% gives a few percent at most; no cap gives nearly 100%.
    assert!(
        frac < 0.25,
        "{:.1}% busy: the cap was not applied",
        frac * 100.0
    );
    let named = lines_naming(&run.stderr, "GPUSLICE_COMPUTE_CAP");
    assert_eq!(named.len(), 1, "one line:\n{}", run.report());
    assert!(
        named[0].starts_with("gpuslice: error: GPUSLICE_COMPUTE_CAP=\"30\": unknown variable (did you mean GPUSLICE_COMPUTE_LIMIT?)")
            && named[0].ends_with("compute share 1% and cap 1% on the devices it concerns (strictest); allocations are not affected"),
        "{}",
        named[0]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Extra variables, the alloc's result (0 success, 2 `CUDA_ERROR_OUT_OF_MEMORY`), how the line about
/// the first variable starts and how it ends.
type Case = (
    &'static [(&'static str, &'static str)],
    &'static str,
    &'static str,
    &'static str,
);

/// A mistyped memory limit (in upper or lower case) refuses allocations as
/// `GPUSLICE_MEMORY_LIMIT=banana` does, with one error line naming the variable and
/// `GPUSLICE_MEMORY_LIMIT`; beside the real setting it only warns and the
/// real limit holds; the near miss of a setting that limits nothing (`GPUSLICE_LOGG`) warns and
/// refuses nothing.
#[test]
fn a_mistyped_memory_limit_refuses_allocations_and_other_typos_warn() {
    let sim = Sim::new("memory-typo");
    let dir = private_dir("memory");
    let cases: [Case; 5] = [
        (
            &[("GPUSLICE_MEMORY_LIMT", "1GiB")],
            "2",
            "gpuslice: error: GPUSLICE_MEMORY_LIMT=\"1GiB\": unknown variable (did you mean GPUSLICE_MEMORY_LIMIT?)",
            "allocations on the devices it concerns are refused",
        ),
        (
            &[("gpuslice_memory_limit", "1GiB")],
            "2",
            "gpuslice: error: gpuslice_memory_limit=\"1GiB\": unknown variable (did you mean GPUSLICE_MEMORY_LIMIT?)",
            "allocations on the devices it concerns are refused",
        ),
        (
            &[("GPUSLICE_MEMORY_LIMIT", "banana")],
            "2",
            "gpuslice: error: GPUSLICE_MEMORY_LIMIT=\"banana\"",
            "allocations on the devices it concerns are refused",
        ),
        (
            &[("GPUSLICE_MEMORY_LIMIT", "1GiB"), ("GPUSLICE_MEMORY_LIMT", "2GiB")],
            "0",
            "gpuslice: warn: GPUSLICE_MEMORY_LIMT=\"2GiB\": unknown variable (did you mean GPUSLICE_MEMORY_LIMIT?)",
            "ignored: the memory limit is set (GPUSLICE_MEMORY_LIMIT=\"1GiB\")",
        ),
        (
            &[("GPUSLICE_MEMORY_LIMIT", "1GiB"), ("GPUSLICE_LOGG", "debug")],
            "0",
            "gpuslice: warn: GPUSLICE_LOGG=\"debug\": unknown variable (did you mean GPUSLICE_LOG?)",
            "ignored",
        ),
    ];
    for (i, (vars, alloc, starts, ends)) in cases.into_iter().enumerate() {
        let mut cmd = sim.command(compile(&ROBUST));
        cmd.env("LD_PRELOAD", shim())
            .env("GPUSLICE_LEDGER", dir.join(format!("{i}.ledger")))
            .env("GPUSLICE_DEVICE_DIR", dir.join("devices"))
            .env("GPUSLICE_CONTEXT_RESERVE", "0")
            .env("UNRELATED_SETTING", "1")
            .arg("cmd");
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let run = feed(sim.spawn(&mut cmd), "alloc 64\nexit\n", starts);
        assert_eq!(run.get("alloc"), alloc, "{}", run.report());
        let var = starts
            .split(": ")
            .nth(2)
            .unwrap()
            .split('=')
            .next()
            .unwrap();
        let named = lines_naming(&run.stderr, var);
        assert_eq!(named.len(), 1, "one line about {var}:\n{}", run.report());
        assert!(
            named[0].starts_with(starts) && named[0].ends_with(ends),
            "{}",
            named[0]
        );
        assert!(
            !run.stderr.contains("UNRELATED_SETTING"),
            "{}",
            run.report()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
