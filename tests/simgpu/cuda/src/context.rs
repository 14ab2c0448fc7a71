//! Contexts: primary (one per device, retained/released) and created ones; the per-thread stack of
//! current contexts. A live context costs `config().context_memory` of device memory, as a real
//! context's own allocations (local memory, printf buffer, module space) do, and its limits
//! (`cuCtxSetLimit`) cost what a real driver reserves for them beyond their defaults: the stack size
//! for every thread the device can hold resident, the malloc heap and the printf FIFO.

use crate::handles::Handles;
use gpuslice_api::types::{
    CUcontext, CUctxCreateParams, CUdevice, CUexecAffinityParam, CU_CTX_FLAGS_MASK,
    CU_CTX_SCHED_MASK, CU_LIMIT_COUNT,
};
use gpuslice_api::{CUerror, CUresult};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// One CUDA context of this process.
pub struct Context {
    /// The client's handle (`CUcontext`): given to the next context created once this one is
    /// destroyed ([`Handles`]).
    handle: usize,
    /// Physical device ordinal.
    pub device: u32,
    /// simcuda-exec's per-context stream state.
    pub streams: crate::stream::ContextStreams,
    /// `cuCtxGetId`: unique in the process, never reused.
    pub id: u64,
    /// simgpu-core's tag for this context: unique on the machine (the device time-slices between
    /// tags, and runs kernels of one tag concurrently).
    pub tag: u64,
    pub primary: bool,
    /// The `CUcontext` a green context converts to (`cuCtxFromGreenCtx`): its memory is the
    /// primary context's, which the green context retains (see `green`).
    pub green: bool,
    flags: AtomicU32,
    /// Created contexts: until destroyed. Primary: while retained (the object outlives it because
    /// its handle is stable across release/retain, as in the real driver).
    active: AtomicBool,
    limits: Mutex<[usize; CU_LIMIT_COUNT]>,
    /// Device memory charged for the limits beyond their defaults (see [`limits_cost`]).
    limits_charge: AtomicU64,
}

/// `cuCtxGetLimit` defaults (the real driver's, per `CUlimit` value).
const DEFAULT_LIMITS: [usize; CU_LIMIT_COUNT] =
    [1024, 1 << 20, 8 << 20, 2, 2048, 64, 0, 0, 0, 0, 0];
/// Limits the 12.x driver accepts (STACK_SIZE .. PERSISTING_L2_CACHE_SIZE).
const KNOWN_LIMITS: usize = 7;
/// Resident threads per multiprocessor (`CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR`).
pub const THREADS_PER_MULTIPROCESSOR: u64 = 2048;
/// The driver reserves device memory in pages of this size.
pub const GRANULE: u64 = 2 << 20;

/// Device memory the limits take beyond what the defaults take (those are in the context's own cost):
/// stack size x multiprocessors x resident threads per multiprocessor, the malloc heap and the printf
/// FIFO, each its own allocation, in the driver's 2 MiB pages. A limit set below its default gives
/// nothing back (its default allocation is part of the context) and does not pay for another's.
pub fn limits_cost(device: u32, limits: &[usize; CU_LIMIT_COUNT]) -> u64 {
    let sms = simgpu_core::physical_devices()
        .get(device as usize)
        .map_or(0, |d| d.multiprocessor_count.max(0) as u64);
    let stack = |bytes: usize| {
        (bytes as u64)
            .saturating_mul(sms)
            .saturating_mul(THREADS_PER_MULTIPROCESSOR)
    };
    let beyond = |value: u64, default: u64| {
        value
            .saturating_sub(default)
            .div_ceil(GRANULE)
            .saturating_mul(GRANULE)
    };
    beyond(stack(limits[0]), stack(DEFAULT_LIMITS[0]))
        .saturating_add(beyond(limits[1] as u64, DEFAULT_LIMITS[1] as u64))
        .saturating_add(beyond(limits[2] as u64, DEFAULT_LIMITS[2] as u64))
}

