//! Driver overhead: contexts, module code and context limits take device memory the program never
//! asked `cuMemAlloc` for. Each is charged what the driver spent on it (measured, see
//! `accounting::overhead`), returned when the object goes: a created context when destroyed, a
//! primary context on its last release or reset, a module or library when unloaded or its context
//! destroyed, a limit when changed back or its context destroyed.

use super::{hooks, Out};
use crate::accounting::overhead::driver_pages as pages;
use crate::accounting::overhead::Overhead;
use crate::accounting::{tenant, Device, Tenant};
use crate::driver::calls as driver;
use crate::scheduling;
use gpuslice_api::types::{
    CUcontext, CUctxCreateParams, CUdevice, CUexecAffinityParam, CUfunction, CUgreenCtx, CUkernel,
    CUlibrary, CUmodule,
};
use gpuslice_api::{CUerror, CUresult};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

hooks! {
    ret = CUresult;
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
        => primary_retain(Out::new(pctx), dev, || real::cuDevicePrimaryCtxRetain(pctx, dev));
    fn cuDevicePrimaryCtxRelease(dev: CUdevice) => primary_release(dev, false, || real::cuDevicePrimaryCtxRelease(dev));
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) => primary_release(dev, false, || real::cuDevicePrimaryCtxRelease_v2(dev));
    fn cuDevicePrimaryCtxReset(dev: CUdevice) => primary_release(dev, true, || real::cuDevicePrimaryCtxReset(dev));
    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) => primary_release(dev, true, || real::cuDevicePrimaryCtxReset_v2(dev));
    fn cuGreenCtxCreate(phctx: *mut CUgreenCtx, desc: *mut c_void, dev: CUdevice, flags: c_uint)
        => green_create(Out::new(phctx), dev, || real::cuGreenCtxCreate(phctx, desc, dev, flags));
    fn cuGreenCtxDestroy(hctx: CUgreenCtx) => green_destroy(hctx, || real::cuGreenCtxDestroy(hctx));

    fn cuModuleLoad(module: *mut CUmodule, fname: *const c_char)
        => module_load(Out::new(module), Image::File(fname), || real::cuModuleLoad(module, fname));
    fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void)
        => module_load(Out::new(module), Image::Memory(image), || real::cuModuleLoadData(module, image));
    fn cuModuleLoadDataEx(module: *mut CUmodule, image: *const c_void, num_options: c_uint, options: *mut c_int, values: *mut *mut c_void)
        => module_load(Out::new(module), Image::Memory(image), || real::cuModuleLoadDataEx(module, image, num_options, options, values));
    fn cuModuleLoadFatBinary(module: *mut CUmodule, image: *const c_void)
        => module_load(Out::new(module), Image::Memory(image), || real::cuModuleLoadFatBinary(module, image));
    fn cuModuleUnload(module: CUmodule)
        => unload(Overhead::Module, module as usize, || real::cuModuleUnload(module));
    fn cuLibraryLoadData(library: *mut CUlibrary, code: *const c_void, jit_options: *mut c_int, jit_values: *mut *mut c_void, num_jit: c_uint, lib_options: *mut c_int, lib_values: *mut *mut c_void, num_lib: c_uint)
        => library_load(Out::new(library), Image::Memory(code),
                        || real::cuLibraryLoadData(library, code, jit_options, jit_values, num_jit, lib_options, lib_values, num_lib));
    fn cuLibraryLoadFromFile(library: *mut CUlibrary, fname: *const c_char, jit_options: *mut c_int, jit_values: *mut *mut c_void, num_jit: c_uint, lib_options: *mut c_int, lib_values: *mut *mut c_void, num_lib: c_uint)
        => library_load(Out::new(library), Image::File(fname),
                        || real::cuLibraryLoadFromFile(library, fname, jit_options, jit_values, num_jit, lib_options, lib_values, num_lib));
    fn cuLibraryUnload(library: CUlibrary)
        => unload(Overhead::Library, library as usize, || real::cuLibraryUnload(library));
    fn cuModuleGetFunction(hfunc: *mut CUfunction, hmod: CUmodule, name: *const c_char)
        => module_function(Out::new(hfunc), hmod as usize, name, || real::cuModuleGetFunction(hfunc, hmod, name));
    fn cuLibraryGetKernel(kernel: *mut CUkernel, library: CUlibrary, name: *const c_char)
        => get_kernel(Out::new(kernel), library as usize, name, || real::cuLibraryGetKernel(kernel, library, name));
    fn cuKernelGetFunction(func: *mut CUfunction, kernel: CUkernel)
        => kernel_function(Out::new(func), kernel as usize, || real::cuKernelGetFunction(func, kernel));
    fn cuCtxSetLimit(limit: c_int, value: usize) => set_limit(limit, value, || real::cuCtxSetLimit(limit, value));
}

