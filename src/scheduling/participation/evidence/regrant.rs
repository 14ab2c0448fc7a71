//! Was our ownership's epoch replaced by a forger, or by an honest re-grant? Only an owner that has
//! run past its slice and the grace can be revoked honestly (`Sched::overdue`: 120 ms after its
//! grant with a heartbeat 20 ms old, or 160 ms after it beating or not), and the hand-over that
//! follows may grant it the device again: a new epoch naming it that it did not write. A forger
//! writes the same words whenever it likes. The words cannot tell the two apart (anyone can write
//! them), so the decision rests on this process's own clock, which no other tenant can write:
//! a replacement is forged only when we adopted (or renewed) the ownership recently and our
//! scheduler thread, whose passes write our heartbeat, ran without a stall since before then and
//! runs now. Otherwise it is ambiguous and nothing is concluded (no log, no count, no pacing): a
//! forger that goes on replacing our epochs every few milliseconds is found at its next write.
//!
//! An adoption counts only when the words it read were one hand-over's ([`settled`]): a hand-over
//! writes the owner word, then the epoch, under the arbitration lock, and an adopter reads the
//! epoch, then the owner word, without it. One that read the epoch just before a hand-over to its
//! process and the owner word just after pairs the previous epoch with the new owner; the new
//! epoch, written a moment later by that same honest hand-over, then looks like a replacement
//! (docs/COMPUTE.md, "Forged ownership evidence": one honest run in about fifty was paced that way).

use super::SLICE_NS;
use crate::scheduling::arbiter::{DRAIN_LIMIT_NS, GRACE_NS};
use crate::scheduling::shm::Header;
use std::sync::atomic::{AtomicU64, Ordering::*};

/// A pause of our scheduler thread this long may leave our heartbeat stale to a waiter (half of
/// `BEAT_STALE_NS`: the heartbeat is written at the start of a pass).
pub const STALL_NS: u64 = 10_000_000;
/// Held this long since our adoption or renewal, an honest waiter may revoke us (the slice and
/// the grace; past them with a stale heartbeat).
pub const HONEST_REVOKE_NS: u64 = SLICE_NS + GRACE_NS;
/// A stall of ours that ended this recently may have let an honest waiter revoke us (the longest
/// an honest owner may be seen holding, beating or not).
pub const STALL_MEMORY_NS: u64 = SLICE_NS + DRAIN_LIMIT_NS + GRACE_NS;

/// Whether a new epoch naming us, seen at `now` while we owned, is forged: we adopted or renewed
/// at `adopted_ns`, our scheduler thread's last pass was at `step_ns`, and its last stall (a gap of
/// [`STALL_NS`] or more between passes) ended at `stall_end_ns` (0: never). All on this process's
/// monotonic clock.
pub fn replaced_is_forged(now: u64, adopted_ns: u64, step_ns: u64, stall_end_ns: u64) -> bool {
    let held = now.saturating_sub(adopted_ns);
    let stalled_now = now.saturating_sub(step_ns) >= STALL_NS;
    let stalled_lately = stall_end_ns != 0 && now.saturating_sub(stall_end_ns) < STALL_MEMORY_NS;
    adopted_ns != 0 && held < HONEST_REVOKE_NS && !stalled_now && !stalled_lately
}

/// Whether an adopter's view of the words is one hand-over's: it read the epoch `e`, then an owner
/// word naming its process, then the arbitration lock word (`lock_word`) and the epoch again
/// (`epoch_again`). Honest hand-overs write both words under the lock, the owner word first: with
/// the lock free and the epoch unchanged after the owner word was read, no hand-over was under
/// way between the two reads. Otherwise the adoption is not evidence ([`Regrant::adopt`]):
/// a forger gains nothing by holding the lock word (the watch still measures what it owns, and
/// honest lockers take an overstayed lock over).
pub fn settled(lock_word: u32, epoch_again: u32, e: u32) -> bool {
    lock_word == 0 && epoch_again == e
}

/// What [`replaced_is_forged`] reads, kept by this process: written by the thread that adopts
/// (the scheduler thread, or a launch waiting for its grant) and by the scheduler thread's passes.
#[derive(Default)]
pub struct Regrant {
    adopted_ns: AtomicU64,
    step_ns: AtomicU64,
    stall_end_ns: AtomicU64,
}

impl Regrant {
    /// We adopted an ownership, or renewed ours, at `now`.
    pub fn adopted(&self, now: u64) {
        self.adopted_ns.store(now, Relaxed);
    }

    /// We adopted at `now` the ownership of epoch `e`, read before an owner word naming us in
    /// header `h`: evidence for a later replacement only when [`settled`] (read here, after the
    /// owner word); otherwise its replacement proves nothing.
    pub fn adopt(&self, h: &Header, e: u32, now: u64) {
        let lock = h.lock.load(Acquire);
        let at = if settled(lock, h.epoch.load(Acquire), e) {
            now
        } else {
            0
        };
        self.adopted_ns.store(at, Relaxed);
    }

    /// A pass of the scheduler thread at `now`.
    pub fn step(&self, now: u64) {
        let last = self.step_ns.swap(now, Relaxed);
        if last != 0 && now.saturating_sub(last) >= STALL_NS {
            self.stall_end_ns.store(now, Relaxed);
        }
    }

    /// A new epoch naming us was seen at `now` while we owned: forged, or ambiguous.
    pub fn forged(&self, now: u64) -> bool {
        replaced_is_forged(
            now,
            self.adopted_ns.load(Relaxed),
            self.step_ns.load(Relaxed),
            self.stall_end_ns.load(Relaxed),
        )
    }
}
