//! The driver functions the scheduler calls, reached through the driver layer (never through the
//! hooks), and the small queries built on them: which device a stream belongs to, device UUIDs, and a
//! guard that keeps our event calls from disturbing an application's stream capture.

pub use crate::driver::calls::capturing;
use crate::driver::calls::real::{
    cuCtxGetCurrent, cuCtxGetDevice, cuCtxPopCurrent_v2, cuCtxPushCurrent_v2, cuDeviceGetCount,
    cuStreamGetCtx,
};
use gpuslice_api::types::{CUcontext, CUdevice, CUevent, CUstream};
use gpuslice_api::{CUerror, CUresult};
use std::ffi::{c_int, c_uint};

crate::driver::real_calls! {
    ret = CUresult, missing = Err(CUerror::NOT_INITIALIZED);
    fn cuEventCreate(event: *mut CUevent, flags: c_uint);
    fn cuEventQuery(event: CUevent);
    fn cuEventRecord(event: CUevent, stream: CUstream);
    fn cuEventRecord_ptsz(event: CUevent, stream: CUstream);
    fn cuEventSynchronize(event: CUevent);
    fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent);
    fn cuThreadExchangeStreamCaptureMode(mode: *mut c_uint);
}

pub use real::*;

/// `CU_STREAM_CAPTURE_MODE_RELAXED` (cuda.h).
const CAPTURE_MODE_RELAXED: c_uint = 2;
/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD` (cuda.h): the current context's default streams.
const STREAM_LEGACY: usize = 1;
const STREAM_PER_THREAD: usize = 2;

/// The calling thread's current context (null when there is none).
pub fn current_context() -> CUcontext {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-parameter.
    let _ = unsafe { cuCtxGetCurrent(&mut ctx) };
    ctx
}

/// The context a launch on `stream` runs in, and that context's device ordinal.
pub fn stream_device(stream: CUstream) -> Option<(CUcontext, u32)> {
    let current = current_context();
    let ctx = match stream as usize {
        0 | STREAM_LEGACY | STREAM_PER_THREAD => current,
        _ => {
            let mut ctx: CUcontext = std::ptr::null_mut();
            // SAFETY: valid out-parameter; the caller's stream handle, as the launch received it.
            match unsafe { cuStreamGetCtx(stream, &mut ctx) } {
                Ok(()) if !ctx.is_null() => ctx,
                _ => current,
            }
        }
    };
    if ctx.is_null() {
        return None;
    }
    let ordinal = in_context(ctx, || {
        let mut dev: CUdevice = -1;
        // SAFETY: valid out-parameter.
        unsafe { cuCtxGetDevice(&mut dev) }
            .ok()
            .and_then(|()| u32::try_from(dev).ok())
    })?;
    Some((ctx, ordinal))
}

/// Runs `f` with `ctx` current on this thread (pushed and popped when it is not already current).
pub fn in_context<R>(ctx: CUcontext, f: impl FnOnce() -> R) -> R {
    if ctx == current_context() {
        return f();
    }
    // SAFETY: a context handle the driver gave us; popped below.
    let pushed = unsafe { cuCtxPushCurrent_v2(ctx) }.is_ok();
    let r = f();
    if pushed {
        let mut popped: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-parameter; pops what we pushed.
        let _ = unsafe { cuCtxPopCurrent_v2(&mut popped) };
    }
    r
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

/// While alive, the calling thread's stream-capture interaction mode is RELAXED: event queries and
/// synchronisation we make from an application thread are not "potentially unsafe API calls" that
/// would invalidate another thread's `CU_STREAM_CAPTURE_MODE_GLOBAL` capture (cuda.h, documentation of
/// `cuThreadExchangeStreamCaptureMode`). The thread's own mode is restored on drop.
pub struct RelaxedCapture(Option<c_uint>);

impl RelaxedCapture {
    pub fn enter() -> RelaxedCapture {
        let mut mode = CAPTURE_MODE_RELAXED;
        // SAFETY: valid in/out parameter; only the calling thread's mode changes.
        let ok = unsafe { real::cuThreadExchangeStreamCaptureMode(&mut mode) }.is_ok();
        RelaxedCapture(ok.then_some(mode))
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        if let Some(mut mode) = self.0 {
            // SAFETY: as above; puts back the mode we replaced.
            let _ = unsafe { real::cuThreadExchangeStreamCaptureMode(&mut mode) };
        }
    }
}