fn create(pctx: Out<CUcontext>, dev: CUdevice, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some(t) = tenant() else { return call() };
    if pctx.is_null() {
        return call();
    }
    let Ok(device) = t.device(dev) else {
        return call();
    };
    t.create_context(
        device,
        || {
            call()?;
            Ok(pctx.get().unwrap_or(std::ptr::null_mut()))
        },
        |ctx| {
            // SAFETY: the context was just created by this call and is not the program's yet.
            let _ = unsafe { driver::real::cuCtxDestroy_v2(ctx) };
        },
    )
}

fn destroy(ctx: CUcontext, call: impl FnOnce() -> CUresult) -> CUresult {
    scheduling::context_ending(ctx);
    call()?;
    if let Some(t) = tenant() {
        t.forget_context(ctx as usize);
    }
    Ok(())
}

fn primary_retain(
    pctx: Out<CUcontext>,
    dev: CUdevice,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let call = || {
        call()?;
        if let Some(ctx) = pctx.get() {
            scheduling::primary_retained(dev, ctx);
        }
        Ok(())
    };
    let Some(t) = tenant() else { return call() };
    let Ok(device) = t.device(dev) else {
        return call();
    };
    t.primary_retain(
        device,
        || {
            call()?;
            Ok(pctx.get().unwrap_or(std::ptr::null_mut()))
        },
        |_| {
            // SAFETY: drops the reference this call took.
            let _ = unsafe { driver::real::cuDevicePrimaryCtxRelease_v2(dev) };
        },
    )
}

fn primary_release(dev: CUdevice, reset: bool, call: impl FnOnce() -> CUresult) -> CUresult {
    if reset {
        scheduling::primary_resetting(dev);
    }
    call()?;
    if !reset {
        scheduling::primary_released(dev);
    }
    if let Some(t) = tenant() {
        t.primary_release(dev, reset);
    }
    Ok(())
}

/// A green context created: the driver retains the device's primary context for it, charged as a
/// retain of the program's would be (once, on the retain that creates it).
fn green_create(
    phctx: Out<CUgreenCtx>,
    dev: CUdevice,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let call = || {
        call()?;
        let primary = primary_handle(dev);
        if !primary.is_null() {
            scheduling::primary_retained(dev, primary);
        }
        Ok(primary)
    };
    let Some(t) = tenant() else {
        return call().map(|_| ());
    };
    let Ok(device) = t.device(dev) else {
        return call().map(|_| ());
    };
    t.green_create(
        device,
        call,
        || phctx.get().map_or(0, |g| g as usize),
        |_| {
            if let Some(green) = phctx.get() {
                // SAFETY: the green context was just created by this call and is not the
                // program's yet; destroying it releases the primary context it retained.
                let _ = unsafe { real::cuGreenCtxDestroy(green) };
            }
        },
    )
}

