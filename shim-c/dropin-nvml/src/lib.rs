//! gpuslice as a drop-in `libnvidia-ml.so.1`: exports everything NVIDIA's NVML exports, shows the
//! tenant's quota as the memory total (like the preloaded libgpuslice.so), and forwards everything else
//! to the real library (`GPUSLICE_REAL_NVML` or the standard locations; never itself).

use gpuslice::driver::{Library, Role};

const LIBRARY: Library = Library::Nvml;
const ROLE: Role = Role::DropinNvml;

/// What a call answers when no real NVML was found: NVML_ERROR_LIBRARY_NOT_FOUND.
extern "C" fn no_library() -> c_int {
    12
}

/// What a call answers when the real NVML lacks the function: NVML_ERROR_FUNCTION_NOT_FOUND.
extern "C" fn not_found() -> c_int {
    13
}

/// `nvmlErrorString` returns a string, not an nvmlReturn_t.
extern "C" fn error_string_stand_in() -> *const std::ffi::c_char {
    c"Unknown Error (gpuslice: the real NVML library or its nvmlErrorString is missing)".as_ptr()
}

fn stand_in(name: &CStr, library_found: bool) -> *const c_void {
    if name.to_bytes() == b"nvmlErrorString" {
        error_string_stand_in as *const c_void
    } else if library_found {
        not_found as *const c_void
    } else {
        no_library as *const c_void
    }
}

include!("../../dropin-common.rs");
