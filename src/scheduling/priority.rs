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

use crate::scheduling::{arbiter, batch};

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
