//! Liveness: reclaiming dead processes' slots (sweeps), and a fork child's own slot.

use super::*;

impl Ledger {
    /// [`Ledger::sweep`], at most once per `SWEEP_INTERVAL_MS` in this process (`now`: `now_ms`).
    pub(super) fn sweep_if_due(&self, now: u64) -> usize {
        let last = self.last_sweep_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= SWEEP_INTERVAL_MS
            && self
                .last_sweep_ms
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            return self.sweep();
        }
        0
    }

    /// Before the tenant's usage is shown (`cuMemGetInfo`, NVML): the memory of its processes that
    /// died is given back first (at most every `SWEEP_INTERVAL_MS`), so that what is shown free is
    /// what can be had.
    pub fn sweep_before_showing(&self) {
        self.sweep_if_due(now_ms());
    }

    /// Reclaims the slots of dead processes; returns how many. Never waits on another process.
    pub fn sweep(&self) -> usize {
        if !self.writable || self.damaged(true) || self.sweeping.swap(true, Ordering::AcqRel) {
            return 0;
        }
        let fd = self.raw_fd();
        let me = self.slot();
        let l = self.layout();
        let mut n = 0;
        for i in 0..MAX_SLOTS {
            if Some(i) == me || l.slot_state(i) == shm::SLOT_FREE {
                continue;
            }
            // Its holder is gone when its lock can be taken: we alone hold it then.
            if let Some(Some(excess)) =
                slotfile::take_dead_slot::<Layout, _>(fd, i, || l.reclaim_slot(i))
            {
                n += 1;
                if excess > 0 {
                    self.report_impossible_slot(i, excess);
                }
            }
        }
        self.sweeping.store(false, Ordering::Release);
        if n > 0 {
            log::info(format_args!(
                "ledger {}: reclaimed the memory of {n} dead process(es)",
                self.path.display()
            ));
        }
        n
    }

    #[inline]
    pub(super) fn check_fork(&self) {
        // getpid() is a system call (glibc no longer caches it): compare it only after a fork.
        if self.fork_pending() {
            self.after_fork();
        }
    }

    /// A fork happened since this process last looked (its slot may be its parent's).
    #[inline]
    pub(super) fn fork_pending(&self) -> bool {
        sys::forks_seen() != self.forks_seen.load(Ordering::Relaxed)
    }

    #[cold]
    pub(super) fn after_fork(&self) {
        self.forks_seen.store(sys::forks_seen(), Ordering::Relaxed);
        if self.owner_pid.load(Ordering::Acquire) != sys::getpid() && self.slot().is_some() {
            if let Err(e) = self.reattach_after_fork() {
                log::error(format_args!(
                    "{e}; this fork child's allocations are refused"
                ));
            }
        }
    }

    /// In a fork child: opens the file anew (OFD locks belong to the open file description, which
    /// the child shares with its parent) and claims a slot of its own. Idempotent; called
    /// automatically by `try_reserve`/`release` when the pid changed.
    pub fn reattach_after_fork(&self) -> Result<(), LedgerError> {
        let me = sys::getpid();
        let old = self.owner_pid.load(Ordering::Acquire);
        if old == me || !self.writable {
            return Ok(());
        }
        if self
            .owner_pid
            .compare_exchange(old, me, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Ok(()); // another thread of this child is doing it
        }
        // The same file as the mapping's, even if the path now names another one.
        let fd = match &self.map {
            Map::Shared(w) => w.lock_fd(),
            Map::Copy(_) => return Ok(()),
        }
        .map_err(io_err(&self.path, "reopen after fork"))?;
        // Locks taken by other threads of the parent at fork time do not matter in the child.
        self.sweeping.store(false, Ordering::Release);
        self.claiming.store(false, Ordering::Release);
        self.slot.store(NO_SLOT, Ordering::Release);
        self.fd.store(fd.as_raw_fd(), Ordering::Release);
        {
            // Closing our copy of the parent's fd keeps the parent's lock (the parent still has it
            // open) while letting the parent's slot die with the parent.
            let mut fds = self.fds.try_lock().ok_or_else(|| LedgerError::Corrupt {
                path: self.path.clone(),
                what: "fd list locked at fork".into(),
            })?;
            fds.clear();
            fds.push(fd);
        }
        // The child's own slot is claimed at its first reservation.
        Ok(())
    }
}
