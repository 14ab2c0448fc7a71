//! Expands the NVML entry-point table (`src/api/nvml_entry_points.tsv`) into simgpu's exports: every
//! symbol the table lists is exported; unimplemented ones answer NVML_ERROR_NOT_SUPPORTED and log once.

#[path = "../exports.rs"]
mod exports;
#[path = "../../../shim-c/static_unwinder.rs"]
mod static_unwinder;

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    // Like NVIDIA's library, which needs no libgcc_s.so.1: the unwinder (for the exports' panic
    // catching) linked in, so a process's start-up on simgpu loads what it would on a GPU
    // (docs/BENCHMARKS.md, "Start-up without libgcc_s").
    static_unwinder::link();
    let symbols = exports::table("../../../src/api/nvml_entry_points.tsv");
    exports::generate(&symbols, "nvml", "crate::not_supported(\"NAME\")", false);
}
