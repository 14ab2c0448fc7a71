//! Finding the real driver and its functions.
//!
//! The real `libcuda.so.1` / `libnvidia-ml.so.1` are found by `GPUSLICE_REAL_LIBCUDA` /
//! `GPUSLICE_REAL_NVML` when set, otherwise the copy the process already loaded (`RTLD_NOLOAD`), otherwise
//! by the standard name. A library that turns out to be gpuslice itself is refused. Each hooked entry
//! point's real function is resolved once, lazily, with glibc's own `dlsym` (never our interposer), into
//! a slot with three states: unresolved, missing, or the address.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

include!(concat!(env!("OUT_DIR"), "/hook_table.rs"));

/// Which real library holds a function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Library {
    Cuda,
    Nvml,
}

extern "C" {
    /// glibc's dlsym, found without going through our interposer (shim-c/interpose.c).
    fn gpuslice_real_dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void;
    fn gpuslice_real_dlvsym(
        handle: *mut c_void,
        name: *const c_char,
        version: *const c_char,
    ) -> *mut c_void;
}

/// glibc's `dlsym`.
// The handle is opaque to us and validated by the loader, never dereferenced here.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn real_dlsym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    // SAFETY: `name` is NUL-terminated; glibc's dlsym accepts any handle value and reports errors by NULL.
    unsafe { gpuslice_real_dlsym(handle, name.as_ptr()) }
}

/// glibc's `dlvsym`.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn real_dlvsym(handle: *mut c_void, name: &CStr, version: &CStr) -> *mut c_void {
    // SAFETY: both strings are NUL-terminated; glibc's dlvsym reports errors by NULL.
    unsafe { gpuslice_real_dlvsym(handle, name.as_ptr(), version.as_ptr()) }
}

const UNRESOLVED: usize = 0;
const MISSING: usize = 1;

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_SLOT: AtomicUsize = AtomicUsize::new(UNRESOLVED);
static SLOTS: [AtomicUsize; HOOKED_COUNT] = [EMPTY_SLOT; HOOKED_COUNT];

/// The real function behind a hook, or `None` when the real library lacks it (or is absent).
#[inline]
pub fn real(which: Real) -> Option<*const ()> {
    match SLOTS[which as usize].load(Ordering::Acquire) {
        UNRESOLVED => resolve(which),
        MISSING => None,
        addr => Some(addr as *const ()),
    }
}

#[cold]
fn resolve(which: Real) -> Option<*const ()> {
    let (name, library) = HOOKED[which as usize];
    let handle = library_handle(library);
    let addr = if handle.is_null() {
        std::ptr::null_mut()
    } else {
        real_dlsym(handle, name)
    };
    if addr.is_null() {
        // A library that is not there yet may be loaded later: stay unresolved unless it is loaded.
        if !handle.is_null() {
            SLOTS[which as usize].store(MISSING, Ordering::Release);
        }
        return None;
    }
    SLOTS[which as usize].store(addr as usize, Ordering::Release);
    Some(addr as *const ())
}

/// The real library's handle (null when it is not to be found).
pub fn library_handle(library: Library) -> *mut c_void {
    static HANDLES: [AtomicPtr<c_void>; 2] = [
        AtomicPtr::new(std::ptr::null_mut()),
        AtomicPtr::new(std::ptr::null_mut()),
    ];
    let slot = &HANDLES[library as usize];
    let h = slot.load(Ordering::Acquire);
    if !h.is_null() {
        return h;
    }
    let h = open_library(library);
    if !h.is_null() {
        slot.store(h, Ordering::Release);
    }
    h
}

fn dlopen(name: &CStr, flags: c_int) -> *mut c_void {
    // SAFETY: `name` is NUL-terminated; dlopen reports failure by NULL.
    unsafe { libc::dlopen(name.as_ptr(), flags) }
}

/// Standard names, then the Debian/Ubuntu/RHEL driver locations.
const CUDA_NAMES: &[&CStr] = &[c"libcuda.so.1", c"libcuda.so"];
const NVML_NAMES: &[&CStr] = &[c"libnvidia-ml.so.1", c"libnvidia-ml.so"];

fn open_library(library: Library) -> *mut c_void {
    let (var, names) = match library {
        Library::Cuda => ("GPUSLICE_REAL_LIBCUDA", CUDA_NAMES),
        Library::Nvml => ("GPUSLICE_REAL_NVML", NVML_NAMES),
    };
    if let Some(path) =
        std::env::var_os(var).and_then(|p| CString::new(p.into_encoded_bytes()).ok())
    {
        return accept(dlopen(&path, libc::RTLD_NOW | libc::RTLD_LOCAL));
    }
    for name in names {
        let h = accept(dlopen(name, libc::RTLD_NOW | libc::RTLD_NOLOAD));
        if !h.is_null() {
            return h;
        }
    }
    for name in names {
        let h = accept(dlopen(name, libc::RTLD_NOW | libc::RTLD_LOCAL));
        if !h.is_null() {
            return h;
        }
    }
    std::ptr::null_mut()
}

/// Refuses a handle whose library is gpuslice itself (a drop-in copy first on the library path).
fn accept(handle: *mut c_void) -> *mut c_void {
    if handle.is_null() || !is_self(handle) {
        return handle;
    }
    // SAFETY: `handle` came from dlopen and is closed once.
    unsafe { libc::dlclose(handle) };
    std::ptr::null_mut()
}

fn is_self(handle: *mut c_void) -> bool {
    let probe = real_dlsym(handle, c"gpuslice_dlsym_hook");
    !probe.is_null()
}

/// The path of the object that holds `addr` (for `gpuslice doctor` and logs).
// `addr` is only looked up in the loader's tables, never dereferenced.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn object_path(addr: *const c_void) -> Option<String> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only reads `addr` as a number and fills `info`.
    let found = unsafe { libc::dladdr(addr, info.as_mut_ptr()) } != 0;
    // SAFETY: zero-initialised and filled by dladdr when found.
    let info = unsafe { info.assume_init() };
    if !found || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    Some(
        unsafe { CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned(),
    )
}
