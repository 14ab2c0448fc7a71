//! The pure arbitration logic of compute shares (docs/COMPUTE.md): virtual time (start-time fair
//! queuing), the token bucket of caps, eligibility and the choice of the next owner. No shared memory
//! here: the device ledger copies its entries into these plain values under its lock, calls these
//! functions, and writes the results back.

/// Longest ownership of the device (`S`).
pub const SLICE_NS: u64 = 20_000_000;
/// A capped tenant's bucket holds at most this much GPU time (`B` = 2 slices).
pub const BUCKET_NS: i64 = 2 * SLICE_NS as i64;
/// An owner that submitted nothing for this long and whose work completed hands the device over (`I`).
pub const IDLE_NS: u64 = 500_000;
/// A stopped or hung owner keeps the device at most its slice plus this grace.
pub const GRACE_NS: u64 = 100_000_000;
/// Longest an arbitration can be kept from running while a live tenant waits (a slice, its drain
/// and the grace of a stopped owner): a waiting tenant unseen for longer was not waiting.
pub const UNSEEN_NS: u64 = SLICE_NS + DRAIN_LIMIT_NS + GRACE_NS;
/// A tenant that wanted the device within this interval counts as active (its virtual time stands).
pub const ACTIVE_GAP_NS: u64 = 50_000_000;
/// Shortest slice granted to a capped tenant with few tokens (keeps hand-overs from thrashing).
pub const MIN_SLICE_NS: u64 = 1_000_000;
/// Largest share read from a ledger (shares are ratios; a larger word is garbage).
pub const MAX_SHARE: u32 = 10_000;
/// Lowest a capped tenant's bucket goes (an overrun of a few slices; a lower word is garbage).
pub const MIN_TOKENS_NS: i64 = -50 * SLICE_NS as i64;
/// Longest an owner waits for its in-flight work at the end of its slice before handing the device
/// over anyway: a kernel that waits for another process (a collective whose peer waits at another
/// device's gate) must not hold the device forever; the hardware time-slices contexts, our gate only
/// decides who may enqueue. (An owner that submits nothing while its work waits hands over sooner:
/// see the scheduler thread.) Ordinary drains take at most `Q` kernels, well below this.
pub const DRAIN_LIMIT_NS: u64 = 2 * SLICE_NS;
/// Share of a tenant that has none.
pub const DEFAULT_SHARE: u32 = 10;
/// Work a process keeps in flight on a contended device: `Q` launches, `Q` = this / the observed
/// length of one launch's work, within [`MIN_QUEUE_DEPTH`, `MAX_QUEUE_DEPTH`] (4 before anything is
/// observed); 1 beside a high-priority tenant.
pub const INFLIGHT_TARGET_NS: u64 = 1_000_000;
pub const MIN_QUEUE_DEPTH: usize = 2;
pub const MAX_QUEUE_DEPTH: usize = 32;
pub const QUEUE_DEPTH_BESIDE_HIGH: usize = 1;

/// `Q` for launches whose work takes `launch_ns` each.
pub fn queue_depth(launch_ns: u64) -> usize {
    ((INFLIGHT_TARGET_NS / launch_ns.max(1)) as usize).clamp(MIN_QUEUE_DEPTH, MAX_QUEUE_DEPTH)
}

/// One tenant's scheduling state, as read from the ledger.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantView {
    /// Percent; only ratios matter. 0 is read as 1.
    pub share: u32,
    /// Percent cap, 0 = none.
    pub cap: u32,
    pub high: bool,
    /// Virtual time: charged ns x 100 / share.
    pub vtime: u64,
    /// Bucket of GPU time, ns (negative after an overrun).
    pub tokens: i64,
    pub refill_ns: u64,
    pub last_active_ns: u64,
}

/// A process slot that wants the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waiter {
    pub slot: usize,
    pub tenant: usize,
    /// When it started waiting (ns); the longest waiter of a tenant goes first.
    pub since: u64,
}

/// The outcome of an arbitration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// `slot` owns the device for at most `slice_ns`.
    Grant { slot: usize, slice_ns: u64 },
    /// Nobody is eligible now (caps); try again after `retry_ns`.
    Wait { retry_ns: u64 },
    /// Nobody wants the device.
    Idle,
}

/// Adds the tokens earned since the last refill (cap percent of wall time), up to the bucket size.
pub fn refill(t: &mut TenantView, now: u64) {
    if t.cap == 0 {
        return;
    }
    let elapsed = now.saturating_sub(t.refill_ns);
    let earned = (elapsed as u128 * t.cap.min(100) as u128 / 100) as i64;
    t.tokens = t.tokens.saturating_add(earned).min(BUCKET_NS);
    t.refill_ns = now;
}

