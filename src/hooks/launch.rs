//! Launch hooks: every entry point that puts kernels on the device passes through the compute-share
//! gate ([`crate::scheduling::gate`]) before the real driver sees it. Graph launches: `graph.rs`.

use super::{hooks, In};
use crate::accounting::first_launch;
use crate::scheduling::gate;
use gpuslice_api::launch_types::CUlaunchConfig;
use gpuslice_api::types::{CUfunction, CUstream};
use gpuslice_api::{CUerror, CUresult};
use std::ffi::{c_uint, c_void};

/// `CUDA_LAUNCH_PARAMS_v1` (cuda.h): the element of cuLaunchCooperativeKernelMultiDevice's list.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LaunchParams {
    pub function: CUfunction,
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub stream: CUstream,
    pub kernel_params: *mut *mut c_void,
}

hooks! {
    // Uncontended (or no compute sharing at all), and not a kernel whose code the driver loads at
    // this launch: straight to the driver, before any other work.
    ret = CUresult, missing = Err(CUerror::NOT_INITIALIZED),
    fast = crate::scheduling::launch_passes() && !first_launch::pending(f as usize);
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
    use super::{gate, hooks, multi_streams, LaunchParams};
    use gpuslice_api::{CUerror, CUresult};
    use std::ffi::c_uint;

    hooks! {
        ret = CUresult, missing = Err(CUerror::NOT_INITIALIZED), fast = crate::scheduling::launch_passes();
        fn cuLaunchCooperativeKernelMultiDevice(list: *mut LaunchParams, count: c_uint, flags: c_uint)
            => gate(&multi_streams(list, count), false, || real::cuLaunchCooperativeKernelMultiDevice(list, count, flags));
    }
}

pub use multi::cuLaunchCooperativeKernelMultiDevice;

/// A launch off the fast path: a kernel whose code the driver loads first is loaded and charged
/// (`context::first_launch`), then the launch goes through the compute-share gate.
fn launch(f: CUfunction, launch: impl FnOnce() -> CUresult) -> CUresult {
    if first_launch::pending(f as usize) {
        return super::context::first_launch(f, launch);
    }
    launch()
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
unsafe fn multi_streams(list: *const LaunchParams, count: c_uint) -> Vec<CUstream> {
    if list.is_null() {
        return Vec::new();
    }
    (0..count.min(64) as usize)
        .filter_map(|i| {
            // SAFETY: element `i < count` of the caller's array.
            unsafe { In::new(list.wrapping_add(i)) }
                .get()
                .map(|p| p.stream)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn launch_params_layout_matches_cuda_h() {
        use std::mem::{offset_of, size_of};
        assert_eq!(size_of::<super::LaunchParams>(), 56);
        assert_eq!(offset_of!(super::LaunchParams, stream), 40);
        assert_eq!(offset_of!(super::LaunchParams, kernel_params), 48);
    }
}