/// The device's primary context, which a green context on it holds a reference to (taken and
/// given back at once: it is not created, the green context keeps it alive).
fn primary_handle(dev: CUdevice) -> CUcontext {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-parameter; the reference taken is released just after.
    if unsafe { real::cuDevicePrimaryCtxRetain(&mut ctx, dev) }.is_ok() {
        // SAFETY: drops the reference just taken.
        let _ = unsafe { driver::real::cuDevicePrimaryCtxRelease_v2(dev) };
    }
    ctx
}

fn green_destroy(green: CUgreenCtx, call: impl FnOnce() -> CUresult) -> CUresult {
    call()?;
    if let Some(t) = tenant() {
        if let Some(dev) = t.green_destroyed(green as usize) {
            scheduling::primary_released(dev);
        }
    }
    Ok(())
}

/// The tenant and the device of the current context (or, for a library loaded without one, the
/// first device), or `None` when quotas do not apply.
fn overhead_device(need_context: bool) -> Option<(&'static Tenant, &'static Device)> {
    let t = tenant()?;
    match t.current_device() {
        Ok(d) => Some((t, d)),
        Err(_) if !need_context => t.device(0).ok().map(|d| (t, d)),
        Err(_) => None,
    }
}

fn module_load(module: Out<CUmodule>, image: Image, call: impl FnOnce() -> CUresult) -> CUresult {
    load(Overhead::Module, module, image, call, |m| {
        // SAFETY: the module was just loaded by this call and is not the program's yet.
        let _ = unsafe { driver::real::cuModuleUnload(m) };
    })
}

fn library_load(
    library: Out<CUlibrary>,
    image: Image,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    load(Overhead::Library, library, image, call, |l| {
        // SAFETY: the library was just loaded by this call and is not the program's yet.
        let _ = unsafe { driver::real::cuLibraryUnload(l) };
    })
}

/// A module (in the current context, which it goes with) or a library (context-independent: it
/// goes when unloaded) loaded from `image`, charged what loading it cost the driver. What its code
/// will take on the device, read from the image, is reserved before the driver is asked: a load the
/// quota has no room for is refused before the driver spends the memory. A driver that loads
/// lazily loads nothing yet: the code is reserved and charged at its lookups ([`lookup`]).
fn load<H>(
    kind: Overhead,
    handle: Out<*mut H>,
    image: Image,
    call: impl FnOnce() -> CUresult,
    unload: impl FnOnce(*mut H),
) -> CUresult {
    let module = kind == Overhead::Module;
    let Some((t, device)) = overhead_device(module) else {
        return call();
    };
    if handle.is_null() {
        return call();
    }
    let owner = if module { t.current_context() } else { 0 };
    let what = if module {
        "module load"
    } else {
        "library load"
    };
    let (size, code) = image.measure(device.ordinal);
    let lazy = driver::lazy_module_loading();
    let expected = if lazy { 0 } else { pages(code.total()) };
    let fallback = match (lazy, code.total()) {
        (true, _) => 0,
        (false, 0) => size,
        (false, _) => expected,
    };
    let (loaded, charge) = t.charge_measured(
        device,
        what,
        None,
        fallback,
        None,
        || expected,
        0,
        || {
            call()?;
            Ok(handle.get().unwrap_or(std::ptr::null_mut()))
        },
        Some(unload),
    )?;
    t.record_overhead(kind, loaded as usize, owner, charge);
    if lazy {
        t.record_lazy_code(kind, loaded as usize, code);
    }
    t.reconcile_device(device);
    Ok(())
}

/// A kernel's lookup in a module or library loaded lazily: the driver loads the module's data (on
/// its first lookup) and the kernel's code now. What that takes, read from the image at the load,
/// is reserved before the driver is asked (a lookup the quota has no room for is refused before
/// the driver loads anything), then charged what the driver spent, with the module.
fn lookup(
    kind: Overhead,
    handle: usize,
    name: *const c_char,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some(t) = tenant() else {
        return call();
    };
    if name.is_null() {
        return call();
    }
    // SAFETY: the driver API requires a NUL-terminated name.
    let kernel = unsafe { CStr::from_ptr(name) }.to_bytes();
    load_code(t, kind, handle, kernel, call)
}

