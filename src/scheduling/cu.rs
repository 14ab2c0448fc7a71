//! The driver functions the scheduler calls, reached through the driver layer (never through the
//! hooks), and the small queries built on them: which device a stream belongs to, device UUIDs, and a
//! guard that keeps our event calls from disturbing an application's stream capture.

use crate::driver::calls::real::cuDeviceGetCount;
pub use crate::driver::calls::{
    capturing, in_context, primary_context_active, stream_device, RelaxedCapture,
};
use gpuslice_api::types::CUdevice;
use std::ffi::c_int;

pub use crate::driver::real::{
    cuEventCreate, cuEventElapsedTime, cuEventQuery, cuEventRecord, cuEventRecord_ptsz,
};

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
