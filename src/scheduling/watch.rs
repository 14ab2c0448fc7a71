//! How often a thread waiting for a grant looks at the device ledger, and who looks for it (docs/
//! COMPUTE.md, "Ownership, slices, draining"): pure decisions, no shared memory.
//!
//! A hand-over wakes every waiter at once (a futex on the ledger's `epoch` word), so a waiter's own
//! looks are only for what wakes nobody: an owner that died (its liveness lock freed), one past its
//! slice and the grace, an owner word that names no slot. While the process's scheduler thread
//! runs, it makes those looks for the process's waiting threads at its own pace (it wakes at least
//! every `REFRESH_NS / 2` when it does not own the device, and at every hand-over), and revokes such
//! an owner itself; the waiting launch sleeps until the hand-over, at most `WATCHED_POLL_NS` (the
//! bound that stays: never a wait without one). Two wake-ups of the launching thread remain per
//! wait: at its own process's hand-over (it then sleeps on the new owner) and at the grant. Before, every waiting launch woke every 2 ms to
//! look: about ten wake-ups of the launching thread for each 20 ms slice of another tenant, which
//! was most of what gpuslice added to a launch of 200 us kernels (+2.3-2.6 us per launch).

use crate::scheduling::arbiter::{DRAIN_LIMIT_NS, SLICE_NS};

/// How often a waiter looks while nobody else looks for it: its scheduler thread is gone, it is of
/// high priority (it asks a normal owner to yield on each look: a lost request is made again soon),
/// or its own ownership is ending.
pub const WAITER_POLL_NS: u64 = 2_000_000;
/// How often a waiter looks while its tenant's work on another device waits (a collective): a
/// launch may pass for it (`peers`).
pub const PEER_POLL_NS: u64 = 200_000;
/// The longest a waiter sleeps while its scheduler thread looks at the owner for it: a slice and
/// the longest drain, as long as a live owner keeps the device from any instant (it then hands
/// over and wakes it). One slice was too short: a waiter that went to sleep just after its own
/// hand-over woke at the end of the next owner's slice, before that owner's drain ended (a third
/// wake-up of the launching thread for each wait, at 200 us kernels).
pub const WATCHED_POLL_NS: u64 = SLICE_NS + DRAIN_LIMIT_NS;

/// How long a thread waiting for a grant sleeps before it looks again (a hand-over wakes it
/// sooner): `watched` (the scheduler thread looks at the owner for it, see [`watches`]),
/// `high` (of a high-priority tenant), `peer_recent` (the tenant's work on another device waited
/// recently), `until_window_ns` (paced: until the tenant's window of the frame begins).
pub fn waiter_poll_ns(watched: bool, high: bool, peer_recent: bool, until_window_ns: u64) -> u64 {
    let poll = if peer_recent {
        PEER_POLL_NS
    } else if watched && !high {
        WATCHED_POLL_NS
    } else {
        WAITER_POLL_NS
    };
    poll.min(until_window_ns.max(1))
}

/// Whether the scheduler thread looks at the owner for the process's waiting threads on this pass:
/// some wait (`waiting`) and the process does not own the device (`owned`: its own hand-over ends
/// that wait). It revokes an owner that is dead, overdue or named by a damaged word, as a waiter
/// would.
pub fn watches(waiting: u32, owned: bool) -> bool {
    waiting > 0 && !owned
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watched_waiter_sleeps_until_the_hand_over_at_most_a_slice_and_a_drain() {
        assert_eq!(
            waiter_poll_ns(true, false, false, u64::MAX),
            WATCHED_POLL_NS
        );
        // Not woken by its own bound while a live owner's slice and drain run.
        const { assert!(WATCHED_POLL_NS >= SLICE_NS + DRAIN_LIMIT_NS) };
        const { assert!(WATCHED_POLL_NS <= 3 * SLICE_NS) };
        // Nobody looks for it: it looks itself, as before.
        assert_eq!(
            waiter_poll_ns(false, false, false, u64::MAX),
            WAITER_POLL_NS
        );
    }

    #[test]
    fn high_priority_collectives_and_pacing_keep_their_shorter_looks() {
        assert_eq!(waiter_poll_ns(true, true, false, u64::MAX), WAITER_POLL_NS);
        assert_eq!(waiter_poll_ns(true, false, true, u64::MAX), PEER_POLL_NS);
        assert_eq!(waiter_poll_ns(false, true, true, u64::MAX), PEER_POLL_NS);
        assert_eq!(waiter_poll_ns(true, false, false, 300_000), 300_000);
        // A window that begins now: looked at at once, never a zero (unbounded-looking) timeout.
        assert_eq!(waiter_poll_ns(true, false, false, 0), 1);
    }

    #[test]
    fn the_scheduler_thread_watches_only_for_waiters_of_a_process_without_the_device() {
        assert!(watches(1, false));
        assert!(watches(3, false));
        assert!(!watches(0, false));
        assert!(!watches(2, true));
    }
}