/// The driver loads `kernel`'s code of lazily loaded module or library `handle` (and the module's
/// data, on its first load) in `call`: what that adds is reserved before, then charged what the
/// driver spent, with the module or library.
fn load_code(
    t: &'static Tenant,
    kind: Overhead,
    handle: usize,
    kernel: &[u8],
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some(expected) = t.lazy_code_expected(kind, handle, kernel) else {
        return call();
    };
    let Some((t, device)) = overhead_device(kind == Overhead::Module) else {
        return call();
    };
    let ((), charge) = t.charge_measured(
        device,
        "kernel load",
        None,
        expected,
        None,
        || expected,
        0,
        call,
        // Loaded code cannot be unloaded on its own, and the driver answered: the lookup succeeds,
        // what the quota has no room for beyond what was reserved is left to reconciliation.
        None::<fn(())>,
    )?;
    t.lazy_code_loaded(kind, handle, kernel, charge);
    t.reconcile_device(device);
    Ok(())
}

/// A kernel of a library: a lazily loaded library's kernel is not loaded yet (`cuLibraryLoadData`:
/// it "will only be loaded when a function is needed for that context, such as a kernel launch"),
/// so nothing is charged here; the kernel is noted, and charged at its `cuKernelGetFunction` or
/// first launch ([`load_kernel`], [`first_launch`]).
fn get_kernel(
    kernel: Out<CUkernel>,
    library: usize,
    name: *const c_char,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    call()?;
    if let (Some(t), Some(k)) = (tenant(), kernel.get()) {
        if !name.is_null() {
            // SAFETY: the driver API requires a NUL-terminated name (and the driver accepted it).
            let name = unsafe { CStr::from_ptr(name) }.to_bytes();
            t.lazy_kernel_got(library, k as usize, name);
        }
    }
    Ok(())
}

/// `cuKernelGetFunction`, or a kernel's first launch: the driver loads a lazily loaded library's
/// kernel in the current context now. A kernel noted at its `cuLibraryGetKernel` and not loaded yet
/// is charged as a module's lookup is ([`load_code`]); any other passes straight through.
fn load_kernel(kernel: usize, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some(t) = tenant() else {
        return call();
    };
    let Some((library, name)) = t.lazy_kernel(kernel) else {
        return call();
    };
    load_code(t, Overhead::Library, library, &name, call)?;
    t.lazy_kernel_loaded(kernel);
    Ok(())
}

/// The first launch of a lazily loaded library's kernel `f` (its `CUkernel`, launched as a
/// function): the driver loads its code before it runs. The shim has it loaded first, by
/// `cuKernelGetFunction` in the current context, charged ([`load_kernel`]), then launches: a load
/// the quota has no room for fails the launch with `CUDA_ERROR_OUT_OF_MEMORY` (as a driver that
/// cannot load the code does) and nothing runs. Other errors of that call are left to the launch to
/// report. Launches after the first take the fast path (`first_launch::pending` is false).
/// A function whose local frame is larger than the context's stack then grows the context's local
/// memory at this launch ([`grow_local`]).
pub fn first_launch(f: CUfunction, launch: impl FnOnce() -> CUresult) -> CUresult {
    let Some(t) = tenant() else {
        return launch();
    };
    if t.lazy_kernel(f as usize).is_some() {
        let mut func: CUfunction = std::ptr::null_mut();
        let loaded = load_kernel(f as usize, || {
            // SAFETY: `func` is a valid out-parameter; `f` is the caller's kernel handle.
            unsafe { real::cuKernelGetFunction(&mut func, f as CUkernel) }
        });
        if loaded == Err(CUerror::OUT_OF_MEMORY) {
            return loaded;
        }
        if loaded.is_ok() {
            note_local_frame(t, func);
            note_local_frame(t, f);
        }
    }
    match t.local_frame_launched(f as usize) {
        Some(local) => {
            let launched = grow_local(t, local, launch);
            if launched == Err(CUerror::OUT_OF_MEMORY) {
                // Refused (or the driver had no room): the next launch tries again.
                t.local_frame_seen(f as usize, local, 0);
            }
            launched
        }
        None => launch(),
    }
}

