//! Stream-ordered memory pools: a pool is charged what the driver says it holds (its reserved size),
//! never less than what is outstanding from it. A driver answer below the outstanding bytes is
//! impossible: the pool's figures are then not believed (logged once). It is charged the larger
//! figure, grows by every block the driver cannot be seen (by the block's address) to have cut from
//! memory the pool already had, and goes down only when trimmed by us to its outstanding blocks.

use super::{Charge, Tenant};
use crate::ledger::QuotaExceeded;
use crate::log;
use gpuslice_api::types::{CUdevice, CUmemLocation, CU_MEM_LOCATION_TYPE_DEVICE};
use parking_lot::ReentrantMutexGuard;
use std::collections::BTreeMap;

/// Most freed ranges kept per pool whose figures are not believed: past them, the smallest is
/// forgotten (a block later cut from it is charged as growth: more, never less).
const FREED_RANGES: usize = 1024;

/// What a pool is charged.
#[derive(Clone, Debug)]
pub(super) struct PoolCharge {
    pub device: usize,
    /// Charged in the ledger for the pool.
    pub bytes: u64,
    /// Allocated from it and not freed (as counted here).
    pub outstanding: u64,
    /// The driver once said the pool held less than its outstanding blocks: its figures are not
    /// believed any more, and its charge only grows until the pool is destroyed.
    pub untrusted: bool,
    /// While untrusted: address -> length of the blocks freed back to it, memory the charge covers.
    /// A new block inside one of them is memory the pool already had; any other is growth (the
    /// driver's free memory may be in pieces too small for it, or given back to the device).
    freed: BTreeMap<u64, u64>,
    /// What the last block recorded while untrusted added to the pool.
    last_growth: u64,
    /// While untrusted: the streams blocks were freed on (`cuMemFreeAsync`) since the pool was last
    /// trimmed, and how many bytes. The pool holds such a block until its stream reaches the free,
    /// so they are waited for before the pool is taken to hold only its outstanding blocks.
    pending_frees: Vec<(PendingFree, u64)>,
    /// Destroyed with blocks still allocated: the driver releases the pool "once there are no more
    /// outstanding allocations" (`cuMemPoolDestroy`), and it stays charged until then. Kept under a
    /// key no pool handle can be (the driver may give the handle to a new pool).
    destroyed: bool,
}

/// A stream a pool block was freed on: its handle, whether through a `_ptsz` entry point, and for
/// a per-thread default stream (a different stream in every thread) the freeing thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingFree {
    pub stream: usize,
    pub per_thread: bool,
    pub thread: Option<i32>,
}

/// The stream a free was enqueued on (`cuMemFreeAsync`): its handle, and whether through a `_ptsz`
/// entry point. Made a [`PendingFree`] only for a pool whose figures are not believed.
#[derive(Clone, Copy, Debug)]
pub struct FreedOn {
    pub stream: usize,
    pub per_thread: bool,
}

impl PendingFree {
    fn new(FreedOn { stream, per_thread }: FreedOn) -> PendingFree {
        // CU_STREAM_PER_THREAD, or the null stream through a `_ptsz` entry point.
        let per_thread_default = stream == 2 || (per_thread && stream == 0);
        PendingFree {
            stream,
            per_thread,
            thread: per_thread_default.then(thread_id),
        }
    }

    /// Whether the calling thread can wait for this stream (not another thread's default stream).
    pub fn reachable(&self) -> bool {
        self.thread.map_or(true, |t| t == thread_id())
    }
}

/// The calling thread's id. The system call, not glibc's `gettid` wrapper: that one is glibc 2.30's,
/// and the library loads into programs of glibc 2.28 (scripts/check-glibc).
fn thread_id() -> libc::pid_t {
    // SAFETY: gettid takes no arguments and cannot fail; a thread id fits a pid_t.
    unsafe { libc::syscall(libc::SYS_gettid) as libc::pid_t }
}

impl PoolCharge {
    fn new(device: usize) -> PoolCharge {
        PoolCharge {
            device,
            bytes: 0,
            outstanding: 0,
            untrusted: false,
            freed: BTreeMap::new(),
            last_growth: 0,
            pending_frees: Vec::new(),
            destroyed: false,
        }
    }

    /// A block of `bytes` at `at`: cut from a freed range (what it added is 0), or new memory.
    fn place(&mut self, at: u64, bytes: u64) -> u64 {
        let Some((&start, &len)) = self.freed.range(..=at).next_back() else {
            return bytes;
        };
        let end = start.saturating_add(len);
        if at.saturating_add(bytes) > end {
            return bytes;
        }
        self.freed.remove(&start);
        if at > start {
            self.freed.insert(start, at - start);
        }
        let after = at.saturating_add(bytes);
        if end > after {
            self.freed.insert(after, end - after);
        }
        0
    }

