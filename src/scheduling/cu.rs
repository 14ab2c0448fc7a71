//! The driver functions the scheduler calls, reached through the driver layer (never through the
//! hooks), and the small queries built on them: which device a stream belongs to, device UUIDs, and a
//! guard that keeps our event calls from disturbing an application's stream capture.

use crate::driver::calls::real::cuDeviceGetCount;
pub use crate::driver::calls::{capturing, in_context, primary_context_active, RelaxedCapture};
pub use crate::driver::seam::stream_context_stale;
use gpuslice_api::types::{CUcontext, CUdevice, CUstream};
use std::ffi::c_int;

pub use crate::driver::real::{
    cuEventCreate, cuEventElapsedTime, cuEventQuery, cuEventRecord, cuEventRecord_ptsz,
};

/// The context and device ordinal of a launch's stream, cached per thread
/// (`driver::seam::launch_stream_device`: no driver call for a stream seen before).
pub fn stream_device(stream: CUstream) -> Option<(CUcontext, u32)> {
    crate::driver::seam::launch_stream_device(stream as usize)
        .map(|(ctx, ordinal)| (ctx as CUcontext, ordinal))
}

/// How many devices the process sees (0 before `cuInit` or on error).
pub fn device_count() -> u32 {
    let mut n: c_int = 0;
    // SAFETY: valid out-parameter.
    match unsafe { cuDeviceGetCount(&mut n) } {
        Ok(()) => u32::try_from(n).unwrap_or(0),
        Err(_) => 0,
    }
}

/// `GPU-...` for a device ordinal.
pub fn device_uuid(ordinal: u32) -> Option<String> {
    crate::driver::calls::device_uuid(CUdevice::try_from(ordinal).ok()?).ok()
}