/// `CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES` (cuda.h).
const FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: c_int = 3;

/// Notes `f`'s local frame (bytes per thread), read from the driver, for its first launch.
fn note_local_frame(t: &Tenant, f: CUfunction) {
    if f.is_null() {
        return;
    }
    let mut local: c_int = 0;
    // SAFETY: `local` is a valid out-parameter; `f` is a function the driver just handed out.
    if unsafe { driver::real::cuFuncGetAttribute(&mut local, FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f) }
        .is_ok()
    {
        let default = limit_default(LIMIT_STACK_SIZE) as u64;
        t.local_frame_seen(f as usize, u64::try_from(local).unwrap_or(0), default);
    }
}

/// `cuModuleGetFunction`: the kernel's code loaded (a lazy driver loads it now, [`lookup`]) and
/// its local frame noted for its first launch.
fn module_function(
    func: Out<CUfunction>,
    module: usize,
    name: *const c_char,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    lookup(Overhead::Module, module, name, call)?;
    if let (Some(t), Some(f)) = (tenant(), func.get()) {
        note_local_frame(t, f);
    }
    Ok(())
}

/// `cuKernelGetFunction`: the kernel loaded in the current context ([`load_kernel`]) and the
/// function's local frame noted for its first launch.
fn kernel_function(
    func: Out<CUfunction>,
    kernel: usize,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    load_kernel(kernel, call)?;
    if let (Some(t), Some(f)) = (tenant(), func.get()) {
        note_local_frame(t, f);
    }
    Ok(())
}

/// The first launch of a function whose local frame is `local` bytes per thread. A context whose
/// local memory holds less per thread grows it at the launch for every thread the device can hold
/// resident, and keeps it (cuda.h: `CU_CTX_LMEM_RESIZE_TO_MAX`, "Keep local memory allocation
/// after launch", the default from CUDA 12.9; the per-thread size is the stack size,
/// `CU_LIMIT_STACK_SIZE`). Charged as raising the stack limit to `local` is ([`set_limit`]): what
/// NVIDIA documents it to take (bytes x multiprocessors x resident threads per multiprocessor,
/// beyond the default) is reserved before the launch; a launch the quota has no room for fails
/// with `CUDA_ERROR_OUT_OF_MEMORY` and nothing runs. The launch cannot be undone: what the driver
/// spends beyond the reservation is left to reconciliation.
fn grow_local(t: &'static Tenant, local: u64, launch: impl FnOnce() -> CUresult) -> CUresult {
    let Some((t, device)) = overhead_device(true).filter(|(o, _)| std::ptr::eq(*o, t)) else {
        return launch();
    };
    let mut old: usize = 0;
    // SAFETY: `old` is a valid out-parameter.
    if unsafe { driver::real::cuCtxGetLimit(&mut old, LIMIT_STACK_SIZE) }.is_err() {
        return launch();
    }
    let value = usize::try_from(local).unwrap_or(usize::MAX);
    if value <= old {
        return launch();
    }
    charge_limit(
        t,
        device,
        "local memory growth",
        LIMIT_STACK_SIZE,
        old,
        value,
        launch,
        None::<fn(())>,
    )
}

fn unload(kind: Overhead, handle: usize, call: impl FnOnce() -> CUresult) -> CUresult {
    call()?;
    if let Some(t) = tenant() {
        let charged = t.overhead_of(kind, handle) > 0;
        // Also a lazily loaded library with nothing loaded yet: its pending kernels go.
        t.forget_overhead(kind, handle);
        if charged {
            t.reconcile_all();
        }
    }
    Ok(())
}

