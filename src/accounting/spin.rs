//! A spin lock for the allocation records: the hot path of every `cuMemAlloc`/`cuMemFree` takes it
//! once, and holds it for a table insert or remove (tens of nanoseconds).
//!
//! Why not `parking_lot::Mutex`: its unlock is a locked compare-and-swap (it must see whether a
//! thread is parked). Here the unlock is a plain release store, so a lock/unlock pair costs one
//! locked instruction instead of two, on a path whose whole added cost is a handful of them. The
//! price is that a waiter cannot be woken: it spins briefly, then yields, then sleeps in short
//! steps, so a holder preempted (or of lower real-time priority on the same CPU) always gets to run
//! and release it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The raw lock: `true` while held.
pub struct RawSpin(AtomicBool);

/// Spins with a pause instruction before yielding the CPU.
const SPINS: u32 = 64;
/// Yields before sleeping.
const YIELDS: u32 = 16;
/// One sleep step once yielding did not help (a preempted holder needs the CPU).
const NAP: Duration = Duration::from_micros(20);

// SAFETY: `lock` returns only after this thread changed the flag from false to true (Acquire), and
// only the holder calls `unlock`, which stores false (Release): at most one holder at a time, and
// the holder sees everything the previous holder wrote.
unsafe impl lock_api::RawMutex for RawSpin {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: RawSpin = RawSpin(AtomicBool::new(false));
    type GuardMarker = lock_api::GuardSend;

    #[inline]
    fn lock(&self) {
        if !self.try_lock() {
            self.lock_contended();
        }
    }

    #[inline]
    fn try_lock(&self) -> bool {
        self.0
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    #[inline]
    unsafe fn unlock(&self) {
        self.0.store(false, Ordering::Release);
    }
}

impl RawSpin {
    #[cold]
    fn lock_contended(&self) {
        let mut waited = 0u32;
        loop {
            // Wait on a plain read (no cache-line ping-pong), then try again.
            while self.0.load(Ordering::Relaxed) {
                if waited < SPINS {
                    std::hint::spin_loop();
                } else if waited < SPINS + YIELDS {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(NAP);
                }
                waited = waited.saturating_add(1);
            }
            if lock_api::RawMutex::try_lock(self) {
                return;
            }
        }
    }
}

/// A value behind a [`RawSpin`].
pub type SpinMutex<T> = lock_api::Mutex<RawSpin, T>;

#[cfg(test)]
mod tests {
    use super::SpinMutex;

    #[test]
    fn excludes_concurrent_writers() {
        let counter = SpinMutex::new(0u64);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..20_000 {
                        // A non-atomic read-modify-write: lost updates if two held it at once.
                        let mut g = counter.lock();
                        let v = *g;
                        std::hint::black_box(&v);
                        *g = v + 1;
                    }
                });
            }
        });
        assert_eq!(*counter.lock(), 80_000);
    }
}
