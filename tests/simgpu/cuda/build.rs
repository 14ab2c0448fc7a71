//! Expands the driver entry-point table (`src/api/driver_entry_points.tsv`) into simgpu's exports:
//! every symbol the table lists is exported, so a client finds exactly the names a real driver has.
//! Unimplemented ones answer CUDA_ERROR_NOT_SUPPORTED and log once. The generated `exports.rs` also
//! holds the name -> address table that cuGetProcAddress uses.

#[path = "../exports.rs"]
mod exports;

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    // As NVIDIA links libcuda.so.1 (DT_SYMBOLIC): the library's own references, such as the addresses
    // cuGetProcAddress hands out, bind to its own functions, never to a preloaded library's.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    let symbols = exports::table("../../../src/api/driver_entry_points.tsv");
    exports::generate(&symbols, "cu", "crate::not_supported(\"NAME\")", true);
}
