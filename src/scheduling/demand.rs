//! Who *wants* the device (docs/COMPUTE.md, "Contention"): pure logic, no shared memory.
//!
//! A tenant beside a neighbour that merely holds a slot (an idle inference server, one short kernel
//! now and then) must stay on the launch fast path: the slow path costs driver calls on every
//! launch. So contention is decided by demand, not presence. A process wants the device when, at
//! its scheduler thread's refreshes, it was active (it launched since the previous refresh, a thread
//! of it waited at the gate, or it owned the device) in at least [`DEMAND_MIN`] of the last
//! [`DEMAND_WINDOWS`] windows of [`DEMAND_WINDOW_NS`]. Each process decides this from what it saw of
//! itself ([`DemandHistory`], private), and says it with the kernel: an OFD lock on its slot's
//! demand byte of the device ledger (`DeviceLedger::set_demand`), held while it wants the device.
//! Others test that lock. Nothing here is a word a tenant could clear for someone else: a tenant
//! can only lock other slots' demand bytes, which makes everyone contended (arbitration as if this
//! did not exist), never uncontended.
//!
//! The thresholds: a steady launcher is active in every window (a refresh every 10-15 ms, windows
//! of 20 ms) and wants the device from its third window on; one short request every 100 ms is
//! active in at most two windows of any four (the launch, and an ownership seen at the next
//! refresh), so it never does. A process of a high-priority tenant wants the device from its first
//! active window ([`DEMAND_MIN_HIGH`]): its neighbours are gated for its requests from the next
//! refresh on. A process that does not yet want the device still gets it at once
//! when it launches: nobody owns it while the others run on the fast path.

/// Length of one demand window.
pub const DEMAND_WINDOW_NS: u64 = 20_000_000;
/// Windows a process remembers.
pub const DEMAND_WINDOWS: usize = 4;
/// Windows (of the remembered ones) a process must have been active in to want the device.
pub const DEMAND_MIN: u32 = 3;
/// Windows a high-priority process must have been active in to want the device: one. Its requests
/// are what priority is for, and a normal tenant is gated beside it (one kernel in flight, holding
/// back while it asks for the device) only while contended: at three windows of four, the normal
/// tenant stayed on the fast path, its queue as deep as its program made it, through a
/// high-priority tenant's first two or three requests (each then waited behind two 2 ms kernels
/// instead of one, often a round's slowest: docs/BENCHMARKS.md, "Where the slowest high-priority
/// requests' time goes"), and through every request of one that asks less often than every 20-30
/// ms. One window of four keeps its neighbours contended for up to 80 ms
/// plus the hold after its last request.
pub const DEMAND_MIN_HIGH: u32 = 1;
/// A process that saw another tenant want the device stays contended this long after it last saw
/// it: a scheduler thread delayed on a loaded host must not put one tenant on the fast path while
/// another is gated, and a neighbour pausing between bursts must not flip everyone back and forth.
pub const CONTENTION_HOLD_NS: u64 = 100_000_000;

/// Window number of `now` (truncated to 32 bits: only differences of a few windows are used).
pub fn window_of(now: u64) -> u32 {
    (now / DEMAND_WINDOW_NS) as u32
}

/// The windows of the last [`DEMAND_WINDOWS`] in which this process was active.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DemandHistory {
    /// (window number, active in it), one entry per window modulo [`DEMAND_WINDOWS`].
    windows: [(u32, bool); DEMAND_WINDOWS],
}

impl DemandHistory {
    /// Notes a refresh in `window`: active or not (activity only accumulates within a window).
    pub fn observe(&mut self, window: u32, active: bool) {
        let e = &mut self.windows[window as usize % DEMAND_WINDOWS];
        if e.0 == window {
            e.1 |= active;
        } else {
            *e = (window, active);
        }
    }

    /// Whether this process was active in at least [`DEMAND_MIN`] of the windows up to `now_window`.
    pub fn wants(&self, now_window: u32) -> bool {
        self.wants_as(now_window, false)
    }

    /// [`DemandHistory::wants`] for a process of a high-priority tenant (`high`): active in at
    /// least [`DEMAND_MIN_HIGH`] of the windows.
    pub fn wants_as(&self, now_window: u32, high: bool) -> bool {
        let seen = self
            .windows
            .iter()
            .filter(|&&(w, active)| active && now_window.wrapping_sub(w) < DEMAND_WINDOWS as u32)
            .count();
        seen as u32 >= if high { DEMAND_MIN_HIGH } else { DEMAND_MIN }
    }
}

