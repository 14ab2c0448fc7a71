//! What the dynamic loader has loaded: every object's file name, the file a `dlopen` handle or an
//! address belongs to.
//!
//! Two programs ask this: the preloaded library, while it finds the real driver libraries and checks
//! it is not loading itself, and `gpuslice doctor`'s probe, which reports what a CUDA program started
//! in the caller's environment gets and must therefore not link the preloaded library (its
//! constructor and hooks would change what it sees). Both link this crate. Nothing here allocates
//! except where a `String` is returned, and nothing takes a lock of ours.

use std::ffi::{c_char, c_int, c_void, CStr};

/// Calls `visit` with the file name of each loaded object, in load order (the main program's name is
/// empty, as the loader gives it), until `visit` returns `true`. Returns whether it did.
pub fn any_loaded_object(mut visit: impl FnMut(&CStr) -> bool) -> bool {
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the `&mut dyn FnMut` handed to dl_iterate_phdr below, alive for its call.
        let visit = unsafe { &mut *(data as *mut &mut dyn FnMut(&CStr) -> bool) };
        // SAFETY: the loader hands a valid `dl_phdr_info` for each loaded object.
        let name = unsafe { (*info).dlpi_name };
        if name.is_null() {
            return 0;
        }
        // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
        c_int::from(visit(unsafe { CStr::from_ptr(name) }))
    }
    let mut visit: &mut dyn FnMut(&CStr) -> bool = &mut visit;
    // SAFETY: `each` only reads what the loader hands it and calls `visit`, which outlives the call.
    unsafe {
        libc::dl_iterate_phdr(
            Some(each),
            (&mut visit as *mut &mut dyn FnMut(&CStr) -> bool).cast(),
        ) != 0
    }
}

/// The last component of a path.
pub fn file_name(path: &[u8]) -> &[u8] {
    path.rsplit(|&b| b == b'/').next().unwrap_or(path)
}

/// The file a `dlopen` handle was loaded from (`None` for the main program or an unknown handle).
// The handle is only passed to the loader, which checks it, never dereferenced here.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn handle_path(handle: *mut c_void) -> Option<String> {
    let mut map: *mut c_void = std::ptr::null_mut();
    // SAFETY: dlinfo(RTLD_DI_LINKMAP) writes a `struct link_map *` for a valid handle.
    if unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_LINKMAP,
            (&mut map as *mut *mut c_void).cast(),
        )
    } != 0
        || map.is_null()
    {
        return None;
    }
    // SAFETY: glibc's `struct link_map` starts with l_addr (an address) then l_name (a C string).
    let name = unsafe { *(map as *const *const c_char).add(1) };
    if name.is_null() {
        return None;
    }
    // SAFETY: l_name is a NUL-terminated string owned by the loader.
    let name = unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned();
    (!name.is_empty()).then_some(name)
}

/// The file of the object that holds `addr`.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_c_library_is_among_the_loaded_objects_and_the_visit_stops_when_asked() {
        let mut seen = 0;
        let found = any_loaded_object(|name| {
            seen += 1;
            file_name(name.to_bytes()).starts_with(b"libc.so")
        });
        assert!(found, "libc.so.* not among the loaded objects");
        let mut all = 0;
        assert!(!any_loaded_object(|_| {
            all += 1;
            false
        }));
        assert!(
            seen <= all,
            "the visit went on after `true` ({seen} > {all})"
        );
        assert!(!any_loaded_object(
            |name| file_name(name.to_bytes()).starts_with(b"no-such-object-")
        ));
    }

    #[test]
    fn a_handle_and_an_address_name_the_file_they_belong_to() {
        // SAFETY: RTLD_NOLOAD only looks up libc, which every test binary has loaded.
        let h = unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        assert!(!h.is_null());
        let by_handle = handle_path(h).expect("libc's handle names its file");
        // SAFETY: drops the reference RTLD_NOLOAD took.
        unsafe { libc::dlclose(h) };
        let by_address = object_path(libc::malloc as *const c_void).expect("malloc's object");
        assert!(
            file_name(by_handle.as_bytes()).starts_with(b"libc.so"),
            "{by_handle}"
        );
        assert_eq!(
            std::fs::canonicalize(&by_handle).unwrap(),
            std::fs::canonicalize(&by_address).unwrap()
        );
        assert_eq!(file_name(b"/a/b/libcuda.so.1"), b"libcuda.so.1");
        assert_eq!(file_name(b"libcuda.so.1"), b"libcuda.so.1");
    }
}
