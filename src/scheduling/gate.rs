//! One device's scheduling in this process ([`Sched`]) and the launch gate: on a contended device only
//! the owner's launches reach the driver (at most `Q` in flight); the others wait for a grant, and a
//! waiter takes the device from an owner that is dead, stopped, or named by a damaged ledger word.

use super::arbiter::{self, Choice, GRACE_NS, SLICE_NS};
use super::cu::{self, RelaxedCapture};
use super::device::{futex_wait, futex_wake, now_ns, DeviceLedger};
use super::events::{Pending, Tracked};
use super::{incident, runtime, Holder, Incident, TenantId};
use gpuslice_api::types::{CUcontext, CUstream};
use gpuslice_api::CUresult;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};

/// Longest a waiter sleeps before checking the owner's liveness again.
const WAITER_POLL_NS: u64 = 2_000_000;
/// An owner whose heartbeat is older than this (and past its slice plus grace) is revoked.
pub(super) const BEAT_STALE_NS: u64 = 20_000_000;

/// The process's participation in one device's scheduling.
pub struct Sched {
    pub(super) ledger: DeviceLedger,
    pub(super) ordinal: u32,
    pub(super) slot: usize,
    /// Our tenant's entry in the ledger (re-found if the entry is damaged).
    pub(super) tenant: std::sync::atomic::AtomicUsize,
    pub(super) id: TenantId,
    /// More than one tenant attached, or our tenant is capped: launches take the slow path.
    pub(super) contended: AtomicBool,
    pub(super) high: AtomicBool,
    /// Another tenant of high priority is active: keep one launch in flight.
    pub(super) beside_high: AtomicBool,
    /// The epoch under which we own the device (0 = we do not).
    pub(super) owned: AtomicU32,
    /// Our slice is ending: launches wait.
    pub(super) stopping: AtomicBool,
    /// Launch hooks between their ownership check and the end of their launch.
    pub(super) launching: AtomicU32,
    /// Launch hooks waiting in flow control for our oldest launch (we still have work to submit).
    pub(super) flow_waiting: AtomicU32,
    /// Threads of this process waiting for a grant, and since when the oldest of them waits: the
    /// truth our slot's `wants` / `wait_since` words publish. The words live in a file others can
    /// zero or scribble (a truncation repaired with zeros): they are written again from these
    /// values, never counted up and down in place, so a waiter stays visible to arbitration.
    pub(super) waiting: AtomicU32,
    pub(super) waiting_since: AtomicU64,
    pub(super) last_submit_ns: AtomicU64,
    /// Estimated device time of one launch (EWMA), for `Q`.
    pub(super) launch_ns: AtomicU64,
    pub(super) last_completion_ns: AtomicU64,
    /// When one of our tracked launches last completed (any path): our work makes progress.
    pub(super) progress_ns: AtomicU64,
    /// Event pairs in flight: around a launch, or empty (`Tracked::calibration`).
    pub(super) inflight: Mutex<VecDeque<Tracked>>,
    /// Device time of our launches completed during the current ownership (ns), not charged yet.
    pub(super) measured_ns: AtomicU64,
    /// Device time of launches that completed after we handed the device over (ns), not charged yet.
    pub(super) carried_ns: AtomicU64,
    /// What an empty event pair measures (the driver's own step from one stream operation to the
    /// next, not device time): taken off each launch's two steps. Running low estimate.
    pub(super) event_overhead_ns: AtomicU64,
    pub(super) last_calibration_ns: AtomicU64,
    pub(super) free_events: Mutex<Vec<Pending>>,
    /// Exit: the scheduler thread hands over and stops; it sets `done` when it has.
    pub(super) stop: AtomicBool,
    pub(super) done: AtomicBool,
}

impl Sched {
    pub(super) fn new(
        ledger: DeviceLedger,
        ordinal: u32,
        slot: usize,
        tenant: usize,
        id: TenantId,
        high: bool,
    ) -> Sched {
        Sched {
            ledger,
            ordinal,
            slot,
            tenant: tenant.into(),
            id,
            contended: AtomicBool::new(true),
            high: AtomicBool::new(high),
            beside_high: AtomicBool::new(false),
            owned: AtomicU32::new(0),
            stopping: AtomicBool::new(false),
            launching: AtomicU32::new(0),
            flow_waiting: AtomicU32::new(0),
            waiting: AtomicU32::new(0),
            waiting_since: AtomicU64::new(0),
            last_submit_ns: AtomicU64::new(0),
            launch_ns: AtomicU64::new(250_000),
            last_completion_ns: AtomicU64::new(0),
            progress_ns: AtomicU64::new(0),
            inflight: Mutex::new(VecDeque::new()),
            measured_ns: AtomicU64::new(0),
            carried_ns: AtomicU64::new(0),
            event_overhead_ns: AtomicU64::new(0),
            last_calibration_ns: AtomicU64::new(0),
            free_events: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            done: AtomicBool::new(false),
        }
    }

