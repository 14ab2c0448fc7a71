//! Launches that pass the gate without ownership for a collective (docs/COMPUTE.md,
//! "Collectives"): while our tenant's work on another device waits without completing, a launch
//! here may be its peer rank's part; one round of launches passes per such wait.

use super::runtime;
use super::Sched;
use crate::scheduling::cu::RelaxedCapture;
use crate::scheduling::device::now_ns;
use crate::scheduling::watch;
use std::sync::atomic::Ordering::*;

/// A published wait of the tenant on another device counts while it was seen within this.
const PEER_FRESH_NS: u64 = 1_000_000;
/// Waiters of a tenant whose work waited on another device within this interval look every
/// `watch::PEER_POLL_NS` (instead of longer), so a pass is not missed.
const PEER_RECENT_NS: u64 = 1_000_000_000;
/// Launches that pass the gate for one wait of the tenant on another device.
const MAX_PASSES: u32 = 8;

impl Sched {
    /// A waiter looks again at least this often (`watch::waiter_poll_ns`): more often while the
    /// tenant's work waits on another device (a pass may be due), and seldom while the scheduler
    /// thread looks at the owner for it (`watched`: a hand-over wakes it).
    pub(in crate::scheduling) fn waiter_poll_ns(&self, watched: bool) -> u64 {
        let now = now_ns();
        // Paced: awake when our tenant's window starts (`evidence`).
        watch::waiter_poll_ns(
            watched && !self.thread_done(),
            self.high.load(Relaxed),
            self.peer_recent(now),
            self.evidence.until_window(now),
        )
    }

    /// Whether a wait of our tenant's work on another device was seen within `PEER_RECENT_NS`:
    /// the tenant's programs span devices and wait for each other (collectives).
    pub(in crate::scheduling) fn peer_recent(&self, now: u64) -> bool {
        let seen = self.peer_seen_ns.load(Relaxed);
        seen != 0 && now.saturating_sub(seen) < PEER_RECENT_NS
    }

    /// The tenant's published wait on another device, if it is current: its start (the episode).
    fn peer_stall(&self, now: u64) -> Option<u64> {
        let ledger = runtime::tenant_ledger()?;
        let (device, since, seen) = ledger.stall();
        if device == self.device_key || since == 0 || seen > now || now - seen > PEER_FRESH_NS {
            return None;
        }
        self.peer_seen_ns.store(now, Relaxed);
        Some(since)
    }

    /// Whether a launch of ours would pass the gate now (see [`Sched::peer_pass`]), without
    /// counting it.
    pub(in crate::scheduling) fn peer_pass_due(&self) -> bool {
        let now = now_ns();
        let Some(episode) = self.peer_stall(now) else {
            return false;
        };
        if self.beside_high.load(Relaxed) || self.ledger.view(self.tenant()).cap != 0 {
            return false;
        }
        if self.pass_episode.load(Acquire) != episode {
            return true;
        }
        {
            // Our event queries must not break another thread's global-mode capture.
            let _relaxed = RelaxedCapture::when_needed();
            self.completed();
        }
        self.passes.load(Acquire) < MAX_PASSES
            && self.progress_ns.load(Acquire) < self.pass_from.load(Acquire)
    }

    /// Lets a launch through the gate without ownership when our tenant's work on another device
    /// waits without completing (published in the tenant's memory ledger by the process whose work
    /// it is): that work may be a collective waiting for this very launch (its peer rank here),
    /// and without it the other device's owner would only drain or stall, and then hand over
    /// with the collective half launched, whose kernel then spins in every gap of the next owner's
    /// work (the hardware time-slices it). One round per wait: launches pass until one of them
    /// has completed (the round went through), at most [`MAX_PASSES`]. Not beside an active
    /// high-priority tenant (its latency) or for a capped tenant (its cap). What passes runs in
    /// another tenant's ownership and is charged to ours when it completes, like work left
    /// running at a hand-over.
    pub(in crate::scheduling) fn peer_pass(&self) -> bool {
        if !self.peer_pass_due() {
            return false;
        }
        let Some(episode) = self.peer_stall(now_ns()) else {
            return false;
        };
        if self.pass_episode.swap(episode, AcqRel) != episode {
            self.pass_from.store(now_ns(), Release);
            self.passes.store(0, Release);
        }
        self.passes.fetch_add(1, AcqRel);
        true
    }
}
