//! Repair and health of a device ledger: the sweep that frees dead processes' slots, the repair
//! of a truncated file (this process's slot and tenant written again), and the health report.

use super::tenants::fill_tenant;
use super::*;

impl DeviceLedger {
    /// What the file looks like from the kernel's evidence and its counters: for
    /// `gpuslice status --compute`, the exporter and the decision to throttle.
    pub fn health(&self) -> Health {
        let l = self.layout();
        let h = &l.header;
        let mut free = 0;
        let mut squatted = 0;
        for i in 0..MAX_SLOTS {
            if l.slots[i].state.load(Acquire) != SLOT_FREE {
                continue;
            }
            // A free slot whose lock is held: nobody in it, yet nobody can claim it (a claimant
            // holds the lock only for the instant between its lock and its state word).
            if slotfile::slot_alive::<Layout>(self.raw_fd(), i) {
                squatted += 1;
            } else {
                free += 1;
            }
        }
        let size = match &self.map {
            Map::Shared(w) => sys::fstat(w.fd()).map(|st| st.st_size as u64).ok(),
            Map::Copy(r) => std::fs::metadata(r.path()).map(|m| m.len()).ok(),
        };
        Health {
            free_slots: free,
            squatted_slots: squatted,
            size,
            expected_size: TOTAL_SIZE as u64,
            lock_takeovers: h.lock_takeovers.load(Acquire),
            slot_denials: h.slot_denials.load(Acquire),
            size_repairs: h.size_repairs.load(Acquire),
            forged_owner: h.forged_owner.load(Acquire),
            slot_reclaims: h.slot_reclaims.load(Acquire),
        }
    }

    /// Frees the slots of dead processes (the cleaner holds the dead slot's lock while it does).
    /// First checks the file's size: a truncated file is repaired (`slotfile`), and what this
    /// process had in it (its slot, its tenant) is put back, so arbitration resumes within one
    /// sweep. A fork child does not sweep (it gave up the descriptor the locks are tested on).
    pub fn sweep(&self, me: Option<usize>) {
        // The node's policy, re-read when root replaced it (`gpuslice set`): a `stat` otherwise.
        self.policy.reload();
        if !self.writable() || self.forked() {
            return;
        }
        self.repair();
        if let Some(TallyMap::Shared(t)) = &self.tally {
            t.trim_excess();
        }
        if let Some(me) = me {
            self.retake_shared_lock(me);
        }
        let ours = self.own.lock().tenant.as_ref().map(|t| t.0);
        // Which slots count for their labels, read again (a verdict lasts one sweep at most).
        self.attest(true);
        let now = now_ns();
        let l = self.layout();
        for i in 0..MAX_SLOTS {
            // Any state but FREE counts: a scribbled state word must not keep a slot forever.
            if Some(i) == me || l.slots[i].state.load(Acquire) == SLOT_FREE {
                continue;
            }
            let freed = slotfile::take_dead_slot::<Layout, _>(self.raw_fd(), i, || {
                let s = &l.slots[i];
                s.wants.store(0, Release);
                s.wait_since.store(0, Release);
                s.state.store(SLOT_FREE, Release);
            });
            // Looks alive (its byte is held): one of our tenant's, dead, under a squatter's lock?
            if freed.is_none() {
                if let Some(t) = ours {
                    self.free_own_dead_slot(i, t, now);
                }
            }
        }
    }

