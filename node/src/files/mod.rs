//! Files and directories root writes on a node where tenants write too.
//!
//! Everything goes through directory descriptors (the model: systemd-tmpfiles and runc):
//!
//! - A directory is reached by walking its path one component at a time from `/` (or the working
//!   directory) with `openat(O_DIRECTORY|O_NOFOLLOW)`. Every directory met must be *trusted*: owned
//!   by root (or by us) and writable by nobody else, or sticky (`/tmp`), where the next entry must be
//!   ours in turn. A symbolic link is followed only where it lies in a trusted, non-sticky directory
//!   (`/var/run -> /run`), or is ours in a sticky one, so nothing another user can plant is ever
//!   followed. A directory root writes into must be trusted and not sticky.
//! - Files are created under an unpredictable temporary name with `O_CREAT|O_EXCL|O_NOFOLLOW`
//!   (`O_TMPFILE` first where the filesystem has it), changed with `fchmod`/`fchown` on their
//!   descriptor, and published with `renameat`/`renameat2` relative to the directory descriptor.
//! - Existing files are opened with `O_NOFOLLOW|O_NONBLOCK` and their type checked on the descriptor
//!   before anything is changed.
//!
//! `openat2(RESOLVE_NO_SYMLINKS)` is not used: the node must follow the distribution's own links
//! (`/var/run`), which the walk allows only where no other user could have made them.

use std::ffi::{CStr, CString, OsStr};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Temporary names start with this (and end with `.tmp`): `sweep_temporaries` knows them.
const TMP_PREFIX: &str = ".gs-";

/// A directory opened by a trusted walk: every operation is relative to its descriptor.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

fn cstr(name: &OsStr) -> Result<CString, String> {
    CString::new(name.as_bytes()).map_err(|_| format!("{name:?}: a name holding a NUL byte"))
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn geteuid() -> u32 {
    // SAFETY: no arguments; cannot fail.
    unsafe { libc::geteuid() }
}

fn fstat(fd: &OwnedFd) -> std::io::Result<libc::stat> {
    // SAFETY: a zeroed stat is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a pointer to a stat we own.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(errno());
    }
    Ok(st)
}

