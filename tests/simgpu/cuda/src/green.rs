//! Green contexts (CUDA 12.4+): a device's SM resource, descriptors of resources, and green contexts
//! made of them. As NVIDIA documents `cuGreenCtxCreate`: "This API will retain the primary context
//! on device dev, which will is released when the green context is destroyed"; "The API does not
//! set the green context current"; `cuCtxFromGreenCtx` gives the `CUcontext` that stands for it
//! ("treated as if it were a primary context", its memory the primary context's); "a green context
//! can be current to only one thread at a time". The SM partition itself is not simulated: kernels
//! of a green context run as the primary context's would (see README).

use crate::context::{self, Context};
use crate::handles::Handles;
use gpuslice_api::launch_types::CU_STREAM_NON_BLOCKING;
use gpuslice_api::types::{CUcontext, CUdevice, CUgreenCtx, CUstream};
use gpuslice_api::{CUerror, CUresult};
use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// `CU_DEV_RESOURCE_TYPE_SM`.
const RESOURCE_TYPE_SM: c_int = 1;
/// `CU_GREEN_CTX_DEFAULT_STREAM` (required by 12.4-12.x drivers; 13.x also takes 0).
const GREEN_CTX_DEFAULT_STREAM: c_uint = 0x1;
/// Where `CUdevResource`'s union starts (`type` and `_internal_padding[92]` before it), in cuda.h
/// 12.4 to 13.x; `CUdevSmResource.smCount` is its first word.
const SM_COUNT_OFFSET: usize = 96;

/// A green context: the device it is on and the `CUcontext` it converts to.
struct Green {
    device: u32,
    ctx: Arc<Context>,
    sms: u32,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn greens() -> &'static Mutex<HashMap<usize, Green>> {
    static G: OnceLock<Mutex<HashMap<usize, Green>>> = OnceLock::new();
    G.get_or_init(Default::default)
}

/// Resource descriptors (`cuDevResourceGenerateDesc`) by handle: the SMs they describe.
fn descriptors() -> &'static Mutex<HashMap<usize, u32>> {
    static D: OnceLock<Mutex<HashMap<usize, u32>>> = OnceLock::new();
    D.get_or_init(Default::default)
}

static GREEN_HANDLES: Handles = Handles::new(0x7a00_0000_0000);
static DESC_HANDLES: Handles = Handles::new(0x7900_0000_0000);

fn device_sms(device: u32) -> u32 {
    simgpu_core::physical_devices()
        .get(device as usize)
        .map_or(0, |d| u32::try_from(d.multiprocessor_count).unwrap_or(0))
}

/// Writes an SM resource of `sms` multiprocessors into the client's `CUdevResource`.
///
/// # Safety
/// `out` must be NULL or point to a `CUdevResource` (at least `SM_COUNT_OFFSET + 4` bytes).
unsafe fn write_sm_resource(out: *mut c_void, resource_type: c_int, sms: u32) -> CUresult {
    if out.is_null() {
        return Err(CUerror::INVALID_VALUE);
    }
    if resource_type != RESOURCE_TYPE_SM {
        return Err(CUerror::INVALID_RESOURCE_TYPE);
    }
    let base = out.cast::<u8>();
    // SAFETY: the caller passes a whole `CUdevResource`; writes unaligned-safe.
    unsafe {
        std::ptr::write_bytes(base, 0, SM_COUNT_OFFSET + 4);
        base.cast::<c_int>().write_unaligned(RESOURCE_TYPE_SM);
        base.add(SM_COUNT_OFFSET).cast::<u32>().write_unaligned(sms);
    }
    Ok(())
}

fn green_of(h: CUgreenCtx) -> Result<(u32, Arc<Context>, u32), CUerror> {
    crate::entry::initialized()?;
    lock(greens())
        .get(&(h as usize))
        .map(|g| (g.device, g.ctx.clone(), g.sms))
        .ok_or(CUerror::INVALID_HANDLE)
}

