//! What a bad setting does is what its message says (docs/CONFIGURATION.md, "Bad values"): a bad
//! compute setting applies the strictest share *and* cap it announces; settings that refuse nothing
//! (priority, log level) say that allocations are not affected, and they are not. Real clients on
//! simgpu with the shim preloaded; the judge is simgpu's busy counter.

use gpuslice_testkit as common;

use common::libgpuslice as shim;
use common::*;
use std::path::PathBuf;

fn private_dir(tag: &str) -> PathBuf {
    scratch_dir("config-effects", tag)
}

/// `GPUSLICE_COMPUTE_SHARE=0` is out of range (1..100): the process runs at share 1% and cap 1%,
/// as its error line says, so alone on the GPU it keeps it busy a small fraction of the time
/// (without the cap it would keep it busy nearly all the time).
#[test]
fn compute_share_zero_applies_the_strictest_setting_it_announces() {
    let sim = Sim::new("share0");
    let dir = private_dir("share0");
    let (run, frac) = spin_alone(&sim, &dir, &[("GPUSLICE_COMPUTE_SHARE", "0")], 3000);
    println!("share 0: {:.1}% busy", frac * 100.0);
    assert!(
        run.stderr
            .contains("GPUSLICE_COMPUTE_SHARE=\"0\": out of range")
            && run.stderr.contains("compute share 1% and cap 1%"),
        "{}",
        run.report()
    );
    assert!(!run.stderr.contains("are refused"), "{}", run.report());
    // Generous: a cap of 1% gives a few percent at most; no cap gives nearly 100%.
    assert!(
        frac < 0.25,
        "{:.1}% busy: the cap was not applied",
        frac * 100.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bad priority or log level refuses nothing, and its message says so.
#[test]
fn settings_that_refuse_nothing_say_what_happens() {
    let sim = Sim::new("harmless");
    let dir = private_dir("harmless");
    for (var, value, effect) in [
        (
            "GPUSLICE_PRIORITY",
            "urgent",
            "compute priority normal; allocations are not affected",
        ),
        (
            "GPUSLICE_LOG",
            "loud",
            "logging at warn; allocations are not affected",
        ),
    ] {
        let mut cmd = sim.command(compile(&ROBUST));
        cmd.env("LD_PRELOAD", shim())
            .env("GPUSLICE_LEDGER", dir.join(format!("{value}.ledger")))
            .env("GPUSLICE_DEVICE_DIR", dir.join("devices"))
            .env("GPUSLICE_MEMORY_LIMIT", "1GiB")
            .env("GPUSLICE_CONTEXT_RESERVE", "0")
            .env(var, value)
            .arg("cmd");
        let run = feed(sim.spawn(&mut cmd), "alloc 64\nexit\n", var);
        assert_eq!(run.get("alloc"), "0", "{}", run.report());
        let line = format!("{var}={value:?}");
        let logged = run
            .stderr
            .lines()
            .find(|l| l.contains(&line))
            .unwrap_or_else(|| panic!("no line about {line}:\n{}", run.report()));
        assert!(logged.ends_with(effect), "{logged}");
        assert!(!run.stderr.contains("refused"), "{}", run.report());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A limit list that names no device the process can see (`7=1GiB` on a one-GPU machine, a UUID
/// of another machine's GPU) refuses every allocation, and an error line names the variable, its
/// value, the keys and the devices that are visible; each refusal says why.
#[test]
fn a_limit_list_naming_no_visible_device_says_so() {
    let sim = Sim::new("nomatch");
    let dir = private_dir("nomatch");
    for (i, value) in ["7=1GiB", "GPU-99999999-0000-1111-2222-333344445555=1GiB"]
        .into_iter()
        .enumerate()
    {
        let mut cmd = sim.command(compile(&ROBUST));
        cmd.env("LD_PRELOAD", shim())
            .env("GPUSLICE_LEDGER", dir.join(format!("{i}.ledger")))
            .env("GPUSLICE_DEVICE_DIR", dir.join("devices"))
            .env("GPUSLICE_MEMORY_LIMIT", value)
            .env("GPUSLICE_CONTEXT_RESERVE", "0")
            .arg("cmd");
        let run = feed(sim.spawn(&mut cmd), "alloc 64\nexit\n", value);
        assert_eq!(
            run.get("alloc"),
            "2",
            "CUDA_ERROR_OUT_OF_MEMORY\n{}",
            run.report()
        );
        let said = format!("GPUSLICE_MEMORY_LIMIT={value:?}: the memory limit lists devices");
        let errors: Vec<&str> = run
            .stderr
            .lines()
            .filter(|l| l.contains("error") && l.contains(&said))
            .collect();
        assert_eq!(errors.len(), 1, "one error line:\n{}", run.report());
        assert!(
            errors[0].contains("none of them is visible") && errors[0].contains("visible: 0=GPU-"),
            "{}",
            run.report()
        );
        assert!(
            run.stderr
                .lines()
                .any(|l| l.contains("cuMemAlloc of 64 MiB") && l.contains(&said)),
            "the refusal says why:\n{}",
            run.report()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Aliases are read from the real environment as from the loader's tests: HAMi's per-device
/// `CUDA_DEVICE_MEMORY_LIMIT_<i>` (probed only when a variable has that prefix) limits device 0, and
/// a `GPUSLICE_*` variable that is set wins over its alias, with a line saying which was ignored.
#[test]
fn aliases_from_the_real_environment() {
    let sim = Sim::new("aliases");
    let dir = private_dir("aliases");
    for (extra, limited) in [
        (None, true),
        (Some(("GPUSLICE_MEMORY_LIMIT", "1GiB")), false),
    ] {
        let mut cmd = sim.command(compile(&ROBUST));
        cmd.env("LD_PRELOAD", shim())
            .env("GPUSLICE_LEDGER", dir.join(format!("{limited}.ledger")))
            .env("GPUSLICE_DEVICE_DIR", dir.join("devices"))
            .env("GPUSLICE_CONTEXT_RESERVE", "0")
            .env("GPUSLICE_LOG", "info")
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "64m")
            .arg("cmd");
        if let Some((var, value)) = extra {
            cmd.env(var, value);
        }
        let run = feed(sim.spawn(&mut cmd), "alloc 32\nalloc 48\nexit\n", "aliases");
        let allocs: Vec<&str> = run
            .stdout
            .lines()
            .filter_map(|l| l.strip_prefix("alloc="))
            .collect();
        // 2 = CUDA_ERROR_OUT_OF_MEMORY: 32 + 48 MiB is over the alias's 64 MiB.
        let want = if limited { ["0", "2"] } else { ["0", "0"] };
        assert_eq!(allocs, want, "{}", run.report());
        let note = if limited {
            "CUDA_DEVICE_MEMORY_LIMIT_0=\"64m\" read as the memory limit 64 MiB for device 0"
        } else {
            "GPUSLICE_MEMORY_LIMIT is set: ignoring CUDA_DEVICE_MEMORY_LIMIT_*"
        };
        assert!(run.stderr.contains(note), "{}", run.report());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
