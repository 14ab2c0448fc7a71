//! How long a drain pauses between two looks at our work still in flight (docs/COMPUTE.md,
//! "Ownership, slices, draining"). Pure logic: `Sched::drain` applies it to the queue of measured
//! batches.
//!
//! Every look is a driver call (`cuEventQuery`), and a look every 20 us made most of the calls the
//! shim adds under contention; a look that comes late leaves the device idle before the hand-over.
//! So the drain sleeps for what is **known** to be left, never more: the batches in flight run in
//! their stream's order, so what has not started yet (every batch of a stream after its oldest) is
//! left in full, and the oldest batch of all, once a look saw the batch before it complete, began at
//! the earlier look at the soonest. Streams may run side by side: what is left is at least the
//! longest of the streams, not their sum. A quarter of it is kept as a margin for the estimate of a
//! launch's length; once what is known is within a few looks, the drain looks every
//! [`POLL_NS`].

/// The pause once what is known to be left is short (and the shortest pause).
pub const POLL_NS: u64 = 20_000;
/// The longest pause, whatever is left: the drain beats and watches for a stall between looks.
pub const PAUSE_MAX_NS: u64 = 2_000_000;
/// The pause while only batches already running are left, and nothing says when they began: a
/// fraction of their estimated work within `POLL_NS` and this.
pub const UNKNOWN_MAX_NS: u64 = 50_000;

/// The drain's estimate of one launch's device time after a batch measured `per_launch_ns` a
/// launch: a low one, following decreases at once and increases by a sixteenth. A batch's interval
/// also holds the device's idle time between its kernels when the host submitted them late (a
/// busy host), which work already queued at a drain does not have: sleeping for the average
/// left the device idle before hand-overs (mixed 50 us / 5 ms kernels at 50/50 split 40-45 / 55-60
/// on a loaded 2-core machine, against 46 / 54 with a look every 20 us).
pub fn low_estimate(old_ns: u64, per_launch_ns: u64) -> u64 {
    if old_ns == 0 || per_launch_ns <= old_ns {
        per_launch_ns
    } else {
        old_ns + (per_launch_ns - old_ns) / 16
    }
}

/// The pause before a drain's next look. `batches`: the stream keys of the batches in flight and
/// how many launches each spans (0: an empty calibration pair), oldest first;
/// `launch_ns`: the estimated device time of one launch; `front_began_ns`: how long ago the oldest batch of all began at the soonest (a look
/// saw the batch before it complete since the previous look), `None` when unknown.
pub fn pause_ns<K: PartialEq + Copy>(
    batches: impl Iterator<Item = (K, u32)>,
    launch_ns: u64,
    front_began_ns: Option<u64>,
) -> u64 {
    // Per stream: at most 8 told apart, no allocation; batches of further streams are left out
    // (what is known to be left is then only underestimated: an earlier look).
    let mut keys: [Option<K>; 8] = [None; 8];
    let mut left = [0u64; 8];
    let mut running = 0u64;
    for (i, (key, launches)) in batches.enumerate() {
        let work = u64::from(launches).saturating_mul(launch_ns);
        let mut slot = keys.len();
        for (n, k) in keys.iter().enumerate() {
            if k.is_none() || *k == Some(key) {
                slot = n;
                break;
            }
        }
        if slot == keys.len() {
            continue;
        }
        if keys[slot].is_none() {
            // The stream's oldest batch: it may be running, with any part of it left, unless it is
            // the oldest of all and we know when it began.
            keys[slot] = Some(key);
            running = running.max(work);
            if let (0, Some(began)) = (i, front_began_ns) {
                left[slot] = work.saturating_sub(began);
            }
        } else {
            left[slot] = left[slot].saturating_add(work);
        }
    }
    if keys[0].is_none() {
        // Nothing in flight (a batch still open): look again soon.
        return POLL_NS;
    }
    let known = left.iter().copied().max().unwrap_or(0);
    let pause = known - known / 4;
    if pause >= POLL_NS {
        return pause.min(PAUSE_MAX_NS);
    }
    if front_began_ns.is_some() {
        // Past the estimated end: it completes any moment.
        POLL_NS
    } else {
        let part = running / 8;
        if part <= POLL_NS {
            POLL_NS
        } else {
            part.min(UNKNOWN_MAX_NS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_is_what_has_not_started_less_a_margin() {
        // A running batch of 8 and a closed one of 4 launches behind it, 200 us each: 800 us at
        // least are left, three quarters of it slept.
        let p = pause_ns([(1, 8), (1, 4)].into_iter(), 200_000, None);
        assert_eq!(p, 600_000);
        // Longer work is slept in pieces of at most 2 ms (the drain beats in between).
        let p = pause_ns([(1, 1), (1, 4)].into_iter(), 5_000_000, None);
        assert_eq!(p, PAUSE_MAX_NS);
    }

    #[test]
    fn the_oldest_batch_counts_from_when_it_began_at_the_soonest() {
        // 8 launches of 200 us that began at least 400 us ago: 1.2 ms left at least.
        let p = pause_ns([(1, 8)].into_iter(), 200_000, Some(400_000));
        assert_eq!(p, 900_000);
        // Past its estimated end: looked at every 20 us.
        let p = pause_ns([(1, 8)].into_iter(), 200_000, Some(2_000_000));
        assert_eq!(p, POLL_NS);
        // Its start known only for the oldest batch of all, not for another stream's oldest.
        let p = pause_ns([(1, 1), (2, 8)].into_iter(), 200_000, Some(0));
        assert_eq!(p, 150_000);
    }

    #[test]
    fn streams_side_by_side_count_once() {
        // Two streams with 1 ms and 2 ms not yet started: 2 ms are left at least, not 3.
        let p = pause_ns([(1, 1), (2, 1), (1, 5), (2, 10)].into_iter(), 200_000, None);
        assert_eq!(p, 1_500_000);
    }

    #[test]
    fn the_drains_launch_length_is_a_low_estimate() {
        // The first measurement, then a shorter one at once.
        assert_eq!(low_estimate(0, 60_000), 60_000);
        assert_eq!(low_estimate(60_000, 50_000), 50_000);
        // A batch stretched by a late host moves it by a sixteenth only.
        assert_eq!(low_estimate(50_000, 210_000), 60_000);
    }

    #[test]
    fn running_work_of_unknown_progress_is_looked_at_often() {
        // One batch of 10 launches of 200 us, begun who knows when: every 50 us at most.
        assert_eq!(
            pause_ns([(1, 10)].into_iter(), 200_000, None),
            UNKNOWN_MAX_NS
        );
        // Short work: every 20 us at least.
        assert_eq!(pause_ns([(1, 2)].into_iter(), 20_000, None), POLL_NS);
        // Nothing in flight.
        assert_eq!(
            pause_ns(std::iter::empty::<(i32, u32)>(), 200_000, None),
            POLL_NS
        );
    }
}