/// `CU_LIMIT_STACK_SIZE`, `CU_LIMIT_PRINTF_FIFO_SIZE`, `CU_LIMIT_MALLOC_HEAP_SIZE`.
const LIMIT_STACK_SIZE: c_int = 0;
const LIMIT_PRINTF_FIFO_SIZE: c_int = 1;
const LIMIT_MALLOC_HEAP_SIZE: c_int = 2;

fn set_limit(limit: c_int, value: usize, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some((t, device)) = overhead_device(true) else {
        return call();
    };
    let mut old: usize = 0;
    // SAFETY: `old` is a valid out-parameter.
    if unsafe { driver::real::cuCtxGetLimit(&mut old, limit) }.is_err() {
        // A limit the driver does not know: it answers for itself.
        return call();
    }
    charge_limit(
        t,
        device,
        "cuCtxSetLimit",
        limit,
        old,
        value,
        call,
        Some(|()| {
            // SAFETY: puts back the value this call replaced.
            let _ = unsafe { driver::real::cuCtxSetLimit(limit, old) };
        }),
    )
}

/// Limit `limit` of the current context goes from `old` to `value` in `call`: charged what NVIDIA
/// documents the change to take beyond the default, at least, reserved before `call`.
#[allow(clippy::too_many_arguments)]
fn charge_limit(
    t: &'static Tenant,
    device: &'static Device,
    what: &str,
    limit: c_int,
    old: usize,
    value: usize,
    call: impl FnOnce() -> CUresult,
    undo: Option<impl FnOnce(())>,
) -> CUresult {
    let ctx = t.current_context();
    let current = t.overhead_of(Overhead::Limits, ctx);
    // What NVIDIA documents the change to take: charged at least (a driver may reserve it lazily).
    // The default's memory is the context's (charged with it): only what a value takes beyond the
    // default is the limit's, so a limit lowered below its default and raised again is not charged
    // twice for the default's part.
    let beyond = |v: usize| {
        pages(
            limit_bytes(device.ordinal, limit, v).saturating_sub(limit_bytes(
                device.ordinal,
                limit,
                limit_default(limit),
            )),
        )
    };
    let estimate = i128::from(beyond(value)) - i128::from(beyond(old));
    let ((), charge) = t.charge_measured(
        device,
        what,
        None,
        u64::try_from(estimate.max(0)).unwrap_or(u64::MAX),
        Some(estimate),
        || 0,
        current,
        call,
        undo,
    )?;
    t.record_overhead(Overhead::Limits, ctx, ctx, charge);
    t.reconcile_device(device);
    Ok(())
}

/// The device memory a limit's value takes, as NVIDIA documents the limits: the stack size for every
/// thread the device can hold resident, the heap and the FIFO themselves.
fn limit_bytes(ordinal: CUdevice, limit: c_int, value: usize) -> u64 {
    let value = value as u64;
    match limit {
        LIMIT_STACK_SIZE => {
            let attribute = |a: c_int| {
                let mut v: c_int = 0;
                // SAFETY: `v` is a valid out-parameter.
                let ok = unsafe { driver::real::cuDeviceGetAttribute(&mut v, a, ordinal) }.is_ok();
                if ok {
                    u64::try_from(v).unwrap_or(0)
                } else {
                    0
                }
            };
            // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, _MAX_THREADS_PER_MULTIPROCESSOR.
            value
                .saturating_mul(attribute(16))
                .saturating_mul(attribute(39))
        }
        LIMIT_PRINTF_FIFO_SIZE | LIMIT_MALLOC_HEAP_SIZE => value,
        _ => 0,
    }
}

