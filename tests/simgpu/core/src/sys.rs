//! The FFI edge: memory mapping, OFD byte-range locks, futexes, fork handling. All of simgpu-core's
//! `unsafe` is here.

use crate::layout::{State, STATE_SIZE};
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::time::Duration;

/// A `MAP_SHARED` mapping of a whole state file.
pub struct Mapping {
    ptr: *mut libc::c_void,
}

// SAFETY: the mapped memory is only ever accessed through atomics (every field of `State` is one).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `STATE_SIZE` bytes of `fd` (which must be at least that long), writable or read-only.
    pub fn map(fd: RawFd, writable: bool) -> io::Result<Mapping> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh mapping chosen by the kernel; it aliases no Rust object.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                STATE_SIZE,
                prot,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr })
    }

    /// The state in the mapping. Read-only mappings must only be loaded from (atomic loads of at
    /// most 8 bytes are allowed on read-only memory).
    pub fn state(&self) -> &State {
        // SAFETY: the mapping is page-aligned (more than `State`'s alignment), `STATE_SIZE` long, lives
        // as long as `self`, and every field of `State` is an atomic integer, valid for any bytes and
        // accessed only atomically, so concurrent writers in other processes are no data race.
        unsafe { &*(self.ptr as *const State) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr` is a live mapping of `STATE_SIZE` bytes that this value owns; no reference into
        // it outlives `self` (`state()` borrows `self`).
        unsafe { libc::munmap(self.ptr, STATE_SIZE) };
    }
}

fn flock(kind: libc::c_int, offset: i64) -> libc::flock {
    // SAFETY: `flock` is a plain C struct of integers; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = offset;
    fl.l_len = 1;
    fl
}

fn fcntl_lock(fd: RawFd, cmd: libc::c_int, fl: &mut libc::flock) -> io::Result<()> {
    loop {
        // SAFETY: `fl` is a valid, exclusively borrowed `struct flock` for the duration of the call.
        let r = unsafe { libc::fcntl(fd, cmd, fl as *mut libc::flock) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Whether an open file description other than `fd`'s holds a lock on byte `offset`. On error the
/// answer is "held": a process is never declared dead on a doubt.
pub fn locked_by_other(fd: RawFd, offset: i64) -> bool {
    let mut fl = flock(libc::F_WRLCK, offset);
    match fcntl_lock(fd, libc::F_OFD_GETLK, &mut fl) {
        Ok(()) => fl.l_type != libc::F_UNLCK as libc::c_short,
        Err(_) => true,
    }
}

/// Takes a write lock on byte `offset` without waiting: `Ok(false)` if someone else holds it.
pub fn try_lock(fd: RawFd, offset: i64) -> io::Result<bool> {
    let mut fl = flock(libc::F_WRLCK, offset);
    match fcntl_lock(fd, libc::F_OFD_SETLK, &mut fl) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Takes a write lock on byte `offset`, waiting for it.
pub fn lock_wait(fd: RawFd, offset: i64) -> io::Result<()> {
    let mut fl = flock(libc::F_WRLCK, offset);
    fcntl_lock(fd, libc::F_OFD_SETLKW, &mut fl)
}

/// Sleeps while `*word == expected`, at most `timeout` (shared futex: waiters and wakers may be in
/// different processes).
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    // SAFETY: `word` is a valid, aligned u32 for the duration of the call; the kernel only reads it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            0usize,
            0u32,
        )
    };
}

/// Wakes every waiter on `word`.
pub fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: `word` is a valid, aligned u32; FUTEX_WAKE does not touch memory beyond the address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            0usize,
            0usize,
            0u32,
        )
    };
}

/// Registration descriptors (which hold this process's slot lock), closed in a forked child: the
/// child must not keep its parent's slot alive, it registers on its own if it uses simgpu.
pub static REGISTRATION_FDS: [AtomicI32; 16] = [const { AtomicI32::new(-1) }; 16];

extern "C" fn close_registration_fds_in_child() {
    for fd in &REGISTRATION_FDS {
        let fd = fd.swap(-1, Ordering::AcqRel);
        if fd >= 0 {
            // SAFETY: `fd` was a descriptor this library opened and owns; close is async-signal-safe.
            unsafe { libc::close(fd) };
        }
    }
}

/// Installs the fork handler (once per process).
pub fn install_fork_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a handler that only closes descriptors we own; it runs in the child.
        unsafe { libc::pthread_atfork(None, None, Some(close_registration_fds_in_child)) };
    });
}

/// This process's PID as the PID namespace of the mounted `/proc` sees it: the first entry of
/// `NSpid` in `/proc/self/status` (the last is `getpid()`). A real driver lives in the kernel and
/// reports every process by its PID in the initial PID namespace, so a program in a container
/// with its own PID namespace never finds its `getpid()` in NVML's process lists; simgpu takes the
/// PID namespace of `/proc` as the initial one (a container that mounts its own `/proc` is seen as
/// the host), unless `SIMGPU_HOST_PROC` names where the initial namespace's `/proc` is mounted
/// (a test's container bind-mounts it there before mounting its own `/proc`: the kernel-side
/// driver still sees the host PID). Without `/proc`: `getpid()`.
pub fn host_pid() -> u32 {
    let own = std::process::id();
    let proc = std::env::var_os("SIMGPU_HOST_PROC")
        .filter(|p| !p.is_empty())
        .map_or_else(
            || std::path::PathBuf::from("/proc"),
            std::path::PathBuf::from,
        );
    std::fs::read_to_string(proc.join("self/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|ids| ids.split_whitespace().next())
                .and_then(|first| first.parse().ok())
        })
        .unwrap_or(own)
}

/// Realtime clock in ns (shared by all processes, comparable to NVML's CPU timestamps).
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Whether process `pid` exists and is not stopped (SIGSTOP) or a zombie. On doubt (no `/proc`),
/// "running": a lock is never taken from a holder that may still be using it.
pub fn process_running(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        // SAFETY: signal 0 only checks that the process exists.
        let exists = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0
            || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
        return exists;
    };
    // "pid (comm) S ...": the state follows the last ')'.
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].trim_start().chars().next());
    !matches!(state, Some('T' | 't' | 'Z' | 'X' | 'x'))
}
