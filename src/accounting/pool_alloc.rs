//! A stream-ordered allocation from a memory pool, decided here: which device's quota it concerns,
//! what is reserved before the driver is asked, how room is made near the quota (synchronise, wait
//! for pending frees, trim, read the pool again), and how the pool's charge settles afterwards.
//! The hooks only hand over the request; every driver call goes through the seam
//! (`driver::seam::Driver`).

use super::{allocation_size, PendingFree, Tenant};
use gpuslice_api::{CUerror, CUresult};
use parking_lot::ReentrantMutexGuard;
use std::sync::atomic::{AtomicBool, Ordering};

/// A stream-ordered allocation as the program asked for it.
#[derive(Clone, Copy, Debug)]
pub struct PoolRequest {
    pub bytes: u64,
    pub stream: usize,
    /// Through a `_ptsz` entry point.
    pub per_thread: bool,
    /// The pool named (`cuMemAllocFromPoolAsync`); `None`: the stream's device's current pool.
    pub pool: Option<usize>,
}

/// Whether this process allocated from a pool yet (synchronisations then settle the pools).
static POOLS_USED: AtomicBool = AtomicBool::new(false);

impl Tenant {
    /// A stream-ordered allocation: `call` asks the driver and returns the block's address, `free`
    /// gives a block back. Captured into a graph (`capturing`), it allocates nothing now: the
    /// graph's memory is allocated at its launch and charged by reconciliation (docs/MEMORY.md).
    pub fn alloc_from_pool(
        &self,
        request: PoolRequest,
        call: impl FnOnce() -> Result<u64, CUerror>,
        free: impl FnOnce(u64) -> CUresult,
    ) -> CUresult {
        let PoolRequest {
            bytes,
            stream,
            per_thread,
            pool,
        } = request;
        // No context: the driver answers (and reports its own error).
        let Ok(device) = self.stream_device(stream as gpuslice_api::types::CUstream) else {
            return call().map(drop);
        };
        if self.driver.capturing(stream, per_thread) {
            return call().map(drop);
        }
        let bytes = allocation_size(bytes);
        let Some(pool) = pool.or_else(|| self.driver.current_pool(device.ordinal)) else {
            // No pool to watch: charge the allocation itself, returned by its free.
            return self.charged(device, bytes, "cuMemAllocAsync", call);
        };
        // The memory is the pool's device's, whatever the current context's device.
        let device = match self.pool_place(pool) {
            Some(None) => return call().map(drop),
            Some(Some(ordinal)) if ordinal != device.ordinal => {
                self.device(ordinal).unwrap_or(device)
            }
            _ => device,
        };
        let sync = || self.driver.stream_synchronize(stream, per_thread);
        let mut serial = self.pool_serial();
        // The pool may grow by the whole request: reserve it before the driver is asked (a block
        // the pool reuses is given back right after). Near the quota, memory the pool holds for
        // blocks already freed on this stream is released first -- the stream is synchronised so
        // that those frees have run, and the pool trimmed to what is in use -- rather than
        // refusing. The synchronisations run without the pool bookkeeping's lock (the process's
        // other stream-ordered allocations must not wait for this stream): what they decide is
        // read again after them.
        let slot = device.slot.as_ref().copied().unwrap_or(0);
        let reservation = self.reserve_or_make_room(device, bytes, "cuMemAllocAsync", || {
            self.make_pool_room(pool, slot, &request, &mut serial)
        })?;
        let block = call()?;
        let charge = reservation.commit();
        POOLS_USED.store(true, Ordering::Relaxed);
        self.record_pool_block(pool, charge.device, block, bytes);
        let held = self.driver.pool_reserved(pool);
        if let Err(refused) = self.pool_now_holds(pool, charge.device, held, charge.bytes) {
            // The pool grew by more than the request (allocation granularity) and the quota has
            // no room for the rest: give the block back, shrink the pool, refuse.
            if self.uncharge(block, || free(block)).is_ok() {
                let _ = ReentrantMutexGuard::unlocked(&mut serial, sync);
            }
            // Trimming releases only memory no block holds: to 0 when the driver cannot say what
            // is used.
            let used = self.driver.pool_used(pool).unwrap_or(0);
            self.driver.pool_trim(pool, used);
            let now = self.driver.pool_reserved(pool);
            let _ = self.pool_now_holds(pool, charge.device, now, 0);
            self.refused(device, bytes, "cuMemAllocAsync", refused);
            return Err(CUerror::OUT_OF_MEMORY);
        }
        Ok(())
    }

    /// Makes room in `pool` (charged on ledger device `slot`) for `request`, refused at the quota:
    /// true when the pool's charge went down. A pool whose figures are believed is synchronised
    /// with the allocating stream and trimmed to what it has handed out; one whose figures are not
    /// is trimmed to nothing once every free enqueued on it has run, then holds only its
    /// outstanding blocks. The synchronisations run without `serial` (the pool bookkeeping's lock).
    pub(super) fn make_pool_room(
        &self,
        pool: usize,
        slot: usize,
        request: &PoolRequest,
        serial: &mut ReentrantMutexGuard<'_, ()>,
    ) -> bool {
        let sync = || {
            self.driver
                .stream_synchronize(request.stream, request.per_thread)
                .is_ok()
        };
        if self.pool_untrusted(pool) {
            let waited = ReentrantMutexGuard::unlocked(serial, || {
                sync().then(|| self.wait_for_pending_frees(pool)).flatten()
            });
            let Some(waited) = waited else {
                return false;
            };
            self.driver.pool_trim(pool, 0);
            return self.untrusted_pool_trimmed(pool, &waited);
        }
        let (Some(held), Some(used)) =
            (self.driver.pool_reserved(pool), self.driver.pool_used(pool))
        else {
            return false;
        };
        if held <= used || !ReentrantMutexGuard::unlocked(serial, sync) {
            return false;
        }
        // Trimming to `used` as read before the synchronisation is safe if another allocation
        // grew the pool since: the driver never releases memory a block holds.
        self.driver.pool_trim(pool, used);
        let now = self.driver.pool_reserved(pool);
        let _ = self.pool_now_holds(pool, slot, now, 0);
        now.is_some_and(|n| n < held)
    }

    /// Waits for the frees enqueued on other streams since `pool` was last trimmed. Returns the
    /// streams waited for; `None` when one cannot be waited for now (another thread's default
    /// stream, a stream capturing, a failed wait).
    fn wait_for_pending_frees(&self, pool: usize) -> Option<Vec<PendingFree>> {
        let pending = self.untrusted_pending_frees(pool);
        let _relaxed = self.driver.relaxed_capture();
        for p in &pending {
            if !p.reachable() || self.driver.capturing(p.stream, p.per_thread) {
                return None;
            }
            if self
                .driver
                .stream_synchronize(p.stream, p.per_thread)
                .is_err()
            {
                // A stream destroyed since: its free runs on its own; refused this time, counted
                // as run the next.
                self.forget_pending_free(pool, *p);
                return None;
            }
        }
        Some(pending)
    }

    /// After a synchronisation the program asked for: pools may hold less, and graphs that ran
    /// have given their memory back.
    pub fn synchronized(&self) {
        if POOLS_USED.load(Ordering::Relaxed) {
            self.settle_pools();
        }
        self.release_finished_graph_memory();
    }
}
