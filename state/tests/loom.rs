//! A loom model of the compare-and-swap loops every process of a tenant runs on the shared ledgers:
//! the reservation against a quota (`slotfile::atomic::add_within`, what `Ledger::try_reserve`
//! runs on a device's `used`), the saturating release (`sub_saturating`) and the slot claim
//! (`take`, what both ledgers run on a slot's state word). The model runs these very functions
//! over loom's atomics and explores every interleaving of two or three threads.
//!
//!     RUSTFLAGS="--cfg loom" cargo test -p gpuslice-state --release --test loom
//!
//! Not modelled: the OFD lock a claimant takes before the state word (the kernel's), and the
//! process slots' own counters (each written by its holder alone).
#![cfg(loom)]

use gpuslice_state::slotfile::atomic::{add_within, sub_saturating, take, Ordering, Word};
use loom::sync::atomic::{AtomicU32, AtomicU64};
use loom::sync::Arc;
use loom::thread;

/// A loom word, as the facade's words are for the real loops.
struct W64(AtomicU64);
struct W32(AtomicU32);

impl Word for W64 {
    type V = u64;
    fn load(&self, order: Ordering) -> u64 {
        self.0.load(order)
    }
    fn compare_exchange(&self, c: u64, n: u64, s: Ordering, f: Ordering) -> Result<u64, u64> {
        self.0.compare_exchange(c, n, s, f)
    }
    fn compare_exchange_weak(&self, c: u64, n: u64, s: Ordering, f: Ordering) -> Result<u64, u64> {
        self.0.compare_exchange_weak(c, n, s, f)
    }
}

impl Word for W32 {
    type V = u32;
    fn load(&self, order: Ordering) -> u32 {
        self.0.load(order)
    }
    fn compare_exchange(&self, c: u32, n: u32, s: Ordering, f: Ordering) -> Result<u32, u32> {
        self.0.compare_exchange(c, n, s, f)
    }
    fn compare_exchange_weak(&self, c: u32, n: u32, s: Ordering, f: Ordering) -> Result<u32, u32> {
        self.0.compare_exchange_weak(c, n, s, f)
    }
}

const LIMIT: u64 = 100;
const FREE: u32 = 0;
const ACTIVE: u32 = 1;

/// Three processes reserve 40 bytes each against a quota of 100: exactly two get them, the total
/// is what they were granted, and no grant ever passed the quota.
#[test]
fn loom_reserve_never_passes_the_quota() {
    loom::model(|| {
        let used = Arc::new(W64(AtomicU64::new(0)));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let used = used.clone();
                thread::spawn(move || {
                    let r = add_within(&*used, 40, LIMIT);
                    if let Ok(total) = r {
                        assert!(total <= LIMIT, "granted up to {total} of {LIMIT}");
                    }
                    r.is_ok()
                })
            })
            .collect();
        let granted = threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|&ok| ok)
            .count() as u64;
        assert_eq!(granted, 2, "two of three 40-byte reservations fit in 100");
        assert_eq!(used.load(Ordering::Acquire), 40 * granted);
    });
}

/// A reservation racing a release and a watcher: the word never reads above the quota, and ends
/// at exactly what is still held (a release never lets a reservation pass the quota, nor wraps).
#[test]
fn loom_reserve_and_release_keep_the_count() {
    loom::model(|| {
        let used = Arc::new(W64(AtomicU64::new(70)));
        let releaser = {
            let used = used.clone();
            thread::spawn(move || {
                // 70 held; 50 of it freed (and 30 more than was held is clamped, not wrapped).
                assert_eq!(sub_saturating(&*used, 50), 0);
            })
        };
        let reserver = {
            let used = used.clone();
            thread::spawn(move || add_within(&*used, 60, LIMIT).is_ok())
        };
        let seen = used.load(Ordering::Acquire);
        assert!(seen <= LIMIT, "{seen} in use past the quota of {LIMIT}");
        releaser.join().unwrap();
        let got = reserver.join().unwrap();
        // 60 fits only once the 50 are back (70 + 60 > 100; 20 + 60 <= 100).
        let held = 20 + if got { 60 } else { 0 };
        assert_eq!(used.load(Ordering::Acquire), held);
        assert_eq!(sub_saturating(&*used, 1000), 1000 - held, "saturates at 0");
        assert_eq!(used.load(Ordering::Acquire), 0);
    });
}

/// Three processes claim among two free slots (each scanning from the first, as the ledgers
/// do): two get one each, never the same one, and the third finds none.
#[test]
fn loom_slot_claims_never_double_claim() {
    loom::model(|| {
        let slots = Arc::new([W32(AtomicU32::new(FREE)), W32(AtomicU32::new(FREE))]);
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let slots = slots.clone();
                thread::spawn(move || {
                    (0..slots.len()).find(|&i| {
                        slots[i].load(Ordering::Acquire) == FREE && take(&slots[i], FREE, ACTIVE)
                    })
                })
            })
            .collect();
        let mut got: Vec<usize> = threads
            .into_iter()
            .filter_map(|t| t.join().unwrap())
            .collect();
        got.sort_unstable();
        assert_eq!(got, vec![0, 1], "each slot claimed once, by one claimant");
        assert!(slots.iter().all(|s| s.load(Ordering::Acquire) == ACTIVE));
    });
}
