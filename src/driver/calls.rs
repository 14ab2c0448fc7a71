//! Real driver functions the accounting calls (without hooking them, or past their hooks), and small
//! queries built on them: the layer below accounting, so that it never calls up into the hooks.

use gpuslice_api::nvml::nvmlDevice_t;
use gpuslice_api::types::{
    CUcontext, CUdevice, CUmemAllocationProp, CUmemoryPool, CUstream, CUuuid,
};
use gpuslice_api::CUerror;
use std::ffi::{c_char, c_int, c_uint};

/// Typed calls to the real functions (generated from the table).
pub use super::real;

pub use super::capture::{capturing, RelaxedCapture};

/// Whether device `dev`'s primary context exists now (`None`: the driver did not say). A release
/// destroys it only when it drops the last reference, and a reset destroys it while keeping the
/// references ("resetting the primary context does not release it": NVIDIA's
/// `cuDevicePrimaryCtxReset`), so only the driver knows.
pub fn primary_context_active(dev: CUdevice) -> Option<bool> {
    let (mut flags, mut active): (c_uint, c_int) = (0, 0);
    // SAFETY: valid out-parameters.
    match unsafe { real::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active) } {
        Ok(()) => Some(active != 0),
        Err(_) => None,
    }
}

/// Whether the driver may still hold `ptr`: asked for its device ordinal, which NVIDIA's driver
/// refuses with `CUDA_ERROR_INVALID_VALUE` for an address no allocation covers, such as one freed
/// with its context. Any other failure says nothing about the memory: it is taken as held (a
/// charge is never given back on a failed query).
pub fn pointer_known(ptr: u64) -> bool {
    let mut ordinal: c_int = -1;
    // SAFETY: the attribute is an int; `ordinal` is a valid out-parameter.
    let answer = unsafe {
        real::cuPointerGetAttribute(
            (&mut ordinal as *mut c_int).cast(),
            gpuslice_api::types::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    };
    answer != Err(CUerror::INVALID_VALUE)
}

/// NVML functions (a separate library, its own error type).
pub mod nvml {
    pub use crate::driver::real;
}

/// The UUID of an NVML device handle (its address), through the real NVML.
pub fn nvml_device_uuid(handle: usize) -> Option<String> {
    let device = handle as nvmlDevice_t;
    let mut uuid = [0 as c_char; 96];
    // SAFETY: `uuid` is a writable buffer of the length given.
    unsafe { real::nvmlDeviceGetUUID(device, uuid.as_mut_ptr(), uuid.len() as u32) }.ok()?;
    // SAFETY: NVML wrote a NUL-terminated string into the buffer (it is zero-initialised besides).
    let uuid = unsafe { std::ffi::CStr::from_ptr(uuid.as_ptr()) };
    Some(uuid.to_string_lossy().into_owned())
}

/// The GPU and compute instance ids of an NVML device handle (nvml.h `nvmlDeviceGetGpuInstanceId`,
/// `nvmlDeviceGetComputeInstanceId`); `u32::MAX` each (NVML's "no instance") for a GPU's handle,
/// where the driver refuses them.
pub fn nvml_instance_ids(handle: usize) -> (u32, u32) {
    let device = handle as nvmlDevice_t;
    let (mut gi, mut ci): (c_uint, c_uint) = (0, 0);
    // SAFETY: valid out-parameters; the handle is the caller's, validated by the driver.
    let ok = unsafe {
        real::nvmlDeviceGetGpuInstanceId(device, &mut gi).is_ok()
            && real::nvmlDeviceGetComputeInstanceId(device, &mut ci).is_ok()
    };
    if ok {
        (gi, ci)
    } else {
        (u32::MAX, u32::MAX)
    }
}

/// The identity of a CUDA device ordinal, as NVML, `nvidia-smi -L` and `CUDA_VISIBLE_DEVICES` spell
/// it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, or `MIG-…` for a MIG instance (whose UUID
/// `cuDeviceGetUuid_v2` returns in MIG mode: [`super::mig`]).
pub fn device_uuid(ordinal: CUdevice) -> Result<String, CUerror> {
    let mut uuid = CUuuid::default();
    // SAFETY: `uuid` is a valid out-parameter.
    let r = unsafe { real::cuDeviceGetUuid_v2(&mut uuid, ordinal) };
    // SAFETY: as above; the legacy entry point for drivers that predate _v2.
    r.or_else(|_| unsafe { real::cuDeviceGetUuid(&mut uuid, ordinal) })?;
    Ok(super::mig::device_key(&uuid.bytes))
}

/// What a memory pool holds (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
pub fn pool_reserved(pool: usize) -> Option<u64> {
    pool_attribute(
        pool,
        gpuslice_api::types::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
    )
}

/// What a memory pool has handed out (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`).
pub fn pool_used(pool: usize) -> Option<u64> {
    pool_attribute(pool, gpuslice_api::types::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
}

/// A memory pool's attribute that is a `cuuint64_t` (the reserved and used sizes).
fn pool_attribute(pool: usize, attribute: u32) -> Option<u64> {
    let mut value: u64 = 0;
    // SAFETY: the attribute is a cuuint64_t written to `value`.
    let r = unsafe {
        real::cuMemPoolGetAttribute(
            pool as CUmemoryPool,
            attribute as c_int,
            (&mut value as *mut u64).cast(),
        )
    };
    r.ok().map(|()| value)
}

/// The minimum granularity of physical allocations with `prop`
/// (`CU_MEM_ALLOC_GRANULARITY_MINIMUM`): `cuMemCreate` requires a multiple of it.
pub fn allocation_granularity(prop: &CUmemAllocationProp) -> Option<u64> {
    let mut granularity: usize = 0;
    // SAFETY: valid out-parameter and property struct; option 0 is the minimum granularity.
    let r = unsafe { real::cuMemGetAllocationGranularity(&mut granularity, prop, 0) };
    r.ok().map(|()| granularity as u64).filter(|g| *g > 0)
}

/// Whether the driver loads modules lazily (`CU_MODULE_LAZY_LOADING`, the default since CUDA 12.2):
/// asked once; a driver that cannot say (before 11.7) loads eagerly.
pub fn lazy_module_loading() -> bool {
    static MODE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| {
        let mut mode: c_int = 0;
        // SAFETY: `mode` is a valid out-parameter.
        let ok = unsafe { real::cuModuleGetLoadingMode(&mut mode) }.is_ok();
        ok && mode == 2
    })
}

/// The memory pool `cuMemAllocAsync` uses on a device: its current pool.
pub fn current_pool(ordinal: CUdevice) -> Option<usize> {
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-parameter.
    let r = unsafe { real::cuDeviceGetMemPool(&mut pool, ordinal) };
    r.ok().filter(|()| !pool.is_null()).map(|()| pool as usize)
}

/// The device whose default or current memory pool `pool` is (`None`: neither of any device's).
pub fn pool_owner(pool: usize) -> Option<CUdevice> {
    let mut count: c_int = 0;
    // SAFETY: `count` is a valid out-parameter.
    unsafe { real::cuDeviceGetCount(&mut count) }.ok()?;
    (0..count).find(|&ordinal| {
        let mut default: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `default` is a valid out-parameter.
        let is_default = unsafe { real::cuDeviceGetDefaultMemPool(&mut default, ordinal) }.is_ok()
            && default as usize == pool;
        is_default || current_pool(ordinal) == Some(pool)
    })
}

/// The devices this process sees, as (ordinal, UUID); empty before `cuInit`.
pub fn visible_devices() -> Vec<(u32, String)> {
    let mut count: c_int = 0;
    // SAFETY: `count` is a valid out-parameter.
    if unsafe { real::cuDeviceGetCount(&mut count) }.is_err() {
        return Vec::new();
    }
    (0..count)
        .filter_map(|i| device_uuid(i).ok().map(|u| (i as u32, u)))
        .collect()
}

/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD` (cuda.h): the current context's default streams.
const STREAM_LEGACY: usize = 1;
const STREAM_PER_THREAD: usize = 2;

/// The calling thread's current context (null when there is none).
pub fn current_context() -> CUcontext {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-parameter.
    let _ = unsafe { real::cuCtxGetCurrent(&mut ctx) };
    ctx
}

/// The context work on `stream` runs in, and that context's device ordinal.
// The stream handle is opaque to us, only passed to the driver, which validates it.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn stream_device(stream: CUstream) -> Option<(CUcontext, u32)> {
    let current = current_context();
    let ctx = match stream as usize {
        0 | STREAM_LEGACY | STREAM_PER_THREAD => current,
        _ => {
            let mut ctx: CUcontext = std::ptr::null_mut();
            // SAFETY: valid out-parameter; the caller's stream handle, as the launch received it.
            match unsafe { real::cuStreamGetCtx(stream, &mut ctx) } {
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
        unsafe { real::cuCtxGetDevice(&mut dev) }
            .ok()
            .and_then(|()| u32::try_from(dev).ok())
    })?;
    Some((ctx, ordinal))
}

/// Runs `f` with `ctx` current on this thread (pushed and popped when it is not already current).
// The context handle is opaque to us, only passed to the driver, which validates it.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn in_context<R>(ctx: CUcontext, f: impl FnOnce() -> R) -> R {
    if ctx == current_context() {
        return f();
    }
    // SAFETY: a context handle the driver gave us; popped below.
    let pushed = unsafe { real::cuCtxPushCurrent_v2(ctx) }.is_ok();
    let r = f();
    if pushed {
        let mut popped: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-parameter; pops what we pushed.
        let _ = unsafe { real::cuCtxPopCurrent_v2(&mut popped) };
    }
    r
}
