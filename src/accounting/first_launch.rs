//! Functions whose first launch makes the driver spend memory: a library's kernels whose code the
//! driver has not loaded yet, and functions whose local frame is larger than the context's stack
//! (their launch grows the context's local memory, see `hooks::first_launch::grow_local`).
//!
//! Kernels whose code is not loaded: a library's kernels under lazy loading
//! (`CUDA_MODULE_LOADING=LAZY`, the default since CUDA 12.2). `cuLibraryLoadData`'s documentation:
//! a lazily loaded library "will only be loaded when a function is needed for that context, such as
//! a kernel launch"; so `cuLibraryGetKernel` loads nothing, and the kernel's code goes to the device
//! at `cuKernelGetFunction` or at the first launch of the `CUkernel`. Those are where it is charged
//! (`hooks::first_launch`).
//!
//! The launch hooks ask [`pending`] on their fast path: one load of a counter while no kernel is
//! pending, else a few loads of a lock-free open-addressed table of kernel handles. Entries are
//! added (at `cuLibraryGetKernel`) and removed (at the kernel's first load, or its library's
//! unload) only under the tenant's records lock; readers take no lock. A kernel that finds no free
//! slot within [`PROBES`] of its home is not tracked (logged once): its code is then charged by
//! reconciliation, as any driver memory no operation showed.

use super::overhead::Overhead;
use super::records::Records;
use super::Tenant;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

const SLOTS: usize = 1 << 13;
/// How far from its home slot a handle may lie.
const PROBES: usize = 8;
/// A slot whose kernel was removed (reusable; a search goes on past it).
const GONE: usize = usize::MAX;

static TABLE: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static COUNT: AtomicUsize = AtomicUsize::new(0);
static WARNED_FULL: AtomicBool = AtomicBool::new(false);

#[inline(always)]
fn home(kernel: usize) -> usize {
    // Fibonacci hashing: handles are heap addresses, alike in their low bits.
    kernel.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (usize::BITS - SLOTS.trailing_zeros())
}

#[inline(always)]
fn slot(kernel: usize) -> Option<usize> {
    if kernel == 0 || kernel == GONE {
        return None;
    }
    let start = home(kernel);
    for i in 0..PROBES {
        let s = (start + i) & (SLOTS - 1);
        match TABLE[s].load(Relaxed) {
            0 => return None,
            v if v == kernel => return Some(s),
            _ => {}
        }
    }
    None
}

/// Whether launching `f` makes the driver load its code first (a kernel of a lazily loaded library
/// not loaded yet). The launch fast path: one load while nothing is pending.
#[inline(always)]
pub fn pending(f: usize) -> bool {
    COUNT.load(Relaxed) != 0 && slot(f).is_some()
}

/// Adds `kernel` (under the records lock). `false` when it cannot be tracked (logged once).
pub(super) fn insert(kernel: usize) -> bool {
    if kernel == 0 || kernel == GONE {
        return false;
    }
    if slot(kernel).is_some() {
        return true;
    }
    let start = home(kernel);
    for i in 0..PROBES {
        let s = (start + i) & (SLOTS - 1);
        let v = TABLE[s].load(Relaxed);
        if v == 0 || v == GONE {
            TABLE[s].store(kernel, Relaxed);
            COUNT.fetch_add(1, Relaxed);
            return true;
        }
    }
    if !WARNED_FULL.swap(true, Relaxed) {
        crate::log::warn(format_args!(
            "too many kernels of lazily loaded libraries not launched yet: the code of further ones \
             is charged by reconciliation, not at their first launch"
        ));
    }
    false
}

/// Removes `kernel` (under the records lock).
pub(super) fn remove(kernel: usize) {
    if let Some(s) = slot(kernel) {
        TABLE[s].store(GONE, Relaxed);
        COUNT.fetch_sub(1, Relaxed);
    }
}

impl Tenant {
    /// `cuLibraryGetKernel` answered `kernel` for `name` in `library`: when the library is loaded
    /// lazily and the kernel's code is not loaded yet, the kernel is pending until its first load.
    pub fn lazy_kernel_got(&self, library: usize, kernel: usize, name: &[u8]) {
        if !self.lazy_code_pending(Overhead::Library, library, name) {
            return;
        }
        let mut records = self.records.lock();
        if !records.lazy_kernels.contains_key(&kernel) && insert(kernel) {
            records
                .lazy_kernels
                .insert(kernel, (library, name.to_vec()));
        }
    }

    /// The library and name of a pending kernel (`None`: not pending).
    pub fn lazy_kernel(&self, kernel: usize) -> Option<(usize, Vec<u8>)> {
        let records = self.records.lock();
        let found = records.lazy_kernels.get(&kernel).cloned();
        if found.is_none() && !records.local_frames.contains_key(&kernel) {
            remove(kernel);
        }
        found
    }

    /// A pending kernel's code was loaded: its launches take the fast path from now on.
    pub fn lazy_kernel_loaded(&self, kernel: usize) {
        let mut records = self.records.lock();
        records.lazy_kernels.remove(&kernel);
        if !records.local_frames.contains_key(&kernel) {
            remove(kernel);
        }
    }
}

impl Tenant {
    /// `f` (a function or kernel) has a local frame of `local` bytes per thread: beyond
    /// `default_stack`, its first launch may make the driver grow the context's local memory.
    pub fn local_frame_seen(&self, f: usize, local: u64, default_stack: u64) {
        if local <= default_stack {
            return;
        }
        let mut records = self.records.lock();
        if insert(f) {
            records.local_frames.insert(f, local);
        }
    }

    /// The local frame of a function not launched yet (then no longer pending for it).
    pub fn local_frame_launched(&self, f: usize) -> Option<u64> {
        let mut records = self.records.lock();
        let local = records.local_frames.remove(&f);
        if !records.lazy_kernels.contains_key(&f) {
            remove(f);
        }
        local
    }
}

/// A library was unloaded: its pending kernels go.
pub(super) fn forget_library(records: &mut Records, library: usize) {
    records.lazy_kernels.retain(|&kernel, (l, _)| {
        let keep = *l != library;
        if !keep {
            remove(kernel);
        }
        keep
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_are_pending_until_removed_and_slots_are_reused() {
        // Handles unlike any a test process's libraries would have.
        let base = 0x7f00_dead_0000usize;
        assert!(!pending(base));
        for i in 0..64 {
            assert!(insert(base + i * 64));
        }
        for i in 0..64 {
            assert!(pending(base + i * 64));
        }
        assert!(!pending(base + 8));
        for i in 0..64 {
            remove(base + i * 64);
        }
        for i in 0..64 {
            assert!(!pending(base + i * 64));
        }
        assert!(insert(base));
        assert!(pending(base));
        remove(base);
        assert!(!pending(base));
        assert!(!insert(0) && !pending(0));
    }
}
