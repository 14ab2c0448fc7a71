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

/// Every driver API function returns a CUresult.
fn stand_in(_name: &CStr, library_found: bool) -> *const c_void {
    if library_found {
        not_found as *const c_void
    } else {
        no_library as *const c_void
    }
}

include!("../../dropin-common.rs");
