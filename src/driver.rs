//! Finding the real driver and its functions.
//!
//! The real `libcuda.so.1` / `libnvidia-ml.so.1` are found by `GPUSLICE_REAL_LIBCUDA` /
//! `GPUSLICE_REAL_NVML` when set (and nowhere else if that is refused), otherwise the copy the process
//! already loaded (`RTLD_NOLOAD`, when a loaded object has the library's file-name stem), otherwise
//! by the standard name, otherwise in the standard driver locations. This very library (same file, even bind-mounted over the driver's) is never its own
//! driver. Another gpuslice library (one exporting `gpuslice_dlsym_hook`) is skipped by a drop-in
//! library, and accepted by the preloaded one, which then defers to it (see [`deferring`]): every call
//! flows preloaded hook -> drop-in hook -> real driver, counted once. Each hooked entry
//! point's real function is resolved once, lazily, with glibc's own `dlsym` (never our interposer), into
//! a slot with three states: unresolved, missing, or the address.

use gpuslice_loader::handle_path;
use loaded::{file_id, loaded_object_named, own_file};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};

include!(concat!(env!("OUT_DIR"), "/hook_table.rs"));

pub mod calls;
pub mod capture;
#[cfg(test)]
pub mod fake;
pub mod image;
mod loaded;
pub mod measure;
pub mod mig;
pub mod seam;

/// Which real library holds a function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Library {
    Cuda,
    Nvml,
}

