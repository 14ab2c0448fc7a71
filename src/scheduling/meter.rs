//! What an ownership is charged (docs/COMPUTE.md, "Caps"): pure logic, no shared memory.
//!
//! A launch's device time is measured by its event pair only when it completes. Charged only then,
//! a kernel that outlasts the slice would be charged nothing at the slice's end, the slice renewed,
//! and a capped tenant never run out of tokens (alone, cap 30 gave 91-99% of the device with
//! kernels of 5-50 ms). So each charge also takes the time our unfinished work has run since the
//! previous charge (`running_ns`, seen from the host: in flight since the later of its first
//! submission and the last completion), and remembers it as paid in advance ([`Meter::prepaid_ns`]);
//! the device time measured when that work completes first pays the advance back, so over time
//! what is charged is what the events measured, never charged twice. An advance that was too high
//! (our work queued behind another's) is taken off later completions; one that was too low is
//! charged with them.

/// What the scheduler saw of its work since the previous charge.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reading {
    /// Device time of launches that completed while we owned the device.
    pub measured_ns: u64,
    /// Device time of launches that completed after we handed the device over (work left running
    /// at a hand-over, or passed the gate): charged in full.
    pub carried_ns: u64,
    /// How long our unfinished work has run since the previous charge (0: nothing in flight).
    pub running_ns: u64,
    /// Wall time since the previous charge (the grant or last renewal).
    pub wall_ns: u64,
}

/// Device time charged ahead of its measurement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Meter {
    /// Charged for work that was running, not yet matched by its measured completion.
    pub prepaid_ns: u64,
}

impl Meter {
    /// What one charge takes: completions less what was paid for them in advance, at most the wall
    /// time (launches of several streams that overlap count once), plus what our unfinished work
    /// ran since the previous charge (within the same wall time), plus carried work.
    pub fn charge(&mut self, r: Reading) -> u64 {
        let measured = self.pay_back(r.measured_ns);
        let carried = self.pay_back(r.carried_ns);
        let done = measured.min(r.wall_ns);
        let running = r.running_ns.min(r.wall_ns - done);
        self.prepaid_ns = self.prepaid_ns.saturating_add(running);
        done.saturating_add(running).saturating_add(carried)
    }

    /// `ns` of measured completions, less what was already charged for them.
    fn pay_back(&mut self, ns: u64) -> u64 {
        let paid = self.prepaid_ns.min(ns);
        self.prepaid_ns -= paid;
        ns - paid
    }
}

/// How long our unfinished work has run at `now`, as the host sees it: nothing when nothing is in
/// flight; otherwise since the latest of the previous charge (`since`), the submission that found
/// nothing in flight (`pending_since`), and the last completion seen (`progress`): the oldest
/// unfinished launch cannot have started before any of them.
pub fn running_ns(pending: bool, now: u64, since: u64, pending_since: u64, progress: u64) -> u64 {
    if !pending {
        return 0;
    }
    now.saturating_sub(since.max(pending_since).max(progress))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn reading(measured: u64, carried: u64, running: u64, wall: u64) -> Reading {
        Reading {
            measured_ns: measured,
            carried_ns: carried,
            running_ns: running,
            wall_ns: wall,
        }
    }

    /// A kernel of 20 ms under slices of 1 ms: each renewal charges the millisecond it ran, and
    /// its completion charges only the rest: 20 ms in all, as the device ran.
    #[test]
    fn a_kernel_longer_than_the_slice_is_charged_as_it_runs() {
        let mut m = Meter::default();
        let mut total = 0;
        for _ in 0..19 {
            let c = m.charge(reading(0, 0, MS, MS));
            assert_eq!(c, MS);
            total += c;
        }
        assert_eq!(m.prepaid_ns, 19 * MS);
        total += m.charge(reading(20 * MS, 0, 0, MS));
        assert_eq!(total, 20 * MS);
        assert_eq!(m.prepaid_ns, 0);
    }

    /// The old charge (completions only) took nothing while the kernel ran: the slice was renewed
    /// for free. The running term is what makes the renewal cost.
    #[test]
    fn nothing_completed_but_running_still_costs() {
        let mut m = Meter::default();
        assert_eq!(m.charge(reading(0, 0, 0, MS)), 0);
        assert_eq!(m.charge(reading(0, 0, 5 * MS, 20 * MS)), 5 * MS);
    }

    /// Work left running at a hand-over was paid in advance up to the hand-over: when it completes
    /// (carried), only the rest is charged.
    #[test]
    fn carried_work_pays_back_its_advance() {
        let mut m = Meter::default();
        assert_eq!(m.charge(reading(0, 0, 3 * MS, 3 * MS)), 3 * MS);
        assert_eq!(m.charge(reading(0, 10 * MS, 0, MS)), 7 * MS);
        assert_eq!(m.prepaid_ns, 0);
    }

    /// An advance larger than what the work turned out to measure (it waited behind another
    /// tenant's work) is taken off later completions.
    #[test]
    fn an_advance_too_high_is_given_back_later() {
        let mut m = Meter::default();
        assert_eq!(m.charge(reading(0, 0, 4 * MS, 4 * MS)), 4 * MS);
        assert_eq!(m.charge(reading(MS, 0, 0, 4 * MS)), 0);
        assert_eq!(m.prepaid_ns, 3 * MS);
        assert_eq!(m.charge(reading(5 * MS, 0, 0, 5 * MS)), 2 * MS);
        assert_eq!(m.prepaid_ns, 0);
    }

    /// Overlapping streams count once: completions and running work within the wall time.
    #[test]
    fn never_more_than_the_wall_time_besides_carried_work() {
        let mut m = Meter::default();
        assert_eq!(m.charge(reading(30 * MS, 0, 5 * MS, 20 * MS)), 20 * MS);
        assert_eq!(m.prepaid_ns, 0);
        assert_eq!(m.charge(reading(2 * MS, 0, 5 * MS, 4 * MS)), 4 * MS);
        assert_eq!(m.prepaid_ns, 2 * MS);
        assert_eq!(m.charge(reading(0, 9 * MS, 0, 0)), 7 * MS);
    }

    #[test]
    fn running_counts_from_the_latest_evidence() {
        // Nothing in flight: nothing runs.
        assert_eq!(running_ns(false, 10 * MS, 0, 0, 0), 0);
        // In flight since before the charge: since the charge.
        assert_eq!(running_ns(true, 10 * MS, 4 * MS, MS, 2 * MS), 6 * MS);
        // Submitted to an empty queue after the charge: since then.
        assert_eq!(running_ns(true, 10 * MS, 4 * MS, 7 * MS, 2 * MS), 3 * MS);
        // A completion seen after that: the next launch runs from it.
        assert_eq!(running_ns(true, 10 * MS, 4 * MS, 7 * MS, 9 * MS), MS);
        // Stamps ahead of the clock never make it negative.
        assert_eq!(running_ns(true, 10 * MS, 4 * MS, 11 * MS, 0), 0);
    }
}
