//! The wait for a grant (docs/COMPUTE.md, "Arbitration"): a launch that may not go through waits
//! here until its process owns the device, its tenant's turn or a paced window lets it through, or
//! the device is no longer contended; meanwhile it takes the device from an owner that is dead,
//! overdue or named by a damaged word, and asks a normal owner to yield to high priority.

use super::{runtime, Sched, TURN_POLL_NS, WAITER_POLL_NS};
use crate::scheduling::arbiter::Choice;
use crate::scheduling::device::{futex_wait, futex_wake, now_ns};
use crate::scheduling::{incident, Holder, Incident};
use std::sync::atomic::Ordering::*;

impl Sched {
    /// Waits until this process owns the device (or the device is no longer contended).
    pub(in crate::scheduling) fn wait_for_grant(&self) {
        let l = self.ledger.layout();
        let h = &l.header;
        let slot = &l.slots[self.slot];
        if self.waiting.fetch_add(1, SeqCst) == 0 {
            self.waiting_since.store(now_ns(), SeqCst);
        }
        self.publish_waiting();
        loop {
            if !self.contended()
                || runtime::stopped()
                || self.peer_pass_due()
                || self.tenant_turn()
                || self.evidence.paced()
            {
                break;
            }
            // Our words zeroed or scribbled (a truncation repaired with zeros, another program):
            // arbitration would never see us wait. Written again on every pass (at most
            // `WAITER_POLL_NS` apart).
            if !self.waiting_published(slot) {
                self.publish_waiting();
            }
            let e = h.epoch.load(Acquire);
            let o = Holder::from_word(h.owner.load(Acquire));
            if o == self.me() {
                // `stopping` before `owned`: our release sets `owned` to 0 before it clears
                // `stopping`, so a release that granted us again (a new epoch naming us) is never
                // seen finished with our old epoch still in `owned`.
                let stopping = self.stopping.load(SeqCst);
                let owned = self.owned.load(SeqCst);
                if owned != e && !stopping && self.evidence.may_own() {
                    let now = now_ns();
                    if owned != 0 {
                        // Our ownership's epoch replaced by another naming us: the same evidence
                        // as the scheduler thread's (`owner_loop`), seen first here.
                        self.evidence.replaced(now);
                    }
                    self.adopt(e, now);
                }
                if self.owns_now() {
                    break;
                }
                // Our own slice is ending: wait for the hand-over.
                futex_wait(&h.epoch, e, self.waiter_poll_ns(false));
                continue;
            }
            if o.is_none() {
                let mut timeout = WAITER_POLL_NS;
                let g = self.ledger.lock(self.slot);
                if Holder::from_word(h.owner.load(Acquire)).is_none() {
                    let c = g.hand_over(now_ns());
                    drop(g);
                    futex_wake(&h.epoch);
                    if let Choice::Wait { retry_ns } = c {
                        timeout = retry_ns.min(WAITER_POLL_NS);
                    }
                } else {
                    drop(g);
                }
                if h.epoch.load(Acquire) == e && h.owner.load(Acquire) == 0 {
                    futex_wait(&h.epoch, e, timeout);
                }
                continue;
            }
            if self.revoke_lapsed(o, e) {
                continue;
            }
            let Some(owner) = o.slot() else {
                continue;
            };
            let ot = l.slots[owner].tenant.load(Acquire) as usize;
            if self.high.load(Relaxed) && !self.ledger.is_high(ot) && h.preempt.swap(1, AcqRel) == 0
            {
                futex_wake(&h.preempt);
            }
            // Our tenant's owner past its slice: it renews (the turn is shared again) or hands
            // over, soon.
            // Another tenant's owner: it wakes us when it hands over, and our scheduler thread
            // looks at it for us meanwhile (`watch`).
            let poll = if ot == self.tenant() {
                TURN_POLL_NS
            } else {
                self.waiter_poll_ns(true)
            };
            futex_wait(&h.epoch, e, poll);
        }
        self.waiting.fetch_sub(1, SeqCst);
        self.publish_waiting();
    }

    /// Adopts the ownership of epoch `e`, read before an owner word naming us (by a waiting launch,
    /// or the scheduler thread). As evidence for a later replacement (`evidence::Regrant`) only
    /// when no hand-over was under way between the two reads (`evidence::settled`): a hand-over
    /// to us writes the owner word before the epoch, and `e` may be the epoch before it.
    pub(in crate::scheduling) fn adopt(&self, e: u32, now: u64) {
        self.owned.store(e, SeqCst);
        self.evidence
            .regrant
            .adopt(&self.ledger.layout().header, e, now);
    }

    /// Takes the device from owner `o` (under `epoch` `e`) when it is dead, overdue, or an owner
    /// word that names no slot: true when it did (or the words moved meanwhile). Called by a
    /// waiter on each look and by the scheduler thread for the process's waiters (`watch`).
    pub(in crate::scheduling) fn revoke_lapsed(&self, o: Holder, e: u32) -> bool {
        let h = &self.ledger.layout().header;
        let Some(owner) = o.slot() else {
            incident(
                Incident::Owner,
                format_args!(
                    "device ledger {}: owner word {:#x} names no slot",
                    self.ledger.path().display(),
                    o.word()
                ),
            );
            self.revoke(o, e);
            return true;
        };
        if self.overdue(h) || !self.ledger.slot_alive(owner, Some(self.slot)) {
            self.revoke(o, e);
            return true;
        }
        false
    }
}
