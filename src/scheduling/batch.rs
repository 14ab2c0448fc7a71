//! Batches of launches (docs/COMPUTE.md, "Measuring device time"): how many launches one event
//! measures ([`batch_len`]), and a launch joining its stream's open batch: decided
//! once, under one look at the process's open batches, before the launch. A launch that finds its
//! stream's batch open is counted in it there and then, and one that fills it takes it out to
//! record its end after the launch: a launch that continues a batch looks at the open batches once,
//! not three times (whether it begins one, before, and to count itself, after). A batch the
//! scheduler thread closes between the count and the launch (its idle close) leaves that launch
//! unmeasured: the window counting after the launch had too (the launch then began a batch without
//! a start event). Pure, unit-tested; the batches themselves are `participation::events`.

use crate::scheduling::flow::StreamKey;

/// Device time a batch of launches between two of our events spans at most (estimated): one event
/// measures this much work, whatever the kernels' length, up to [`BATCH_MAX`] launches.
pub const BATCH_SPAN_NS: u64 = 2_000_000;
/// Launches one event measures at most: with short kernels (5-30 us: `Q` is 32) a batch of 32
/// halves the event calls per launch of batches of 16 (a record, a query and an elapsed time a
/// batch: at 5 us kernels 0.10-0.12 calls added a launch instead of 0.24, docs/BENCHMARKS.md), and
/// the previous batch, closed one launch earlier (a few microseconds of host time), is within its
/// chaining gap (`flow::chains`: a twentieth of the batch's work, 8 us at 5 us kernels, 4 us with
/// 16) where it was not before.
pub const BATCH_MAX: u32 = 32;
/// Launches one event measures at most where fewer than [`BATCH_MAX`] are kept in flight: the
/// larger of this and `Q`, so that a stream's queue (`stream_limit`: `max(Q, B) + B - 1`) stays
/// within twice `Q`, about 2 ms of work, where `Q` is 16 or more.
pub const BATCH_FLOOR: u32 = 16;

/// How many launches on one stream one of our events measures, launches of `launch_ns` each
/// (estimated) with `q` kept in flight: about [`BATCH_SPAN_NS`] of work, at most `q` within
/// [`BATCH_FLOOR`] and [`BATCH_MAX`] launches; one where one launch at a time is kept in flight
/// (`q` 1, beside a high-priority tenant) or the stream is a thread's per-thread default stream
/// (`thread_stream`: only its own thread can record on it, and a batch left open must be closable
/// by the scheduler thread).
pub fn batch_len(launch_ns: u64, q: usize, thread_stream: bool) -> u32 {
    if thread_stream || q <= 1 {
        return 1;
    }
    let most = u32::try_from(q)
        .unwrap_or(BATCH_MAX)
        .clamp(BATCH_FLOOR, BATCH_MAX);
    (BATCH_SPAN_NS / launch_ns.max(1)).clamp(1, u64::from(most)) as u32
}

/// Whether a launch closes its stream's open batch (records the event that measures it): the
/// batch holds `open` launches with this one, of `batch` at most.
pub fn closes(open: u32, batch: u32) -> bool {
    open >= batch.max(1)
}

/// An open batch as this decision sees it: its stream (and context), and the launches counted in it.
pub trait OpenBatch {
    fn stream(&self) -> (StreamKey, usize);
    fn launches(&mut self) -> &mut u32;
}

/// What a launch found of its stream's batch, before it reached the driver.
#[derive(Debug, PartialEq, Eq)]
pub enum Joined<B> {
    /// Nothing open on the stream: the launch begins a batch (after flow control).
    Begins,
    /// Counted in the stream's open batch. `Some`: the launch fills it; the batch is out of the
    /// open list, its end to be recorded after the launch.
    Counted(Option<B>),
}

/// Counts a launch on `stream` in its open batch, if there is one in `open` (`batch`: the launches
/// one batch spans now, [`batch_len`]), and takes the batch out when the launch fills it.
pub fn join<B: OpenBatch>(open: &mut Vec<B>, stream: (StreamKey, usize), batch: u32) -> Joined<B> {
    let Some(i) = open.iter().position(|o| o.stream() == stream) else {
        return Joined::Begins;
    };
    let n = open[i].launches();
    *n = n.saturating_add(1);
    if closes(*n, batch) {
        Joined::Counted(Some(open.swap_remove(i)))
    } else {
        Joined::Counted(None)
    }
}