fn fstatat_nofollow(dir: &OwnedFd, name: &CStr) -> std::io::Result<libc::stat> {
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

fn openat(dir: libc::c_int, name: &CStr, flags: i32, mode: u32) -> std::io::Result<OwnedFd> {
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

/// Owned by root or by us.
fn ours(st: &libc::stat) -> bool {
    st.st_uid == 0 || st.st_uid == geteuid()
}

/// Why a directory is not trusted, if it is not: another owner, or writable by others without the
/// sticky bit. `for_writing`: the sticky exception does not apply (others could plant names).
fn distrust(st: &libc::stat, for_writing: bool) -> Option<String> {
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Some("not a directory".into());
    }
    if !ours(st) {
        return Some(format!("owned by uid {} (neither root nor us)", st.st_uid));
    }
    let others_write = st.st_mode & 0o022 != 0;
    let sticky = st.st_mode & libc::S_ISVTX != 0;
    if others_write && (for_writing || !sticky) {
        return Some(format!(
            "writable by others (mode {:04o})",
            st.st_mode & 0o7777
        ));
    }
    None
}

fn random_u64() -> u64 {
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

/// `Some((0, 0))` when we are root (files root writes are root's), else `None` (unit tests).
pub fn root_owned() -> Option<(u32, u32)> {
    (geteuid() == 0).then_some((0, 0))
}

/// An unpredictable temporary name for `final_name` in its directory.
pub fn temporary_name(final_name: &str) -> String {
    let short: String = final_name.chars().take(40).collect();
    format!("{TMP_PREFIX}{short}.{:016x}.tmp", random_u64())
}

impl Dir {
    /// Opens the directory at `path` by a trusted walk (see the module's documentation); refuses a
    /// path through anything another user could have changed.
    pub fn open(path: &Path) -> Result<Dir, String> {
        Self::walk(path, false).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// As [`Dir::open`], creating missing directories (root-owned, 0755 less the umask) on the way.
    pub fn open_or_create(path: &Path) -> Result<Dir, String> {
        Self::walk(path, true).map_err(|e| format!("{}: {e}", path.display()))
    }

    fn walk(path: &Path, create: bool) -> Result<Dir, String> {
        let start = if path.is_absolute() { c"/" } else { c"." };
        let mut cur = openat(libc::AT_FDCWD, start, libc::O_PATH | libc::O_DIRECTORY, 0)
            .map_err(|e| e.to_string())?;
        let st = fstat(&cur).map_err(|e| e.to_string())?;
        if let Some(why) = distrust(&st, false) {
            return Err(format!("{}: {why}", start.to_string_lossy()));
        }
        let mut todo: Vec<PathBuf> = path
            .components()
            .rev()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(PathBuf::from(n)),
                Component::ParentDir => Some(PathBuf::from("..")),
                _ => None,
            })
            .collect();
        let mut links = 0;
        let mut sticky_parent = st.st_mode & libc::S_ISVTX != 0;
        while let Some(name) = todo.pop() {
            let c = cstr(name.as_os_str())?;
            let opened = openat(
                cur.as_raw_fd(),
                &c,
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                0,
            );
            let next = match opened {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) && create => {
                    // SAFETY: a valid descriptor and a NUL-terminated name.
                    if unsafe { libc::mkdirat(cur.as_raw_fd(), c.as_ptr(), 0o755) } != 0 {
                        let e = errno();
                        if e.raw_os_error() != Some(libc::EEXIST) {
                            return Err(format!("creating {}: {e}", name.display()));
                        }
                    }
                    todo.push(name);
                    continue;
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) => {
                    // A link (or not a directory at all): followed only where nobody else made it.
                    let st = fstatat_nofollow(&cur, &c).map_err(|e| e.to_string())?;
                    if st.st_mode & libc::S_IFMT != libc::S_IFLNK {
                        return Err(format!("{} is not a directory", name.display()));
                    }
                    if sticky_parent && !ours(&st) {
                        return Err(format!(
                            "{} is a link owned by uid {} in a shared directory: not followed",
                            name.display(),
                            st.st_uid
                        ));
                    }
                    links += 1;
                    if links > 40 {
                        return Err("too many links".into());
                    }
                    let target = readlinkat(&cur, &c).map_err(|e| e.to_string())?;
                    if target.is_absolute() {
                        cur = openat(libc::AT_FDCWD, c"/", libc::O_PATH | libc::O_DIRECTORY, 0)
                            .map_err(|e| e.to_string())?;
                    }
                    for comp in target.components().rev() {
                        match comp {
                            Component::Normal(n) => todo.push(PathBuf::from(n)),
                            Component::ParentDir => todo.push(PathBuf::from("..")),
                            _ => {}
                        }
                    }
                    continue;
                }
                Err(e) => return Err(format!("{}: {e}", name.display())),
            };
            let st = fstat(&next).map_err(|e| e.to_string())?;
            if let Some(why) = distrust(&st, false) {
                return Err(format!("{} is {why}", name.display()));
            }
            sticky_parent = st.st_mode & libc::S_ISVTX != 0;
            cur = next;
        }
        // Reopened for reading (fchown/fchmod and listing need more than O_PATH).
        let fd =
            openat(cur.as_raw_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap_or(cur);
        let st = fstat(&fd).map_err(|e| e.to_string())?;
        if let Some(why) = distrust(&st, true) {
            return Err(format!("not a directory root may write into: {why}"));
        }
        Ok(Dir {
            fd,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Owner, group and mode of the directory, set on its descriptor where they differ.
    pub fn fix(&self, uid: Option<u32>, gid: Option<u32>, mode: Option<u32>) -> Result<(), String> {
        fix_fd(&self.fd, uid, gid, mode).map_err(|e| format!("{}: {e}", self.path.display()))
    }

    /// The subdirectory `name`, created (`mode`, owner root, group `gid`) when missing; an existing
    /// one must be a directory (not a link) and is given that owner, group and mode. `exclusive`:
    /// an existing one is an error (`AlreadyExists`).
    pub fn subdir(&self, name: &str, gid: u32, mode: u32, exclusive: bool) -> Result<Dir, String> {
        let c = cstr(OsStr::new(name))?;
        let path = self.path.join(name);
        let at = |e: std::io::Error| format!("{}: {e}", path.display());
        // SAFETY: a valid descriptor and a NUL-terminated name.
        if unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), 0o700) } != 0 {
            let e = errno();
            if exclusive || e.raw_os_error() != Some(libc::EEXIST) {
                return Err(at(e));
            }
        }
        let fd = openat(
            self.fd.as_raw_fd(),
            &c,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )
        .map_err(at)?;
        fix_fd(&fd, Some(0), Some(gid), Some(mode)).map_err(at)?;
        Ok(Dir { fd, path })
    }

    /// The existing subdirectory `name`, not through a link, trusted for writing.
    pub fn open_subdir(&self, name: &str) -> Result<Dir, String> {
        let c = cstr(OsStr::new(name))?;
        let path = self.path.join(name);
        let fd = openat(
            self.fd.as_raw_fd(),
            &c,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )
        .map_err(|e| format!("{}: {e}", path.display()))?;
        let st = fstat(&fd).map_err(|e| format!("{}: {e}", path.display()))?;
        if let Some(why) = distrust(&st, true) {
            return Err(format!("{}: {why}", path.display()));
        }
        Ok(Dir { fd, path })
    }

    /// Writes `bytes` as `name` atomically: a new file under an unpredictable name (never an
    /// existing one, never through a link), `mode` (and `owner`) set on its descriptor, synced,
    /// then renamed over `name`. A reader sees the old file or the new one, never a part.
    pub fn write_file(
        &self,
        name: &str,
        bytes: &[u8],
        mode: u32,
        owner: Option<(u32, u32)>,
    ) -> Result<(), String> {
        let path = self.path.join(name);
        let final_c = cstr(OsStr::new(name))?;
        let tmp = temporary_name(name);
        let tmp_c = cstr(OsStr::new(&tmp))?;
        let result = (|| -> std::io::Result<()> {
            let fd = openat(
                self.fd.as_raw_fd(),
                &tmp_c,
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
                0o600,
            )?;
            let (uid, gid) = owner.map_or((None, None), |(u, g)| (Some(u), Some(g)));
            fix_fd(&fd, uid, gid, Some(mode))?;
            let mut f = std::fs::File::from(fd);
            f.write_all(bytes)?;
            f.sync_all()?;
            // SAFETY: a valid descriptor, two NUL-terminated names relative to it.
            if unsafe {
                libc::renameat(
                    self.fd.as_raw_fd(),
                    tmp_c.as_ptr(),
                    self.fd.as_raw_fd(),
                    final_c.as_ptr(),
                )
            } != 0
            {
                return Err(errno());
            }
            Ok(())
        })();
        result.map_err(|e| {
            self.unlink(&tmp_c);
            format!("writing {}: {e}", path.display())
        })
    }

    fn unlink(&self, name: &CStr) {
        // SAFETY: a valid descriptor and a NUL-terminated name; never follows a link.
        unsafe { libc::unlinkat(self.fd.as_raw_fd(), name.as_ptr(), 0) };
    }

    /// Opens the existing regular file `name` (no link, no FIFO or device) for reading, or
    /// reading and writing.
    pub fn open_file(&self, name: &str, write: bool) -> Result<std::fs::File, String> {
        let c = cstr(OsStr::new(name))?;
        let path = self.path.join(name);
        let flags = if write { libc::O_RDWR } else { libc::O_RDONLY };
        let fd = openat(
            self.fd.as_raw_fd(),
            &c,
            flags | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
            0,
        )
        .map_err(|e| format!("{}: {e}", path.display()))?;
        let st = fstat(&fd).map_err(|e| format!("{}: {e}", path.display()))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(format!("{}: not a regular file", path.display()));
        }
        Ok(std::fs::File::from(fd))
    }

    /// The regular file `name`, created empty when missing (never through a link, never a FIFO or
    /// device), with this owner, group and mode set on its descriptor.
    pub fn create_file(
        &self,
        name: &str,
        uid: u32,
        gid: u32,
        mode: u32,
    ) -> Result<std::fs::File, String> {
        let c = cstr(OsStr::new(name))?;
        let path = self.path.join(name);
        let at = |e: std::io::Error| format!("{}: {e}", path.display());
        let fd = openat(
            self.fd.as_raw_fd(),
            &c,
            libc::O_RDONLY | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
            0o600,
        )
        .map_err(at)?;
        let st = fstat(&fd).map_err(at)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(format!("{}: not a regular file", path.display()));
        }
        fix_fd(&fd, Some(uid), Some(gid), Some(mode)).map_err(at)?;
        Ok(std::fs::File::from(fd))
    }

    /// Owner, group and mode of the existing regular file `name`, set on its descriptor.
    pub fn fix_file(&self, name: &str, uid: u32, gid: u32, mode: u32) -> Result<(), String> {
        let f = self.open_file(name, false)?;
        fix_fd(&OwnedFd::from(f), Some(uid), Some(gid), Some(mode))
            .map_err(|e| format!("{}: {e}", self.path.join(name).display()))
    }

    /// Renames `from` (here) to `to` in `dir` unless `to` exists (`AlreadyExists`).
    pub fn rename_noreplace(&self, from: &str, dir: &Dir, to: &str) -> std::io::Result<()> {
        let (f, t) = (
            CString::new(from).map_err(|_| std::io::ErrorKind::InvalidInput)?,
            CString::new(to).map_err(|_| std::io::ErrorKind::InvalidInput)?,
        );
        // SAFETY: valid descriptors and NUL-terminated names relative to them.
        let rc = unsafe {
            libc::renameat2(
                self.fd.as_raw_fd(),
                f.as_ptr(),
                dir.fd.as_raw_fd(),
                t.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(errno())
        }
    }

    /// Points the symbolic link `name` at `target`: a new link under an unpredictable name, renamed
    /// over `name`.
    pub fn replace_with_symlink(&self, name: &str, target: &str) -> Result<(), String> {
        let tmp = temporary_name(name);
        let (t, tmp_c, name_c) = (
            cstr(OsStr::new(target))?,
            cstr(OsStr::new(&tmp))?,
            cstr(OsStr::new(name))?,
        );
        // SAFETY: NUL-terminated strings and a valid descriptor; symlinkat never follows a link.
        let made = unsafe { libc::symlinkat(t.as_ptr(), self.fd.as_raw_fd(), tmp_c.as_ptr()) } == 0;
        let renamed = made && {
            // SAFETY: as above; both names are relative to our directory's descriptor.
            let rc = unsafe {
                libc::renameat(
                    self.fd.as_raw_fd(),
                    tmp_c.as_ptr(),
                    self.fd.as_raw_fd(),
                    name_c.as_ptr(),
                )
            };
            rc == 0
        };
        if !renamed {
            let e = errno();
            self.unlink(&tmp_c);
            return Err(format!(
                "pointing {} at {target}: {e}",
                self.path.join(name).display()
            ));
        }
        Ok(())
    }

    /// Removes the file `name` (a link is removed, never followed); a missing one is no error.
    pub fn remove_file(&self, name: &str) -> Result<(), String> {
        let c = cstr(OsStr::new(name))?;
        // SAFETY: a valid descriptor and a NUL-terminated name.
        if unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) } != 0 {
            let e = errno();
            if e.raw_os_error() != Some(libc::ENOENT) {
                return Err(format!("removing {}: {e}", self.path.join(name).display()));
            }
        }
        Ok(())
    }

    /// Removes the tree `name` below this directory without following any link (a link is
    /// removed as a name). A missing one is no error.
    pub fn remove_tree(&self, name: &str) -> Result<(), String> {
        remove_tree_at(&self.fd, name, 0)
            .map_err(|e| format!("removing {}: {e}", self.path.join(name).display()))
    }

    /// Names in this directory (not `.`/`..`), unsorted.
    pub fn names(&self) -> Result<Vec<String>, String> {
        list(&self.fd).map_err(|e| format!("{}: {e}", self.path.display()))
    }

    /// `lstat` of `name` here.
    pub fn stat(&self, name: &str) -> Option<libc::stat> {
        let c = cstr(OsStr::new(name)).ok()?;
        fstatat_nofollow(&self.fd, &c).ok()
    }

    /// Removes this directory's temporaries (names [`temporary_name`] makes, for a final name
    /// starting with `only` when given) older than `age`: what a writer killed between creating
    /// and renaming one left behind.
    pub fn sweep_temporaries(&self, age: std::time::Duration, only: Option<&str>) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        for n in self.names().unwrap_or_default() {
            if !(n.starts_with(TMP_PREFIX) && n.ends_with(".tmp")) {
                continue;
            }
            if only.is_some_and(|o| !n[TMP_PREFIX.len()..].starts_with(o)) {
                continue;
            }
            let Some(st) = self.stat(&n) else { continue };
            if st.st_mode & libc::S_IFMT == libc::S_IFREG
                && now.saturating_sub(st.st_mtime) >= age.as_secs() as i64
            {
                let _ = self.remove_file(&n);
            }
        }
    }
}

