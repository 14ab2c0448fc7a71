//! What a waiting process publishes in the device ledger, and how a waiter tells a stopped, dead
//! or forged owner and takes the device from it (docs/COMPUTE.md, "Ownership, slices, draining").
//! Every word read from the ledger is untrusted.

use super::{Sched, BEAT_STALE_NS};
use crate::scheduling::arbiter::{self, GRACE_NS, SLICE_NS};
use crate::scheduling::device::{futex_wake, now_ns};
use crate::scheduling::{incident, Holder, Incident};
use std::sync::atomic::Ordering::*;

impl Sched {
    /// Writes our slot's `wants` and `wait_since` from this process's own count. Two threads
    /// publishing at once may leave a stale value; a waiter's next pass and the scheduler thread's
    /// refresh write it again.
    pub(in crate::scheduling) fn publish_waiting(&self) {
        let slot = &self.ledger.layout().slots[self.slot];
        let n = self.published_wants();
        let since = if n == 0 {
            0
        } else {
            self.waiting_since.load(SeqCst).max(1)
        };
        slot.wants.store(n, Release);
        slot.wait_since.store(since, Release);
    }

    /// What our `wants` word says: the threads waiting, or one while we launch paced
    /// (`evidence`): our neighbours' buckets then count us as waiting, and arbitration may grant
    /// us a turn again.
    fn published_wants(&self) -> u32 {
        self.waiting
            .load(SeqCst)
            .max(u32::from(self.evidence.fallback()))
    }

    /// Whether our slot's `wants` and `wait_since` words say what this process's count says.
    pub(in crate::scheduling) fn waiting_published(
        &self,
        slot: &crate::scheduling::shm::SlotEntry,
    ) -> bool {
        let n = self.published_wants();
        let since = slot.wait_since.load(Acquire);
        slot.wants.load(Acquire) == n && (n == 0) == (since == 0) && since <= now_ns()
    }

    /// Whether the owner is stopped or hung: past its slice plus the grace, and silent (a draining
    /// owner beats); or past its slice, the longest drain and the grace, beating or not. A grant, slice or heartbeat that cannot be genuine is repaired first.
    pub(in crate::scheduling) fn overdue(&self, h: &crate::scheduling::shm::Header) -> bool {
        // Read before the clock: a genuine stamp is then never ahead of `now`.
        let (grant, slice, beat) = (
            h.grant_ns.load(Acquire),
            h.slice_ns.load(Acquire),
            h.owner_beat_ns.load(Acquire),
        );
        let now = now_ns();
        if grant > now || slice > SLICE_NS || beat > now {
            let g = self.ledger.lock(self.slot);
            let fixed_grant = h.grant_ns.load(Acquire).min(now);
            h.grant_ns.store(fixed_grant, Release);
            h.slice_ns
                .store(h.slice_ns.load(Acquire).min(SLICE_NS), Release);
            h.owner_beat_ns
                .store(h.owner_beat_ns.load(Acquire).min(now), Release);
            drop(g);
            incident(
                Incident::Time,
                format_args!(
                    "device ledger {}: grant {grant}, slice {slice} ns, heartbeat {beat} (now {now})",
                    self.ledger.path().display()
                ),
            );
            return false;
        }
        let past = grant.saturating_add(slice).saturating_add(GRACE_NS);
        // A heartbeat is a word anybody can write: past the longest a genuine owner can keep one
        // grant (its slice, the bounded drain, the grace), a fresh one does not save it.
        (now > past && now.saturating_sub(beat) > BEAT_STALE_NS)
            || now > past.saturating_add(arbiter::DRAIN_LIMIT_NS)
    }

    /// Takes the device from a dead, stopped or invalid owner (still `owner` under `epoch`).
    pub(in crate::scheduling) fn revoke(&self, owner: Holder, epoch: u32) {
        let l = self.ledger.layout();
        let h = &l.header;
        let g = self.ledger.lock(self.slot);
        if h.owner.load(Acquire) != owner.word() || h.epoch.load(Acquire) != epoch {
            return;
        }
        let now = now_ns();
        if let Some(slot) = owner.slot() {
            let t = l.slots[slot].tenant.load(Acquire) as usize;
            let held = now.saturating_sub(h.grant_ns.load(Acquire).min(now));
            let bound = h
                .slice_ns
                .load(Acquire)
                .min(SLICE_NS)
                .saturating_add(GRACE_NS);
            g.charge(t, held.min(bound), now);
            self.ledger.count(t, true);
            crate::log::info(format_args!(
                "compute: revoked the device from slot {slot} (dead or stopped)"
            ));
        }
        h.revocations.fetch_add(1, Relaxed);
        g.hand_over(now);
        drop(g);
        futex_wake(&h.epoch);
    }
}
