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

use super::SLICE_NS;
use crate::scheduling::arbiter::{DRAIN_LIMIT_NS, GRACE_NS};
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