/// Charges `ns` of device time: virtual time advances by `ns / share`, a capped tenant pays tokens.
pub fn charge(t: &mut TenantView, ns: u64, now: u64) {
    refill(t, now);
    t.vtime = t
        .vtime
        .saturating_add(ns.saturating_mul(100) / t.share.max(1) as u64);
    if t.cap != 0 {
        t.tokens = t.tokens.saturating_sub(ns.min(i64::MAX as u64) as i64);
    }
    t.last_active_ns = now;
}

/// Whether a tenant may own the device now (its bucket is not empty).
pub fn eligible(t: &TenantView) -> bool {
    t.cap == 0 || t.tokens > 0
}

/// The slice a tenant gets: `S`, cut to its tokens when capped.
pub fn slice_for(t: &TenantView) -> u64 {
    if t.cap == 0 {
        SLICE_NS
    } else {
        (t.tokens.max(0) as u64).clamp(MIN_SLICE_NS, SLICE_NS)
    }
}

/// A tenant (re)becoming active starts at the smallest virtual time of the active ones, so idle time
/// is not banked. `wanted_since`: when it started waiting for the device; waiting is wanting, so
/// only a gap before that is idle time (a tenant kept waiting by a long slice keeps its credit).
pub fn activate(tenants: &mut [TenantView], i: usize, wanted_since: u64, now: u64) {
    let idle = wanted_since
        .min(now)
        .saturating_sub(tenants[i].last_active_ns);
    // Every arbitration marks the tenants it sees waiting; one unseen for longer than any ownership
    // keeps a live waiter out did not wait meanwhile, whatever its `since` says: its process did not
    // run (stopped, or starved of CPU, its heartbeat stale), and banking that time let a tenant
    // stopped for 1 s take 60% for a second after it continued.
    let unseen = now.saturating_sub(tenants[i].last_active_ns);
    if idle > ACTIVE_GAP_NS || unseen > UNSEEN_NS {
        let floor = tenants
            .iter()
            .enumerate()
            .filter(|(j, t)| {
                *j != i
                    && t.last_active_ns != 0
                    && now.saturating_sub(t.last_active_ns) <= ACTIVE_GAP_NS
            })
            .map(|(_, t)| t.vtime)
            .min();
        if let Some(f) = floor {
            tenants[i].vtime = tenants[i].vtime.max(f);
        }
    }
    tenants[i].last_active_ns = now;
}

