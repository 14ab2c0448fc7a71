//! Flow control's bookkeeping (docs/COMPUTE.md, "Flow control"): which stream a launch is on, which
//! of our launches in flight a new one waits for, and how long it may wait. Pure logic: the gate
//! (`gate.rs`) applies it to its queue of tracked launches and to the driver's events.
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
    /// The launch in flight at this position (the oldest of its stream, or, with the process's
    /// total reached and nothing of its own stream in flight, the oldest of all).
    Wait(usize),
}

/// Which launch a new launch on `key` waits for: the oldest of its own stream when `per_stream` of
/// its stream are in flight, or when `total` are in flight over all streams (then the oldest of all
/// if its stream has none in flight: any completion makes room).
pub fn pick<K: PartialEq>(
    inflight: impl Iterator<Item = K>,
    key: &K,
    per_stream: usize,
    total: usize,
) -> Pick {
    let (mut len, mut mine, mut oldest_mine) = (0usize, 0usize, None);
    for (i, k) in inflight.enumerate() {
        len += 1;
        if k == *key {
            mine += 1;
            oldest_mine.get_or_insert(i);
        }
    }
    if mine >= per_stream.max(1) || len >= total.max(1) {
        Pick::Wait(oldest_mine.unwrap_or(0))
    } else {
        Pick::Go
    }
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

    #[test]
    fn a_long_kernel_on_one_stream_does_not_hold_up_another() {
        // Two long launches on stream 1, three short ones on stream 2, per-stream depth 2.
        let q = [1, 2, 1, 2, 2];
        // Stream 2 is at its depth: it waits for its own oldest (position 1), not the long one.
        assert_eq!(pick(q.iter().copied(), &2, 2, 64), Pick::Wait(1));
        assert_eq!(pick(q.iter().copied(), &1, 2, 64), Pick::Wait(0));
        // Stream 2 below its depth: through, whatever stream 1 has in flight.
        assert_eq!(pick([1, 1, 2].into_iter(), &2, 2, 64), Pick::Go);
        // A new stream goes through.
        assert_eq!(pick(q.iter().copied(), &3, 2, 64), Pick::Go);
    }

    #[test]
    fn the_process_total_bounds_the_queue() {
        let q = [1, 1, 2, 2, 3];
        // At the total: a stream with launches in flight waits for its own oldest...
        assert_eq!(pick(q.iter().copied(), &2, 4, 5), Pick::Wait(2));
        // ...one with none waits for the oldest of all.
        assert_eq!(pick(q.iter().copied(), &4, 4, 5), Pick::Wait(0));
        // Depths of 0 read as 1: never an unbounded queue.
        assert_eq!(pick([7].into_iter(), &7, 0, 0), Pick::Wait(0));
        assert_eq!(pick(std::iter::empty(), &7, 0, 0), Pick::Go);
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
