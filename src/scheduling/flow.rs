//! Flow control's bookkeeping (docs/COMPUTE.md, "Flow control" and "Measuring device time"): which
//! stream a launch is on, how many launches one event measures (a batch) and when a batch may start
//! at the previous one's end, which of our batches in flight a launch that begins a batch waits for,
//! and how long it may wait. Pure logic: the gate (`gate.rs`) and `events.rs` apply it to the queue
//! of measured batches and to the driver's events.
//!
//! * Per stream: a launch waits only for launches of its own stream, so a long kernel on one stream
//!   (a big GEMM, a collective) never holds up launches on another stream of the process. The
//!   per-thread default stream (`CU_STREAM_PER_THREAD`, the `_ptsz` entry points) has one handle in
//!   every thread but is a different stream in each: it is keyed by the launching thread. The
//!   legacy default stream is a key of its own.
//! * Per process: at most [`TOTAL_DEPTH`] launches in flight over all streams, so the queue cannot
//!   grow without limit however many streams a program uses.
//! * Bounded: a wait the program never asked for must never become a hang it would not have without
//!   us (the launch waited for may itself wait for something the waiting thread does later: a
//!   kernel spinning on a host flag, `cuStreamWaitValue32`, a host function). A wait ends in
//!   letting the launch through once the launch waited for has completed nothing for
//!   [`WaitBound::limit_ns`] *while we own the device* (behind another tenant's work, waiting is
//!   legitimate and does not count), and for that one launch only: the next one waits again, so the
//!   queue grows by at most one launch per bound, and past [`HARD_DEPTH`] a launch that is let
//!   through is not tracked (the queue's memory stays bounded).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Launches of one process in flight on one device, over all its streams, before a launch waits
/// for one of them.
pub const TOTAL_DEPTH: usize = 64;
/// Tracked launches at most: launches let through past the bound beyond this run untracked.
pub const HARD_DEPTH: usize = 128;
/// Shortest bound on a flow-control wait (owned time without the launch waited for completing).
pub const WAIT_LIMIT_MIN_NS: u64 = 10_000_000;
/// Longest bound, however long our launches were seen to take.
pub const WAIT_LIMIT_MAX_NS: u64 = 200_000_000;
/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD` (cuda.h).
const STREAM_LEGACY: usize = 1;
const STREAM_PER_THREAD: usize = 2;

/// The stream a launch is on, as flow control and the chaining of event intervals tell streams
/// apart (with the context: the default streams are one per context).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamKey {
    /// The context's legacy default stream (`NULL` through a plain entry point, `CU_STREAM_LEGACY`).
    Legacy,
    /// The per-thread default stream of the thread with this number (`NULL` through a `_ptsz`
    /// entry point, `CU_STREAM_PER_THREAD`).
    Thread(u64),
    /// A stream the program created.
    Handle(usize),
}

/// The key of `stream` launched on by the calling thread (`per_thread`: through a `_ptsz` entry
/// point, where `NULL` names the per-thread default stream).
pub fn stream_key(stream: usize, per_thread: bool) -> StreamKey {
    match stream {
        0 if per_thread => StreamKey::Thread(thread_number()),
        0 | STREAM_LEGACY => StreamKey::Legacy,
        STREAM_PER_THREAD => StreamKey::Thread(thread_number()),
        s => StreamKey::Handle(s),
    }
}

/// A number for the calling thread, never reused in the process (a thread id is, after the thread
/// exits). No allocation: a constant-initialised thread-local.
fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static NUMBER: Cell<u64> = const { Cell::new(0) };
    }
    NUMBER.with(|n| match n.get() {
        0 => {
            let v = NEXT.fetch_add(1, Relaxed);
            n.set(v);
            v
        }
        v => v,
    })
}

/// What a launch on `key` waits for, given the keys of the launches in flight, oldest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    /// Nothing: it goes through.
    Go,
    /// The batch in flight at this position (the oldest of its stream, or, with the process's
    /// total reached and nothing of its own stream in flight, the oldest of all).
    Wait(usize),
}

/// Which batch a launch that begins a batch on `key` waits for, given the batches in flight
/// (their stream keys and how many launches each spans, oldest first): the oldest of its own
/// stream while `per_stream` launches of its stream are in flight, or while `total` are over all
/// streams (then the oldest of all if its stream has none in flight: any completion makes room).
pub fn pick<K: PartialEq>(
    inflight: impl Iterator<Item = (K, u32)>,
    key: &K,
    per_stream: usize,
    total: usize,
) -> Pick {
    let (mut len, mut mine, mut oldest_mine) = (0usize, 0usize, None);
    for (i, (k, n)) in inflight.enumerate() {
        let n = n.max(1) as usize;
        len = len.saturating_add(n);
        if k == *key {
            mine = mine.saturating_add(n);
            oldest_mine.get_or_insert(i);
        }
    }
    if mine >= per_stream.max(1) || len >= total.max(1) {
        Pick::Wait(oldest_mine.unwrap_or(0))
    } else {
        Pick::Go
    }
}

/// The estimated device time of one launch after a batch of `launches` measured `ns`: the batch's
/// average, weighted by its length (a batch of 8 or more replaces the estimate: batches and `Q`
/// follow a program whose kernels change length within a batch or two; a single launch moves it
/// by an eighth).
pub fn launch_estimate(old_ns: u64, ns: u64, launches: u32) -> u64 {
    let n = u64::from(launches.clamp(1, 8));
    let per = ns / u64::from(launches.max(1));
    (old_ns
        .saturating_mul(8 - n)
        .saturating_add(per.saturating_mul(n)))
        / 8
}

/// The driver's steps from one stream operation to the next that an interval between two of our
/// events spans besides the device time of the `launches` in it: one before each launch and one
/// before the end event. Each is what an empty event pair measures (calibrated); taking off two per
/// batch, as per launch before, would charge a batch of 16 launches 15 steps of a device idle
/// between its kernels (on simgpu's debug build a few microseconds each).
pub fn steps(launches: u32) -> u64 {
    u64::from(launches.max(1)) + 1
}

/// Launches of one stream in flight at which a launch that begins a batch waits for the stream's
/// oldest batch: `q` (the work kept in flight), never less than one batch, plus the batch about to
/// begin less one. With batches of one launch, `q`: the old bound of one event pair per launch.
/// With longer batches a batch is only ever waited for as a whole, so one full batch stays queued
/// while the next is submitted (the device never drains for flow control).
pub fn stream_limit(q: usize, batch: u32) -> usize {
    let b = batch.max(1) as usize;
    q.max(b).saturating_add(b - 1)
}

/// Whether a batch that begins `gap_ns` after the stream's previous batch was closed (its end
/// event recorded) may start where that one ends (its end event is the new batch's start: one
/// event a batch instead of two). The device may have run out of our work in between, and the
/// interval then includes the idle time: at most `gap_ns`, so only a gap within a twentieth of a
/// batch's estimated work (at most 20 us) is chained; a longer one records a start of its own.
pub fn chains(gap_ns: u64, launch_ns: u64, batch: u32) -> bool {
    let limit = (launch_ns.saturating_mul(u64::from(batch.max(1))) / 20).min(CHAIN_GAP_MAX_NS);
    gap_ns <= limit
}

/// The longest host gap between two batches that are chained.
pub const CHAIN_GAP_MAX_NS: u64 = 20_000;

/// The first pause of a wait for a batch of `launches` of `launch_ns` each: a quarter of its
/// estimated work, within 2 us and 200 us (queries cost the host; a late look leaves the device
/// with the rest of the queue). (Half its work, within 2 ms, made no fewer queries a launch at 200
/// us kernels and moved mixed 50 us / 5 ms kernels towards the 5 ms tenant: docs/BENCHMARKS.md.)
pub fn first_poll_ns(launches: u32, launch_ns: u64) -> u64 {
    (u64::from(launches.max(1)).saturating_mul(launch_ns) / 4).clamp(2_000, 200_000)
}

/// The longest pause between two looks of a flow-control wait whose stream has `behind` launches
/// of `launch_ns` each queued after the batch it waits for: half their estimated work (the device
/// runs them while the waiting thread sleeps, so a look that late leaves it busy), within 200 us and
/// 2 ms. Each look and each wake-up costs the launching thread host time: with 200 us kernels,
/// looks every 200 us made about ten of them per batch.
pub fn poll_max_ns(behind: u32, launch_ns: u64) -> u64 {
    (u64::from(behind).saturating_mul(launch_ns) / 2).clamp(200_000, 2_000_000)
}

/// How long a flow-control wait may last, from what earlier waits took: at least
/// [`WAIT_LIMIT_MIN_NS`], twice the longest recent wait that ended in a completion (a program with
/// long kernels waits long for each), at most [`WAIT_LIMIT_MAX_NS`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitBound {
    /// Longest owned wait that ended in a completion, decaying by an eighth at each later one.
    longest_ns: u64,
}

impl WaitBound {
    /// The bound on the owned time of one wait.
    pub fn limit_ns(&self) -> u64 {
        self.longest_ns
            .saturating_mul(2)
            .clamp(WAIT_LIMIT_MIN_NS, WAIT_LIMIT_MAX_NS)
    }

    /// A wait ended in its launch completing after `owned_ns` of owned time.
    pub fn completed_after(&mut self, owned_ns: u64) {
        let decayed = self.longest_ns - self.longest_ns / 8;
        self.longest_ns = owned_ns.min(WAIT_LIMIT_MAX_NS).max(decayed);
    }
}

/// One flow-control wait's clock: the time it spent while we owned the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnedClock {
    last_ns: u64,
    owned_ns: u64,
    unowned_ns: u64,
}

/// What a wait does after a look at the launch it waits for (still running).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Looks again.
    Wait,
    /// The launch goes through without the wait: it waited `limit` of owned time.
    Pass,
    /// We have not owned the device for the bound: the launch goes back to the gate, which waits
    /// for a grant (bounded by arbitration) and runs flow control again.
    Regrant,
}

impl OwnedClock {
    pub fn start(now: u64) -> OwnedClock {
        OwnedClock {
            last_ns: now,
            owned_ns: 0,
            unowned_ns: 0,
        }
    }

    /// Owned time so far.
    pub fn owned_ns(&self) -> u64 {
        self.owned_ns
    }

    /// A look at `now` (monotonic) found the launch still running; `owning`: we own the device
    /// (the time since the previous look counts as owned only then).
    pub fn step(&mut self, now: u64, owning: bool, limit_ns: u64) -> Next {
        let dt = now.saturating_sub(self.last_ns);
        self.last_ns = self.last_ns.max(now);
        if owning {
            self.owned_ns = self.owned_ns.saturating_add(dt);
        } else {
            self.unowned_ns = self.unowned_ns.saturating_add(dt);
        }
        if self.owned_ns >= limit_ns {
            Next::Pass
        } else if !owning && self.unowned_ns >= limit_ns {
            Next::Regrant
        } else {
            Next::Wait
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_tell_default_streams_apart() {
        assert_eq!(stream_key(0, false), StreamKey::Legacy);
        assert_eq!(stream_key(STREAM_LEGACY, true), StreamKey::Legacy);
        assert_eq!(
            stream_key(0x7f00_1000, false),
            StreamKey::Handle(0x7f00_1000)
        );
        assert_eq!(
            stream_key(0x7f00_1000, true),
            StreamKey::Handle(0x7f00_1000)
        );
        let here = stream_key(0, true);
        assert!(matches!(here, StreamKey::Thread(_)));
        assert_eq!(stream_key(STREAM_PER_THREAD, false), here);
        let there = std::thread::spawn(|| stream_key(STREAM_PER_THREAD, false))
            .join()
            .unwrap();
        assert_ne!(
            here, there,
            "each thread's per-thread default stream is its own"
        );
    }

    fn ones(q: &[u32]) -> impl Iterator<Item = (u32, u32)> + '_ {
        q.iter().map(|&k| (k, 1))
    }

    #[test]
    fn a_long_kernel_on_one_stream_does_not_hold_up_another() {
        // Two long launches on stream 1, three short ones on stream 2, per-stream depth 2.
        let q = [1, 2, 1, 2, 2];
        // Stream 2 is at its depth: it waits for its own oldest (position 1), not the long one.
        assert_eq!(pick(ones(&q), &2, 2, 64), Pick::Wait(1));
        assert_eq!(pick(ones(&q), &1, 2, 64), Pick::Wait(0));
        // Stream 2 below its depth: through, whatever stream 1 has in flight.
        assert_eq!(pick(ones(&[1, 1, 2]), &2, 2, 64), Pick::Go);
        // A new stream goes through.
        assert_eq!(pick(ones(&q), &3, 2, 64), Pick::Go);
    }

    #[test]
    fn the_process_total_bounds_the_queue() {
        let q = [1, 1, 2, 2, 3];
        // At the total: a stream with launches in flight waits for its own oldest...
        assert_eq!(pick(ones(&q), &2, 4, 5), Pick::Wait(2));
        // ...one with none waits for the oldest of all.
        assert_eq!(pick(ones(&q), &4, 4, 5), Pick::Wait(0));
        // Depths of 0 read as 1: never an unbounded queue.
        assert_eq!(pick(ones(&[7]), &7, 0, 0), Pick::Wait(0));
        assert_eq!(pick(ones(&[]), &7, 0, 0), Pick::Go);
    }

    /// Batches count as the launches they span, for the stream and for the total.
    #[test]
    fn batches_count_their_launches() {
        // Stream 1: a batch of 10 and one of 8 in flight; the limit for q 5, batches of 10 is 19.
        let limit = stream_limit(5, 10);
        assert_eq!(limit, 19);
        assert_eq!(pick([(1, 10), (1, 8)].into_iter(), &1, limit, 64), Pick::Go);
        assert_eq!(
            pick([(1, 10), (1, 9)].into_iter(), &1, limit, 64),
            Pick::Wait(0)
        );
        assert_eq!(
            pick([(2, 1), (1, 10), (1, 8), (1, 0)].into_iter(), &1, limit, 64),
            Pick::Wait(1),
            "a calibration pair (0 launches) counts as one"
        );
        // Over the process total in launches, not in batches.
        assert_eq!(
            pick([(1, 16), (2, 16), (3, 16)].into_iter(), &4, 64, 48),
            Pick::Wait(0)
        );
        assert_eq!(
            pick([(1, 16), (2, 16), (3, 15)].into_iter(), &4, 64, 48),
            Pick::Go
        );
    }

    /// With one launch a batch the bound is the old one (q launches); with batches, one full
    /// batch stays queued while the next one is submitted.
    #[test]
    fn the_stream_limit_keeps_a_batch_queued() {
        assert_eq!(stream_limit(4, 1), 4);
        assert_eq!(stream_limit(1, 1), 1);
        assert_eq!(stream_limit(5, 10), 19);
        assert_eq!(stream_limit(32, 16), 47);
        // Batches of b at a limit of l: the oldest is waited for with at least l - b + 1 in
        // flight, so a whole batch (b) is still queued after it completes.
        for (q, b) in [(2, 3), (5, 10), (32, 16), (4, 1)] {
            let l = stream_limit(q, b);
            let b = b as usize;
            assert!(l + 1 - b >= b, "q {q}, batch {b}: limit {l}");
        }
    }

    /// A batch starts at the previous batch's end only when the host gap bounds the idle time the
    /// interval could include to a twentieth of the batch's work (and 20 us).
    #[test]
    fn chaining_bounds_what_an_idle_gap_adds() {
        // 10 launches of 200 us: 2 ms of work, 20 us at most.
        assert!(chains(20_000, 200_000, 10));
        assert!(!chains(20_001, 200_000, 10));
        // 16 launches of 5 us: 80 us of work, a gap of 4 us at most.
        assert!(chains(4_000, 5_000, 16));
        assert!(!chains(4_001, 5_000, 16));
        // No estimate: only back-to-back launches chain.
        assert!(chains(0, 0, 1) && !chains(1, 0, 1));
    }

    /// A batch's measured time per launch is the estimate after a full batch; a short one moves
    /// it by its share of eight.
    #[test]
    fn the_launch_estimate_follows_measured_batches() {
        // 16 launches of 2 ms measured 32 ms: 2 ms at once, from the initial 250 us guess.
        assert_eq!(launch_estimate(250_000, 32_000_000, 16), 2_000_000);
        assert_eq!(launch_estimate(250_000, 16_000_000, 8), 2_000_000);
        // One launch of 2 ms: an eighth of the way.
        assert_eq!(launch_estimate(250_000, 2_000_000, 1), 468_750);
        // A calibration-like empty batch is never passed (0 launches reads as 1), no overflow.
        assert_eq!(launch_estimate(u64::MAX, u64::MAX, 0), u64::MAX / 8);
    }

    /// An interval over n launches spans n + 1 steps of the driver: 2 for one launch, as before.
    #[test]
    fn a_batch_spans_a_step_per_launch_and_one() {
        assert_eq!(steps(1), 2);
        assert_eq!(steps(16), 17);
        assert_eq!(steps(0), 2);
    }

    #[test]
    fn polls_follow_the_estimated_work() {
        assert_eq!(first_poll_ns(10, 200_000), 200_000);
        assert_eq!(first_poll_ns(32, 5_000), 40_000);
        assert_eq!(first_poll_ns(1, 0), 2_000);
        // Looks no further apart than half the work queued behind, from 200 us to 2 ms.
        assert_eq!(poll_max_ns(9, 200_000), 900_000);
        assert_eq!(poll_max_ns(15, 5_000), 200_000);
        assert_eq!(poll_max_ns(0, 200_000), 200_000);
        assert_eq!(poll_max_ns(31, 5_000_000), 2_000_000);
        assert_eq!(poll_max_ns(u32::MAX, u64::MAX), 2_000_000);
    }

    #[test]
    fn only_owned_time_counts_toward_the_bound() {
        let limit = 10;
        let mut c = OwnedClock::start(100);
        // Behind another tenant's work (not owning) for 9: still waiting, nothing owned.
        assert_eq!(c.step(109, false, limit), Next::Wait);
        assert_eq!(c.owned_ns(), 0);
        // Owned 9 more: still within the bound.
        assert_eq!(c.step(118, true, limit), Next::Wait);
        assert_eq!(c.step(119, true, limit), Next::Pass);
        // A clock going backwards adds nothing.
        let mut c = OwnedClock::start(100);
        assert_eq!(c.step(50, true, limit), Next::Wait);
        assert_eq!(c.owned_ns(), 0);
        // Not owning for the whole bound: back to the gate for a grant, not through.
        let mut c = OwnedClock::start(0);
        assert_eq!(c.step(10, false, limit), Next::Regrant);
    }

    #[test]
    fn the_bound_follows_long_waits_within_limits() {
        let mut b = WaitBound::default();
        assert_eq!(b.limit_ns(), WAIT_LIMIT_MIN_NS);
        // 20 ms kernels: waits of 20 ms are legitimate; the bound leaves them room.
        b.completed_after(20_000_000);
        assert_eq!(b.limit_ns(), 40_000_000);
        // Short waits afterwards let it decay back to the minimum, not at once.
        b.completed_after(50_000);
        assert_eq!(b.limit_ns(), 35_000_000);
        for _ in 0..40 {
            b.completed_after(50_000);
        }
        assert_eq!(b.limit_ns(), WAIT_LIMIT_MIN_NS);
        // Never beyond the maximum.
        b.completed_after(u64::MAX);
        assert_eq!(b.limit_ns(), WAIT_LIMIT_MAX_NS);
    }
}
