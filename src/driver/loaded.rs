//! What the loader has loaded: this library's own file, and whether an object of a given name is
//! loaded (both asked while the real libraries are found, `super::open_library`).

use std::ffi::{c_void, CString};

/// Whether the process has loaded an object whose file name starts with `stem`.
pub(super) fn loaded_object_named(stem: &[u8]) -> bool {
    gpuslice_loader::any_loaded_object(|name| {
        gpuslice_loader::file_name(name.to_bytes()).starts_with(stem)
    })
}

/// This library's file as the loader names it, and its (device, inode).
pub(super) struct OwnFile {
    pub path: String,
    pub c_path: CString,
    pub id: Option<(u64, u64)>,
}

/// [`OwnFile`], found once per process (a `dladdr` and a `stat`): both real libraries are checked
/// against it at start-up, and `cuGetProcAddress` looks its exports up by it. Found without holding
/// a lock (`dladdr` takes the loader's lock, which a thread in a library constructor may hold while
/// it waits here); threads racing on the first call each find it, one is kept.
pub(super) fn own_file() -> Option<&'static OwnFile> {
    static OWN: std::sync::OnceLock<Option<OwnFile>> = std::sync::OnceLock::new();
    if let Some(own) = OWN.get() {
        return own.as_ref();
    }
    let found = gpuslice_loader::object_path(own_file as *const c_void).and_then(|path| {
        Some(OwnFile {
            c_path: CString::new(path.as_str()).ok()?,
            id: file_id(&path),
            path,
        })
    });
    let _ = OWN.set(found);
    OWN.get().and_then(Option::as_ref)
}

pub(super) fn file_id(path: &str) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn loaded_objects_are_found_by_the_start_of_their_file_name() {
        // Every test process has the C library loaded (`libc.so.6`), and nothing of this name.
        assert!(super::loaded_object_named(b"libc.so"));
        assert!(!super::loaded_object_named(b"libgpuslice-no-such-object"));
    }

    #[test]
    fn own_file_is_the_object_holding_this_code() {
        // In a unit test the code is the test executable's.
        let own = super::own_file().expect("dladdr names this object");
        assert_eq!(
            own.id,
            super::file_id("/proc/self/exe"),
            "{} is not this executable",
            own.path
        );
        assert_eq!(own.c_path.to_str().ok(), Some(own.path.as_str()));
        assert!(std::ptr::eq(own, super::own_file().unwrap()), "found once");
    }
}
