//! Functions whose first launch makes the driver spend memory: a library's kernels whose code the
//! driver has not loaded yet, and functions whose local frame is larger than the context's stack
//! (their launch grows the context's local memory, see `hooks::first_launch::grow_local`).
//!
//! Kernels whose code is not loaded: a library's kernels under lazy loading
//! (`CUDA_MODULE_LOADING=LAZY`, the default since CUDA 12.2). `cuLibraryLoadData`'s documentation:
//! a lazily loaded library "will only be loaded when a function is needed for that context, such as
//! a kernel launch"; so `cuLibraryGetKernel` loads nothing, and the kernel's code goes to the device
//! at `cuKernelGetFunction` or at the first launch of the `CUkernel`, in each context that needs it
//! ("for that context": a second context launching the same kernel loads its code again). Those
//! are where it is charged (`hooks::first_launch`).
//!
//! The launch hooks ask [`pending`] on their fast path: one load of a counter while no kernel is
//! pending, else a few loads of a lock-free open-addressed table of kernel handles. Each entry
//! holds the contexts its kernel is loaded in, as bits of a fixed table of [`CONTEXT_BITS`]
//! context handles: a kernel loaded in some contexts but not all the process's live ones costs
//! its launches one `cuCtxGetCurrent` and a scan of that table, no lock and no allocation. A
//! kernel loaded in every live context leaves the table; a new context puts the process's lazy
//! kernels back. Entries are added and removed only under the tenant's records lock; readers take
//! no lock. A kernel that finds no free slot within [`PROBES`] of its home, or a context beyond
//! the table's, is not tracked (logged once): its code is then charged by reconciliation, as any
//! driver memory no operation showed.

use super::limits::{limit_default, LimitChange, LIMIT_STACK_SIZE};
use super::overhead::Overhead;
use super::records::Records;
use super::Tenant;
use gpuslice_api::CUresult;
use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};

const SLOTS: usize = 1 << 13;
/// How far from its home slot a handle may lie.
const PROBES: usize = 8;
/// A slot whose kernel was removed (reusable; a search goes on past it).
const GONE: usize = usize::MAX;
/// Contexts a kernel's loaded set can name.
pub const CONTEXT_BITS: usize = 63;
/// In a set of contexts: a live context without a bit (pending there, whatever the entry says).
const EVERYWHERE: u64 = 1 << 63;
/// Every context a bit can name.
const ALL: u64 = !EVERYWHERE;

static TABLE: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
/// Per slot: the bits of the contexts its kernel's launch spends nothing in (its code loaded, and
/// its local frame held by the context's local memory).
static LOADED: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// Context handle by bit (0: free).
static CONTEXTS: [AtomicUsize; CONTEXT_BITS] = [const { AtomicUsize::new(0) }; CONTEXT_BITS];
static WARNED_FULL: AtomicBool = AtomicBool::new(false);
static WARNED_CONTEXTS: AtomicBool = AtomicBool::new(false);

/// A kernel of a library loaded lazily: its library, its name, the contexts it is loaded in.
pub struct LazyKernel {
    library: usize,
    name: Vec<u8>,
    loaded_in: u64,
}

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
        match TABLE[s].load(Acquire) {
            0 => return None,
            v if v == kernel => return Some(s),
            _ => {}
        }
    }
    None
}

/// The bit of context `ctx` (`None`: not in the table).
#[inline(always)]
fn context_bit(ctx: usize) -> Option<u64> {
    if ctx == 0 {
        return None;
    }
    CONTEXTS
        .iter()
        .position(|c| c.load(Relaxed) == ctx)
        .map(|i| 1u64 << i)
}

/// The bit of context `ctx`, given one if it has none (under the records lock).
fn assign_context(ctx: usize) -> Option<u64> {
    if let Some(bit) = context_bit(ctx) {
        return Some(bit);
    }
    if ctx == 0 {
        return None;
    }
    for (i, c) in CONTEXTS.iter().enumerate() {
        if c.load(Relaxed) == 0 {
            c.store(ctx, Relaxed);
            return Some(1u64 << i);
        }
    }
    if !WARNED_CONTEXTS.swap(true, Relaxed) {
        crate::log::warn(format_args!(
            "more than {CONTEXT_BITS} contexts loaded lazily loaded kernels: the code loaded in \
             further contexts is charged by reconciliation, not at first launch"
        ));
    }
    None
}