/// The green context `ctx` (a converted `CUcontext`) stands for, if any.
fn green_handle_of(ctx: &Context) -> Option<usize> {
    lock(greens())
        .iter()
        .find(|(_, g)| std::ptr::eq(Arc::as_ptr(&g.ctx), ctx))
        .map(|(h, _)| *h)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDevResource(
    dev: CUdevice,
    result: *mut c_void,
    resource_type: c_int,
) -> CUresult {
    crate::call("cuDeviceGetDevResource", || {
        crate::entry::initialized()?;
        let device = crate::device::physical(dev)?;
        // SAFETY: the client passes a `CUdevResource`.
        unsafe { write_sm_resource(result, resource_type, device_sms(device)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevResourceGenerateDesc(
    desc: Option<&mut usize>,
    resources: *const c_void,
    count: c_uint,
) -> CUresult {
    crate::call("cuDevResourceGenerateDesc", || {
        crate::entry::initialized()?;
        let desc = crate::out(desc)?;
        if resources.is_null() || count == 0 {
            return Err(CUerror::INVALID_VALUE);
        }
        // One SM resource is what this simulation takes (a 12.x descriptor holds one of each type).
        if count != 1 {
            return Err(CUerror::INVALID_RESOURCE_CONFIGURATION);
        }
        let base = resources.cast::<u8>();
        // SAFETY: the client passes `count` `CUdevResource`s.
        let (kind, sms) = unsafe {
            (
                base.cast::<c_int>().read_unaligned(),
                base.add(SM_COUNT_OFFSET).cast::<u32>().read_unaligned(),
            )
        };
        if kind != RESOURCE_TYPE_SM || sms == 0 {
            return Err(CUerror::INVALID_RESOURCE_TYPE);
        }
        let h = DESC_HANDLES.take();
        lock(descriptors()).insert(h, sms);
        *desc = h;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGreenCtxCreate(
    ph: Option<&mut CUgreenCtx>,
    desc: usize,
    dev: CUdevice,
    flags: c_uint,
) -> CUresult {
    crate::call("cuGreenCtxCreate", || {
        crate::entry::initialized()?;
        let ph = crate::out(ph)?;
        let device = crate::device::physical(dev)?;
        if flags & !GREEN_CTX_DEFAULT_STREAM != 0 {
            return Err(CUerror::INVALID_VALUE);
        }
        let sms = *lock(descriptors())
            .get(&desc)
            .ok_or(CUerror::INVALID_VALUE)?;
        if sms > device_sms(device) {
            return Err(CUerror::INVALID_RESOURCE_CONFIGURATION);
        }
        // "This API will retain the primary context on device dev": created (and its memory
        // spent) here when it is not active yet.
        context::primary_retain(dev)?;
        let ctx = context::new_green(device);
        let h = GREEN_HANDLES.take();
        lock(greens()).insert(h, Green { device, ctx, sms });
        *ph = h as CUgreenCtx;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGreenCtxDestroy(h: CUgreenCtx) -> CUresult {
    crate::call("cuGreenCtxDestroy", || {
        crate::entry::initialized()?;
        let green = lock(greens())
            .remove(&(h as usize))
            .ok_or(CUerror::INVALID_HANDLE)?;
        GREEN_HANDLES.give_back(h as usize);
        context::destroy_green(&green.ctx);
        // "... which will is released when the green context is destroyed".
        let dev = crate::device::visible_ordinal(green.device);
        context::primary_release(dev)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxFromGreenCtx(
    pctx: Option<&mut CUcontext>,
    h: CUgreenCtx,
) -> CUresult {
    crate::call("cuCtxFromGreenCtx", || {
        let pctx = crate::out(pctx)?;
        let (_, ctx, _) = green_of(h)?;
        *pctx = context::handle_of(&ctx);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGreenCtxGetDevResource(
    h: CUgreenCtx,
    result: *mut c_void,
    resource_type: c_int,
) -> CUresult {
    crate::call("cuGreenCtxGetDevResource", || {
        let (_, _, sms) = green_of(h)?;
        // SAFETY: the client passes a `CUdevResource`.
        unsafe { write_sm_resource(result, resource_type, sms) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGreenCtxStreamCreate(
    ph: Option<&mut CUstream>,
    h: CUgreenCtx,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    crate::call("cuGreenCtxStreamCreate", || {
        let ph = crate::out(ph)?;
        let (_, ctx, _) = green_of(h)?;
        // "CU_STREAM_NON_BLOCKING must be specified" (cuGreenCtxStreamCreate).
        if flags != CU_STREAM_NON_BLOCKING {
            return Err(CUerror::INVALID_VALUE);
        }
        *ph = crate::stream::create_in(&ctx, flags, priority)?;
        Ok(())
    })
}

/// The green context a stream was created in (NULL for a stream of another context).
fn stream_green(h: CUstream, per_thread: bool, out: Option<&mut CUgreenCtx>) -> CUresult {
    let out = crate::out(out)?;
    let stream = crate::stream::resolve(h, per_thread)?;
    let ctx = stream.context()?;
    *out = green_handle_of(&ctx).map_or(std::ptr::null_mut(), |g| g as CUgreenCtx);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetGreenCtx(
    h: CUstream,
    out: Option<&mut CUgreenCtx>,
) -> CUresult {
    crate::call("cuStreamGetGreenCtx", || stream_green(h, false, out))
}