impl Library {
    /// The start of the real library's file names (`libcuda.so.1`, `libcuda.so.550.54.15`).
    fn stem(self) -> &'static [u8] {
        match self {
            Library::Cuda => b"libcuda",
            Library::Nvml => b"libnvidia-ml",
        }
    }

    /// The variable that names the real library, and its standard names.
    fn names(self) -> (&'static str, &'static [&'static CStr]) {
        match self {
            Library::Cuda => ("GPUSLICE_REAL_LIBCUDA", CUDA_NAMES),
            Library::Nvml => ("GPUSLICE_REAL_NVML", NVML_NAMES),
        }
    }
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

/// The real function behind a hook if it has been resolved already; `None` when it has not been
/// looked up yet or is missing (the caller then takes [`real`]'s way).
#[inline]
pub fn resolved(which: Real) -> Option<*const ()> {
    match SLOTS[which as usize].load(Ordering::Acquire) {
        UNRESOLVED | MISSING => None,
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

/// The real library's handle (null when it is not to be found). The full search (and its error)
/// happens once per process; after it failed, a call looks only among the libraries the program
/// has loaded since: a dozen `dlopen`s and an error line at every call would help no one.
pub fn library_handle(library: Library) -> *mut c_void {
    static HANDLES: [AtomicPtr<c_void>; 2] = [
        AtomicPtr::new(std::ptr::null_mut()),
        AtomicPtr::new(std::ptr::null_mut()),
    ];
    static SEARCHED: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];
    let slot = &HANDLES[library as usize];
    let h = slot.load(Ordering::Acquire);
    if !h.is_null() {
        return h;
    }
    // Threads racing here may each search (and log): none waits on another, which could be
    // holding the dynamic loader's lock in a library constructor.
    let h = if SEARCHED[library as usize].swap(true, Ordering::AcqRel) {
        loaded_since(library)
    } else {
        open_library(library)
    };
    if !h.is_null() {
        slot.store(h, Ordering::Release);
    }
    h
}

/// The real library if the program loaded it after the search failed (by a path of its own: the
/// loader then answers to the standard name). Never when a path was given: that choice stands.
fn loaded_since(library: Library) -> *mut c_void {
    let (var, names) = library.names();
    if std::env::var_os(var).is_some() {
        return std::ptr::null_mut();
    }
    names
        .iter()
        .map(|name| accept(library, dlopen(name, libc::RTLD_NOW | libc::RTLD_NOLOAD)))
        .find(|h| !h.is_null())
        .unwrap_or(std::ptr::null_mut())
}

fn dlopen(name: &CStr, flags: c_int) -> *mut c_void {
    // SAFETY: `name` is NUL-terminated; dlopen reports failure by NULL.
    unsafe { libc::dlopen(name.as_ptr(), flags) }
}

/// Standard names, then the driver's usual locations (Debian/Ubuntu multiarch, RHEL, NVIDIA's container
/// toolkit and GPU operator, WSL), by absolute path: a drop-in first on the library path answers to the
/// standard name itself.
///
/// The names lie on 16-byte boundaries: the loader compares each with every loaded object's names
/// (`strcmp`, whose instruction count depends on its operands' alignment), so where the compiler
/// happens to place them no longer moves start-up's cost (by about 1,000 instructions between two
/// builds differing elsewhere; docs/BENCHMARKS.md).
static CUDA_NAMES: &[&CStr] = &[aligned(&LIBCUDA_1.0), aligned(&LIBCUDA.0)];
static NVML_NAMES: &[&CStr] = &[aligned(&LIBNVML_1.0), aligned(&LIBNVML.0)];

#[repr(C, align(16))]
struct Aligned<const N: usize>([u8; N]);
static LIBCUDA_1: Aligned<13> = Aligned(*b"libcuda.so.1\0");
static LIBCUDA: Aligned<11> = Aligned(*b"libcuda.so\0");
static LIBNVML_1: Aligned<18> = Aligned(*b"libnvidia-ml.so.1\0");
static LIBNVML: Aligned<16> = Aligned(*b"libnvidia-ml.so\0");

const fn aligned(bytes: &'static [u8]) -> &'static CStr {
    match CStr::from_bytes_with_nul(bytes) {
        Ok(name) => name,
        Err(_) => panic!("a library name is one NUL-terminated string"),
    }
}
const DRIVER_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/usr/lib64",
    "/usr/lib64/nvidia",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
    "/run/nvidia/driver/usr/lib/x86_64-linux-gnu",
    "/run/nvidia/driver/usr/lib64",
    "/usr/lib/wsl/lib",
];

/// What this library is: the preloaded `libgpuslice.so` or one of the drop-in libraries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Preload = 0,
    DropinCuda = 1,
    DropinNvml = 2,
}

static ROLE: AtomicU8 = AtomicU8::new(Role::Preload as u8);
static DEFERRING: AtomicBool = AtomicBool::new(false);

/// Called by a drop-in library's constructor, before any of its exports can run.
pub fn set_role(role: Role) {
    ROLE.store(role as u8, Ordering::Release);
}

pub fn role() -> Role {
    match ROLE.load(Ordering::Acquire) {
        1 => Role::DropinCuda,
        2 => Role::DropinNvml,
        _ => Role::Preload,
    }
}

/// True when this (preloaded) library found a gpuslice drop-in as its CUDA driver: the drop-in
/// enforces, so this library must count and gate nothing (`process::Process::deferring`).
pub fn deferring() -> bool {
    DEFERRING.load(Ordering::Acquire)
}

fn open_library(library: Library) -> *mut c_void {
    let (var, names) = library.names();
    if library == Library::Nvml && role() == Role::DropinCuda {
        // The drop-in libcuda reads the real NVML to measure driver memory. Loaded first by its
        // path, the real library would then answer the program's own dlopen("libnvidia-ml.so.1")
        // (the loader matches loaded objects by soname) and bypass the drop-in NVML: whatever the
        // standard name finds (the drop-in, when deployed) is loaded first and kept.
        let _kept = dlopen(NVML_NAMES[0], libc::RTLD_NOW | libc::RTLD_LOCAL);
    }
    if let Some(path) =
        std::env::var_os(var).and_then(|p| CString::new(p.into_encoded_bytes()).ok())
    {
        // An explicit choice is never second-guessed by a search: refused means no driver.
        let h = accept(library, dlopen(&path, libc::RTLD_NOW | libc::RTLD_LOCAL));
        if h.is_null() {
            crate::log::error(format_args!(
                "{var}={} is not a usable {} (missing, not a library, or gpuslice itself); its calls fail",
                path.to_string_lossy(),
                names[0].to_string_lossy()
            ));
        }
        return h;
    }
    // The copy the process loaded, by any of the names (a later name's copy before loading the first
    // name). Only asked when the process has loaded a file of that stem: a probe that misses searches
    // the library path and opens the file it finds to compare it with the loaded objects (four system
    // calls a name and more), and the `RTLD_LOCAL` open below finds a loaded copy by its name, soname
    // or file all the same.
    if loaded_object_named(library.stem()) {
        for name in names {
            let h = accept(library, dlopen(name, libc::RTLD_NOW | libc::RTLD_NOLOAD));
            if !h.is_null() {
                return h;
            }
        }
    }
    for name in names {
        let h = accept(library, dlopen(name, libc::RTLD_NOW | libc::RTLD_LOCAL));
        if !h.is_null() {
            return h;
        }
    }
    for dir in DRIVER_DIRS {
        let Ok(path) = CString::new(format!("{dir}/{}", names[0].to_string_lossy())) else {
            continue;
        };
        if !std::path::Path::new(path.to_str().unwrap_or_default()).exists() {
            continue;
        }
        let h = accept(library, dlopen(&path, libc::RTLD_NOW | libc::RTLD_LOCAL));
        if !h.is_null() {
            return h;
        }
    }
    if role() != Role::Preload {
        crate::log::error(format_args!(
            "no real {} found (set {var}); its calls fail",
            names[0].to_string_lossy()
        ));
    }
    std::ptr::null_mut()
}

/// This very library -> refused; another gpuslice library -> refused by a drop-in (drop-ins never
/// chain), accepted by the preloaded library, which defers to it; anything else -> accepted.
fn accept(library: Library, handle: *mut c_void) -> *mut c_void {
    if handle.is_null() {
        return handle;
    }
    let refuse = if is_this_library(handle) {
        true
    } else if is_gpuslice(handle) {
        if role() == Role::Preload {
            if library == Library::Cuda {
                DEFERRING.store(true, Ordering::Release);
                crate::log::info(format_args!(
                    "the CUDA driver found is a gpuslice drop-in library: it enforces, this one defers"
                ));
            }
            false
        } else {
            true
        }
    } else {
        false
    };
    if !refuse {
        return handle;
    }
    // SAFETY: `handle` came from dlopen and is closed once (this drops only our reference).
    unsafe { libc::dlclose(handle) };
    std::ptr::null_mut()
}

fn is_gpuslice(handle: *mut c_void) -> bool {
    !real_dlsym(handle, c"gpuslice_dlsym_hook").is_null()
}

/// Whether `handle` is this library: the same loaded object, or the same file (device and inode; a
/// bind mount of it over the driver's path is still the same file).
fn is_this_library(handle: *mut c_void) -> bool {
    let Some(own) = own_file() else {
        return false;
    };
    if with_this_library(|me| me == handle) == Some(true) {
        return true;
    }
    match (handle_path(handle), own.id) {
        (Some(path), _) if path == own.path => true,
        (Some(path), Some(own_id)) => file_id(&path) == Some(own_id),
        _ => false,
    }
}

/// This library's own export `name` (null if it has none).
pub fn own_export(name: &str) -> *mut c_void {
    let Ok(name) = CString::new(name) else {
        return std::ptr::null_mut();
    };
    with_this_library(|me| real_dlsym(me, &name)).unwrap_or(std::ptr::null_mut())
}

/// `f` of this library's dlopen handle (`None` when the loader cannot name it).
fn with_this_library<R>(f: impl FnOnce(*mut c_void) -> R) -> Option<R> {
    let own = own_file()?;
    // SAFETY: the path is NUL-terminated; RTLD_NOLOAD only looks the object up (and takes a reference).
    let me = unsafe { libc::dlopen(own.c_path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if me.is_null() {
        return None;
    }
    let r = f(me);
    // SAFETY: drops the reference just taken (this library stays loaded: it is running).
    unsafe { libc::dlclose(me) };
    Some(r)
}

/// The file the real library was loaded from (for `gpuslice doctor` and logs), if it was found.
pub fn library_path(library: Library) -> Option<String> {
    let h = library_handle(library);
    (!h.is_null()).then(|| handle_path(h)).flatten()
}

/// Typed calls to the real function of every entry point the table marks hooked or called
/// (`real::NAME`), generated by `build.rs` from the table's `signature` column (NVIDIA's prototypes):
/// the one declaration of each; a hook whose parameters differ from it does not compile
/// (the `hooks!` macro checks it).
///
/// Each call is itself an `unsafe extern "C" fn` of the entry point's C type: it stands in for the
/// real function (a value of the very type the real function and our export have), and its parameter
/// list is NVIDIA's C prototype, which is not ours to regroup (`cuLaunchKernel` takes 11).
#[allow(non_snake_case, dead_code)]
pub mod real {
    use gpuslice_api::launch_types::{CUlaunchConfig, CUDA_LAUNCH_PARAMS};
    use gpuslice_api::nvml::*;
    use gpuslice_api::types::*;
    use gpuslice_api::{CUerror, CUresult, NvmlReturn};
    use std::ffi::{c_char, c_int, c_uint, c_void};

    /// Declares one typed call per entry point.
    macro_rules! real_fns {
        (ret = $ret:ty, missing = $missing:expr;
         $( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ); )*) => {
            $(
                /// Calls the real function.
                ///
                /// # Safety
                /// The arguments satisfy the driver API's contract for this entry point.
                #[inline]
                pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                    match $crate::driver::real($crate::driver::Real::$name) {
                        // SAFETY: the slot holds the address the real library exports under this exact
                        // name, whose C signature is the one declared here (NVIDIA's prototype, from
                        // the table).
                        Some(f) => unsafe {
                            let f: unsafe extern "C" fn($($ty),*) -> $ret = std::mem::transmute(f);
                            f($($arg),*)
                        },
                        None => $missing,
                    }
                }
            )*
        };
    }

    include!(concat!(env!("OUT_DIR"), "/real_declarations.rs"));
}
