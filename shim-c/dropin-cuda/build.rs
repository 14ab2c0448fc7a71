//! Expands the API table into this drop-in library's trampolines and export list (shim-c/dropin-build.rs).

include!("../dropin-build.rs");

fn main() {
    generate("src/api/driver_entry_points.tsv");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
