//! Entry-point lookup: `cuGetProcAddress` (both signatures) and the `dlsym`/`dlvsym` interposer's Rust half.
//!
//! Both ask the real driver (or loader) first and substitute the hook only when the answer is exactly
//! the real function of an entry point gpuslice hooks, so a caller never receives a function whose ABI
//! differs from what it asked for. Anything else is handed back untouched.

use super::{hooks, Out};
use crate::driver::{self, hooked_entry};
use gpuslice_api::entry_points::variants_of;
use gpuslice_api::procaddress;
use gpuslice_api::{CUerror, CUresult};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};

hooks! {
    ret = CUresult;
    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64)
        => get_proc_address(symbol, Out::new(pfn), None, (cuda_version, flags),
                            || real::cuGetProcAddress(symbol, pfn, cuda_version, flags));
    fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64,
                           status: *mut c_int)
        => get_proc_address(symbol, Out::new(pfn), Some(Out::new(status)), (cuda_version, flags),
                            || real::cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, status));
}

/// `status`: the `_v2` entry point's out-parameter; `request`: (CUDA version, flags).
fn get_proc_address(
    symbol: *const c_char,
    pfn: Out<*mut c_void>,
    status: Option<Out<c_int>>,
    request: (c_int, u64),
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    if let Some(answer) = without_driver(symbol, &pfn, status.as_ref(), request) {
        return answer;
    }
    call()?;
    if let (Some(p), false) = (pfn.get(), symbol.is_null()) {
        if !p.is_null() {
            // SAFETY: the driver accepted `symbol` as a NUL-terminated name.
            let name = unsafe { CStr::from_ptr(symbol) };
            pfn.set(substitute(name, p));
        }
    }
    Ok(())
}

/// A drop-in libcuda with no real driver behind it answers lookups as a driver would, with its own
/// exports, each of which fails with `CUDA_ERROR_NOT_INITIALIZED` (the log says why once). A program
/// then learns from its first call that the driver cannot be initialised, rather than that the
/// functions do not exist (NVIDIA's cuda-bindings raised "function cuInit is not found", and the
/// CUDA runtime would report a driver too old). `None`: there is a driver; ask it.
fn without_driver(
    symbol: *const c_char,
    pfn: &Out<*mut c_void>,
    status: Option<&Out<c_int>>,
    (cuda_version, flags): (c_int, u64),
) -> Option<CUresult> {
    if driver::role() != driver::Role::DropinCuda
        || !driver::library_handle(driver::Library::Cuda).is_null()
    {
        return None;
    }
    if symbol.is_null() || pfn.is_null() {
        return Some(Err(CUerror::INVALID_VALUE));
    }
    // SAFETY: a non-NULL C string from the caller, per the API contract.
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    let resolution = procaddress::resolve(name, cuda_version, flags, u32::MAX);
    let Some(found) = resolution.status() else {
        return Some(Err(CUerror::INVALID_VALUE));
    };
    let address = match resolution {
        procaddress::Resolution::Found(entry) => driver::own_export(entry.symbol()),
        _ => std::ptr::null_mut(),
    };
    match status {
        // The 12.x entry point: success, with the outcome in `status` and NULL when not found.
        Some(status) => {
            pfn.set(address);
            status.set(found);
            Some(Ok(()))
        }
        None if address.is_null() => Some(Err(CUerror::NOT_FOUND)),
        None => {
            pfn.set(address);
            Some(Ok(()))
        }
    }
}

/// The hook for the exact variant the real driver resolved `base` to, or `resolved` itself.
fn substitute(base: &CStr, resolved: *mut c_void) -> *mut c_void {
    let Ok(base) = base.to_str() else {
        return resolved;
    };
    let mut hooked_base = false;
    for variant in variants_of(base) {
        if let Some((real, hook)) = hooked_entry(variant.symbol().as_bytes()) {
            hooked_base = true;
            if driver::real(real) == Some(resolved as *const ()) {
                return hook as *mut c_void;
            }
        }
    }
    if hooked_base {
        static WARNED: AtomicBool = AtomicBool::new(false);
        if !WARNED.swap(true, Ordering::Relaxed) {
            crate::log::warn(format_args!(
                "cuGetProcAddress({base}) returned an entry point gpuslice does not know; calls through it are \
                 passed to the driver uncounted"
            ));
        }
    }
    resolved
}

/// For the `dlopen(RTLD_DEEPBIND)` interposer (shim-c/interpose.c): the hook of entry point `name`
/// when `current` (a GOT slot's value) is the real driver's function of that name, else null.
///
/// # Safety
/// `name` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn gpuslice_rebind(name: *const c_char, current: *mut c_void) -> *mut c_void {
    let body = || {
        // SAFETY: the C side passes a NUL-terminated name from a symbol table.
        let name = unsafe { CStr::from_ptr(name) };
        let (real, hook) = hooked_entry(name.to_bytes())?;
        (!current.is_null() && driver::real(real) == Some(current as *const ()))
            .then_some(hook as *mut c_void)
    };
    std::panic::catch_unwind(body)
        .ok()
        .flatten()
        .unwrap_or(std::ptr::null_mut())
}

/// The Rust half of the `dlsym`/`dlvsym` interposer (shim-c/interpose.c), called for names starting with
/// `cu` or `nvml`. Sets `*answered` when it answered the lookup itself; otherwise the C side forwards it.
///
/// # Safety
/// `name` is a NUL-terminated string; `version` is NULL or one; `answered` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn gpuslice_dlsym_hook(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
    answered: *mut c_int,
) -> *mut c_void {
    let body = || {
        // SAFETY: the C side passes the caller's NUL-terminated name.
        let name = unsafe { CStr::from_ptr(name) };
        let (real, hook) = hooked_entry(name.to_bytes())?;
        if handle == libc::RTLD_NEXT {
            // "Next after the caller": for a driver name that is the driver itself.
            return driver::real(real).map(|_| hook as *mut c_void);
        }
        let found = if version.is_null() {
            driver::real_dlsym(handle, name)
        } else {
            // SAFETY: the C side passes the caller's NUL-terminated version string.
            driver::real_dlvsym(handle, name, unsafe { CStr::from_ptr(version) })
        };
        Some(
            if !found.is_null() && driver::real(real) == Some(found as *const ()) {
                hook as *mut c_void
            } else {
                found
            },
        )
    };
    match std::panic::catch_unwind(body) {
        Ok(Some(p)) => {
            // SAFETY: the C side passes a valid out-parameter.
            unsafe { *answered = 1 };
            p
        }
        _ => std::ptr::null_mut(),
    }
}
