//! gpuslice as a drop-in `libcuda.so.1`: put first on the library path (or in place of the driver's
//! file), it exports everything NVIDIA's libcuda exports, enforces the memory quota like the preloaded
//! libgpuslice.so, and forwards everything else to the real driver (`GPUSLICE_REAL_LIBCUDA` or the
//! standard locations; never itself). See docs/DEPLOYMENT.md.

use gpuslice::driver::{Library, Role};

const LIBRARY: Library = Library::Cuda;
const ROLE: Role = Role::DropinCuda;

/// What a call answers when no real driver was found: CUDA_ERROR_NOT_INITIALIZED.
extern "C" fn no_library() -> c_int {
    3
}

/// What a call answers when the real driver lacks the function: CUDA_ERROR_NOT_FOUND.
extern "C" fn not_found() -> c_int {
    500
}

/// `cuGetErrorName` and `cuGetErrorString` without a real driver: answered from the driver's table
/// of codes, as NVIDIA's driver answers them before (and without) initialisation, so that a
/// program can name the CUDA_ERROR_NOT_INITIALIZED every other call answers.
extern "C" fn error_name(code: u32, text: *mut *const std::ffi::c_char) -> c_int {
    describe(code, text, true)
}

extern "C" fn error_string(code: u32, text: *mut *const std::ffi::c_char) -> c_int {
    describe(code, text, false)
}

fn describe(code: u32, text: *mut *const std::ffi::c_char, name: bool) -> c_int {
    use std::ffi::CString;
    use std::sync::OnceLock;
    static TEXTS: OnceLock<Vec<(u32, CString, CString)>> = OnceLock::new();
    if text.is_null() {
        return 1; // CUDA_ERROR_INVALID_VALUE
    }
    let texts = TEXTS.get_or_init(|| {
        gpuslice_api::result::CUDA_CODES
            .iter()
            .filter_map(|&(code, n, s)| Some((code, CString::new(n).ok()?, CString::new(s).ok()?)))
            .collect()
    });
    let found =
        texts
            .iter()
            .find(|(c, _, _)| *c == code)
            .map(|(_, n, s)| if name { n.as_ptr() } else { s.as_ptr() });
    // SAFETY: a non-NULL out-parameter from the caller, per the API contract.
    unsafe { *text = found.unwrap_or(std::ptr::null()) };
    if found.is_some() {
        0
    } else {
        1 // CUDA_ERROR_INVALID_VALUE, as the driver answers for a code it does not define
    }
}

/// Every driver API function returns a CUresult.
fn stand_in(name: &CStr, library_found: bool) -> *const c_void {
    match name.to_bytes() {
        b"cuGetErrorName" if !library_found => error_name as *const c_void,
        b"cuGetErrorString" if !library_found => error_string as *const c_void,
        _ if library_found => not_found as *const c_void,
        _ => no_library as *const c_void,
    }
}

include!("../../dropin-common.rs");
