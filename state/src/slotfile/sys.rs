//! The system calls of the slot files: opening without following symlinks or blocking, space
//! allocation, mapping, and open-file-description (OFD) locks.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::NonNull;
// The guarded descriptors' table is process-local; its 64-bit words use the facade's type all the
// same (one set of atomics in this crate, `clippy.toml`).
use super::atomic::AtomicU64;
use std::sync::atomic::{
    AtomicI32,
    Ordering::{AcqRel, Acquire, Release},
};

fn cpath(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// `open(2)` with `O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK` added to `flags`: a FIFO or a device node at
/// the path opens at once (the caller checks the type with [`fstat`] before reading).
pub fn open(path: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let c = cpath(path)?;
    // SAFETY: `c` is a valid NUL-terminated string; open has no other memory arguments.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            flags | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK,
            mode as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid, writable `stat`; the fd is open.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// Allocates `len` bytes of the file for real (a sparse file on a full tmpfs would fault on first
/// store instead). `ErrorKind::StorageFull` (ENOSPC) when there is no room.
pub fn fallocate(fd: &OwnedFd, len: u64) -> io::Result<()> {
    // SAFETY: plain call on an open fd; it returns an errno value rather than setting errno.
    match unsafe { libc::posix_fallocate(fd.as_raw_fd(), 0, len as libc::off_t) } {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

pub fn ftruncate(fd: &OwnedFd, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall on an open fd.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub fn fchmod(fd: &OwnedFd, mode: u32) -> io::Result<()> {
    // SAFETY: plain syscall on an open fd.
    if unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub fn fchown_group(fd: &OwnedFd, gid: u32) -> io::Result<()> {
    // SAFETY: plain syscall on an open fd; uid -1 leaves the owner unchanged.
    if unsafe { libc::fchown(fd.as_raw_fd(), u32::MAX, gid) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Writes all of `buf` at `offset`.
pub fn pwrite(fd: &OwnedFd, buf: &[u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: the source is the unwritten tail of `buf`, valid for reads of that length.
        let n = unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                buf[done..].as_ptr().cast(),
                buf.len() - done,
                (offset + done as u64) as libc::off_t,
            )
        };
        match n {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            n if n < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            n => done += n as usize,
        }
    }
    Ok(())
}

/// An anonymous file in memory (`memfd_create`, close-on-exec), named `name` in /proc.
pub fn memfd(name: &std::ffi::CStr) -> io::Result<OwnedFd> {
    // SAFETY: `name` is a valid NUL-terminated string; no other memory arguments.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads up to `buf.len()` bytes at `offset`; returns how many were read.
pub fn pread(fd: &OwnedFd, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: the destination is the unread tail of `buf`, valid for writes of that length.
        let n = unsafe {
            libc::pread(
                fd.as_raw_fd(),
                buf[done..].as_mut_ptr().cast(),
                buf.len() - done,
                (offset + done as u64) as libc::off_t,
            )
        };
        match n {
            0 => break,
            n if n < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            n => done += n as usize,
        }
    }
    Ok(done)
}

/// `link(2)`, falling back to `renameat2(RENAME_NOREPLACE)` where hard links are not supported.
/// Either way an existing `to` is never replaced (`AlreadyExists`).
pub fn publish(from: &Path, to: &Path) -> io::Result<()> {
    let (f, t) = (cpath(from)?, cpath(to)?);
    // SAFETY: both are valid NUL-terminated strings.
    if unsafe { libc::link(f.as_ptr(), t.as_ptr()) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.kind() == io::ErrorKind::AlreadyExists {
        return Err(e);
    }
    // SAFETY: both are valid NUL-terminated strings; AT_FDCWD resolves them like link does.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Maps `len` bytes of `fd` shared and read-write. The caller has checked the file is at least that
/// long.
pub fn map_shared(fd: &OwnedFd, len: usize) -> io::Result<NonNull<u8>> {
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    // SAFETY: a fresh mapping chosen by the kernel (addr NULL) aliases no Rust object.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned NULL"))
}

fn flock(kind: i32, offset: u64) -> libc::flock {
    // SAFETY: an all-zero `flock` is a valid value of this plain C struct (l_pid must be 0 for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = offset as libc::off_t;
    fl.l_len = 1;
    fl
}

/// Non-blocking OFD write lock on one byte. `Ok(false)` if someone else holds it.
pub fn try_lock(fd: RawFd, offset: u64) -> io::Result<bool> {
    let mut fl = flock(libc::F_WRLCK, offset);
    // SAFETY: `fl` is a valid flock; F_OFD_SETLK never blocks.
    if unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &mut fl) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

pub fn unlock(fd: RawFd, offset: u64) {
    let mut fl = flock(libc::F_UNLCK, offset);
    // SAFETY: `fl` is a valid flock; unlocking cannot block. A failure leaves a lock that dies
    // with the fd, which is harmless.
    unsafe {
        libc::fcntl(fd, libc::F_OFD_SETLK, &mut fl);
    }
}

/// Whether another open file description holds a lock on the byte (works on a read-only fd).
pub fn is_locked(fd: RawFd, offset: u64) -> io::Result<bool> {
    let mut fl = flock(libc::F_WRLCK, offset);
    // SAFETY: `fl` is a valid flock that F_OFD_GETLK overwrites.
    if unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut fl) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

pub fn getpid() -> u32 {
    std::process::id()
}

/// This process's PID without a system call once known: `getpid()` (a system call each time:
/// glibc keeps no cache) read once per process image and per fork ([`forks_seen`]), for paths
/// that ask it several times per operation (a measured module load).
pub fn own_pid() -> u32 {
    // forks_seen << 32 | pid; 0: not read yet.
    #[allow(clippy::disallowed_types)]
    static KNOWN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    count_forks();
    let forks = forks_seen();
    let known = KNOWN.load(std::sync::atomic::Ordering::Relaxed);
    if known != 0 && (known >> 32) as u32 == forks {
        return known as u32;
    }
    let pid = std::process::id();
    KNOWN.store(
        u64::from(forks) << 32 | u64::from(pid),
        std::sync::atomic::Ordering::Relaxed,
    );
    pid
}

/// Milliseconds of the coarse monotonic clock (the kernel's last tick: a few ms of resolution, read
/// from the vDSO without the timestamp counter), for intervals of tens of milliseconds on hot paths.
/// Counted from boot; a kernel without the coarse clock gets the precise one.
#[inline(always)]
pub fn coarse_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-parameter of both clocks.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } != 0 {
        // SAFETY: as above; CLOCK_MONOTONIC always exists.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    }
    (ts.tv_sec as u64)
        .saturating_mul(1000)
        .saturating_add(ts.tv_nsec as u64 / 1_000_000)
}

/// Process-local: this process image's fork count.
#[allow(clippy::disallowed_types)]
static FORKS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

extern "C" fn count_fork() {
    FORKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Starts counting forks (idempotent); call before relying on [`forks_seen`].
pub fn count_forks() {
    static REGISTER: std::sync::Once = std::sync::Once::new();
    REGISTER.call_once(|| {
        // SAFETY: registers a child handler that only increments an atomic (async-signal-safe).
        unsafe { libc::pthread_atfork(None, None, Some(count_fork)) };
    });
}

/// How many forks this process image has gone through since [`count_forks`] (bumped in every fork
/// child), so a caller can tell cheaply whether its pid may have changed.
#[inline]
pub fn forks_seen() -> u32 {
    FORKS.load(std::sync::atomic::Ordering::Relaxed)
}

/// A new open file description of the file behind `fd` (same inode, even if renamed or unlinked).
pub fn reopen(fd: &OwnedFd, writable: bool) -> io::Result<OwnedFd> {
    let c = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let flags = if writable {
        libc::O_RDWR
    } else {
        libc::O_RDONLY
    };
    // SAFETY: `c` is a valid NUL-terminated string; open has no other memory arguments. No
    // O_NOFOLLOW: /proc/self/fd entries are links by design.
    let new = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
    if new < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `new` was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// Descriptors that hold a slot lock, pointed at /dev/null in a fork child: a child that never uses
/// the ledger (a data-loader worker, a helper) must not keep its parent's slot alive once the parent
/// dies. A child that does use it reopens the file (`Ledger::reattach_after_fork`).
///
/// Each entry also records the file's identity (device, inode): a number whose descriptor was closed
/// without being forgotten, and then reused by the program for something else, is never touched (the
/// child handler checks the identity first), and such stale entries are pruned when the table fills.
struct GuardedFd {
    /// -1: free; -2: being written; otherwise the descriptor.
    fd: AtomicI32,
    dev: AtomicU64,
    ino: AtomicU64,
}

const GUARD_FREE: i32 = -1;
const GUARD_WRITING: i32 = -2;

/// Room for a tenant ledger and a device ledger per GPU, several times over.
static SLOT_FDS: [GuardedFd; 64] = [const {
    GuardedFd {
        fd: AtomicI32::new(GUARD_FREE),
        dev: AtomicU64::new(0),
        ino: AtomicU64::new(0),
    }
}; 64];

/// The (device, inode) of an open descriptor; async-signal-safe.
fn identity(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is valid and writable; fstat only reads the descriptor number.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

fn still_guarded_file(e: &GuardedFd, fd: RawFd) -> bool {
    identity(fd) == Some((e.dev.load(Acquire), e.ino.load(Acquire)))
}

extern "C" fn drop_slot_fds_in_child() {
    for e in &SLOT_FDS {
        let fd = e.fd.load(Acquire);
        if fd < 0 || !still_guarded_file(e, fd) {
            continue;
        }
        e.fd.store(GUARD_FREE, Release);
        // Replaced, not closed: the Ledger still owns the number and closes it later.
        // SAFETY: open/dup3/close are async-signal-safe and touch only descriptors we own.
        unsafe {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if null >= 0 {
                libc::dup3(null, fd, libc::O_CLOEXEC);
                libc::close(null);
            }
        }
    }
}

/// Registers a descriptor that holds this process's slot lock (see [`SLOT_FDS`]).
pub fn guard_slot_fd(fd: RawFd) {
    static REGISTER: std::sync::Once = std::sync::Once::new();
    REGISTER.call_once(|| {
        // SAFETY: registers a child handler that only swaps descriptors we own (async-signal-safe calls).
        unsafe { libc::pthread_atfork(None, None, Some(drop_slot_fds_in_child)) };
    });
    let Some((dev, ino)) = identity(fd) else {
        return;
    };
    let registered = |e: &GuardedFd| {
        e.fd.load(Acquire) == fd && e.dev.load(Acquire) == dev && e.ino.load(Acquire) == ino
    };
    if SLOT_FDS.iter().any(registered) {
        return;
    }
    for attempt in 0..2 {
        for e in &SLOT_FDS {
            if e.fd
                .compare_exchange(GUARD_FREE, GUARD_WRITING, AcqRel, Acquire)
                .is_ok()
            {
                e.dev.store(dev, Release);
                e.ino.store(ino, Release);
                e.fd.store(fd, Release);
                return;
            }
        }
        if attempt == 0 {
            // Full: forget entries whose descriptor no longer shows the file it was registered for.
            for e in &SLOT_FDS {
                let old = e.fd.load(Acquire);
                if old >= 0 && !still_guarded_file(e, old) {
                    let _ = e.fd.compare_exchange(old, GUARD_FREE, AcqRel, Acquire);
                }
            }
        }
    }
}

/// Forgets a descriptor registered with [`guard_slot_fd`] (it is about to be closed).
pub fn unguard_slot_fd(fd: RawFd) {
    for e in &SLOT_FDS {
        let _ = e.fd.compare_exchange(fd, GUARD_FREE, AcqRel, Acquire);
    }
}

pub fn geteuid() -> u32 {
    // SAFETY: no arguments; cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether the process is in group `gid` (effective or supplementary).
pub fn in_group(gid: u32) -> bool {
    // SAFETY: no arguments; cannot fail.
    if unsafe { libc::getegid() } == gid {
        return true;
    }
    let mut groups = vec![0 as libc::gid_t; 256];
    // SAFETY: `groups` has room for the 256 entries we declare.
    let n = unsafe { libc::getgroups(groups.len() as i32, groups.as_mut_ptr()) };
    n > 0 && groups[..n as usize].contains(&gid)
}

/// Resolves a group name or number.
pub fn group_id(name: &str) -> io::Result<u32> {
    if let Ok(gid) = name.trim().parse::<u32>() {
        return Ok(gid);
    }
    let c = CString::new(name.trim())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "group name contains NUL"))?;
    // SAFETY: an all-zero `group` is valid; getgrnam_r fills it from `buf`.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut result: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the sizes given; `result` receives NULL or `&mut grp`.
    let rc = unsafe {
        libc::getgrnam_r(
            c.as_ptr(),
            &mut grp,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    if result.is_null() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no group named {name:?}"),
        ));
    }
    Ok(grp.gr_gid)
}
