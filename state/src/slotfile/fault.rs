//! Containment of `SIGBUS` on the slot files' mappings.
//!
//! A shared file can be shrunk by any process allowed to write it (a buggy tenant, an operator's
//! `truncate`, a hostile one). A store or load past the new end of file then raises `SIGBUS`, which
//! by default kills the process: a library living in someone else's program must not let that
//! happen. Every writable mapping is registered here; the first one installs a `SIGBUS` handler
//! which, for a fault inside a registered mapping, gives the file back its size (`fallocate`, an
//! async-signal-safe system call) and returns, so the faulting instruction runs again on the
//! (now zero-filled) pages. Zeros fail closed: an empty device entry refuses every reservation, a
//! zeroed header refuses every new joiner. When the size cannot be restored (no space left, or the
//! descriptor no longer names the mapped file: the program closed it and may have reused its
//! number), the range is replaced by private anonymous zero pages instead (this process alone then sees zeros;
//! it fails closed too) and the mapping is marked detached. Faults outside registered mappings go
//! to the handler that was installed before ours, or kill the process as they would have.
//!
//! A program that installs its own `SIGBUS` handler after ours replaces it (docs/SECURITY.md).

// Process-local: the registry of this process's mappings that the SIGBUS handler reads (none of
// these words is in shared memory).
#![allow(clippy::disallowed_types)]

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

const ENTRIES: usize = 32;

struct Entry {
    addr: AtomicUsize,
    len: AtomicUsize,
    fd: AtomicI32,
    /// The file's identity (device, inode) when mapped: the descriptor is used only while it still
    /// names that file (a program may close a descriptor it did not open and reuse its number).
    dev: AtomicU64,
    ino: AtomicU64,
    /// Faults contained in this mapping (size restored or replaced).
    faults: AtomicU32,
    /// The file could not be re-extended: the range is private zeros now.
    detached: AtomicBool,
}

static TABLE: [Entry; ENTRIES] = [const {
    Entry {
        addr: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        fd: AtomicI32::new(-1),
        dev: AtomicU64::new(0),
        ino: AtomicU64::new(0),
        faults: AtomicU32::new(0),
        detached: AtomicBool::new(false),
    }
}; ENTRIES];

/// The disposition of `SIGBUS` before ours (written once, before our handler is installed).
static mut PREVIOUS: Option<libc::sigaction> = None;

/// A registration; unregistering happens before the mapping is unmapped.
pub struct Registration(usize);

/// Registers a shared mapping of `len` bytes of `fd` at `addr`, the file whose identity is
/// `(dev, ino)`. `None` when the table is full (the mapping then works unprotected, as before this
/// module existed).
pub fn register(
    addr: usize,
    len: usize,
    fd: RawFd,
    (dev, ino): (u64, u64),
) -> Option<Registration> {
    install();
    for (i, e) in TABLE.iter().enumerate() {
        if e.addr
            .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            e.len.store(len, Ordering::Relaxed);
            e.fd.store(fd, Ordering::Relaxed);
            e.dev.store(dev, Ordering::Relaxed);
            e.ino.store(ino, Ordering::Relaxed);
            e.faults.store(0, Ordering::Relaxed);
            e.detached.store(false, Ordering::Relaxed);
            e.addr.store(addr, Ordering::Release);
            return Some(Registration(i));
        }
    }
    None
}

impl Registration {
    /// Faults contained in this mapping so far.
    #[inline]
    pub fn faults(&self) -> u32 {
        TABLE[self.0].faults.load(Ordering::Acquire)
    }

    /// The mapping no longer shows the file (its size could not be restored).
    pub fn detached(&self) -> bool {
        TABLE[self.0].detached.load(Ordering::Acquire)
    }

    /// The same repair as the handler's, from a slow path that found the file short (`fstat`),
    /// before any access faults.
    pub fn repair(&self) {
        repair(&TABLE[self.0]);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let e = &TABLE[self.0];
        e.fd.store(-1, Ordering::Release);
        e.addr.store(0, Ordering::Release);
    }
}

/// Gives the file its size back, or hides the range behind private zeros. Async-signal-safe.
fn repair(e: &Entry) {
    let (addr, len, fd) = (
        e.addr.load(Ordering::Acquire),
        e.len.load(Ordering::Acquire),
        e.fd.load(Ordering::Acquire),
    );
    if addr == 0 || addr == usize::MAX || fd < 0 {
        return;
    }
    e.faults.fetch_add(1, Ordering::AcqRel);
    // Re-extended only through a descriptor that still names the mapped file: the program may
    // have closed ours and opened one of its own files under the same number.
    // SAFETY: an all-zero `stat` is a valid value; fstat is async-signal-safe and writes only `st`.
    let ours = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut st) == 0
            && st.st_dev == e.dev.load(Ordering::Acquire)
            && st.st_ino == e.ino.load(Ordering::Acquire)
    };
    // SAFETY: fallocate is a plain system call on a descriptor that names our file (mode 0:
    // allocate, extending the size; it never shrinks a file).
    let restored = ours && unsafe { libc::fallocate(fd, 0, 0, len as libc::off_t) } == 0;
    if restored {
        // The content is no longer what its processes wrote: say so to all of them (the
        // state word of the slot file's prefix, at byte 12 of the mapping).
        // SAFETY: the mapping is at least 16 bytes and 8-aligned; its pages exist again.
        let state = unsafe { &*((addr + 12) as *const AtomicU32) };
        state.store(super::STATE_DAMAGED, Ordering::Release);
    } else {
        // SAFETY: replaces exactly the registered range, which belongs to our mapping, with fresh
        // private zero pages at the same address (MAP_FIXED); every reference into it stays valid
        // (same address, same length, still readable and writable).
        unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            );
        }
        e.detached.store(true, Ordering::Release);
    }
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let at = unsafe { (*info).si_addr() } as usize;
    for e in &TABLE {
        let addr = e.addr.load(Ordering::Acquire);
        if addr != 0
            && addr != usize::MAX
            && at >= addr
            && at < addr + e.len.load(Ordering::Acquire)
        {
            repair(e);
            return; // the faulting access runs again, on pages that exist now
        }
    }
    // Not ours: what would have happened without us.
    // SAFETY: PREVIOUS was written before the handler was installed and never after.
    let prev = unsafe { *std::ptr::addr_of!(PREVIOUS) };
    match prev {
        Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
            if p.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the program installed this handler with this signature.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig, info, ctx);
            } else {
                // SAFETY: as above, a plain handler.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig);
            }
        }
        _ => {
            // SAFETY: resets the default disposition; returning re-runs the access, which then
            // terminates the process as it would have without us.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
            }
        }
    }
}

fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: zeroed sigaction structs are valid; sigaction reads `act` and fills `old`.
        // PREVIOUS is written here, before the handler that reads it exists.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_sigbus as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK;
            libc::sigemptyset(&mut act.sa_mask);
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) == 0 {
                *std::ptr::addr_of_mut!(PREVIOUS) = Some(old);
                libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut());
            }
        }
    });
}