/// A limit's value in a new context, as NVIDIA documents them (a 1 KiB stack per thread, a 1 MiB
/// printf FIFO, an 8 MiB malloc heap).
fn limit_default(limit: c_int) -> usize {
    match limit {
        LIMIT_STACK_SIZE => 1024,
        LIMIT_PRINTF_FIFO_SIZE => 1 << 20,
        LIMIT_MALLOC_HEAP_SIZE => 8 << 20,
        _ => 0,
    }
}

/// A module image as the driver API takes it: in memory, or a file's path.
#[derive(Clone, Copy)]
enum Image {
    Memory(*const c_void),
    File(*const c_char),
}

/// Most bytes of an in-memory image read to estimate its cost (headers claiming more are not
/// believed: the image is then only measured).
const MAX_IMAGE: u64 = 1 << 32;

impl Image {
    /// The image's size and what its code takes on device `ordinal` ([`gpuslice_api::image`]),
    /// 0 and nothing when it cannot be read.
    fn measure(self, ordinal: CUdevice) -> (u64, gpuslice_api::image::Code) {
        let bytes = match self {
            Image::File(path) => read_file(path),
            Image::Memory(p) => read_image(p.cast(), true),
        };
        let Some(bytes) = bytes else {
            return (0, gpuslice_api::image::Code::default());
        };
        let attribute = |a: c_int| {
            let mut v: c_int = 0;
            // SAFETY: `v` is a valid out-parameter.
            let ok = unsafe { driver::real::cuDeviceGetAttribute(&mut v, a, ordinal) }.is_ok();
            u32::try_from(v).ok().filter(|_| ok)
        };
        // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, _MINOR.
        let code = match (attribute(75), attribute(76)) {
            (Some(major), Some(minor)) => gpuslice_api::image::device_code(&bytes, major, minor),
            _ => gpuslice_api::image::Code::default(),
        };
        (bytes.len() as u64, code)
    }
}

fn read_file(fname: *const c_char) -> Option<Vec<u8>> {
    if fname.is_null() {
        return None;
    }
    // SAFETY: the driver API requires a NUL-terminated path.
    let path = unsafe { CStr::from_ptr(fname) };
    std::fs::read(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path.to_bytes()))
        .ok()
}

/// A copy of the in-memory image at `p`: as far as its headers say (an ELF cubin, a fatbinary, the
/// compiler's wrapper around one followed when `follow`: a wrapper wraps a fatbinary, never another
/// wrapper), else NUL-terminated PTX. Headers are copied with `process_vm_readv`, which fails
/// instead of faulting: a damaged header makes the driver refuse the image, never this library
/// crash the program.
fn read_image(p: *const u8, follow: bool) -> Option<Vec<u8>> {
    if p.is_null() {
        return None;
    }
    let head = copy_own_memory(p, 64).or_else(|| copy_own_memory(p, 16))?;
    let word = u32::from_le_bytes(head.get(..4)?.try_into().ok()?);
    if word == gpuslice_api::image::FATBIN_WRAPPER_MAGIC {
        if !follow {
            return None;
        }
        let data = usize::from_le_bytes(head.get(8..16)?.try_into().ok()?);
        return read_image(data as *const u8, false);
    }
    match gpuslice_api::image::extent(&head) {
        // An ELF or fatbinary header must be there whole.
        Some(_) if head.len() < 64 => None,
        Some(n) if n <= MAX_IMAGE => copy_own_memory(p, usize::try_from(n).ok()?),
        Some(_) => None,
        // SAFETY: anything else is PTX, which the driver API requires to be NUL-terminated.
        None => Some(unsafe { CStr::from_ptr(p.cast()) }.to_bytes().to_vec()),
    }
}