    pub(super) fn me(&self) -> Holder {
        Holder::of(self.slot)
    }

    pub(super) fn tenant(&self) -> usize {
        self.tenant.load(Relaxed)
    }

    pub(super) fn contended(&self) -> bool {
        self.contended.load(Relaxed)
    }

    pub(super) fn owns_now(&self) -> bool {
        let h = &self.ledger.layout().header;
        let e = self.owned.load(SeqCst);
        e != 0
            && !self.stopping.load(SeqCst)
            && h.owner.load(Acquire) == self.me().word()
            && h.epoch.load(Acquire) == e
    }

    pub(super) fn gate(
        &self,
        streams: &[CUstream],
        ctx: CUcontext,
        per_thread: bool,
        launch: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if !self.contended() {
            return launch();
        }
        // Our event calls must not break another thread's global-mode capture.
        let _relaxed = RelaxedCapture::enter();
        // Launches into a capturing stream build a graph; nothing runs.
        if streams.iter().any(|&s| cu::capturing(s, per_thread)) {
            return launch();
        }
        let mut waited_from = 0;
        loop {
            if !self.contended() || runtime::stopped() {
                return launch();
            }
            if self.owns_now() {
                // Before counting as launching: a drain does not wait for our queue to shrink.
                self.flow_control();
                self.launching.fetch_add(1, SeqCst);
                if !self.owns_now() {
                    self.launching.fetch_sub(1, SeqCst);
                    continue;
                }
                let r = self.launch_tracked(streams, ctx, per_thread, launch);
                self.last_submit_ns.store(now_ns(), Release);
                self.launching.fetch_sub(1, SeqCst);
                if waited_from != 0 {
                    if let Some(t) = self.ledger.layout().tenants.get(self.tenant()) {
                        t.wait_ns
                            .fetch_add(now_ns().saturating_sub(waited_from), Relaxed);
                    }
                }
                return r;
            }
            if waited_from == 0 {
                waited_from = now_ns();
            }
            self.wait_for_grant();
        }
    }

    /// Waits until this process owns the device (or the device is no longer contended).
    fn wait_for_grant(&self) {
        let l = self.ledger.layout();
        let h = &l.header;
        let slot = &l.slots[self.slot];
        if self.waiting.fetch_add(1, SeqCst) == 0 {
            self.waiting_since.store(now_ns(), SeqCst);
        }
        self.publish_waiting();
        loop {
            if !self.contended() || runtime::stopped() {
                break;
            }
            // Our words zeroed or scribbled (a truncation repaired with zeros, another program):
            // arbitration would never see us wait. Written again on every pass (at most
            // `WAITER_POLL_NS` apart).
            if !self.waiting_published(slot) {
                self.publish_waiting();
            }
            let e = h.epoch.load(Acquire);
            let o = Holder::from_word(h.owner.load(Acquire));
            if o == self.me() {
                if self.owned.load(SeqCst) != e && !self.stopping.load(SeqCst) {
                    self.owned.store(e, SeqCst);
                }
                if self.owns_now() {
                    break;
                }
                // Our own slice is ending: wait for the hand-over.
                futex_wait(&h.epoch, e, WAITER_POLL_NS);
                continue;
            }
            if o.is_none() {
                let mut timeout = WAITER_POLL_NS;
                let g = self.ledger.lock(self.slot);
                if Holder::from_word(h.owner.load(Acquire)).is_none() {
                    let c = g.hand_over(now_ns());
                    drop(g);
                    futex_wake(&h.epoch);
                    if let Choice::Wait { retry_ns } = c {
                        timeout = retry_ns.min(WAITER_POLL_NS);
                    }
                } else {
                    drop(g);
                }
                if h.epoch.load(Acquire) == e && h.owner.load(Acquire) == 0 {
                    futex_wait(&h.epoch, e, timeout);
                }
                continue;
            }
            let Some(owner) = o.slot() else {
                incident(
                    Incident::Owner,
                    format_args!(
                        "device ledger {}: owner word {:#x} names no slot",
                        self.ledger.path().display(),
                        o.word()
                    ),
                );
                self.revoke(o, e);
                continue;
            };
            let ot = l.slots[owner].tenant.load(Acquire) as usize;
            if self.high.load(Relaxed) && !self.ledger.is_high(ot) && h.preempt.swap(1, AcqRel) == 0
            {
                futex_wake(&h.preempt);
            }
            if self.overdue(h) || !self.ledger.slot_alive(owner, Some(self.slot)) {
                self.revoke(o, e);
                continue;
            }
            futex_wait(&h.epoch, e, WAITER_POLL_NS);
        }
        self.waiting.fetch_sub(1, SeqCst);
        self.publish_waiting();
    }

