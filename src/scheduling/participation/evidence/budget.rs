//! What a process keeps by its own clock: its private bucket of device time, the window of every
//! frame its tenant launches paced in, and the starvation watch (pure values; [`super::Evidence`]
//! holds them).

use super::*;

/// A private bucket of device time (ns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    pub tokens: i64,
}

impl Default for Bucket {
    fn default() -> Bucket {
        Bucket {
            tokens: BUCKET_MAX_NS,
        }
    }
}

impl Bucket {
    /// `dt` ns went by at fair fraction `f_ppm`; the process held the device (or launched paced)
    /// during them when `held`.
    pub fn tick(&mut self, dt: u64, f_ppm: u64, held: bool) {
        let dt = dt.min(MAX_STEP_NS);
        let earn = (u128::from(dt) * u128::from(f_ppm.min(PPM)) * u128::from(100 + SLACK_PCT)
            / u128::from(100 * PPM)) as i64;
        let spend = if held { dt as i64 } else { 0 };
        self.tokens = self
            .tokens
            .saturating_add(earn)
            .saturating_sub(spend)
            .clamp(-BUCKET_MAX_NS, BUCKET_MAX_NS);
    }

    pub fn full(&mut self) {
        self.tokens = BUCKET_MAX_NS;
    }
}

/// A tenant's window of every [`FRAME_NS`] frame (ppm of the frame): the tenants that want the
/// device, ordered by id, each get a window in proportion to its share (the node's policy), so
/// paced processes of different tenants take turns by the clock alone rather than overlap at
/// random.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    pub start_ppm: u64,
    pub len_ppm: u64,
}

impl Window {
    /// Our window among `tenants` (id, share), ours among them; each id counted once.
    pub fn of(mine: TenantId, tenants: &[(TenantId, u64)]) -> Window {
        let mut sorted: Vec<(TenantId, u64)> = Vec::with_capacity(tenants.len());
        for &(id, share) in tenants {
            if !sorted.iter().any(|(i, _)| *i == id) {
                sorted.push((id, share.max(1)));
            }
        }
        sorted.sort_by_key(|(id, _)| id.0);
        let total: u64 = sorted.iter().map(|(_, s)| *s).sum::<u64>().max(1);
        let before: u64 = sorted
            .iter()
            .take_while(|(id, _)| *id != mine)
            .map(|(_, s)| *s)
            .sum();
        let me = sorted
            .iter()
            .find(|(id, _)| *id == mine)
            .map_or(0, |(_, s)| *s);
        Window {
            start_ppm: fraction(before, total),
            len_ppm: fraction(me, total),
        }
    }

    /// Nanoseconds from `now` until the window starts (0 inside it).
    pub fn until(&self, now: u64) -> u64 {
        if self.holds(now) {
            return 0;
        }
        let start = ppm_of_frame(self.start_ppm);
        let at = now % FRAME_NS;
        if at < start {
            start - at
        } else {
            FRAME_NS - at + start
        }
    }

    /// Whether `now` (monotonic ns, the node's common clock) falls in the window. (What a
    /// process launches in it must also end in it: [`fit`].)
    pub fn holds(&self, now: u64) -> bool {
        self.left(now) != 0
    }

    /// The window's length (ns).
    pub fn len_ns(&self) -> u64 {
        ppm_of_frame(self.len_ppm)
    }

    /// Nanoseconds from `now` to the window's end (0 outside it).
    pub fn left(&self, now: u64) -> u64 {
        let (start, len) = (ppm_of_frame(self.start_ppm), self.len_ns());
        let at = now % FRAME_NS;
        let end = start.saturating_add(len);
        if (start..end).contains(&at) {
            end - at
        } else {
            0
        }
    }
}

fn ppm_of_frame(ppm: u64) -> u64 {
    (u128::from(ppm.min(PPM)) * u128::from(FRAME_NS) / u128::from(PPM)) as u64
}

/// The shortest hold of a launch that waits for its own backlog to shrink ([`fit`]): a look at our
/// completions is a driver call.
pub const FIT_HOLD_MIN_NS: u64 = 100_000;