    /// The block at `at` of `bytes` is back in the pool, next to the ranges it touches.
    fn freed(&mut self, at: u64, bytes: u64) {
        let (mut start, mut end) = (at, at.saturating_add(bytes));
        if let Some((&s, &len)) = self.freed.range(..at).next_back() {
            if s.saturating_add(len) == at {
                self.freed.remove(&s);
                start = s;
            }
        }
        if let Some(len) = self.freed.remove(&end) {
            end = end.saturating_add(len);
        }
        self.freed.insert(start, end - start);
        if self.freed.len() > FREED_RANGES {
            if let Some((&smallest, _)) = self.freed.iter().min_by_key(|(_, &len)| len) {
                self.freed.remove(&smallest);
            }
        }
    }
}

impl Tenant {
    pub(super) fn has_pools(&self) -> bool {
        !self.records.lock().pools.is_empty()
    }

    /// Records where a pool just created allocates: the device of its properties' location, or
    /// host memory (which no device quota counts).
    pub fn pool_created(&self, pool: usize, location: CUmemLocation) {
        let place = (location.type_ == CU_MEM_LOCATION_TYPE_DEVICE).then_some(location.id);
        self.records.lock().pool_places.insert(pool, place);
    }

    /// Where `pool` allocates: `Some(Some(ordinal))` on a device, `Some(None)` in host memory,
    /// `None` when unknown (a pool created before the shim was active and current to no device).
    /// A pool may be on another device than the current context's: NVIDIA documents that
    /// `cuMemAllocFromPoolAsync`'s pool "may be from a device different than that of the specified
    /// stream", and the memory is that device's.
    pub fn pool_place(&self, pool: usize) -> Option<Option<CUdevice>> {
        if let Some(place) = self.records.lock().pool_places.get(&pool) {
            return Some(*place);
        }
        let owner = self.driver.pool_owner(pool)?;
        self.records.lock().pool_places.insert(pool, Some(owner));
        Some(Some(owner))
    }

    /// Records a block just allocated from `pool` (its bytes count as outstanding until freed).
    pub fn record_pool_block(&self, pool: usize, device: usize, ptr: u64, bytes: u64) {
        let mut r = self.records.lock();
        r.pool_blocks.insert(ptr, (pool, bytes));
        let entry = r
            .pools
            .entry(pool)
            .or_insert_with(|| PoolCharge::new(device));
        entry.outstanding = entry.outstanding.saturating_add(bytes);
        if entry.untrusted {
            entry.last_growth = entry.place(ptr, bytes);
        }
    }

    /// Whether `pool`'s figures are not believed ([`PoolCharge::untrusted`]).
    pub fn pool_untrusted(&self, pool: usize) -> bool {
        self.records
            .lock()
            .pools
            .get(&pool)
            .is_some_and(|p| p.untrusted)
    }

    /// A stream of `pool`'s pending frees that can no longer be waited for (destroyed since): its
    /// free runs once the stream's last work has, which the driver does on its own. Forgotten, so
    /// that a later trim counts it as run.
    pub fn forget_pending_free(&self, pool: usize, on: PendingFree) {
        if let Some(p) = self.records.lock().pools.get_mut(&pool) {
            p.pending_frees.retain(|(p, _)| *p != on);
        }
    }

    /// `pool`, whose figures are not believed, was just trimmed to nothing (`cuMemPoolTrimTo` 0)
    /// after the streams of its frees (`waited`) were synchronised: it holds only its outstanding
    /// blocks and those freed on other streams since, and is charged that. Returns whether that
    /// lowered its charge.
    pub fn untrusted_pool_trimmed(&self, pool: usize, waited: &[PendingFree]) -> bool {
        let mut r = self.records.lock();
        let Some(entry) = r.pools.get_mut(&pool) else {
            return false;
        };
        entry.pending_frees.retain(|(on, _)| !waited.contains(on));
        let pending = entry
            .pending_frees
            .iter()
            .fold(0u64, |sum, (_, bytes)| sum.saturating_add(*bytes));
        let holds = entry.outstanding.saturating_add(pending);
        if !entry.untrusted || entry.bytes <= holds {
            return false;
        }
        let freed = entry.bytes - holds;
        entry.bytes = holds;
        entry.freed.clear();
        let device = entry.device;
        drop(r);
        if let Some(Ok(ledger)) = self.ledger.get() {
            ledger.release(device, freed);
        }
        true
    }

    pub(super) fn pool_block_freed(&self, pool: usize, at: u64, bytes: u64, on: Option<FreedOn>) {
        if let Some(entry) = self.records.lock().pools.get_mut(&pool) {
            entry.outstanding = entry.outstanding.saturating_sub(bytes);
            if entry.untrusted {
                entry.freed(at, bytes);
                if let Some(on) = on.map(PendingFree::new) {
                    match entry.pending_frees.iter_mut().find(|(p, _)| *p == on) {
                        Some((_, pending)) => *pending = pending.saturating_add(bytes),
                        None => entry.pending_frees.push((on, bytes)),
                    }
                }
            }
        }
    }