/// Undoes [`join`] for a launch that did not reach the driver after all (it went back to the gate):
/// a batch it took out goes back into `open` less this launch (unless the stream has begun another
/// meanwhile: then it is returned, to be closed as it is), one it was counted in loses the count.
/// A batch closed meanwhile by another thread is left as it is (it counted one launch too many).
pub fn unjoin<B: OpenBatch>(
    open: &mut Vec<B>,
    stream: (StreamKey, usize),
    joined: Joined<B>,
) -> Option<B> {
    match joined {
        Joined::Begins => None,
        Joined::Counted(Some(mut b)) => {
            let n = b.launches();
            *n = n.saturating_sub(1);
            if open.iter().any(|o| o.stream() == stream) {
                return Some(b);
            }
            open.push(b);
            None
        }
        Joined::Counted(None) => {
            if let Some(o) = open.iter_mut().find(|o| o.stream() == stream) {
                let n = o.launches();
                *n = n.saturating_sub(1);
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::flow::{stream_limit, TOTAL_DEPTH};

    /// One event measures about 2 ms of work, at most 32 launches, and no more than `Q` when
    /// that is above 16; one launch each where a single launch is kept in flight or only the
    /// launching thread can record on the stream.
    #[test]
    fn batch_lengths_follow_the_work_per_launch() {
        assert_eq!(batch_len(200_000, 5, false), 10);
        assert_eq!(batch_len(5_000, 32, false), 32);
        assert_eq!(batch_len(20_000, 32, false), 32);
        assert_eq!(batch_len(50_000, 20, false), 20, "at most Q above 16");
        assert_eq!(batch_len(100_000, 10, false), 16, "at most 16 below");
        assert_eq!(batch_len(20_000_000, 2, false), 1);
        // The stream's queue stays within twice Q where Q is 16 or more.
        for (launch_ns, q) in [(5_000, 32), (20_000, 32), (40_000, 25), (60_000, 16)] {
            let b = batch_len(launch_ns, q, false);
            assert!(stream_limit(q, b) < 2 * q, "{launch_ns} ns: {b}");
            assert!(
                stream_limit(q, b) < TOTAL_DEPTH,
                "one stream fits the process total"
            );
        }
        assert_eq!(
            batch_len(0, 32, false),
            BATCH_MAX,
            "no estimate yet: no division by 0"
        );
        assert_eq!(
            batch_len(5_000, 1, false),
            1,
            "beside a high-priority tenant"
        );
        assert_eq!(batch_len(5_000, 32, true), 1, "a per-thread default stream");
        assert!(closes(10, 10) && !closes(9, 10) && closes(1, 0));
    }

    #[derive(Debug, PartialEq, Eq)]
    struct B(StreamKey, usize, u32);

    impl OpenBatch for B {
        fn stream(&self) -> (StreamKey, usize) {
            (self.0, self.1)
        }
        fn launches(&mut self) -> &mut u32 {
            &mut self.2
        }
    }

    const S: StreamKey = StreamKey::Handle(0x100);
    const T: StreamKey = StreamKey::Handle(0x200);

    #[test]
    fn a_launch_begins_a_batch_only_where_none_is_open() {
        let mut open = vec![B(T, 1, 3)];
        assert_eq!(join(&mut open, (S, 1), 16), Joined::Begins);
        // The same handle in another context is another stream.
        assert_eq!(join(&mut open, (T, 2), 16), Joined::Begins);
        assert_eq!(open, vec![B(T, 1, 3)], "nothing counted");
    }

    #[test]
    fn a_launch_is_counted_in_its_streams_open_batch_and_the_one_that_fills_it_takes_it_out() {
        let mut open = vec![B(T, 1, 3), B(S, 1, 14)];
        assert_eq!(join(&mut open, (S, 1), 16), Joined::Counted(None));
        assert_eq!(open[1], B(S, 1, 15));
        assert_eq!(
            join(&mut open, (S, 1), 16),
            Joined::Counted(Some(B(S, 1, 16)))
        );
        assert_eq!(open, vec![B(T, 1, 3)]);
        // The next launch on the stream begins the next batch.
        assert_eq!(join(&mut open, (S, 1), 16), Joined::Begins);
        // A batch whose length shrank meanwhile (shorter kernels measured) closes at once.
        assert_eq!(
            join(&mut open, (T, 1), 2),
            Joined::Counted(Some(B(T, 1, 4)))
        );
    }

    #[test]
    fn a_launch_that_goes_back_to_the_gate_is_counted_out() {
        let mut open = vec![B(S, 1, 5)];
        let j = join(&mut open, (S, 1), 16);
        assert_eq!(unjoin(&mut open, (S, 1), j), None);
        assert_eq!(open, vec![B(S, 1, 5)]);
        // One that filled the batch puts it back, less itself.
        let mut open = vec![B(S, 1, 15)];
        let j = join(&mut open, (S, 1), 16);
        assert!(open.is_empty());
        assert_eq!(unjoin(&mut open, (S, 1), j), None);
        assert_eq!(open, vec![B(S, 1, 15)]);
        // ...unless another launch began a batch there meanwhile: then it is closed as it is.
        let mut open = vec![B(S, 1, 15)];
        let j = join(&mut open, (S, 1), 16);
        open.push(B(S, 1, 1));
        assert_eq!(unjoin(&mut open, (S, 1), j), Some(B(S, 1, 15)));
        assert_eq!(open, vec![B(S, 1, 1)]);
        // A batch closed meanwhile (the scheduler thread's idle close): nothing to count out.
        let mut open = vec![B(S, 1, 5)];
        let j = join(&mut open, (S, 1), 16);
        open.clear();
        assert_eq!(unjoin(&mut open, (S, 1), j), None);
        assert!(open.is_empty());
        assert_eq!(unjoin(&mut open, (S, 1), Joined::<B>::Begins), None);
    }
}
