//! Contexts cost device memory: each one is charged `GPUSLICE_CONTEXT_RESERVE` (see accounting) while it
//! exists. A primary context is charged on its first retain and returned on its last release or reset.

use super::{hooks, Out};
use crate::accounting::tenant;
use gpuslice_api::types::{CUcontext, CUctxCreateParams, CUdevice, CUexecAffinityParam};
use gpuslice_api::{CUerror, CUresult};
use std::ffi::{c_int, c_uint};

hooks! {
    ret = CUresult, missing = Err(CUerror::NOT_INITIALIZED);
    fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice)
        => create(Out::new(pctx), dev, || real::cuCtxCreate(pctx, flags, dev));
    fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice)
        => create(Out::new(pctx), dev, || real::cuCtxCreate_v2(pctx, flags, dev));
    fn cuCtxCreate_v3(pctx: *mut CUcontext, params: *mut CUexecAffinityParam, num_params: c_int, flags: c_uint, dev: CUdevice)
        => create(Out::new(pctx), dev, || real::cuCtxCreate_v3(pctx, params, num_params, flags, dev));
    fn cuCtxCreate_v4(pctx: *mut CUcontext, params: *mut CUctxCreateParams, flags: c_uint, dev: CUdevice)
        => create(Out::new(pctx), dev, || real::cuCtxCreate_v4(pctx, params, flags, dev));
    fn cuCtxDestroy(ctx: CUcontext) => destroy(ctx, || real::cuCtxDestroy(ctx));
    fn cuCtxDestroy_v2(ctx: CUcontext) => destroy(ctx, || real::cuCtxDestroy_v2(ctx));
    fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice)
        => primary_retain(dev, || real::cuDevicePrimaryCtxRetain(pctx, dev));
    fn cuDevicePrimaryCtxRelease(dev: CUdevice) => primary_release(dev, false, || real::cuDevicePrimaryCtxRelease(dev));
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) => primary_release(dev, false, || real::cuDevicePrimaryCtxRelease_v2(dev));
    fn cuDevicePrimaryCtxReset(dev: CUdevice) => primary_release(dev, true, || real::cuDevicePrimaryCtxReset(dev));
    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) => primary_release(dev, true, || real::cuDevicePrimaryCtxReset_v2(dev));
}

fn create(pctx: Out<CUcontext>, dev: CUdevice, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some(t) = tenant() else { return call() };
    if pctx.is_null() {
        return call();
    }
    let Ok(device) = t.device(dev) else {
        return call();
    };
    let charge = t.reserve(device, t.context_reserve, "context creation")?;
    if let Err(e) = call() {
        t.release(charge);
        return Err(e);
    }
    match pctx.get() {
        Some(ctx) => t.record_context(ctx as usize, charge),
        None => t.release(charge),
    }
    Ok(())
}

fn destroy(ctx: CUcontext, call: impl FnOnce() -> CUresult) -> CUresult {
    call()?;
    if let Some(t) = tenant() {
        t.forget_context(ctx as usize);
    }
    Ok(())
}

fn primary_retain(dev: CUdevice, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some(t) = tenant() else { return call() };
    let Ok(device) = t.device(dev) else {
        return call();
    };
    t.primary_retain(device, call)
}

fn primary_release(dev: CUdevice, reset: bool, call: impl FnOnce() -> CUresult) -> CUresult {
    call()?;
    if let Some(t) = tenant() {
        t.primary_release(dev, reset);
    }
    Ok(())
}
