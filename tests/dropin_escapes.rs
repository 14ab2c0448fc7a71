//! The ways around gpuslice that docs/SECURITY.md lists for `RTLD_DEEPBIND` and `dlopen` of the driver
//! by path, each judged by a real program on simgpu: how many 256 MiB allocations a 1 GiB quota lets
//! through (4 = enforced, 8 = escaped). A program not linked against CUDA (`escape_main.c`) opens
//! either a library linked `-lcuda` with `RTLD_DEEPBIND`, or the driver itself by absolute path.

use gpuslice_testkit as common;

use common::*;
use std::path::{Path, PathBuf};

const CHUNKS: &str = "8";
const ENFORCED: &str = "4";
const ESCAPED: &str = "8";

/// `escape_lib.c` as a shared library linked against the driver, with extra linker `flags`, in a
/// directory of its own.
fn escape_lib(tag: &str, flags: &[&str]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("escape-lib-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    compile_into(&ESCAPE_LIB, &dir.join("libescape.so"), flags)
}

enum Mode {
    Preload,
    DropIn,
}

/// Runs `escape_main args...` with gpuslice deployed as `mode`; returns how many chunks it got.
fn granted(tag: &str, mode: Mode, args: &[&str], extra_lib_dir: Option<&Path>) -> Run {
    let sim = Sim::new(tag).env("SIMGPU_MEMORY", "4GiB");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("escape-ledger-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let simgpu = simgpu_lib_dir();
    let mut path = match mode {
        Mode::Preload => simgpu.display().to_string(),
        Mode::DropIn => format!("{}:{}", common::dropin_dir().display(), simgpu.display()),
    };
    if let Some(d) = extra_lib_dir {
        path = format!("{}:{path}", d.display());
    }
    let mut cmd = sim.command(compile(&ESCAPE_MAIN));
    cmd.args(args)
        .args([CHUNKS, "256"])
        .env("LD_LIBRARY_PATH", path)
        .env("GPUSLICE_MEMORY_LIMIT", "1GiB")
        .env("GPUSLICE_CONTEXT_RESERVE", "0")
        .env("GPUSLICE_LOG", "error")
        .env("GPUSLICE_LEDGER", dir.join("t.ledger"))
        .env("GPUSLICE_DEVICE_DIR", dir.join("devices"));
    match mode {
        Mode::Preload => {
            cmd.env("LD_PRELOAD", profile_dir().join("libgpuslice.so"));
        }
        Mode::DropIn => {
            cmd.env("GPUSLICE_REAL_LIBCUDA", simgpu.join("libcuda.so.1"));
        }
    }
    let run = sim.run_cmd(&mut cmd);
    run.assert_success();
    run
}

/// Preloaded: a library opened with RTLD_DEEPBIND by path has its driver calls bound to the hooks
/// (shim-c/interpose.c), whether it was linked for lazy or immediate binding, with or without RELRO.
#[test]
fn deepbind_by_path_is_enforced_when_preloaded() {
    for (tag, flags) in [
        ("default", &[][..]),
        ("now-relro", &["-Wl,-z,now", "-Wl,-z,relro"][..]),
        ("lazy-norelro", &["-Wl,-z,lazy", "-Wl,-z,norelro"][..]),
    ] {
        let lib = escape_lib(tag, flags);
        let run = granted(
            &format!("deepbind-{tag}"),
            Mode::Preload,
            &["deepbind", lib.to_str().unwrap()],
            None,
        );
        assert_eq!(run.get("granted"), ENFORCED, "{tag}\n{}", run.report());
    }
}

/// Preloaded, RTLD_DEEPBIND of a bare library name: the loader searches with the caller's RUNPATH,
/// so the interposer does not take the call over and the library escapes (listed in SECURITY.md).
#[test]
fn deepbind_by_bare_name_escapes_when_preloaded() {
    let lib = escape_lib("bare", &[]);
    let run = granted(
        "deepbind-bare",
        Mode::Preload,
        &["deepbind", "libescape.so"],
        lib.parent(),
    );
    assert_eq!(run.get("granted"), ESCAPED, "{}", run.report());
}

/// Drop-in: the DEEPBIND library's `libcuda.so.1` is the drop-in itself, so it is enforced.
#[test]
fn deepbind_is_enforced_by_the_dropin() {
    let lib = escape_lib("dropin", &[]);
    for name in [lib.to_str().unwrap(), "libescape.so"] {
        let run = granted(
            "deepbind-dropin",
            Mode::DropIn,
            &["deepbind", name],
            lib.parent(),
        );
        assert_eq!(run.get("granted"), ENFORCED, "{name}\n{}", run.report());
    }
}

/// The driver opened by absolute path: the preloaded library answers the program's dlsym with its
/// hooks; a drop-in alone is never loaded, so the program escapes (listed in SECURITY.md).
#[test]
fn driver_by_path() {
    let real = simgpu_lib_dir().join("libcuda.so.1");
    let run = granted(
        "path-preload",
        Mode::Preload,
        &["path", real.to_str().unwrap()],
        None,
    );
    assert_eq!(run.get("granted"), ENFORCED, "{}", run.report());
    let run = granted(
        "path-dropin",
        Mode::DropIn,
        &["path", real.to_str().unwrap()],
        None,
    );
    assert_eq!(run.get("granted"), ESCAPED, "{}", run.report());
}