/// Whether launching `f` in the current context (`current`, asked only when it matters) makes
/// the driver load its code first, or grow the context's local memory. The launch fast path: one
/// load while nothing is pending.
#[inline(always)]
pub fn pending(f: usize, current: impl FnOnce() -> usize) -> bool {
    if COUNT.load(Relaxed) == 0 {
        return false;
    }
    let Some(s) = slot(f) else {
        return false;
    };
    let loaded = LOADED[s].load(Relaxed);
    if loaded == 0 {
        return true;
    }
    !context_bit(current()).is_some_and(|bit| loaded & bit != 0)
}

/// Puts `kernel` in the table with set `loaded` (under the records lock). `false` when it cannot
/// be tracked (logged once).
fn put(kernel: usize, loaded: u64) -> bool {
    if kernel == 0 || kernel == GONE {
        return false;
    }
    if let Some(s) = slot(kernel) {
        LOADED[s].store(loaded, Relaxed);
        return true;
    }
    let start = home(kernel);
    for i in 0..PROBES {
        let s = (start + i) & (SLOTS - 1);
        let v = TABLE[s].load(Relaxed);
        if v == 0 || v == GONE {
            LOADED[s].store(loaded, Relaxed);
            TABLE[s].store(kernel, Release);
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
fn remove(kernel: usize) {
    if let Some(s) = slot(kernel) {
        TABLE[s].store(GONE, Relaxed);
        COUNT.fetch_sub(1, Relaxed);
    }
}

/// A function's local frame (bytes per thread) and the contexts whose local memory holds it.
pub struct LocalFrame {
    bytes: u64,
    held_in: u64,
}

/// The bits of the process's live contexts (created, and primary ones while they exist); a live
/// context without a bit (none of its kernels loaded yet) sets [`EVERYWHERE`].
fn live_contexts(records: &Records) -> u64 {
    records
        .contexts
        .keys()
        .copied()
        .chain(
            records
                .primary
                .values()
                .filter_map(|p| p.live.as_ref().map(|l| l.1)),
        )
        .fold(0, |bits, ctx| bits | context_bit(ctx).unwrap_or(EVERYWHERE))
}

/// Puts `kernel` in the table as its records say, or takes it out when nothing is pending for it
/// (its code loaded in every live context, and its local frame held by every live context's local
/// memory).
fn refresh(records: &Records, kernel: usize) {
    let loaded = records.lazy_kernels.get(&kernel).map(|k| k.loaded_in);
    let held = records.local_frames.get(&kernel).map(|l| l.held_in);
    if loaded.is_none() && held.is_none() {
        remove(kernel);
        return;
    }
    let done = loaded.unwrap_or(ALL) & held.unwrap_or(ALL);
    let live = live_contexts(records);
    if live & !done != 0 || live == 0 && done == 0 {
        put(kernel, done);
    } else {
        remove(kernel);
    }
}

/// Every kernel the records track (lazily loaded, or with a local frame).
fn tracked(records: &Records) -> Vec<usize> {
    let mut kernels: Vec<usize> = records.lazy_kernels.keys().copied().collect();
    kernels.extend(
        records
            .local_frames
            .keys()
            .filter(|k| !records.lazy_kernels.contains_key(k)),
    );
    kernels
}

/// A context appeared (created, or a primary context made live): kernels loaded in the other
/// contexts, and local frames its local memory does not hold yet, are pending in it.
pub(super) fn context_appeared(records: &Records) {
    for k in tracked(records) {
        refresh(records, k);
    }
}

/// Context `ctx` was destroyed: the code loaded in it and its local memory went with it, and its
/// bit is free.
pub(super) fn context_gone(records: &mut Records, ctx: usize) {
    records.local_memory.remove(&ctx);
    let Some(bit) = context_bit(ctx) else {
        return;
    };
    if let Some(c) = CONTEXTS.get(bit.trailing_zeros() as usize) {
        c.store(0, Relaxed);
    }
    for k in tracked(records) {
        if let Some(lazy) = records.lazy_kernels.get_mut(&k) {
            lazy.loaded_in &= !bit;
        }
        if let Some(local) = records.local_frames.get_mut(&k) {
            local.held_in &= !bit;
        }
        if slot(k).is_some() {
            refresh(records, k);
        }
    }
}

impl Tenant {
    /// `cuLibraryGetKernel` answered `kernel` for `name` in `library`: when the library is loaded
    /// lazily and the kernel's code is not loaded yet, the kernel is pending until its first load
    /// in each context.
    /// `false`: its code is loaded in the current context (an eagerly loaded library's).
    pub fn lazy_kernel_got(&self, library: usize, kernel: usize, name: &[u8]) -> bool {
        if !self.lazy_code_pending(Overhead::Library, library, name) {
            return false;
        }
        let mut records = self.records.lock();
        if !records.lazy_kernels.contains_key(&kernel) && put(kernel, 0) {
            records.lazy_kernels.insert(
                kernel,
                LazyKernel {
                    library,
                    name: name.to_vec(),
                    loaded_in: 0,
                },
            );
        }
        true
    }

    /// The library and name of a kernel whose code is not loaded in the current context yet
    /// (`None`: loaded there, or not a lazily loaded library's).
    pub fn lazy_kernel(&self, kernel: usize) -> Option<(usize, Vec<u8>)> {
        let ctx = self.lazy_context(Overhead::Library);
        let records = self.records.lock();
        let Some(lazy) = records.lazy_kernels.get(&kernel) else {
            refresh(&records, kernel);
            return None;
        };
        if context_bit(ctx).is_some_and(|bit| lazy.loaded_in & bit != 0) {
            return None;
        }
        Some((lazy.library, lazy.name.clone()))
    }

    /// A kernel's code was loaded in the current context: its launches there take the fast path
    /// from now on.
    pub fn lazy_kernel_loaded(&self, kernel: usize) {
        let ctx = self.lazy_context(Overhead::Library);
        let mut records = self.records.lock();
        let bit = assign_context(ctx);
        let Some(lazy) = records.lazy_kernels.get_mut(&kernel) else {
            return;
        };
        match bit {
            Some(bit) => {
                lazy.loaded_in |= bit;
                refresh(&records, kernel);
            }
            // Untracked context: its loads are left to reconciliation.
            None => {
                if !records.local_frames.contains_key(&kernel) {
                    remove(kernel);
                }
            }
        }
    }
}

impl Tenant {
    /// `f` (a function or kernel) has a local frame of `local` bytes per thread: beyond
    /// `default_stack`, its launch in a context whose local memory holds less grows it. A handle
    /// noted again (given to another function since) takes its new frame.
    pub fn local_frame_seen(&self, f: usize, local: u64, default_stack: u64) {
        let mut records = self.records.lock();
        if local <= default_stack {
            if records.local_frames.remove(&f).is_some() {
                refresh(&records, f);
            }
            return;
        }
        let held_in = records
            .local_memory
            .iter()
            .filter(|(_, &held)| held >= local)
            .filter_map(|(&ctx, _)| context_bit(ctx))
            .fold(0, |bits, bit| bits | bit);
        records.local_frames.insert(
            f,
            LocalFrame {
                bytes: local,
                held_in,
            },
        );
        refresh(&records, f);
    }

    /// What launching `f` in context `ctx` may grow: `f`'s frame and what the context's local
    /// memory holds per thread as far as this process saw (the largest frame launched in it, or
    /// the stack size set; 0: nothing seen). `None`: `f` has no large frame, or the context
    /// holds it already (then its launches there take the fast path).
    pub fn local_growth(&self, f: usize, ctx: usize) -> Option<(u64, u64)> {
        let mut records = self.records.lock();
        let frame = records.local_frames.get(&f)?.bytes;
        let held = records.local_memory.get(&ctx).copied().unwrap_or(0);
        if frame > held {
            return Some((frame, held));
        }
        if let (Some(bit), Some(local)) = (assign_context(ctx), records.local_frames.get_mut(&f)) {
            local.held_in |= bit;
        }
        refresh(&records, f);
        None
    }

    /// Context `ctx`'s local memory holds `bytes` per thread: grown to it by a launch (`set`
    /// false: it never shrinks), or set to it by `cuCtxSetLimit` of the stack (`set`). The frames
    /// it holds launch there on the fast path; the others grow it.
    pub fn local_memory_holds(&self, ctx: usize, bytes: u64, set: bool) {
        if ctx == 0 {
            return;
        }
        let mut records = self.records.lock();
        let held = match records.local_memory.get(&ctx) {
            Some(&old) if !set => old.max(bytes),
            _ => bytes,
        };
        records.local_memory.insert(ctx, held);
        let Some(bit) = assign_context(ctx) else {
            return;
        };
        let frames: Vec<usize> = records.local_frames.keys().copied().collect();
        for f in frames {
            if let Some(local) = records.local_frames.get_mut(&f) {
                if local.bytes <= held {
                    local.held_in |= bit;
                } else {
                    local.held_in &= !bit;
                }
            }
            refresh(&records, f);
        }
    }

    /// Launches function `f` (by `launch`) in the current context, charging the local memory the
    /// launch grows. The driver keeps one local memory per context, sized by the largest frame
    /// launched in it and kept after the launch (cuda.h: `CU_CTX_LMEM_RESIZE_TO_MAX`, "Keep local
    /// memory allocation after launch", the default from CUDA 12.9; `cuCtxSetLimit`:
    /// `CU_LIMIT_STACK_SIZE` "The driver automatically increases the per-thread stack size for
    /// each kernel launch as needed. This size isn't reset back to the original value after each
    /// launch"), freed with the context. A launch whose frame is larger than what the context
    /// holds (the larger of its stack limit, as the driver answers it, and the largest frame
    /// launched in it) is charged the growth, as raising the stack limit from that to the frame
    /// is ([`Tenant::change_limit`]: what NVIDIA documents, reserved before the launch, then
    /// measured; recorded with the context's limits, returned with the context): a launch the
    /// quota has no room for fails with `CUDA_ERROR_OUT_OF_MEMORY` and runs nothing (the next
    /// one tries again). A launch that grows nothing is not charged.
    pub fn launch_growing_local(&self, f: usize, launch: impl FnOnce() -> CUresult) -> CUresult {
        let ctx = self.current_context();
        let Some((frame, held)) = self.local_growth(f, ctx) else {
            return launch();
        };
        let Some(device) = self.overhead_device(true) else {
            return launch();
        };
        let default = limit_default(LIMIT_STACK_SIZE) as u64;
        let stack = self
            .driver()
            .context_limit(LIMIT_STACK_SIZE)
            .map_or(default, |v| v as u64);
        let old = stack.max(held);
        if frame <= old {
            self.local_memory_holds(ctx, old, false);
            return launch();
        }
        let change = LimitChange {
            what: "local memory growth",
            limit: LIMIT_STACK_SIZE,
            old: usize::try_from(old).unwrap_or(usize::MAX),
            value: usize::try_from(frame).unwrap_or(usize::MAX),
        };
        self.change_limit(device, change, launch, None::<fn(())>)?;
        self.local_memory_holds(ctx, frame, false);
        Ok(())
    }
}

/// A library was unloaded: its kernels go.
pub(super) fn forget_library(records: &mut Records, library: usize) {
    let gone: Vec<usize> = records
        .lazy_kernels
        .iter()
        .filter(|(_, k)| k.library == library)
        .map(|(&kernel, _)| kernel)
        .collect();
    for kernel in gone {
        records.lazy_kernels.remove(&kernel);
        refresh(records, kernel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_are_pending_until_removed_and_slots_are_reused() {
        // Handles unlike any a test process's libraries would have.
        let base = 0x7f00_dead_0000usize;
        let none = || 0;
        assert!(!pending(base, none));
        for i in 0..64 {
            assert!(put(base + i * 64, 0));
        }
        for i in 0..64 {
            assert!(pending(base + i * 64, none));
        }
        assert!(!pending(base + 8, none));
        for i in 0..64 {
            remove(base + i * 64);
        }
        for i in 0..64 {
            assert!(!pending(base + i * 64, none));
        }
        assert!(put(base, 0));
        assert!(pending(base, none));
        remove(base);
        assert!(!pending(base, none));
        assert!(!put(0, 0) && !pending(0, none));
    }

    #[test]
    fn a_kernel_loaded_in_one_context_is_pending_in_the_others() {
        let kernel = 0x7f00_beef_0040usize;
        let (one, two) = (0x7f00_c0de_1000usize, 0x7f00_c0de_2000usize);
        let mut records = Records::default();
        records.lazy_kernels.insert(
            kernel,
            LazyKernel {
                library: 1,
                name: b"k".to_vec(),
                loaded_in: 0,
            },
        );
        let charge = super::super::Charge {
            device: 0,
            bytes: 0,
        };
        records.contexts.insert(one, charge);
        records.contexts.insert(two, charge);
        assert!(put(kernel, 0));
        assert!(pending(kernel, || one) && pending(kernel, || two));
        // Loaded in the first context: its launches there pass, the second's still load it.
        let bit = assign_context(one).unwrap();
        records.lazy_kernels.get_mut(&kernel).unwrap().loaded_in |= bit;
        refresh(&records, kernel);
        assert!(!pending(kernel, || one));
        assert!(pending(kernel, || two));
        // Loaded in both: it leaves the table.
        let bit = assign_context(two).unwrap();
        records.lazy_kernels.get_mut(&kernel).unwrap().loaded_in |= bit;
        refresh(&records, kernel);
        assert!(slot(kernel).is_none());
        assert!(!pending(kernel, || two));
        // The second context is destroyed and a third appears: pending again in the third only.
        records.contexts.remove(&two);
        context_gone(&mut records, two);
        assert_eq!(context_bit(two), None);
        let three = 0x7f00_c0de_3000usize;
        records.contexts.insert(three, charge);
        context_appeared(&records);
        assert!(pending(kernel, || three));
        assert!(!pending(kernel, || one));
        forget_library(&mut records, 1);
        assert!(!pending(kernel, || three));
        context_gone(&mut records, one);
    }
}
