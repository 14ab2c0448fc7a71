//! Driver overhead: contexts, module code and context limits take device memory the program never
//! asked `cuMemAlloc` for. Each is charged what the driver spent on it (measured, see
//! `accounting::overhead`), returned when the object goes: a created context when destroyed, a
//! primary context on its last release or reset, a module or library when unloaded or its context
//! destroyed, a limit when changed back or its context destroyed.

use super::{hooks, Out};
use crate::accounting::limits::{LimitChange, LIMIT_STACK_SIZE};
use crate::accounting::overhead::Overhead;
use crate::accounting::{tenant, Device, Tenant};
use crate::driver::calls as driver;
use crate::driver::image::Image;
use crate::scheduling;
use gpuslice_api::types::{
    CUcontext, CUctxCreateParams, CUdevice, CUexecAffinityParam, CUgreenCtx, CUlibrary, CUmodule,
};
use gpuslice_api::CUresult;
use std::ffi::{c_char, c_int, c_uint, c_void};

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

fn unload(kind: Overhead, handle: usize, call: impl FnOnce() -> CUresult) -> CUresult {
    call()?;
    if let Some(t) = tenant() {
        t.unload_code_object(kind, handle);
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
    )?;
    if limit == LIMIT_STACK_SIZE {
        // The context's local memory is now sized by this stack (as the driver rounded it): a
        // larger frame's launch grows it again.
        let set = t.driver().context_limit(limit).unwrap_or(value);
        t.local_memory_holds(t.current_context(), set as u64, true);
    }
    Ok(())
}
