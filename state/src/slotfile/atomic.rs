//! The one facade over atomics for memory shared with other processes: every word of a slot file's
//! layout is one of these types, and the compare-and-swap loops the layouts share ([`add_within`],
//! [`sub_saturating`], [`take`]) are written once here, over [`Word`], so that the `loom` model
//! (`tests/loom.rs` of this crate) explores the very loops the ledgers run.
//!
//! Each type is `#[repr(transparent)]` over the standard atomic of the same width: layouts keep
//! their size, alignment and offsets to the byte. `state/clippy.toml` forbids the standard types
//! elsewhere in this crate (`clippy::disallowed_types`); a process-local word outside the shared
//! mapping says why with a scoped `#[allow]`.
#![allow(clippy::disallowed_types)] // the facade itself wraps the standard types

use std::fmt;
pub use std::sync::atomic::Ordering;

macro_rules! facade {
    ($(#[$doc:meta])* $name:ident, $std:ident, $int:ty) => {
        $(#[$doc])*
        #[repr(transparent)]
        #[derive(Default)]
        pub struct $name(std::sync::atomic::$std);

        impl $name {
            pub const fn new(v: $int) -> Self {
                Self(std::sync::atomic::$std::new(v))
            }
            #[inline(always)]
            pub fn load(&self, order: Ordering) -> $int {
                self.0.load(order)
            }
            #[inline(always)]
            pub fn store(&self, v: $int, order: Ordering) {
                self.0.store(v, order)
            }
            #[inline(always)]
            pub fn swap(&self, v: $int, order: Ordering) -> $int {
                self.0.swap(v, order)
            }
            #[inline(always)]
            pub fn compare_exchange(
                &self,
                current: $int,
                new: $int,
                success: Ordering,
                failure: Ordering,
            ) -> Result<$int, $int> {
                self.0.compare_exchange(current, new, success, failure)
            }
            #[inline(always)]
            pub fn compare_exchange_weak(
                &self,
                current: $int,
                new: $int,
                success: Ordering,
                failure: Ordering,
            ) -> Result<$int, $int> {
                self.0.compare_exchange_weak(current, new, success, failure)
            }
            #[inline(always)]
            pub fn fetch_add(&self, v: $int, order: Ordering) -> $int {
                self.0.fetch_add(v, order)
            }
            #[inline(always)]
            pub fn fetch_sub(&self, v: $int, order: Ordering) -> $int {
                self.0.fetch_sub(v, order)
            }
            #[inline(always)]
            pub fn fetch_max(&self, v: $int, order: Ordering) -> $int {
                self.0.fetch_max(v, order)
            }
            #[inline(always)]
            pub fn fetch_min(&self, v: $int, order: Ordering) -> $int {
                self.0.fetch_min(v, order)
            }
            #[inline(always)]
            pub fn fetch_or(&self, v: $int, order: Ordering) -> $int {
                self.0.fetch_or(v, order)
            }
            #[inline(always)]
            pub fn fetch_and(&self, v: $int, order: Ordering) -> $int {
                self.0.fetch_and(v, order)
            }
            /// The word's address, for system calls that take it (a futex).
            #[inline(always)]
            pub fn as_ptr(&self) -> *mut $int {
                self.0.as_ptr()
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        impl Word for $name {
            type V = $int;
            #[inline(always)]
            fn load(&self, order: Ordering) -> $int {
                self.0.load(order)
            }
            #[inline(always)]
            fn compare_exchange(
                &self,
                current: $int,
                new: $int,
                success: Ordering,
                failure: Ordering,
            ) -> Result<$int, $int> {
                self.0.compare_exchange(current, new, success, failure)
            }
            #[inline(always)]
            fn compare_exchange_weak(
                &self,
                current: $int,
                new: $int,
                success: Ordering,
                failure: Ordering,
            ) -> Result<$int, $int> {
                self.0.compare_exchange_weak(current, new, success, failure)
            }
        }
    };
}

facade!(
    /// A shared byte.
    AtomicU8, AtomicU8, u8
);
facade!(
    /// A shared 32-bit word (states, pids, futex words).
    AtomicU32, AtomicU32, u32
);
facade!(
    /// A shared 64-bit word (bytes, time stamps, keys).
    AtomicU64, AtomicU64, u64
);
facade!(
    /// A shared signed 64-bit word.
    AtomicI64, AtomicI64, i64
);

/// What the shared compare-and-swap loops need of a word: this facade's types, and the model
/// checker's atomics in the `loom` model.
pub trait Word {
    type V: Copy + Eq;
    fn load(&self, order: Ordering) -> Self::V;
    fn compare_exchange(
        &self,
        current: Self::V,
        new: Self::V,
        success: Ordering,
        failure: Ordering,
    ) -> Result<Self::V, Self::V>;
    fn compare_exchange_weak(
        &self,
        current: Self::V,
        new: Self::V,
        success: Ordering,
        failure: Ordering,
    ) -> Result<Self::V, Self::V>;
}

/// A reservation against a quota: `word += bytes` when the sum stays within `limit`, as one
/// compare-and-swap loop (no lock: every process of a tenant reserves on the same word).
/// `Ok(new total)`, or `Err(what was in use)` when the sum would pass `limit` (or overflow).
#[inline]
pub fn add_within<W: Word<V = u64>>(word: &W, bytes: u64, limit: u64) -> Result<u64, u64> {
    let mut used = word.load(Ordering::Acquire);
    loop {
        let new = match used.checked_add(bytes) {
            Some(n) if n <= limit => n,
            _ => return Err(used),
        };
        match word.compare_exchange_weak(used, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Ok(new),
            Err(now) => used = now,
        }
    }
}

/// A release: `word -= bytes`, saturating at 0 (a garbage counter must not wrap). Returns the
/// part of `bytes` that could not be subtracted.
#[inline]
pub fn sub_saturating<W: Word<V = u64>>(word: &W, bytes: u64) -> u64 {
    let mut cur = word.load(Ordering::Acquire);
    loop {
        let new = cur.saturating_sub(bytes);
        match word.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return bytes - (cur - new),
            Err(now) => cur = now,
        }
    }
}

/// A claim: moves a state word from `from` to `to`; true for exactly one of any number of
/// claimants racing on it.
#[inline]
pub fn take<W: Word<V = u32>>(word: &W, from: u32, to: u32) -> bool {
    word.compare_exchange(from, to, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
}