impl Context {
    pub fn flags(&self) -> u32 {
        self.flags.load(Ordering::Relaxed)
    }
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a lock is already reported as CUDA_ERROR_UNKNOWN; keep serving.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Every context object of the process by handle (destroyed created contexts are removed).
fn registry() -> &'static Mutex<HashMap<usize, Arc<Context>>> {
    // Looked up by handle, never dereferenced: see `Context::handle`.
    static R: OnceLock<Mutex<HashMap<usize, Arc<Context>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

struct Primary {
    ctx: Option<Arc<Context>>,
    refs: u32,
    flags: u32,
}

fn primaries() -> &'static Mutex<Vec<Primary>> {
    static P: OnceLock<Mutex<Vec<Primary>>> = OnceLock::new();
    P.get_or_init(|| {
        let n = simgpu_core::physical_devices().len();
        Mutex::new(
            (0..n)
                .map(|_| Primary {
                    ctx: None,
                    refs: 0,
                    flags: 0,
                })
                .collect(),
        )
    })
}

thread_local! {
    static STACK: RefCell<Vec<Arc<Context>>> = const { RefCell::new(Vec::new()) };
    /// The handle of the thread's current context, kept beside [`STACK`] in a thread-local that
    /// has no destructor: while a thread exits, other libraries' thread-local destructors still
    /// call the driver after `STACK` is gone (cuda.core releases its primary contexts from one at
    /// a program's exit), and a driver still knows the thread's current context then.
    static TOP: Cell<usize> = const { Cell::new(0) };
}

/// Runs `f` on the calling thread's context stack. Once the thread's exit has dropped the stack,
/// `f` gets the stack of the context that was current (if it still exists).
fn with_stack<R>(f: impl FnOnce(&mut Vec<Arc<Context>>) -> R) -> R {
    let top = |stack: &[Arc<Context>]| stack.last().map_or(0, |c| c.handle);
    let mut f = Some(f);
    let alive = STACK.try_with(|s| {
        let mut stack = s.borrow_mut();
        let r = f.take().map(|f| f(&mut stack));
        TOP.set(top(&stack));
        r
    });
    if let Ok(Some(r)) = alive {
        return r;
    }
    let mut stack: Vec<Arc<Context>> = lock(registry())
        .get(&TOP.get())
        .cloned()
        .into_iter()
        .collect();
    let r = f.take().map(|f| f(&mut stack));
    TOP.set(top(&stack));
    r.expect("the stack's function runs once")
}

fn new_context(device: u32, flags: u32, primary: bool) -> Arc<Context> {
    new_context_of(device, flags, primary, false)
}

fn new_context_of(device: u32, flags: u32, primary: bool, green: bool) -> Arc<Context> {
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    let ctx = Arc::new(Context {
        handle: HANDLES.take(),
        device,
        streams: Default::default(),
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        // Without the shared state kernels run unaccounted and the tag is not used.
        tag: simgpu_core::shared().map_or(0, |s| s.new_context_tag()),
        primary,
        green,
        flags: AtomicU32::new(flags),
        active: AtomicBool::new(false),
        limits: Mutex::new(DEFAULT_LIMITS),
        limits_charge: AtomicU64::new(0),
    });
    lock(registry()).insert(ctx.handle, ctx.clone());
    ctx
}

static HANDLES: Handles = Handles::new(0x7c00_0000_0000);

/// A created context's handle no longer finds it: the handle goes to the next context created.
fn forget(ctx: &Context) {
    if lock(registry()).remove(&ctx.handle).is_some() {
        HANDLES.give_back(ctx.handle);
    }
}

fn shared() -> Result<&'static simgpu_core::Shared, CUerror> {
    simgpu_core::shared().map_err(|_| CUerror::NOT_INITIALIZED)
}