/// What a launch of a paced process does in its tenant's window ([`fit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    /// It goes through: it and the work queued ahead of it end in the window.
    Go,
    /// It waits this long (ns), then asks again (or, past the window's end, waits for the next).
    Hold(u64),
}

/// Whether a launch estimated at `launch_ns`, with `backlog_ns` of this process's work still
/// queued ahead of it, may go through `left_ns` before its tenant's window (`len_ns` long) ends:
/// only when it would complete in the window. What one tenant queued past its window's end would
/// run in the next tenant's, time-sliced with it: 8 queued kernels of 2 ms took 16 ms of every
/// next window, and each tenant's device time followed the order of the windows, not its share.
/// Otherwise the launch holds: for the backlog's excess when the launch alone fits (the queue runs
/// meanwhile), or until the window ends when it does not (it goes in the next one). A launch longer
/// than half the window goes alone, from the window's first half: it would fit no better later.
pub fn fit(left_ns: u64, len_ns: u64, backlog_ns: u64, launch_ns: u64) -> Fit {
    let need = backlog_ns.saturating_add(launch_ns);
    if need <= left_ns {
        return Fit::Go;
    }
    let half = len_ns / 2;
    if launch_ns > half {
        return if backlog_ns == 0 && left_ns >= half {
            Fit::Go
        } else {
            Fit::Hold(left_ns.max(FIT_HOLD_MIN_NS))
        };
    }
    if launch_ns <= left_ns && backlog_ns != 0 {
        Fit::Hold((need - left_ns).clamp(FIT_HOLD_MIN_NS, left_ns.max(FIT_HOLD_MIN_NS)))
    } else {
        Fit::Hold(left_ns.max(FIT_HOLD_MIN_NS))
    }
}

/// How much of the time the process wanted the device it owned it, by its own clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Watch {
    pub wanted_ns: u64,
    pub owned_ns: u64,
}

impl Watch {
    /// `dt` ns went by, wanting the device when `wanted`, owning it when `owned`.
    pub fn tick(&mut self, dt: u64, wanted: bool, owned: bool) {
        let dt = dt.min(MAX_STEP_NS);
        if wanted || owned {
            self.wanted_ns = self.wanted_ns.saturating_add(dt);
        }
        if owned {
            self.owned_ns = self.owned_ns.saturating_add(dt);
        }
        if self.wanted_ns > WINDOW_NS {
            self.wanted_ns /= 2;
            self.owned_ns /= 2;
        }
    }

    /// Owned less than half of `floor_ppm` of a judged span.
    pub fn starved(&self, floor_ppm: u64) -> bool {
        self.wanted_ns >= JUDGE_NS
            && u128::from(self.owned_ns) * u128::from(2 * PPM)
                < u128::from(self.wanted_ns) * u128::from(floor_ppm)
    }

    /// Owned at least three quarters of `floor_ppm` of a judged span.
    pub fn recovered(&self, floor_ppm: u64) -> bool {
        self.wanted_ns >= JUDGE_NS
            && u128::from(self.owned_ns) * u128::from(4 * PPM)
                >= u128::from(self.wanted_ns) * u128::from(3 * floor_ppm)
    }

    /// The owned fraction observed (ppm).
    pub fn owned_ppm(&self) -> u64 {
        (u128::from(self.owned_ns) * u128::from(PPM) / u128::from(self.wanted_ns.max(1))) as u64
    }
}

/// `share` over `total` in ppm (at most one whole; a total below the share counts as the share).
pub fn fraction(share: u64, total: u64) -> u64 {
    (u128::from(share) * u128::from(PPM) / u128::from(total.max(share).max(1))) as u64
}

/// The least fraction honest arbitration gives a tenant of `share` among tenants whose shares sum
/// to `listed_total` (every tenant of the GPU wanting it at once), lowered to its cap when it has
/// one (percent, 0 = none), divided among its own `processes` that want the device (at most 8
/// counted: past that, a process may go paced when it need not, which still keeps its share).
pub fn fraction_floor(share: u64, listed_total: u64, cap: u32, processes: u32) -> u64 {
    let mut f = fraction(share, listed_total);
    if cap != 0 {
        f = f.min(u64::from(cap.min(100)) * PPM / 100);
    }
    f / u64::from(processes.clamp(1, 8))
}