/// Chooses the next owner among `waiters`: high priority first, then the eligible tenant with the
/// smallest virtual time, then its longest-waiting slot.
pub fn choose(tenants: &mut [TenantView], waiters: &[Waiter], now: u64) -> Choice {
    if waiters.is_empty() {
        return Choice::Idle;
    }
    let mut seen = [false; 64];
    for w in waiters {
        if w.tenant < tenants.len() && !seen[w.tenant % 64] {
            seen[w.tenant % 64] = true;
            // The tenant has wanted the device since its longest-waiting slot started waiting.
            let since = waiters
                .iter()
                .filter(|v| v.tenant == w.tenant)
                .map(|v| v.since)
                .min()
                .unwrap_or(now);
            refill(&mut tenants[w.tenant], now);
            activate(tenants, w.tenant, since, now);
        }
    }
    let best = waiters
        .iter()
        .filter(|w| w.tenant < tenants.len() && eligible(&tenants[w.tenant]))
        .min_by_key(|w| {
            let t = &tenants[w.tenant];
            (!t.high, t.vtime, w.since, w.slot)
        });
    match best {
        Some(w) => Choice::Grant {
            slot: w.slot,
            slice_ns: slice_for(&tenants[w.tenant]),
        },
        None => {
            // Time until the first capped waiter has a token again.
            let retry = waiters
                .iter()
                .filter(|w| w.tenant < tenants.len())
                .map(|w| {
                    let t = &tenants[w.tenant];
                    let missing = 1i64.saturating_sub(t.tokens).max(1) as u128;
                    (missing * 100 / t.cap.max(1) as u128) as u64
                })
                .min()
                .unwrap_or(MIN_SLICE_NS);
            Choice::Wait {
                retry_ns: retry.clamp(100_000, SLICE_NS),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(share: u32) -> TenantView {
        TenantView {
            share,
            ..Default::default()
        }
    }

    /// Simulates tenants that always have work, each owning whole slices plus `overrun`.
    fn simulate(tenants: &mut [TenantView], overrun: u64, total_ns: u64) -> Vec<u64> {
        let mut got = vec![0u64; tenants.len()];
        let mut now = 1u64;
        while now < total_ns {
            let waiters: Vec<Waiter> = (0..tenants.len())
                .map(|i| Waiter {
                    slot: i,
                    tenant: i,
                    since: now,
                })
                .collect();
            match choose(tenants, &waiters, now) {
                Choice::Grant { slot, slice_ns } => {
                    let used = slice_ns + overrun;
                    now += used;
                    charge(&mut tenants[slot], used, now);
                    got[slot] += used;
                }
                Choice::Wait { retry_ns } => now += retry_ns,
                Choice::Idle => unreachable!(),
            }
        }
        got
    }

    #[test]
    fn shares_are_met_within_the_bound() {
        for shares in [vec![30, 70], vec![50, 50], vec![10, 20, 30, 40]] {
            let mut ts: Vec<_> = shares.iter().map(|&s| tenant(s)).collect();
            let got = simulate(&mut ts, 800_000, 10_000_000_000);
            let total: u64 = got.iter().sum();
            let sum: u32 = shares.iter().sum();
            for (g, s) in got.iter().zip(&shares) {
                let frac = *g as f64 / total as f64;
                let want = *s as f64 / sum as f64;
                assert!((frac - want).abs() < 0.01, "{shares:?}: {got:?}");
            }
        }
    }

    #[test]
    fn a_cap_bounds_a_lone_tenant() {
        let mut ts = vec![TenantView {
            share: 10,
            cap: 30,
            tokens: BUCKET_NS,
            refill_ns: 1,
            ..Default::default()
        }];
        let got = simulate(&mut ts, 800_000, 10_000_000_000);
        let frac = got[0] as f64 / 10e9;
        assert!(frac <= 0.305, "capped tenant got {frac}");
        assert!(frac >= 0.28, "capped tenant got {frac}");
    }

    #[test]
    fn high_priority_goes_first_and_idle_time_is_not_banked() {
        let mut ts = vec![tenant(90), tenant(10)];
        ts[1].high = true;
        ts[1].vtime = 1 << 40;
        let w = [
            Waiter {
                slot: 0,
                tenant: 0,
                since: 1,
            },
            Waiter {
                slot: 5,
                tenant: 1,
                since: 9,
            },
        ];
        assert_eq!(
            choose(&mut ts, &w, 100),
            Choice::Grant {
                slot: 5,
                slice_ns: SLICE_NS
            }
        );
        // A tenant back from idle starts at the active tenants' virtual time.
        let mut ts = vec![tenant(50), tenant(50)];
        ts[0].vtime = 1_000_000;
        ts[0].last_active_ns = 10 * ACTIVE_GAP_NS;
        ts[1].last_active_ns = 1;
        activate(&mut ts, 1, 10 * ACTIVE_GAP_NS, 10 * ACTIVE_GAP_NS + 1);
        assert_eq!(ts[1].vtime, 1_000_000);
        // One that has been waiting all along (kept out by a long slice) keeps its credit.
        let mut ts = vec![tenant(50), tenant(50)];
        ts[0].vtime = 1_000_000;
        ts[0].last_active_ns = UNSEEN_NS;
        ts[1].last_active_ns = 1;
        activate(&mut ts, 1, 1 + ACTIVE_GAP_NS / 2, UNSEEN_NS);
        assert_eq!(ts[1].vtime, 0);
        // One whose waiting started before it was stopped for a second: unseen by arbitration
        // since, it did not wait; it starts at the active tenants' virtual time.
        let mut ts = vec![tenant(50), tenant(50)];
        ts[0].vtime = 1_000_000;
        ts[0].last_active_ns = 1_000_000_000;
        ts[1].last_active_ns = 1;
        activate(&mut ts, 1, 1 + ACTIVE_GAP_NS / 2, 1_000_000_001);
        assert_eq!(ts[1].vtime, 1_000_000);
    }

    #[test]
    fn longest_waiter_of_a_tenant_goes_first_and_empty_buckets_wait() {
        let mut ts = vec![tenant(50)];
        let w = [
            Waiter {
                slot: 3,
                tenant: 0,
                since: 20,
            },
            Waiter {
                slot: 7,
                tenant: 0,
                since: 10,
            },
        ];
        assert!(matches!(
            choose(&mut ts, &w, 30),
            Choice::Grant { slot: 7, .. }
        ));
        let mut ts = vec![TenantView {
            share: 10,
            cap: 50,
            tokens: -1_000_000,
            refill_ns: 100,
            ..Default::default()
        }];
        match choose(&mut ts, &w[..1], 100) {
            Choice::Wait { retry_ns } => assert!((1_900_000..=2_100_000).contains(&retry_ns)),
            c => panic!("{c:?}"),
        }
        assert_eq!(choose(&mut ts, &[], 100), Choice::Idle);
    }
}
