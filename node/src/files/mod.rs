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
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

mod sys;
mod untrusted;
use sys::{
    cstr, errno, fix_fd, fstat, fstatat_nofollow, geteuid, list, openat, random_u64, readlinkat,
    remove_tree_at,
};
pub use untrusted::read_untrusted;

/// Temporary names start with this (and end with `.tmp`): `sweep_temporaries` knows them.
const TMP_PREFIX: &str = ".gs-";

/// A directory opened by a trusted walk: every operation is relative to its descriptor.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
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
mod tests;
