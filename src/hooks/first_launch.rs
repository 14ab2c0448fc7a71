//! Functions whose first launch makes the driver spend memory (`accounting::first_launch`): a
//! lazily loaded module's or library's kernel, whose code the driver loads at its lookup
//! (`cuModuleGetFunction`, `cuKernelGetFunction`) or first launch, and a function whose local frame
//! is larger than what a context's local memory holds, whose first launch there grows it.

use super::{hooks, Out};
use crate::accounting::limits::{limit_default, LIMIT_STACK_SIZE};
use crate::accounting::overhead::Overhead;
use crate::accounting::{tenant, Tenant};
use crate::driver::calls as driver;
use gpuslice_api::types::{CUfunction, CUkernel, CUlibrary, CUmodule};
use gpuslice_api::{CUerror, CUresult};
use std::ffi::{c_char, c_int, CStr};

hooks! {
    ret = CUresult;
    fn cuModuleGetFunction(hfunc: *mut CUfunction, hmod: CUmodule, name: *const c_char)
        => module_function(Out::new(hfunc), hmod as usize, name, || real::cuModuleGetFunction(hfunc, hmod, name));
    fn cuLibraryGetKernel(kernel: *mut CUkernel, library: CUlibrary, name: *const c_char)
        => get_kernel(Out::new(kernel), library as usize, name, || real::cuLibraryGetKernel(kernel, library, name));
    fn cuKernelGetFunction(func: *mut CUfunction, kernel: CUkernel)
        => kernel_function(Out::new(func), kernel as usize, || real::cuKernelGetFunction(func, kernel));
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
            if !t.lazy_kernel_got(library, k as usize, name) {
                // Loaded already (an eagerly loaded library): its frame can be read now.
                note_kernel_frame(t, k);
            }
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
/// A function whose local frame is larger than what the context's local memory holds then grows
/// it at this launch (`Tenant::launch_growing_local`), in each context it is launched in.
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
    t.launch_growing_local(f as usize, launch)
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

/// Notes library kernel `k`'s local frame on the current context's device
/// (`cuKernelGetAttribute`, which NVIDIA documents for a `CUkernel`), for its first launch in
/// each context.
fn note_kernel_frame(t: &Tenant, k: CUkernel) {
    let Ok(device) = t.current_device() else {
        return;
    };
    let mut local: c_int = 0;
    // SAFETY: `local` is a valid out-parameter; `k` is a kernel the driver just handed out.
    let asked = unsafe {
        driver::real::cuKernelGetAttribute(
            &mut local,
            FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
            k,
            device.ordinal,
        )
    };
    if asked.is_ok() {
        let default = limit_default(LIMIT_STACK_SIZE) as u64;
        t.local_frame_seen(k as usize, u64::try_from(local).unwrap_or(0), default);
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
