// Shared by the drop-in libraries' `lib.rs` (shim-c/dropin-cuda, shim-c/dropin-nvml), which `include!`
// it after defining LIBRARY, ROLE and `stand_in(name, library_found)` (what a call answers when the
// real library, or the function in it, is missing).
//
// The library exports every name of its API table: hooked entry points are the Rust hooks of the
// gpuslice rlib (exported by their `#[no_mangle]` names), every other function is a trampoline
// generated from the table (`trampolines.S`, see shim-c/dropin-build.rs) that jumps to the real
// function, resolved on its first call by `gpuslice_dropin_resolve`.

use gpuslice::driver;
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};

include!(concat!(env!("OUT_DIR"), "/names.rs"));

// Re-exported so the gpuslice rlib's `#[no_mangle]` hooks are linked into this library.
pub use gpuslice::hooks;

/// Which library this is (1 = libcuda, 2 = libnvidia-ml): found by `gpuslice doctor` with dlsym.
#[no_mangle]
pub static gpuslice_dropin_library: u32 = ROLE as u32;

/// Tells the gpuslice code linked in here that it is a drop-in library (it then never accepts
/// another gpuslice library as its driver). A constructor: it runs when the library is loaded,
/// before any of its exports can be called.
extern "C" fn init() {
    driver::set_role(ROLE);
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// The address of the real function behind trampoline `index` (which stores it in its slot), or a
/// stand-in answering an error when the real library or the function is not there. Called from the
/// trampolines' common resolver with the caller's argument registers saved.
#[no_mangle]
pub extern "C" fn gpuslice_dropin_resolve(index: u32) -> *const c_void {
    std::panic::catch_unwind(|| resolve(index as usize)).unwrap_or_else(|_| {
        let name = NAMES.get(index as usize).copied().unwrap_or(c"");
        stand_in(name, false)
    })
}

fn resolve(index: usize) -> *const c_void {
    // Reads the configuration once (log level, errors worth reporting) before anything is logged.
    let _ = gpuslice::accounting::mode();
    let name = NAMES.get(index).copied().unwrap_or(c"");
    let handle = driver::library_handle(LIBRARY);
    if handle.is_null() {
        return stand_in(name, false);
    }
    let f = driver::real_dlsym(handle, name);
    if f.is_null() {
        static WARNED: AtomicBool = AtomicBool::new(false);
        if !WARNED.swap(true, Ordering::Relaxed) {
            gpuslice::log::warn(format_args!(
                "the real library has no {} (and maybe other functions this one exports); calls to them \
                 fail",
                name.to_string_lossy()
            ));
        }
        return stand_in(name, true);
    }
    f
}
