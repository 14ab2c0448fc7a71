//! The thin system-call wrappers under the trusted walk and the file operations: each works on a
//! descriptor (or relative to one) and reports the OS error as it is.

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

pub(super) fn cstr(name: &OsStr) -> Result<CString, String> {
    CString::new(name.as_bytes()).map_err(|_| format!("{name:?}: a name holding a NUL byte"))
}

pub(super) fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

pub(super) fn geteuid() -> u32 {
    // SAFETY: no arguments; cannot fail.
    unsafe { libc::geteuid() }
}

pub(super) fn fstat(fd: &OwnedFd) -> std::io::Result<libc::stat> {
    // SAFETY: a zeroed stat is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a pointer to a stat we own.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(errno());
    }
    Ok(st)
}

pub(super) fn fstatat_nofollow(dir: &OwnedFd, name: &CStr) -> std::io::Result<libc::stat> {
    // SAFETY: as in `fstat`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor, a NUL-terminated name, a stat we own.
    if unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    } != 0
    {
        return Err(errno());
    }
    Ok(st)
}

pub(super) fn openat(
    dir: libc::c_int,
    name: &CStr,
    flags: i32,
    mode: u32,
) -> std::io::Result<OwnedFd> {
    // SAFETY: a descriptor (or AT_FDCWD) and a NUL-terminated name; the result is checked.
    let fd = unsafe {
        libc::openat(
            dir,
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: a descriptor just returned to us, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(super) fn random_u64() -> u64 {
    let mut v = 0u64;
    // SAFETY: writes at most 8 bytes into `v`.
    let n = unsafe { libc::getrandom((&mut v as *mut u64).cast(), 8, libc::GRND_NONBLOCK) };
    if n != 8 {
        // Without entropy: the time and our pid (the temporary is still created exclusively).
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        v = t ^ (u64::from(std::process::id()) << 40);
    }
    v
}

pub(super) fn readlinkat(dir: &OwnedFd, name: &CStr) -> std::io::Result<PathBuf> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: a valid descriptor, a NUL-terminated name, a buffer of the length given.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(errno());
    }
    buf.truncate(n as usize);
    Ok(PathBuf::from(OsStr::from_bytes(&buf)))
}

/// `fchown`/`fchmod` on a descriptor, only where the values differ.
pub(super) fn fix_fd(
    fd: &OwnedFd,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
) -> std::io::Result<()> {
    let st = fstat(fd)?;
    let want_uid = uid.filter(|u| *u != st.st_uid);
    let want_gid = gid.filter(|g| *g != st.st_gid);
    if want_uid.is_some() || want_gid.is_some() {
        // SAFETY: a valid descriptor; u32::MAX (-1) leaves a field as it is.
        if unsafe {
            libc::fchown(
                fd.as_raw_fd(),
                want_uid.unwrap_or(u32::MAX),
                want_gid.unwrap_or(u32::MAX),
            )
        } != 0
        {
            return Err(errno());
        }
    }
    // After fchown, which clears set-id bits (so the mode is read again).
    let st = if want_uid.is_some() || want_gid.is_some() {
        fstat(fd)?
    } else {
        st
    };
    if let Some(m) = mode.filter(|m| *m != st.st_mode & 0o7777) {
        // SAFETY: a valid descriptor.
        if unsafe { libc::fchmod(fd.as_raw_fd(), m as libc::mode_t) } != 0 {
            return Err(errno());
        }
    }
    Ok(())
}

pub(super) fn list(fd: &OwnedFd) -> std::io::Result<Vec<String>> {
    let dup = openat(fd.as_raw_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    let raw = dup.as_raw_fd();
    // SAFETY: a valid directory descriptor, whose ownership passes to the stream.
    let dirp = unsafe { libc::fdopendir(raw) };
    if dirp.is_null() {
        return Err(errno());
    }
    std::mem::forget(dup);
    let mut out = Vec::new();
    loop {
        // SAFETY: a stream from fdopendir, not yet closed.
        let ent = unsafe { libc::readdir(dirp) };
        if ent.is_null() {
            break;
        }
        // SAFETY: readdir returned a valid entry whose name is NUL-terminated.
        let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) };
        let b = name.to_bytes();
        if b != b"." && b != b".." {
            out.push(String::from_utf8_lossy(b).into_owned());
        }
    }
    // SAFETY: closes the stream (and its descriptor) once.
    unsafe { libc::closedir(dirp) };
    Ok(out)
}

pub(super) fn remove_tree_at(parent: &OwnedFd, name: &str, depth: u32) -> std::io::Result<()> {
    let c = CString::new(name).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    if depth > 16 {
        return Err(std::io::Error::other("too deep"));
    }
    let st = match fstatat_nofollow(parent, &c) {
        Ok(st) => st,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
        Err(e) => return Err(e),
    };
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        let fd = openat(
            parent.as_raw_fd(),
            &c,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )?;
        for n in list(&fd)? {
            remove_tree_at(&fd, &n, depth + 1)?;
        }
        // SAFETY: a valid descriptor and a NUL-terminated name.
        if unsafe { libc::unlinkat(parent.as_raw_fd(), c.as_ptr(), libc::AT_REMOVEDIR) } != 0 {
            return Err(errno());
        }
    } else {
        // SAFETY: as above; removes the name, never what a link names.
        if unsafe { libc::unlinkat(parent.as_raw_fd(), c.as_ptr(), 0) } != 0 {
            let e = errno();
            if e.raw_os_error() != Some(libc::ENOENT) {
                return Err(e);
            }
        }
    }
    Ok(())
}