    /// After a truncation: the header, our slot and our tenant written again (others do the same
    /// with theirs). Logged once per repair.
    fn repair(&self) {
        let Map::Shared(w) = &self.map else {
            return;
        };
        if let Some(size) = w.trim_excess() {
            self.layout().header.size_repairs.fetch_add(1, Relaxed);
            crate::log::error(format_args!(
                "device ledger {}: grown to {size} bytes while in use (joiners would refuse it); cut back to {TOTAL_SIZE}",
                self.path.display()
            ));
        }
        if w.check_size()
            && self.layout().header.prefix.state.load(Acquire) == slotfile::STATE_READY
        {
            return;
        }
        if w.descriptor_lost() {
            return; // the program closed our descriptor: nothing to tell about the file
        }
        if w.detached() {
            return; // private zeros: nothing to share any more; the next process start rejoins
        }
        let l = self.layout();
        let h = &l.header;
        let uuid = self
            .path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if h.prefix.magic.load(Acquire) != u64::from_ne_bytes(MAGIC) {
            for (w, v) in h.uuid.iter().zip(pack(&uuid).unwrap_or_default()) {
                w.store(v, Release);
            }
            if h.epoch.load(Acquire) == 0 {
                h.epoch.store(1, Release);
            }
            h.prefix.version.store(VERSION, Release);
            h.prefix.total_size.store(TOTAL_SIZE as u64, Release);
            h.prefix.magic.store(u64::from_ne_bytes(MAGIC), Release);
        }
        let own = self.own.lock();
        if let Some(i) = own.slot {
            let s = &l.slots[i];
            if s.state.load(Acquire) != SLOT_ACTIVE {
                s.pid.store(sys::getpid(), Release);
                s.beat_ns.store(now_ns(), Release);
                if let Some((t, ..)) = &own.tenant {
                    s.tenant.store(*t as u32, Release);
                }
                s.state.store(SLOT_ACTIVE, Release);
            }
        }
        if let Some((i, id, name, share, cap, high)) = &own.tenant {
            let t = &l.tenants[*i];
            if t.state.load(Acquire) != TENANT_READY {
                fill_tenant(t, *id, name, *share, *cap, *high);
            }
        }
        h.prefix.state.store(slotfile::STATE_READY, Release);
        if self.repairs.fetch_add(1, Relaxed) == 0 {
            crate::log::error(format_args!(
                "device ledger {}: the file was truncated while in use; repaired (this process's slot and tenant written again)",
                self.path.display()
            ));
        }
    }
}

/// A device ledger's health ([`DeviceLedger::health`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// Free process slots a process can claim.
    pub free_slots: usize,
    /// Free process slots whose lock is held by someone not in them: nobody can claim them.
    pub squatted_slots: usize,
    /// The file's size now (`None`: could not be read), and its layout's.
    pub size: Option<u64>,
    pub expected_size: u64,
    /// Counters kept in the file (anybody can write them: a report, not evidence).
    pub lock_takeovers: u64,
    pub slot_denials: u64,
    pub size_repairs: u64,
    /// Times a process found itself kept from its due by an owner whose words lie and launched
    /// paced (`Header::forged_owner`).
    pub forged_owner: u64,
    /// Slots taken back from a tenant holding more than its limit by a process that found every
    /// slot in use (`Header::slot_reclaims`, `device::limit`).
    pub slot_reclaims: u64,
}

impl Health {
    /// Whether processes starting now may find no slot, or a file they must repair first.
    pub fn unhealthy(&self) -> bool {
        self.free_slots == 0 || self.squatted_slots > 0 || self.size != Some(self.expected_size)
    }

    /// One line for people.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.squatted_slots > 0 {
            parts.push(format!(
                "{} free process slot(s) locked by someone not in them (claimed all the same by processes whose tenant has a memory ledger)",
                self.squatted_slots
            ));
        }
        if self.free_slots == 0 {
            parts.push("no process slot free: a new process takes one back from a tenant over its slot limit (node tenants with a memory ledger) or runs throttled to its share".into());
        }
        match self.size {
            Some(s) if s != self.expected_size => parts.push(format!(
                "{s} bytes instead of {} (repaired by the next process that joins)",
                self.expected_size
            )),
            None => parts.push("size unreadable".into()),
            _ => {}
        }
        if parts.is_empty() {
            parts.push("healthy".into());
        }
        format!(
            "{}; {} free slot(s), {} process(es) throttled without a slot, {} arbitration lock take-over(s), {} size repair(s), {} forged-owner episode(s), {} slot(s) taken back from a tenant over its limit so far",
            parts.join("; "),
            self.free_slots,
            self.slot_denials,
            self.lock_takeovers,
            self.size_repairs,
            self.forged_owner,
            self.slot_reclaims
        )
    }
}
