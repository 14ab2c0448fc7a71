//! The driver layer's calls, as the hooks and the scheduler reach them, and the real functions the
//! compute-share scheduler calls.

use super::real_calls;
pub use crate::driver::calls::*;
use gpuslice_api::types::CUstream;
use gpuslice_api::{CUerror, CUresult};
use std::ffi::c_uint;

/// Driver functions the compute-share scheduler calls (events and stream-capture queries).
pub mod sched {
    use super::*;
    use gpuslice_api::types::CUevent;
    real_calls! {
        ret = CUresult, missing = Err(CUerror::NOT_INITIALIZED);
        fn cuEventCreate(event: *mut CUevent, flags: c_uint);
        fn cuEventDestroy_v2(event: CUevent);
        fn cuEventQuery(event: CUevent);
        fn cuEventRecord(event: CUevent, stream: CUstream);
        fn cuEventRecord_ptsz(event: CUevent, stream: CUstream);
        fn cuEventSynchronize(event: CUevent);
        fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent);
        fn cuStreamIsCapturing(stream: CUstream, status: *mut c_uint);
        fn cuStreamIsCapturing_ptsz(stream: CUstream, status: *mut c_uint);
        fn cuThreadExchangeStreamCaptureMode(mode: *mut c_uint);
    }
}