fn readlinkat(dir: &OwnedFd, name: &CStr) -> std::io::Result<PathBuf> {
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
fn fix_fd(
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

fn list(fd: &OwnedFd) -> std::io::Result<Vec<String>> {
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

fn remove_tree_at(parent: &OwnedFd, name: &str, depth: u32) -> std::io::Result<()> {
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

/// Writes `bytes` to `path` atomically (see [`Dir::write_file`]), the directory reached by a
/// trusted walk. `mode` is set whatever the umask.
pub fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> Result<(), String> {
    let (dir, name) = split(path)?;
    Dir::open(dir)
        .map_err(|e| format!("writing {}: {e}", path.display()))?
        .write_file(name, bytes, mode, None)
}

/// The directory and the file name of `path`.
pub fn split(path: &Path) -> Result<(&Path, &str), String> {
    let name = path
        .file_name()
        .and_then(OsStr::to_str)
        .ok_or_else(|| format!("{}: no file name", path.display()))?;
    Ok((path.parent().unwrap_or(Path::new("/")), name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gpuslice-files-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    #[test]
    fn writes_replace_links_and_never_follow_them() {
        let d = scratch("links");
        let victim = d.join("victim");
        std::fs::write(&victim, "untouched").unwrap();
        std::os::unix::fs::symlink(&victim, d.join("policy")).unwrap();
        write_atomically(&d.join("policy"), b"new", 0o644).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
        assert_eq!(std::fs::read_to_string(d.join("policy")).unwrap(), "new");
        let meta = std::fs::symlink_metadata(d.join("policy")).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(meta.permissions().mode() & 0o7777, 0o644);
        // Nothing else is left beside it.
        let mut names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["policy", "victim"]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn untrusted_directories_are_refused() {
        let d = scratch("trust");
        let open = d.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = write_atomically(&open.join("x"), b"x", 0o644).unwrap_err();
        assert!(e.contains("writable by others"), "{e}");
        assert!(!open.join("x").exists());
        // A directory of another user, and a link into a directory another user could write.
        let theirs = d.join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(4242), Some(4242)).ok();
        if geteuid() == 0 {
            let e = write_atomically(&theirs.join("x"), b"x", 0o644).unwrap_err();
            assert!(e.contains("uid 4242"), "{e}");
        }
        std::os::unix::fs::symlink(&open, d.join("via")).unwrap();
        assert!(write_atomically(&d.join("via/x"), b"x", 0o644).is_err());
        // A link in a trusted directory to a trusted one is followed (`/var/run -> /run`).
        let fine = d.join("fine");
        std::fs::create_dir(&fine).unwrap();
        std::os::unix::fs::symlink("fine", d.join("alias")).unwrap();
        write_atomically(&d.join("alias/y"), b"y", 0o600).unwrap();
        assert_eq!(std::fs::read_to_string(fine.join("y")).unwrap(), "y");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn trees_are_removed_without_following_links() {
        let d = scratch("tree");
        let outside = d.join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "k").unwrap();
        let t = d.join("t");
        std::fs::create_dir_all(t.join("sub")).unwrap();
        std::os::unix::fs::symlink(&outside, t.join("sub/link")).unwrap();
        std::fs::write(t.join("f"), "f").unwrap();
        Dir::open(&d).unwrap().remove_tree("t").unwrap();
        assert!(!t.exists());
        assert!(outside.join("keep").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