    /// Writes our slot's `wants` and `wait_since` from this process's own count. Two threads
    /// publishing at once may leave a stale value; a waiter's next pass and the scheduler thread's
    /// refresh write it again.
    pub(super) fn publish_waiting(&self) {
        let slot = &self.ledger.layout().slots[self.slot];
        let n = self.waiting.load(SeqCst);
        let since = if n == 0 {
            0
        } else {
            self.waiting_since.load(SeqCst).max(1)
        };
        slot.wants.store(n, Release);
        slot.wait_since.store(since, Release);
    }

    /// Whether our slot's `wants` and `wait_since` words say what this process's count says.
    pub(super) fn waiting_published(&self, slot: &super::shm::SlotEntry) -> bool {
        let n = self.waiting.load(SeqCst);
        let since = slot.wait_since.load(Acquire);
        slot.wants.load(Acquire) == n && (n == 0) == (since == 0) && since <= now_ns()
    }

    /// Whether the owner is stopped or hung: past its slice plus the grace, and silent (a draining
    /// owner beats). A grant, slice or heartbeat that cannot be genuine is repaired first.
    fn overdue(&self, h: &super::shm::Header) -> bool {
        // Read before the clock: a genuine stamp is then never ahead of `now`.
        let (grant, slice, beat) = (
            h.grant_ns.load(Acquire),
            h.slice_ns.load(Acquire),
            h.owner_beat_ns.load(Acquire),
        );
        let now = now_ns();
        if grant > now || slice > SLICE_NS || beat > now {
            let g = self.ledger.lock(self.slot);
            let fixed_grant = h.grant_ns.load(Acquire).min(now);
            h.grant_ns.store(fixed_grant, Release);
            h.slice_ns
                .store(h.slice_ns.load(Acquire).min(SLICE_NS), Release);
            h.owner_beat_ns
                .store(h.owner_beat_ns.load(Acquire).min(now), Release);
            drop(g);
            incident(
                Incident::Time,
                format_args!(
                    "device ledger {}: grant {grant}, slice {slice} ns, heartbeat {beat} (now {now})",
                    self.ledger.path().display()
                ),
            );
            return false;
        }
        now > grant.saturating_add(slice).saturating_add(GRACE_NS)
            && now.saturating_sub(beat) > BEAT_STALE_NS
    }

    /// Takes the device from a dead, stopped or invalid owner (still `owner` under `epoch`).
    fn revoke(&self, owner: Holder, epoch: u32) {
        let l = self.ledger.layout();
        let h = &l.header;
        let g = self.ledger.lock(self.slot);
        if h.owner.load(Acquire) != owner.word() || h.epoch.load(Acquire) != epoch {
            return;
        }
        let now = now_ns();
        if let Some(slot) = owner.slot() {
            let t = l.slots[slot].tenant.load(Acquire) as usize;
            let held = now.saturating_sub(h.grant_ns.load(Acquire).min(now));
            let bound = h
                .slice_ns
                .load(Acquire)
                .min(SLICE_NS)
                .saturating_add(GRACE_NS);
            g.charge(t, held.min(bound), now);
            crate::log::info(format_args!(
                "compute: revoked the device from slot {slot} (dead or stopped)"
            ));
        }
        h.revocations.fetch_add(1, Relaxed);
        g.hand_over(now);
        drop(g);
        futex_wake(&h.epoch);
    }

    /// Keeps at most `Q` launches in flight: waits for the oldest.
    fn flow_control(&self) {
        let q = if self.beside_high.load(Relaxed) && !self.high.load(Relaxed) {
            arbiter::QUEUE_DEPTH_BESIDE_HIGH
        } else {
            arbiter::queue_depth(self.launch_ns.load(Relaxed))
        };
        loop {
            let oldest = {
                let mut f = self.inflight.lock();
                if f.len() < q {
                    return;
                }
                f.pop_front()
            };
            if let Some(p) = oldest {
                self.flow_waiting.fetch_add(1, SeqCst);
                self.wait_completed(p);
                self.flow_waiting.fetch_sub(1, SeqCst);
            }
        }
    }
}
