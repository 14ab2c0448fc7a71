//! Launch hooks: every entry point that puts kernels on the device passes through the compute-share
//! gate ([`crate::scheduling::gate`]) before the real driver sees it. Graph launches: `graph.rs`.

use super::{hooks, In};
use crate::accounting::first_launch;
use crate::scheduling::gate;
use gpuslice_api::launch_types::{CUlaunchConfig, CUDA_LAUNCH_PARAMS};
use gpuslice_api::types::{CUfunction, CUstream};
use gpuslice_api::CUresult;
use std::ffi::{c_uint, c_void};

hooks! {
    // Uncontended (or no compute sharing at all), and not a kernel whose launch may spend memory
    // (`first_launch::clear`: loads only): straight to the driver, before any other work.
    ret = CUresult,
    fast = crate::scheduling::launch_passes() && first_launch::clear(f as usize);
    fn cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
                      shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void)
        => launch(f, || gate(&[stream], false, || real::cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)));
    fn cuLaunchKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
                           shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void)
        => launch(f, || gate(&[stream], true, || real::cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)));
    fn cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void)
        => launch(f, || gate(&[config_stream(config)], false, || real::cuLaunchKernelEx(config, f, params, extra)));
    fn cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void)
        => launch(f, || gate(&[config_stream(config)], true, || real::cuLaunchKernelEx_ptsz(config, f, params, extra)));
    fn cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
                                 shared: c_uint, stream: CUstream, params: *mut *mut c_void)
        => launch(f, || gate(&[stream], false, || real::cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params)));
    fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
                                      shared: c_uint, stream: CUstream, params: *mut *mut c_void)
        => launch(f, || gate(&[stream], true, || real::cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shared, stream, params)));
}

/// The multi-device launch names its kernels in a list: not read on the fast path (a lazily
/// loaded library's kernel first launched this way is charged by reconciliation).
mod multi {
    use super::{gate, hooks, multi_streams, CUDA_LAUNCH_PARAMS};
    use gpuslice_api::CUresult;
    use std::ffi::c_uint;

    hooks! {
        ret = CUresult, fast = crate::scheduling::launch_passes();
        fn cuLaunchCooperativeKernelMultiDevice(list: *mut CUDA_LAUNCH_PARAMS, count: c_uint, flags: c_uint)
            => gate(&multi_streams(list, count), false, || real::cuLaunchCooperativeKernelMultiDevice(list, count, flags));
    }
}

pub use multi::cuLaunchCooperativeKernelMultiDevice;

/// A launch off the fast path: a kernel whose code the driver loads first is loaded and charged
/// (`first_launch::first_launch`), then the launch goes through the compute-share gate.
fn launch(f: CUfunction, launch: impl FnOnce() -> CUresult) -> CUresult {
    if first_launch::pending(f as usize, current) {
        return super::first_launch::first_launch(f, launch);
    }
    launch()
}

/// The calling thread's current context, for [`first_launch::pending`] (asked only for a kernel
/// loaded in some of the process's contexts, not all).
#[inline]
fn current() -> usize {
    crate::driver::calls::current_context() as usize
}

/// The stream of a `cuLaunchKernelEx` configuration (NULL config: the driver reports it).
///
/// # Safety
/// `config` is NULL or points to a `CUlaunchConfig`, as the driver API requires.
unsafe fn config_stream(config: *const CUlaunchConfig) -> CUstream {
    // SAFETY: the caller's contract.
    unsafe { In::new(config) }
        .get()
        .map_or(std::ptr::null_mut(), |c| c.hStream)
}

/// The streams of a multi-device cooperative launch.
///
/// # Safety
/// `list` is NULL or points to `count` elements, as the driver API requires.
unsafe fn multi_streams(list: *const CUDA_LAUNCH_PARAMS, count: c_uint) -> Vec<CUstream> {
    if list.is_null() {
        return Vec::new();
    }
    (0..count.min(64) as usize)
        .filter_map(|i| {
            // SAFETY: element `i < count` of the caller's array.
            unsafe { In::new(list.wrapping_add(i)) }
                .get()
                .map(|p| p.hStream)
        })
        .collect()
}