/// `n` bytes at `p` in this process's memory, or `None` where they are not all mapped (or memory
/// for the copy is short). Where a seccomp profile forbids `process_vm_readv`, the bytes are read
/// directly, as the driver itself will: the driver API requires `p` to be a valid image.
fn copy_own_memory(p: *const u8, n: usize) -> Option<Vec<u8>> {
    let mut out: Vec<u8> = Vec::new();
    out.try_reserve_exact(n).ok()?;
    let local = libc::iovec {
        iov_base: out.as_mut_ptr().cast(),
        iov_len: n,
    };
    let remote = libc::iovec {
        iov_base: p as *mut c_void,
        iov_len: n,
    };
    // SAFETY: `local` is `n` bytes of `out`'s reserved capacity; the kernel checks `remote`.
    let copied = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if copied < 0 {
        let errno = std::io::Error::last_os_error().raw_os_error();
        if errno == Some(libc::EPERM) || errno == Some(libc::ENOSYS) {
            // SAFETY: per the driver API, the image's headers say how far it extends.
            out.extend_from_slice(unsafe { std::slice::from_raw_parts(p, n) });
            return Some(out);
        }
    }
    if usize::try_from(copied).ok()? != n {
        return None;
    }
    // SAFETY: the kernel wrote all `n` bytes.
    unsafe { out.set_len(n) };
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One readable page followed by an unmapped one: what a header claiming more than is mapped
    /// would make a direct read fault on.
    fn page_before_a_hole() -> *mut u8 {
        // SAFETY: anonymous private mappings; the second page is unmapped again at once.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            libc::munmap(p.cast::<u8>().add(4096).cast(), 4096);
            p.cast()
        }
    }

    #[test]
    fn a_damaged_image_is_not_read_past_what_is_mapped() {
        let page = page_before_a_hole();
        // SAFETY: the page is 4096 writable bytes.
        let bytes = unsafe { std::slice::from_raw_parts_mut(page, 4096) };
        // An ELF header whose section table would end 1 MiB in: past the mapping.
        bytes[..4].copy_from_slice(b"\x7fELF");
        bytes[0x28..0x30].copy_from_slice(&(1u64 << 20).to_le_bytes());
        assert!(read_image(page, true).is_none());
        // A fatbinary header claiming more than 4 GiB: not believed, nothing read.
        bytes[..4].copy_from_slice(&gpuslice_api::image::FATBIN_MAGIC.to_le_bytes());
        bytes[6..8].copy_from_slice(&16u16.to_le_bytes());
        bytes[8..16].copy_from_slice(&(8u64 << 30).to_le_bytes());
        assert!(read_image(page, true).is_none());
        // A compiler's wrapper pointing at itself: followed once, not for ever.
        bytes[..4].copy_from_slice(&gpuslice_api::image::FATBIN_WRAPPER_MAGIC.to_le_bytes());
        bytes[8..16].copy_from_slice(&(page as usize).to_le_bytes());
        assert!(read_image(page, true).is_none());
        // A header at the very end of the mapping: its 64 bytes are not all there.
        let end = bytes.len() - 16;
        bytes[end..end + 4].copy_from_slice(b"\x7fELF");
        // SAFETY: `end` is within the page.
        assert!(read_image(unsafe { page.add(end) }, true).is_none());
    }

    #[test]
    fn an_image_is_read_as_far_as_its_headers_say() {
        let cubin = include_bytes!("../../tests/fixtures/modules/kernel.sm_80.cubin");
        let fatbin = include_bytes!("../../tests/fixtures/modules/kernel.fatbin");
        assert_eq!(
            read_image(cubin.as_ptr(), true).as_deref(),
            Some(&cubin[..])
        );
        assert_eq!(
            read_image(fatbin.as_ptr(), true).as_deref(),
            Some(&fatbin[..])
        );
        let wrapper: [u64; 3] = [
            u64::from(gpuslice_api::image::FATBIN_WRAPPER_MAGIC) | (1 << 32),
            fatbin.as_ptr() as u64,
            0,
        ];
        let wrapped = read_image(wrapper.as_ptr().cast(), true);
        assert_eq!(wrapped.as_deref(), Some(&fatbin[..]));
        assert_eq!(
            read_image(b"ptx text\0more".as_ptr(), true).as_deref(),
            Some(&b"ptx text"[..])
        );
    }
}
