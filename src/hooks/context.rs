//! Driver overhead: contexts, module code and context limits take device memory the program never
//! asked `cuMemAlloc` for. Each is charged what the driver spent on it (measured, see
//! `accounting::overhead`), returned when the object goes: a created context when destroyed, a
//! primary context on its last release or reset, a module or library when unloaded or its context
//! destroyed, a limit when changed back or its context destroyed.

use super::{hooks, Out};
use crate::accounting::limits::{limit_default, LimitChange, LIMIT_STACK_SIZE};
use crate::accounting::overhead::Overhead;
use crate::accounting::{tenant, Device, Tenant};
use crate::driver::calls as driver;
use crate::driver::image::Image;
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
    Some((t, t.overhead_device(need_context)?))
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

/// A module or library loaded from `image` (`accounting::modules`).
fn load<H>(
    kind: Overhead,
    handle: Out<*mut H>,
    image: Image,
    call: impl FnOnce() -> CUresult,
    unload: impl FnOnce(*mut H),
) -> CUresult {
    let Some((t, device)) = overhead_device(kind == Overhead::Module) else {
        return call();
    };
    if handle.is_null() {
        return call();
    }
    let code = image.measure(device.ordinal);
    let call = || {
        call()?;
        Ok(handle.get().unwrap_or(std::ptr::null_mut()))
    };
    t.load_code_object(device, kind, code, call, |h| h as usize, unload)
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

/// The driver loads `kernel`'s code of lazily loaded module or library `handle`
/// (`accounting::modules`).
fn load_code(
    t: &'static Tenant,
    kind: Overhead,
    handle: usize,
    kernel: &[u8],
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    t.load_lazy_code(kind, handle, kernel, call)
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
/// report. Later launches in the same context take the fast path (`first_launch::pending` is
/// false there); a launch in another context loads (and is charged) the code again.
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
    let Some(old) = t.driver().context_limit(LIMIT_STACK_SIZE) else {
        return launch();
    };
    let value = usize::try_from(local).unwrap_or(usize::MAX);
    if value <= old {
        return launch();
    }
    let change = LimitChange {
        what: "local memory growth",
        limit: LIMIT_STACK_SIZE,
        old,
        value,
    };
    t.change_limit(device, change, launch, None::<fn(())>)
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

fn set_limit(limit: c_int, value: usize, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some((t, device)) = overhead_device(true) else {
        return call();
    };
    let Some(old) = t.driver().context_limit(limit) else {
        // A limit the driver does not know: it answers for itself.
        return call();
    };
    let change = LimitChange {
        what: "cuCtxSetLimit",
        limit,
        old,
        value,
    };
    t.change_limit(
        device,
        change,
        call,
        Some(|()| {
            // SAFETY: puts back the value this call replaced.
            let _ = unsafe { driver::real::cuCtxSetLimit(limit, old) };
        }),
    )
}
