//! Shared by the build scripts of the libraries loaded into CUDA programs (build.rs: libgpuslice.so,
//! and through its rlib the drop-ins) and of simgpu's driver libraries (tests/simgpu/cuda,
//! tests/simgpu/nvml, which NVIDIA's libcuda.so.1 and libnvidia-ml.so.1 stand for: those need no
//! `libgcc_s.so.1` either), each of which includes it with `#[path]`.

/// The unwinder linked into the library, not loaded beside it (start-up time, docs/BENCHMARKS.md,
/// "Start-up without libgcc_s"). Every export catches panics (`catch_unwind`), which needs an
/// unwinder; std asks for the shared `libgcc_s.so.1`, one more library that every CUDA process would
/// search for, map and relocate (about 0.1 ms of start-up measured alone). GNU toolchains ship the
/// same unwinder as an archive, `libgcc_eh.a`; linked whole ahead of std's `-lgcc_s` it defines every
/// `_Unwind_*` std refers to, and rustc's `--as-needed` then leaves `libgcc_s` out of the library's
/// NEEDED. The process then holds two unwinders when something else loads `libgcc_s` (a C++
/// program): the archive's symbols are hidden (and the version script keeps everything but the
/// exports local), so only the library's own code calls its copy, and a panic never leaves the
/// library (caught at every export) for the other unwinder to see; each finds any object's frames
/// through `dl_iterate_phdr`, so both unwind through each other's frames. This is what the glibc 2.28
/// release build (`cargo zigbuild`) already does: zig links its own libunwind statically.
///
/// Skipped where it would not be the GNU linker driver that links: a `zig cc` linker (it finds the
/// system's `libgcc_eh.a` when asked, but links its own unwinder), a target other than Linux + glibc,
/// or a compiler that does not know the archive (`-print-file-name` answers the bare name).
/// From a library crate's build script the directive applies to whatever links its rlib too (the
/// drop-ins, `gpuslice-probe`, test programs), so each of those carries its own unwinder instead of
/// needing `libgcc_s`.
pub fn link() {
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    if env("CARGO_CFG_TARGET_OS") != "linux" || env("CARGO_CFG_TARGET_ENV") != "gnu" {
        return;
    }
    // The linker rustc runs (`cc` unless configured): cargo-zigbuild configures a `zigcc-*` script.
    let linker = std::env::var("RUSTC_LINKER").unwrap_or_else(|_| "cc".to_owned());
    let linker_name = std::path::Path::new(&linker)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if linker_name.contains("zig") {
        return;
    }
    let Ok(out) = std::process::Command::new(&linker)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
    else {
        return;
    };
    let archive = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let Some(dir) = archive
        .parent()
        .filter(|_| archive.is_absolute() && archive.is_file())
    else {
        return;
    };
    println!("cargo:rustc-link-search=native={}", dir.display());
    // Whole: nothing in Rust names the archive's members, and each must be there before `-lgcc_s`
    // is reached. Not bundled into the rlib: named at the final link, where it precedes std's libraries.
    println!("cargo:rustc-link-lib=static:+whole-archive,-bundle=gcc_eh");
}