/// Charges the context's own device memory; OUT_OF_MEMORY when the device is full.
fn activate(ctx: &Context) -> CUresult {
    let setup = simgpu_core::config().context_create_us;
    if setup > 0 {
        std::thread::sleep(std::time::Duration::from_micros(setup));
    }
    let shared = shared()?;
    if !shared.try_reserve(ctx.device, simgpu_core::config().context_memory) {
        return Err(CUerror::OUT_OF_MEMORY);
    }
    shared.count_context(ctx.device, true);
    ctx.active.store(true, Ordering::Release);
    Ok(())
}

/// Waits for the context's work, frees everything allocated in it and its own memory, and
/// invalidates its streams and events (their handles answer `CUDA_ERROR_INVALID_HANDLE`).
fn deactivate(ctx: &Context) {
    if ctx.active.swap(false, Ordering::AcqRel) {
        let _ = crate::stream::synchronize_context(ctx);
        crate::stream::invalidate_context(ctx);
        crate::event::invalidate_context(ctx.id);
        crate::memory::on_context_destroyed(ctx);
        crate::module::on_context_destroyed(ctx.id);
        *lock(&ctx.limits) = DEFAULT_LIMITS;
        let limits = ctx.limits_charge.swap(0, Ordering::AcqRel);
        if let Ok(s) = shared() {
            s.release(
                ctx.device,
                simgpu_core::config().context_memory.saturating_add(limits),
            );
            s.count_context(ctx.device, false);
        }
    }
}

/// The context a new green context on `device` converts to: active at once, costing nothing of
/// its own (its memory is the primary context's, retained by the caller).
pub(crate) fn new_green(device: u32) -> Arc<Context> {
    let ctx = new_context_of(device, 0, false, true);
    ctx.active.store(true, Ordering::Release);
    ctx
}

/// A green context destroyed: its work waited for, its streams and events invalidated, its handle
/// given to the next context. What was allocated through it stays with the primary context.
pub(crate) fn destroy_green(ctx: &Arc<Context>) {
    if ctx.active.swap(false, Ordering::AcqRel) {
        let _ = crate::stream::synchronize_context(ctx);
        crate::stream::invalidate_context(ctx);
        crate::event::invalidate_context(ctx.id);
    }
    forget(ctx);
    with_stack(|s| s.retain(|c| !Arc::ptr_eq(c, ctx)));
}

/// The calling thread's current context.
pub fn current() -> Result<Arc<Context>, CUerror> {
    crate::entry::initialized()?;
    let top = with_stack(|s| s.last().cloned()).ok_or(CUerror::INVALID_CONTEXT)?;
    if !top.is_active() {
        // The documented answer for a destroyed context, or a primary one not (re)initialised.
        return Err(CUerror::CONTEXT_IS_DESTROYED);
    }
    Ok(top)
}

/// The live context behind a handle.
pub fn from_handle(h: CUcontext) -> Result<Arc<Context>, CUerror> {
    crate::entry::initialized()?;
    let ctx = lock(registry())
        .get(&(h as usize))
        .cloned()
        .ok_or(CUerror::INVALID_CONTEXT)?;
    if !ctx.is_active() {
        return Err(CUerror::INVALID_CONTEXT);
    }
    Ok(ctx)
}

pub fn handle_of(ctx: &Context) -> CUcontext {
    ctx.handle as CUcontext
}

/// The context an explicit handle names, or the current one for NULL (as `cuCtxGet*` take them).
fn given_or_current(h: CUcontext) -> Result<Arc<Context>, CUerror> {
    if h.is_null() {
        current()
    } else {
        from_handle(h)
    }
}

/// Accepts `CUctx_flags`: only bits in the mask, and at most one scheduling mode.
fn check_flags(flags: u32) -> CUresult {
    let sched = flags & CU_CTX_SCHED_MASK;
    if flags & !CU_CTX_FLAGS_MASK != 0 || sched.count_ones() > 1 {
        return Err(CUerror::INVALID_VALUE);
    }
    Ok(())
}

