//! Expands the driver entry-point table (`src/api/driver_entry_points.tsv`) into simgpu's exports:
//! every symbol the table lists is exported, so a client finds exactly the names a real driver has.
//! Unimplemented ones answer CUDA_ERROR_NOT_SUPPORTED and log once. The generated `exports.rs` also
//! holds the name -> address table that cuGetProcAddress uses.

#[path = "../exports.rs"]
mod exports;
#[path = "../../../shim-c/static_unwinder.rs"]
mod static_unwinder;

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    // Like NVIDIA's library, which needs no libgcc_s.so.1: the unwinder (for the exports' panic
    // catching) linked in, so a process's start-up on simgpu loads what it would on a GPU
    // (docs/BENCHMARKS.md, "Start-up without libgcc_s").
    static_unwinder::link();
    // As NVIDIA links libcuda.so.1 (DT_SYMBOLIC): the library's own references, such as the addresses
    // cuGetProcAddress hands out, bind to its own functions, never to a preloaded library's.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    let symbols = exports::table("../../../src/api/driver_entry_points.tsv");
    exports::generate(&symbols, "cu", "crate::not_supported(\"NAME\")", true);
}
