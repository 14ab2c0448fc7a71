//! The table of kernels whose launch the driver may spend memory at, by context.
//!
//! The launch hooks ask [`clear`] on their fast path: one load of a counter while no kernel is
//! pending, else a few loads of a lock-free open-addressed table of kernel handles; a kernel in
//! the table takes the hook body, which asks [`pending`]. Each entry
//! holds the contexts its kernel is loaded in, as bits of a fixed table of [`CONTEXT_BITS`]
//! context handles: a kernel loaded in some contexts but not all the process's live ones costs
//! its launches the hook body, one `cuCtxGetCurrent` and a scan of that table, no lock and no
//! allocation. A
//! kernel loaded in every live context leaves the table; a new context puts the process's lazy
//! kernels back. Entries are added and removed only under the tenant's records lock; readers take
//! no lock. A kernel that finds no free slot within [`PROBES`] of its home, or a context beyond
//! the table's, is not tracked (logged once): its code is then charged by reconciliation, as any
//! driver memory no operation showed.

use super::super::records::Records;
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
pub(super) fn context_bit(ctx: usize) -> Option<u64> {
    if ctx == 0 {
        return None;
    }
    CONTEXTS
        .iter()
        .position(|c| c.load(Relaxed) == ctx)
        .map(|i| 1u64 << i)
}

/// The bit of context `ctx`, given one if it has none (under the records lock).
pub(super) fn assign_context(ctx: usize) -> Option<u64> {
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
/// the driver load its code first, or grow the context's local memory. Asked by the launch hooks'
/// body, for a kernel [`clear`] did not clear.
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

/// Whether launching `f` surely makes the driver spend nothing: no kernel is pending anywhere
/// (one load), or `f` is not in the table (a few more). Loads only, no call: the launch exports
/// ask it on their fast path, which then stays a jump to the driver with no frame of its own
/// (a call there, `current` of [`pending`], makes every export save the caller's arguments first:
/// +28 instructions a launch, docs/BENCHMARKS.md). A kernel in the table takes the hook body,
/// which asks [`pending`].
#[inline(always)]
pub fn clear(f: usize) -> bool {
    COUNT.load(Relaxed) == 0 || slot(f).is_none()
}

/// Puts `kernel` in the table with set `loaded` (under the records lock). `false` when it cannot
/// be tracked (logged once).
pub(super) fn put(kernel: usize, loaded: u64) -> bool {
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
pub(super) fn remove(kernel: usize) {
    if let Some(s) = slot(kernel) {
        TABLE[s].store(GONE, Relaxed);
        COUNT.fetch_sub(1, Relaxed);
    }
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
pub(super) fn refresh(records: &Records, kernel: usize) {
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
pub(in crate::accounting) fn context_appeared(records: &Records) {
    for k in tracked(records) {
        refresh(records, k);
    }
}

/// Context `ctx` was destroyed: the code loaded in it and its local memory went with it, and its
/// bit is free.
pub(in crate::accounting) fn context_gone(records: &mut Records, ctx: usize) {
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

/// A library was unloaded: its kernels go.
pub(in crate::accounting) fn forget_library(records: &mut Records, library: usize) {
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
    use crate::accounting::records::LazyKernel;

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

    /// The launch fast path's question: only a kernel in the table takes the hook body, whatever
    /// its contexts (`pending` then asks the current one).
    #[test]
    fn only_kernels_in_the_table_are_not_clear() {
        let base = 0x7f00_face_0000usize;
        assert!(clear(base) && clear(0));
        assert!(put(base, 0));
        assert!(!clear(base), "pending everywhere");
        assert!(clear(base + 64), "another kernel, not in the table");
        assert!(put(base, 1));
        assert!(!clear(base), "loaded in one context, not in every live one");
        remove(base);
        assert!(clear(base));
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
        let charge = crate::accounting::Charge {
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
