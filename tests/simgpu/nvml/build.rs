//! Expands the NVML entry-point table (`src/api/nvml_entry_points.tsv`) into simgpu's exports: every
//! symbol the table lists is exported; unimplemented ones answer NVML_ERROR_NOT_SUPPORTED and log once.

#[path = "../exports.rs"]
mod exports;

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    let symbols = exports::table("../../../src/api/nvml_entry_points.tsv");
    exports::generate(&symbols, "nvml", "crate::not_supported(\"NAME\")", false);
}
