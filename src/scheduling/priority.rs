//! What a launch keeps in flight and how one event measures it, by priority class (docs/COMPUTE.md,
//! "Priority"): pure decisions, unit-tested.
//!
//! A high-priority tenant is charged the wall time of its ownership and keeps the device until it
//! is idle (a normal tenant never takes it from it), so its events measure nothing it is charged
//! with: they only tell when its work has completed (its idle hand-over, a flow-control wait, a
//! drain). Before, it recorded an event after every launch and kept `Q` launches in flight from
//! an estimate it never measured (250 us a launch: `Q` 4), so a request of 10 launches waited
//! in flow control, asleep, for its own kernels six times, each wake-up late on a loaded host and
//! the device idle meanwhile, and every launch added an event (a step of the device's front end
//! between its kernels on a GPU). Now it keeps [`HIGH_QUEUE_DEPTH`] launches in flight, measured
//! [`HIGH_BATCH`] at a time: a request of up to 16 launches records no event of ours before its
//! synchronisation (the batch it leaves open is closed by the scheduler thread once the program
//! stops launching, as any tenant's), and one of up to 47 never waits in flow control.
//!
//! A normal tenant beside an active high-priority tenant keeps one launch in flight
//! (`arbiter::QUEUE_DEPTH_BESIDE_HIGH`), measured one at a time, so a high-priority request waits
//! for at most one normal kernel.

use crate::scheduling::{arbiter, batch, turn};

/// Launches a high-priority tenant keeps in flight (`Q`): the most any tenant keeps.
pub const HIGH_QUEUE_DEPTH: usize = arbiter::MAX_QUEUE_DEPTH;
/// Launches one event of a high-priority tenant measures (on a stream any thread can record on).
pub const HIGH_BATCH: u32 = batch::BATCH_FLOOR;

/// `Q`, the launches kept in flight: [`HIGH_QUEUE_DEPTH`] for a high-priority tenant (`high`); one
/// for a normal tenant beside an active high-priority one (`beside_high`); otherwise about 1 ms of
/// work at `launch_ns` a launch (`arbiter::queue_depth`).
pub fn queue_depth(high: bool, beside_high: bool, launch_ns: u64) -> usize {
    if high {
        HIGH_QUEUE_DEPTH
    } else if beside_high {
        arbiter::QUEUE_DEPTH_BESIDE_HIGH
    } else {
        arbiter::queue_depth(launch_ns)
    }
}

/// How many launches one event measures on a stream (`batch::batch_len` for a normal tenant, `q`
/// from [`queue_depth`]): [`HIGH_BATCH`] for a high-priority tenant, one on a thread's per-thread
/// default stream (only its thread can record there).
pub fn batch_len(high: bool, launch_ns: u64, q: usize, thread_stream: bool) -> u32 {
    if high && !thread_stream {
        HIGH_BATCH
    } else {
        batch::batch_len(launch_ns, q, thread_stream)
    }
}

/// How long an owner's work may complete nothing before the device moves on undrained (`stall`:
/// `turn::stall_ns`, from its progress). For a high-priority owner (`high`, its work not waiting
/// for a collective's peers: `peer_recent` false) at least:
/// - a slice while nothing of its work has completed since its grant (`progressed` false): it
///   waits for what ran before it, at most one kernel of each normal tenant (they keep one in
///   flight beside it), of any length. Handed over as stalled 1 ms after the grant (its own
///   launch length is never measured: 250 us, a stall time of 1 ms), it let the normal tenant
///   queue another kernel ahead of its request: 109 of 200 requests beside 2 ms kernels, each
///   waiting for two normal kernels instead of one;
/// - the work of one of its batches once it has ([`HIGH_BATCH`] launches of `launch_ns`): it sees
///   its progress a batch at a time.
///
/// A high-priority owner that never completes anything (hung) still hands over after a slice.
pub fn stall_ns(
    high: bool,
    peer_recent: bool,
    progressed: bool,
    stall: u64,
    launch_ns: u64,
) -> u64 {
    if !high || peer_recent {
        stall
    } else if !progressed {
        stall.max(arbiter::SLICE_NS)
    } else {
        stall
            .max(u64::from(HIGH_BATCH).saturating_mul(launch_ns))
            .min(turn::STALL_MAX_NS.max(stall))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::flow::{stream_limit, TOTAL_DEPTH};

    /// A request of 10 x 100 us (the scenario) never waits in flow control and records no
    /// event of ours among its launches, whatever the launch estimate (a high-priority tenant
    /// measures none: it stays at its first guess, 250 us).
    #[test]
    fn a_high_priority_request_never_waits_for_its_own_kernels() {
        for launch_ns in [0, 5_000, 100_000, 250_000, 20_000_000] {
            let q = queue_depth(true, false, launch_ns);
            let b = batch_len(true, launch_ns, q, false);
            assert!(b > 10, "{launch_ns} ns: no event among 10 launches ({b})");
            assert!(
                stream_limit(q, b) >= 32,
                "{launch_ns} ns: {}",
                stream_limit(q, b)
            );
            assert!(
                stream_limit(q, b) < TOTAL_DEPTH,
                "one stream fits the process total"
            );
        }
        // Beside another high-priority tenant too: the class decides.
        assert_eq!(queue_depth(true, true, 250_000), HIGH_QUEUE_DEPTH);
        // Only its own thread records on a per-thread default stream: a batch there is one launch.
        assert_eq!(batch_len(true, 250_000, HIGH_QUEUE_DEPTH, true), 1);
    }

    /// A high-priority owner waiting behind a normal kernel that ran before its grant is not
    /// stalled until a slice has passed; after a completion, until a batch's work has; a normal
    /// owner and a collective's waits keep the stall time from progress.
    #[test]
    fn a_high_priority_owner_waits_for_what_ran_before_it() {
        let stall = turn::stall_ns(250_000, 0);
        assert_eq!(stall, 1_000_000);
        // The case: 2 ms (or any kernel up to a slice) ahead of the request.
        assert_eq!(
            stall_ns(true, false, false, stall, 250_000),
            arbiter::SLICE_NS
        );
        assert!(stall_ns(true, false, true, stall, 250_000) >= 16 * 250_000);
        assert!(stall_ns(true, false, true, stall, u64::MAX) <= turn::STALL_MAX_NS);
        assert_eq!(stall_ns(false, false, false, stall, 250_000), stall);
        assert_eq!(
            stall_ns(true, true, false, stall, 250_000),
            stall,
            "a collective's wait"
        );
        // A longer stall time from progress is kept.
        assert_eq!(
            stall_ns(true, false, false, turn::STALL_MAX_NS, 250_000),
            turn::STALL_MAX_NS
        );
    }

    /// A normal tenant keeps one launch in flight beside an active high-priority tenant (a
    /// request waits for at most one of its kernels), and its own `Q` otherwise.
    #[test]
    fn a_normal_tenant_keeps_one_launch_beside_high_priority() {
        assert_eq!(queue_depth(false, true, 2_000_000), 1);
        assert_eq!(batch_len(false, 2_000_000, 1, false), 1);
        assert_eq!(queue_depth(false, false, 200_000), 5);
        assert_eq!(batch_len(false, 200_000, 5, false), 10);
        assert_eq!(queue_depth(false, false, 250_000), 4);
    }
}