fn create(pctx: Option<&mut CUcontext>, flags: u32, dev: CUdevice) -> CUresult {
    crate::entry::initialized()?;
    let pctx = crate::out(pctx)?;
    let device = crate::device::physical(dev)?;
    check_flags(flags)?;
    let ctx = new_context(device, flags, false);
    if let Err(e) = activate(&ctx) {
        forget(&ctx);
        return Err(e);
    }
    *pctx = handle_of(&ctx);
    with_stack(|s| s.push(ctx));
    Ok(())
}

/// # Safety
/// `params` must be NULL or point to `n` readable entries.
unsafe fn check_affinity(params: *const CUexecAffinityParam, n: c_int) -> CUresult {
    if n < 0 || (n > 0 && params.is_null()) {
        return Err(CUerror::INVALID_VALUE);
    }
    for i in 0..n as usize {
        // SAFETY: the caller guarantees `n` entries.
        let p = unsafe { &*params.add(i) };
        // CU_EXEC_AFFINITY_TYPE_SM_COUNT is the only type; the SM limit itself is not simulated.
        if p.type_ != 0 {
            return Err(CUerror::INVALID_VALUE);
        }
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: Option<&mut CUcontext>,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    crate::call("cuCtxCreate_v2", || create(pctx, flags, dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: Option<&mut CUcontext>,
    params: *const CUexecAffinityParam,
    num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    crate::call("cuCtxCreate_v3", || {
        crate::entry::initialized()?;
        // SAFETY: the client passes `num_params` entries.
        unsafe { check_affinity(params, num_params) }?;
        create(pctx, flags, dev)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: Option<&mut CUcontext>,
    params: Option<&CUctxCreateParams>,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    crate::call("cuCtxCreate_v4", || {
        crate::entry::initialized()?;
        if let Some(p) = params {
            if !p.cigParams.is_null() {
                // CIG (graphics interop) needs D3D12/Vulkan: not on this device.
                return Err(CUerror::NOT_SUPPORTED);
            }
            // SAFETY: the client passes `numExecAffinityParams` entries.
            unsafe { check_affinity(p.execAffinityParams, p.numExecAffinityParams) }?;
        }
        create(pctx, flags, dev)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(h: CUcontext) -> CUresult {
    crate::call("cuCtxDestroy_v2", || {
        let ctx = from_handle(h)?;
        if ctx.primary || ctx.green {
            // A green context's handle goes with cuGreenCtxDestroy.
            return Err(CUerror::INVALID_CONTEXT);
        }
        deactivate(&ctx);
        forget(&ctx);
        // Popped from the calling thread's stack; other threads keep a stale entry, as in the driver.
        with_stack(|s| s.retain(|c| !Arc::ptr_eq(c, &ctx)));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(h: CUcontext) -> CUresult {
    crate::call("cuCtxPushCurrent_v2", || {
        let ctx = from_handle(h)?;
        with_stack(|s| s.push(ctx));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: Option<&mut CUcontext>) -> CUresult {
    crate::call("cuCtxPopCurrent_v2", || {
        crate::entry::initialized()?;
        let ctx = with_stack(|s| s.pop()).ok_or(CUerror::INVALID_CONTEXT)?;
        if let Some(p) = pctx {
            *p = handle_of(&ctx);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(h: CUcontext) -> CUresult {
    crate::call("cuCtxSetCurrent", || {
        crate::entry::initialized()?;
        if h.is_null() {
            with_stack(|s| s.pop());
            return Ok(());
        }
        let ctx = from_handle(h)?;
        with_stack(|s| {
            s.pop();
            s.push(ctx);
        });
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: Option<&mut CUcontext>) -> CUresult {
    crate::call("cuCtxGetCurrent", || {
        crate::entry::initialized()?;
        let pctx = crate::out(pctx)?;
        *pctx = with_stack(|s| s.last().map_or(std::ptr::null_mut(), |c| handle_of(c)));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(dev: Option<&mut CUdevice>) -> CUresult {
    crate::call("cuCtxGetDevice", || {
        let ctx = current()?;
        *crate::out(dev)? = crate::device::visible_ordinal(ctx.device);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    crate::call("cuCtxSynchronize", || {
        let ctx = current()?;
        if ctx.streams.all().iter().all(|s| s.capture().is_none()) {
            crate::graph::check_unsafe_call()?;
        }
        let r = crate::stream::synchronize_context(&ctx);
        crate::memory::on_synchronize(&ctx);
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetApiVersion(
    h: CUcontext,
    version: Option<&mut c_uint>,
) -> CUresult {
    crate::call("cuCtxGetApiVersion", || {
        given_or_current(h)?;
        // Every context is created through the 3.2+ (`_v2`) API.
        *crate::out(version)? = 3020;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetFlags(flags: Option<&mut c_uint>) -> CUresult {
    crate::call("cuCtxGetFlags", || {
        let ctx = current()?;
        *crate::out(flags)? = ctx.flags();
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetFlags(flags: c_uint) -> CUresult {
    crate::call("cuCtxSetFlags", || {
        let ctx = current()?;
        check_flags(flags)?;
        ctx.flags.store(flags, Ordering::Relaxed);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetId(h: CUcontext, id: Option<&mut u64>) -> CUresult {
    crate::call("cuCtxGetId", || {
        let ctx = given_or_current(h)?;
        *crate::out(id)? = ctx.id;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetLimit(value: Option<&mut usize>, limit: c_uint) -> CUresult {
    crate::call("cuCtxGetLimit", || {
        let ctx = current()?;
        let value = crate::out(value)?;
        if limit as usize >= KNOWN_LIMITS {
            return Err(CUerror::UNSUPPORTED_LIMIT);
        }
        *value = lock(&ctx.limits)[limit as usize];
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetLimit(limit: c_uint, value: usize) -> CUresult {
    crate::call("cuCtxSetLimit", || {
        let ctx = current()?;
        if limit as usize >= KNOWN_LIMITS {
            return Err(CUerror::UNSUPPORTED_LIMIT);
        }
        set_limit(&ctx, limit as usize, |_| value)
    })
}

/// Sets limit `limit` of `ctx` to `value(old)`: what the new limits take beyond the old is reserved
/// before they apply (a device without the room refuses, as a real driver does), or given back.
fn set_limit(ctx: &Context, limit: usize, value: impl FnOnce(usize) -> usize) -> CUresult {
    let mut limits = lock(&ctx.limits);
    let mut next = *limits;
    next[limit] = value(limits[limit]);
    let before = ctx.limits_charge.load(Ordering::Acquire);
    let after = limits_cost(ctx.device, &next);
    if after > before {
        if !shared()?.try_reserve(ctx.device, after - before) {
            return Err(CUerror::OUT_OF_MEMORY);
        }
    } else if after < before {
        shared()?.release(ctx.device, before - after);
    }
    ctx.limits_charge.store(after, Ordering::Release);
    *limits = next;
    Ok(())
}

/// A launch of a kernel whose local frame is `local` bytes per thread: a context whose local memory
/// holds less per thread grows it for every thread the device can hold resident, and keeps it
/// (cuda.h: `CU_CTX_LMEM_RESIZE_TO_MAX`, "Keep local memory allocation after launch", the default
/// from CUDA 12.9; the per-thread size is the stack size, `CU_LIMIT_STACK_SIZE`, which then reads
/// the larger value). Modelled as the stack limit raised to `local` (costed as `cuCtxSetLimit`
/// costs it); `CUDA_ERROR_OUT_OF_MEMORY` when the device has no room (nothing runs).
pub fn grow_local_memory(ctx: &Context, local: u64) -> CUresult {
    let local = usize::try_from(local).unwrap_or(usize::MAX);
    if local <= lock(&ctx.limits)[0] {
        return Ok(());
    }
    set_limit(ctx, 0, |old| old.max(local))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: Option<&mut c_int>,
    greatest: Option<&mut c_int>,
) -> CUresult {
    crate::call("cuCtxGetStreamPriorityRange", || {
        current()?;
        // Hopper's range: 0 (lowest) to -5 (highest); either output may be NULL.
        if let Some(l) = least {
            *l = 0;
        }
        if let Some(g) = greatest {
            *g = -5;
        }
        Ok(())
    })
}

// ---- Primary contexts ----

pub(crate) fn primary_retain(dev: CUdevice) -> Result<CUcontext, CUerror> {
    let device = crate::device::physical(dev)?;
    let mut primaries = lock(primaries());
    let p = &mut primaries[device as usize];
    let ctx = p
        .ctx
        .get_or_insert_with(|| new_context(device, 0, true))
        .clone();
    // Inactive: never used, released to zero, or reset (a reset keeps the retains; the context is
    // initialised again when next retained).
    if !ctx.is_active() {
        ctx.flags.store(p.flags, Ordering::Relaxed);
        activate(&ctx)?;
    }
    p.refs += 1;
    Ok(handle_of(&ctx))
}

pub(crate) fn primary_release(dev: CUdevice) -> CUresult {
    let device = crate::device::physical(dev)?;
    let ctx = {
        let mut primaries = lock(primaries());
        let p = &mut primaries[device as usize];
        if p.refs == 0 {
            return Err(CUerror::INVALID_CONTEXT);
        }
        p.refs -= 1;
        if p.refs > 0 {
            return Ok(());
        }
        p.ctx.clone()
    };
    if let Some(ctx) = ctx {
        deactivate(&ctx);
    }
    Ok(())
}

fn primary_reset(dev: CUdevice) -> CUresult {
    let device = crate::device::physical(dev)?;
    let ctx = {
        let mut primaries = lock(primaries());
        let p = &mut primaries[device as usize];
        // "Resetting the primary context does not release it, an application that has retained the
        // primary context should explicitly release its usage" (Driver API, cuDevicePrimaryCtxReset):
        // the retain count is kept, so that those releases succeed.
        p.flags = 0;
        p.ctx.clone()
    };
    if let Some(ctx) = ctx {
        deactivate(&ctx);
    }
    Ok(())
}

fn primary_set_flags(dev: CUdevice, flags: u32, allow_active: bool) -> CUresult {
    let device = crate::device::physical(dev)?;
    check_flags(flags)?;
    let mut primaries = lock(primaries());
    let p = &mut primaries[device as usize];
    let active = p.ctx.as_ref().is_some_and(|c| c.is_active());
    if active && !allow_active {
        return Err(CUerror::PRIMARY_CONTEXT_ACTIVE);
    }
    p.flags = flags;
    if let Some(c) = p.ctx.as_ref() {
        c.flags.store(flags, Ordering::Relaxed);
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(
    pctx: Option<&mut CUcontext>,
    dev: CUdevice,
) -> CUresult {
    crate::call("cuDevicePrimaryCtxRetain", || {
        crate::entry::initialized()?;
        let pctx = crate::out(pctx)?;
        *pctx = primary_retain(dev)?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    crate::call("cuDevicePrimaryCtxRelease", || primary_release(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    crate::call("cuDevicePrimaryCtxRelease_v2", || primary_release(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    crate::call("cuDevicePrimaryCtxReset", || primary_reset(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    crate::call("cuDevicePrimaryCtxReset_v2", || primary_reset(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) -> CUresult {
    crate::call("cuDevicePrimaryCtxSetFlags", || {
        primary_set_flags(dev, flags, false)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CUresult {
    crate::call("cuDevicePrimaryCtxSetFlags_v2", || {
        primary_set_flags(dev, flags, true)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: Option<&mut c_uint>,
    active: Option<&mut c_int>,
) -> CUresult {
    crate::call("cuDevicePrimaryCtxGetState", || {
        let device = crate::device::physical(dev)?;
        let (flags, active) = (crate::out(flags)?, crate::out(active)?);
        let primaries = lock(primaries());
        let p = &primaries[device as usize];
        *flags = p.flags;
        *active = c_int::from(p.ctx.as_ref().is_some_and(|c| c.is_active()));
        Ok(())
    })
}
