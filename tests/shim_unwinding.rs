//! The unwinder linked into gpuslice's libraries (shim-c/static_unwinder.rs): they load
//! without `libgcc_s.so.1` (start-up, docs/BENCHMARKS.md), a panic inside a hook is still caught at
//! the C ABI, and a C++ program's exceptions (libstdc++ unwinds with `libgcc_s`) still work beside
//! it, in every deployment (preloaded, drop-in, both).

use gpuslice_testkit as common;

use common::memory::Deploy;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// simgpu's device memory in these tests.
const MEMORY: u64 = GIB;

/// `readelf -d`'s NEEDED entries of `lib`.
fn needed(lib: &Path) -> Vec<String> {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(lib)
        .output()
        .expect("run readelf (binutils)");
    assert!(out.status.success(), "readelf -d {}", lib.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| Some(l.split_once('[')?.1.trim_end_matches(']').to_owned()))
        .collect()
}

#[test]
fn the_libraries_load_without_libgcc_s() {
    let dropins = dropin_dir();
    let simgpu = simgpu_lib_dir();
    // simgpu's too: NVIDIA's libcuda.so.1 and libnvidia-ml.so.1 need no libgcc_s, so a process on
    // simgpu must not get it from simgpu (a start-up benchmark would not see gpuslice's own).
    for lib in [
        libgpuslice(),
        dropins.join("libcuda.so.1"),
        dropins.join("libnvidia-ml.so.1"),
        simgpu.join("libcuda.so.1"),
        simgpu.join("libnvidia-ml.so.1"),
    ] {
        let needed = needed(&lib);
        assert!(
            needed.iter().any(|n| n.starts_with("libc.so")),
            "{}: readelf found no NEEDED entries: {needed:?}",
            lib.display()
        );
        assert!(
            !needed.iter().any(|n| n.starts_with("libgcc_s")),
            "{} needs {needed:?}: libgcc_eh.a was not linked in (shim-c/static_unwinder.rs)",
            lib.display()
        );
    }
}

/// tests/clients/unwinding.cpp, built with the C++ compiler once per test process.
fn unwinding_client() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = tmp_dir().join("clients");
            std::fs::create_dir_all(&dir).unwrap();
            let out = dir.join("unwinding");
            // A private name, then renamed: several test binaries may build it at once.
            let tmp = dir.join(format!(".unwinding.{}", std::process::id()));
            let o = Command::new(std::env::var_os("CXX").unwrap_or_else(|| "c++".into()))
                .args(["-O1", "-g", "-Wall", "-Wextra", "-Werror", "-I"])
                .arg(nvidia_include("cu12"))
                .arg(client_source("unwinding.cpp"))
                .arg("-o")
                .arg(&tmp)
                .arg("-L")
                .arg(simgpu_lib_dir())
                .arg("-lcuda")
                .output()
                .expect("run c++");
            assert!(
                o.status.success(),
                "compiling unwinding.cpp failed:\n{}",
                String::from_utf8_lossy(&o.stderr)
            );
            std::fs::rename(&tmp, &out).unwrap();
            out
        })
        .clone()
}

/// The client run with `args`, gpuslice deployed as `deploy` (None: simgpu alone).
fn run(deploy: Option<Deploy>, args: &[&str]) -> Run {
    let sim = Sim::new("unwinding").env("SIMGPU_MEMORY", "1GiB");
    let dir = scratch_dir("unwinding", "run");
    let mut cmd = match deploy {
        Some(d) => common::memory::tenant_command(unwinding_client(), &sim, d, &dir, "t", args),
        None => {
            let mut cmd = sim.command(unwinding_client());
            cmd.args(args);
            cmd
        }
    };
    let run = sim.run_cmd(&mut cmd);
    let _ = std::fs::remove_dir_all(&dir);
    run
}

/// Three exceptions caught, 15 destructors that each called the driver while one unwound, and the
/// driver answering after it all.
fn assert_exceptions_worked(run: &Run, what: &str) {
    run.assert_success();
    assert_eq!(
        run.get("caught"),
        "3",
        "{what}: exceptions\n{}",
        run.report()
    );
    assert_eq!(
        run.get("destructor_calls"),
        "15",
        "{what}: driver calls from destructors while an exception unwound\n{}",
        run.report()
    );
    assert_eq!(run.get("after_rc"), "0", "{what}\n{}", run.report());
}

#[test]
fn cxx_exceptions_unwind_across_frames_beside_gpuslice() {
    let control = run(None, &[]);
    assert_exceptions_worked(&control, "without gpuslice");
    assert_eq!(control.get_u64("total"), MEMORY, "{}", control.report());
    for deploy in [Deploy::Preload, Deploy::Dropin, Deploy::Mixed] {
        let run = run(Some(deploy), &[]);
        let what = format!("{deploy:?}");
        assert_exceptions_worked(&run, &what);
        assert_eq!(
            run.get_u64("total"),
            GIB,
            "{what}: the quota is the card\n{}",
            run.report()
        );
    }
}

/// The debug library's test-only panic device (src/hooks/info.rs, `PANIC_DEVICE`), asked from a
/// destructor while a C++ exception unwinds: the hook's panic is caught by gpuslice's own unwinder and
/// answered `CUDA_ERROR_UNKNOWN` (999); the C++ exception still reaches its handler, and every later
/// call and exception works. Without gpuslice the driver answers `CUDA_ERROR_INVALID_DEVICE` (101).
#[test]
#[cfg_attr(
    not(debug_assertions),
    ignore = "the panic device is compiled into debug builds only"
)]
fn a_panic_in_a_hook_is_caught_at_the_c_abi_while_a_cxx_exception_unwinds() {
    let control = run(None, &["panic"]);
    assert_exceptions_worked(&control, "without gpuslice");
    assert_eq!(control.get("panic_rc"), "101", "{}", control.report());
    for deploy in [Deploy::Preload, Deploy::Dropin, Deploy::Mixed] {
        let run = run(Some(deploy), &["panic"]);
        let what = format!("{deploy:?}");
        assert_exceptions_worked(&run, &what);
        assert_eq!(
            run.get("panic_rc"),
            "999",
            "{what}: the panic answered CUDA_ERROR_UNKNOWN\n{}",
            run.report()
        );
        assert!(
            run.stderr.contains("internal error (panic) in a hook")
                && run.stderr.contains("the test-only panic device"),
            "{what}: the panic and gpuslice's line about it on stderr\n{}",
            run.report()
        );
    }
}
