//! Stream-ordered memory pools: a pool is charged what the driver says it holds (its reserved size),
//! never less than what is outstanding from it. A driver answer below the outstanding bytes is
//! impossible: the pool is then charged the larger figure from there on, never less (logged once).

use super::{Charge, Tenant};
use crate::driver::calls as driver;
use crate::ledger::QuotaExceeded;
use crate::log;
use gpuslice_api::types::{CUdevice, CUmemLocation, CU_MEM_LOCATION_TYPE_DEVICE};
use parking_lot::ReentrantMutexGuard;

/// What a pool is charged.
#[derive(Clone, Copy, Debug)]
pub(super) struct PoolCharge {
    pub device: usize,
    /// Charged in the ledger for the pool.
    pub bytes: u64,
    /// Allocated from it and not freed (as counted here).
    pub outstanding: u64,
    /// The driver once said the pool held less than its outstanding blocks: its figures are not
    /// believed any more, and its charge only grows until the pool is destroyed.
    pub untrusted: bool,
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
        let owner = driver::pool_owner(pool)?;
        self.records.lock().pool_places.insert(pool, Some(owner));
        Some(Some(owner))
    }

    /// Records a block just allocated from `pool` (its bytes count as outstanding until freed).
    pub fn record_pool_block(&self, pool: usize, device: usize, ptr: u64, bytes: u64) {
        let mut r = self.records.lock();
        r.pool_blocks.insert(ptr, (pool, bytes));
        let entry = r.pools.entry(pool).or_insert(PoolCharge {
            device,
            bytes: 0,
            outstanding: 0,
            untrusted: false,
        });
        entry.outstanding = entry.outstanding.saturating_add(bytes);
    }

    /// What a new block from `pool` must reserve: all of it, except from a pool whose figures are
    /// not believed, whose charge (never lowered) already covers a block up to what it holds beyond
    /// its outstanding blocks.
    pub fn pool_block_reservation(&self, pool: usize, bytes: u64) -> u64 {
        match self.records.lock().pools.get(&pool) {
            Some(p) if p.untrusted => bytes.saturating_sub(p.bytes.saturating_sub(p.outstanding)),
            _ => bytes,
        }
    }

    pub(super) fn pool_block_freed(&self, pool: usize, bytes: u64) {
        if let Some(entry) = self.records.lock().pools.get_mut(&pool) {
            entry.outstanding = entry.outstanding.saturating_sub(bytes);
        }
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
        let entry = r.pools.entry(pool).or_insert(PoolCharge {
            device,
            bytes: 0,
            outstanding: 0,
            untrusted: false,
        });
        let before = entry.bytes;
        let holds = match holds {
            Some(h) if !entry.untrusted && h >= entry.outstanding => h,
            Some(h) => {
                if !entry.untrusted {
                    entry.untrusted = true;
                    log::warn(format_args!(
                        "the driver says memory pool {pool:#x} holds {h} bytes, less than the {} \
                         bytes allocated from it: its figures are no longer believed, and it stays \
                         charged the larger",
                        entry.outstanding
                    ));
                }
                before.max(entry.outstanding)
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
        let pools: Vec<(usize, PoolCharge)> = self
            .records
            .lock()
            .pools
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect();
        for (pool, charge) in pools {
            if charge.untrusted {
                continue;
            }
            if let Some(holds) = driver::pool_reserved(pool) {
                if holds < charge.bytes {
                    let _ = self.pool_now_holds(pool, charge.device, Some(holds), 0);
                }
            }
        }
    }

    pub fn forget_pool(&self, pool: usize) {
        let _serial = self.pool_serial();
        let mut r = self.records.lock();
        r.pool_places.remove(&pool);
        let charge = r.pools.remove(&pool);
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