/// What one device's scheduler thread keeps of its process's demand between refreshes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DemandState {
    pub history: DemandHistory,
    /// When this thread last looked (monotonic ns): a launch noted later counts for it.
    pub looked_ns: u64,
    /// Whether the process holds its demand lock on this device.
    pub said: bool,
}

/// Whether a process is contended at `now`: contended until `until` (the last time another tenant
/// was seen wanting the device plus [`CONTENTION_HOLD_NS`]), or capped (a cap binds alone too).
pub fn contended(now: u64, until: u64, capped: bool) -> bool {
    capped || now < until
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds refreshes every `refresh_ms` from `from_ms` to `to_ms`, active when `active(t_ms)`;
    /// returns the times (ms) at which the history wanted the device.
    fn run(
        h: &mut DemandHistory,
        from_ms: u64,
        to_ms: u64,
        refresh_ms: u64,
        active: impl Fn(u64) -> bool,
    ) -> Vec<u64> {
        let mut wanted = Vec::new();
        let mut t = from_ms;
        while t < to_ms {
            let w = window_of(t * 1_000_000);
            h.observe(w, active(t));
            if h.wants(w) {
                wanted.push(t);
            }
            t += refresh_ms;
        }
        wanted
    }

    #[test]
    fn a_steady_launcher_wants_the_device_within_three_windows() {
        // Refreshes 10 to 15 ms apart (the scheduler thread's cadence), active at every one.
        for refresh in [10, 13, 15] {
            let mut h = DemandHistory::default();
            let wanted = run(&mut h, 1_000, 2_000, refresh, |_| true);
            assert!(!wanted.is_empty(), "refresh {refresh} ms");
            assert!(
                wanted[0] < 1_000 + 3 * 20,
                "refresh {refresh}: from {}",
                wanted[0]
            );
            // And from then on without a gap.
            let n = wanted.len() as u64;
            assert!(
                n >= (2_000 - wanted[0]) / refresh - 1,
                "refresh {refresh}: {wanted:?}"
            );
        }
    }

    #[test]
    fn an_occasional_launcher_never_wants_the_device() {
        // One request every 100 ms, seen active at two consecutive refreshes (its launch, then its
        // ownership), at every phase against the windows.
        for refresh in [10, 15] {
            for phase in 0..20 {
                let mut h = DemandHistory::default();
                let active = |t: u64| {
                    let r = (t + phase) % 100;
                    r < 2 * refresh
                };
                let wanted = run(&mut h, 1_000, 3_000, refresh, active);
                assert!(
                    wanted.is_empty(),
                    "refresh {refresh}, phase {phase}: {wanted:?}"
                );
            }
        }
    }

    #[test]
    fn a_launcher_that_stops_no_longer_wants_the_device_two_windows_later() {
        let mut h = DemandHistory::default();
        run(&mut h, 0, 200, 10, |_| true);
        let wanted = run(&mut h, 200, 400, 10, |_| false);
        assert!(wanted.iter().all(|&t| t < 200 + 2 * 20), "{wanted:?}");
    }

    #[test]
    fn a_high_priority_process_wants_the_device_from_its_first_active_window() {
        // Its first request: wanted at the refresh that saw it, not two windows later.
        let mut h = DemandHistory::default();
        h.observe(100, true);
        assert!(h.wants_as(100, true));
        assert!(!h.wants_as(100, false));
        // A request every 100 ms: wanted for the four windows after each, as long as it asks.
        assert!(h.wants_as(103, true));
        assert!(!h.wants_as(104, true));
        // Never active: never wants.
        assert!(!DemandHistory::default().wants_as(100, true));
    }

    #[test]
    fn old_windows_never_count_however_the_ring_was_filled() {
        let mut h = DemandHistory::default();
        for w in 10..13 {
            h.observe(w, true);
        }
        assert!(h.wants(12));
        assert!(!h.wants(20));
        // Window numbers wrap at 32 bits.
        let mut h = DemandHistory::default();
        for w in [u32::MAX - 1, u32::MAX, 0] {
            h.observe(w, true);
        }
        assert!(h.wants(0));
    }

    #[test]
    fn contention_holds_after_the_neighbour_was_last_seen_and_caps_bind_alone() {
        let seen = 1_000_000_000;
        let until = seen + CONTENTION_HOLD_NS;
        assert!(contended(seen + 1, until, false));
        assert!(contended(until - 1, until, false));
        assert!(!contended(until, until, false));
        assert!(contended(until + 1, until, true));
        assert!(!contended(5, 0, false));
    }
}