    /// The streams blocks of `pool` were freed on since it was last trimmed (see
    /// [`PoolCharge::pending_frees`]), for the caller to wait for.
    pub fn untrusted_pending_frees(&self, pool: usize) -> Vec<PendingFree> {
        self.records
            .lock()
            .pools
            .get(&pool)
            .map(|p| p.pending_frees.iter().map(|(on, _)| *on).collect())
            .unwrap_or_default()
    }

    /// Sets the charge of a memory pool to what the driver says it holds now (`None`: it cannot say,
    /// so the pool keeps the whole reservation), given `reserved` bytes already reserved for its growth.
    /// When the pool grew by more than that and the quota has no room for the rest, the pool stays
    /// charged what was reserved and the refusal is returned: the caller undoes the allocation.
    pub fn pool_now_holds(
        &self,
        pool: usize,
        device: usize,
        holds: Option<u64>,
        reserved: u64,
    ) -> Result<(), QuotaExceeded> {
        let mut r = self.records.lock();
        let entry = r
            .pools
            .entry(pool)
            .or_insert_with(|| PoolCharge::new(device));
        let before = entry.bytes;
        let holds = match holds {
            Some(h) if !entry.untrusted && h >= entry.outstanding => h,
            // Grown by what its last block took beyond its freed ranges (0 when asked after frees).
            _ if entry.untrusted => {
                let grown = std::mem::take(&mut entry.last_growth);
                before.saturating_add(grown).max(entry.outstanding)
            }
            Some(h) => {
                entry.untrusted = true;
                // What it had beyond its blocks is not known to be of any use: no freed range, and
                // the block just allocated (`reserved`) counts as growth.
                entry.freed.clear();
                log::warn(format_args!(
                    "the driver says memory pool {pool:#x} holds {h} bytes, less than the {} \
                     bytes allocated from it: its figures are no longer believed, and it stays \
                     charged the larger",
                    entry.outstanding
                ));
                before.saturating_add(reserved).max(entry.outstanding)
            }
            None => before.saturating_add(reserved),
        };
        let Some(Ok(ledger)) = self.ledger.get() else {
            entry.bytes = holds;
            return Ok(());
        };
        let grown = holds.saturating_sub(before);
        if grown > reserved {
            if let Err(e) = ledger.try_reserve(device, grown - reserved) {
                entry.bytes = before + reserved;
                return Err(e);
            }
        } else if grown < reserved {
            ledger.release(device, reserved - grown);
        }
        if holds < before {
            ledger.release(device, before - holds);
        }
        entry.bytes = holds;
        Ok(())
    }

    /// Held by a stream-ordered allocation from before its reservation until its pool's charge is
    /// settled ([`Tenant::pool_now_holds`]).
    pub fn pool_serial(&self) -> ReentrantMutexGuard<'_, ()> {
        self.pools_serial.lock()
    }

    /// Re-reads every known pool's reserved size and returns what the driver released.
    pub fn settle_pools(&self) {
        let _serial = self.pool_serial();
        let drained: Vec<PoolCharge> = {
            let mut r = self.records.lock();
            let keys: Vec<usize> = r
                .pools
                .iter()
                .filter(|(_, p)| p.destroyed && p.outstanding == 0)
                .map(|(&k, _)| k)
                .collect();
            keys.iter().filter_map(|k| r.pools.remove(k)).collect()
        };
        // A destroyed pool whose last block was freed: released by the driver once that free ran,
        // which a synchronisation (this call) is taken to have waited for.
        for pool in drained {
            self.release(Charge {
                device: pool.device,
                bytes: pool.bytes,
            });
        }
        let pools: Vec<(usize, usize, u64)> = self
            .records
            .lock()
            .pools
            .iter()
            .filter(|(_, charge)| !charge.untrusted && !charge.destroyed)
            .map(|(&pool, charge)| (pool, charge.device, charge.bytes))
            .collect();
        for (pool, device, bytes) in pools {
            if let Some(holds) = self.driver.pool_reserved(pool) {
                if holds < bytes {
                    let _ = self.pool_now_holds(pool, device, Some(holds), 0);
                }
            }
        }
    }

    pub fn forget_pool(&self, pool: usize) {
        let _serial = self.pool_serial();
        let mut r = self.records.lock();
        r.pool_places.remove(&pool);
        let charge = r.pools.remove(&pool);
        if let Some(mut draining) = charge.clone().filter(|c| c.outstanding > 0) {
            // Blocks still allocated: the pool lives on, charged, under a key of its own.
            static DESTROYED: std::sync::atomic::AtomicUsize =
                std::sync::atomic::AtomicUsize::new(0);
            let key = usize::MAX - DESTROYED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            draining.destroyed = true;
            r.pools.insert(key, draining);
            for (p, _) in r.pool_blocks.values_mut() {
                if *p == pool {
                    *p = key;
                }
            }
            return;
        }
        r.pool_blocks.retain(|_, (p, _)| *p != pool);
        drop(r);
        if let Some(c) = charge {
            self.release(Charge {
                device: c.device,
                bytes: c.bytes,
            });
        }
    }
}
