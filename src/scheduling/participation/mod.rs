//! One device's scheduling in this process ([`Sched`]) and the launch gate: on a contended device only
//! the owner's launches reach the driver (at most `Q` in flight); the others wait for a grant, and a
//! waiter takes the device from an owner that is dead, stopped, or named by a damaged ledger word.

//!
//! This folder is a process's participation on one device ([`Sched`], defined here): the files
//! below each add one concern's methods to it, and only this file names what they share.

pub(in crate::scheduling) mod completions;
pub(in crate::scheduling) mod events;
pub mod evidence;
mod grant;
mod liveness;
mod owner;
mod peers;
mod refresh;
pub mod runtime;

use crate::scheduling::batch::Joined;
use crate::scheduling::cu::{self, RelaxedCapture};
use crate::scheduling::demand::DemandState;
use crate::scheduling::device::{futex_wait, now_ns, DeviceLedger};
use crate::scheduling::flow::{self, Pick, StreamKey, WaitBound};
use completions::Waited;
use events::{Open, Pending, Tracked};
use evidence::Evidence;

use crate::scheduling::meter::Meter;
use crate::scheduling::{turn, Holder, TenantId};
use gpuslice_api::types::{CUcontext, CUstream};
use gpuslice_api::CUresult;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::time::Duration;

pub(in crate::scheduling) use crate::scheduling::watch::WAITER_POLL_NS;
/// How often a waiter looks again while another process of its tenant owns the device past its
/// slice (`turn::in_slice`): a renewal does not wake waiters.
const TURN_POLL_NS: u64 = 100_000;
/// How long a launch held back for a high-priority tenant waits before it looks again.
const YIELD_POLL_NS: u64 = 200_000;

/// A 64-bit FNV-1a hash (device keys: the same in every process), never 0 (0: no device).
pub(in crate::scheduling) fn key_of(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    }) | 1
}

/// An owner whose heartbeat is older than this (and past its slice plus grace) is revoked.
pub(in crate::scheduling) const BEAT_STALE_NS: u64 = 20_000_000;

/// The process's participation in one device's scheduling.
pub struct Sched {
    pub(in crate::scheduling) ledger: DeviceLedger,
    pub(in crate::scheduling) ordinal: u32,
    pub(in crate::scheduling) slot: usize,
    /// Our tenant's entry in the ledger (re-found if the entry is damaged).
    pub(in crate::scheduling) tenant: std::sync::atomic::AtomicUsize,
    pub(in crate::scheduling) id: TenantId,
    /// Another tenant wants the device (or did within `demand::CONTENTION_HOLD_NS`), or our tenant
    /// is capped: launches take the slow path.
    pub(in crate::scheduling) contended: AtomicBool,
    /// Where this process was active (`demand`), when it last looked, whether it says it wants.
    pub(in crate::scheduling) demand: Mutex<DemandState>,
    /// Contended until then (monotonic ns): when another tenant was last seen wanting the device,
    /// plus the hold.
    pub(in crate::scheduling) contended_until: AtomicU64,
    pub(in crate::scheduling) high: AtomicBool,
    /// Another tenant of high priority is active: keep one launch in flight.
    pub(in crate::scheduling) beside_high: AtomicBool,
    /// The epoch under which we own the device (0 = we do not).
    pub(in crate::scheduling) owned: AtomicU32,
    /// Our slice is ending: launches wait.
    pub(in crate::scheduling) stopping: AtomicBool,
    /// Launch hooks between their ownership check and the end of their launch.
    pub(in crate::scheduling) launching: AtomicU32,
    /// Launch hooks waiting in flow control for our oldest launch (we still have work to submit).
    pub(in crate::scheduling) flow_waiting: AtomicU32,
    /// Threads of this process waiting for a grant, and since when the oldest of them waits: the
    /// truth our slot's `wants` / `wait_since` words publish. The words live in a file others can
    /// zero or scribble (a truncation repaired with zeros): they are written again from these
    /// values, never counted up and down in place, so a waiter stays visible to arbitration.
    pub(in crate::scheduling) waiting: AtomicU32,
    pub(in crate::scheduling) waiting_since: AtomicU64,
    pub(in crate::scheduling) last_submit_ns: AtomicU64,
    /// Estimated device time of one launch (EWMA), for `Q`.
    pub(in crate::scheduling) launch_ns: AtomicU64,
    /// A low estimate of one launch's device time (`drain::low_estimate`): what a drain sleeps for.
    pub(in crate::scheduling) launch_low_ns: AtomicU64,
    pub(in crate::scheduling) last_completion_ns: AtomicU64,
    /// When one of our tracked launches last completed (any path): our work makes progress.
    pub(in crate::scheduling) progress_ns: AtomicU64,
    /// Measured batches in flight: between two events of ours on a stream (`events`), or an empty
    /// pair (`Tracked::calibration`), oldest first, of every stream (flow control counts their
    /// launches per stream, `flow`).
    pub(in crate::scheduling) inflight: Mutex<VecDeque<Tracked>>,
    /// Batches whose end event is not recorded yet, one per stream at most. Locked before
    /// `inflight` when both are.
    pub(in crate::scheduling) open: Mutex<Vec<Open>>,
    /// How long a flow-control wait may last (`flow::WaitBound`).
    pub(in crate::scheduling) wait_bound: Mutex<WaitBound>,
    /// Device time of our launches completed during the current ownership (ns), not charged yet.
    pub(in crate::scheduling) measured_ns: AtomicU64,
    /// Device time of launches that completed after we handed the device over (ns), not charged yet.
    pub(in crate::scheduling) carried_ns: AtomicU64,
    /// What was charged for our work while it ran, not yet matched by its measured completion.
    pub(in crate::scheduling) meter: Mutex<Meter>,
    /// When a launch was submitted with nothing of ours in flight: our work runs since then at most.
    pub(in crate::scheduling) pending_since_ns: AtomicU64,
    /// What this process owes and is owed by its own clock (`evidence`): ownership it may use,
    /// whether it launches paced because a forged owner keeps it out.
    pub(in crate::scheduling) evidence: Evidence,
    /// What an empty event pair measures (the driver's own step from one stream operation to the
    /// next, not device time): taken off each launch's two steps. Running low estimate.
    pub(in crate::scheduling) event_overhead_ns: AtomicU64,
    pub(in crate::scheduling) last_calibration_ns: AtomicU64,
    pub(in crate::scheduling) free_events: Mutex<Vec<Pending>>,
    /// Contexts whose events were let go of (`forget_context`), counted under the `inflight` lock:
    /// a tracked launch taken off the queue before one of them does not recycle its events.
    pub(in crate::scheduling) teardowns: AtomicU64,
    /// A key for this device common to every process of the machine, whatever path its device
    /// directory has in the process's mount namespace (a hash of the GPU's UUID).
    pub(in crate::scheduling) device_key: u64,
    /// When our work here began to wait without completing (0: it does not), published in the
    /// tenant's memory ledger while it lasts (`watch_stall`).
    pub(in crate::scheduling) stall_since: AtomicU64,
    /// The tenant's wait on another device that our launches passed the gate for, when the first
    /// of them passed, and how many did (`peer_pass`).
    pub(in crate::scheduling) pass_episode: AtomicU64,
    pub(in crate::scheduling) pass_from: AtomicU64,
    pub(in crate::scheduling) passes: AtomicU32,
    /// When a wait of the tenant on another device was last seen: waiters then look more often.
    pub(in crate::scheduling) peer_seen_ns: AtomicU64,
    /// A launch of ours went through in our tenant's turn held by another process: our completions
    /// outside our own ownership are taken as that turn's, which its lead's charge covered (`turn`).
    pub(in crate::scheduling) member: AtomicBool,
    /// The longest launch seen to complete recently (`turn::longest_after`), for the stall time.
    pub(in crate::scheduling) longest_ns: AtomicU64,
    /// Exit: the scheduler thread hands over and stops; it sets `done` when it has.
    pub(in crate::scheduling) stop: AtomicBool,
    pub(in crate::scheduling) done: AtomicBool,
}

impl Sched {
    pub(in crate::scheduling) fn new(
        ledger: DeviceLedger,
        ordinal: u32,
        slot: usize,
        tenant: usize,
        id: TenantId,
        high: bool,
    ) -> Sched {
        let device_key = key_of(ledger.uuid().as_bytes());
        Sched {
            ledger,
            ordinal,
            slot,
            tenant: tenant.into(),
            id,
            contended: AtomicBool::new(true),
            demand: Mutex::new(DemandState::default()),
            contended_until: AtomicU64::new(0),
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
            launch_low_ns: AtomicU64::new(0),
            last_completion_ns: AtomicU64::new(0),
            progress_ns: AtomicU64::new(0),
            inflight: Mutex::new(VecDeque::new()),
            open: Mutex::new(Vec::new()),
            wait_bound: Mutex::new(WaitBound::default()),
            measured_ns: AtomicU64::new(0),
            carried_ns: AtomicU64::new(0),
            meter: Mutex::new(Meter::default()),
            pending_since_ns: AtomicU64::new(0),
            evidence: Evidence::default(),
            event_overhead_ns: AtomicU64::new(0),
            last_calibration_ns: AtomicU64::new(0),
            free_events: Mutex::new(Vec::new()),
            teardowns: AtomicU64::new(0),
            device_key,
            stall_since: AtomicU64::new(0),
            pass_episode: AtomicU64::new(0),
            pass_from: AtomicU64::new(0),
            passes: AtomicU32::new(0),
            peer_seen_ns: AtomicU64::new(0),
            member: AtomicBool::new(false),
            longest_ns: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            done: AtomicBool::new(false),
        }
    }

    pub(in crate::scheduling) fn me(&self) -> Holder {
        Holder::of(self.slot)
    }

    pub(in crate::scheduling) fn tenant(&self) -> usize {
        self.tenant.load(Relaxed)
    }

    pub(in crate::scheduling) fn contended(&self) -> bool {
        self.contended.load(Relaxed)
    }

    pub(in crate::scheduling) fn owns_now(&self) -> bool {
        let h = &self.ledger.layout().header;
        let e = self.owned.load(SeqCst);
        e != 0
            && !self.stopping.load(SeqCst)
            && self.evidence.may_own()
            && h.owner.load(Acquire) == self.me().word()
            && h.epoch.load(Acquire) == e
    }

    /// Whether our tenant's turn is held by another process of the tenant: we may launch in it
    /// (`turn::shares_turn`). The owner's tenant word is untrusted: a slot that claims our tenant
    /// only lets our launches through in its own ownership.
    pub(in crate::scheduling) fn tenant_turn(&self) -> bool {
        let l = self.ledger.layout();
        let owner = Holder::from_word(l.header.owner.load(Acquire)).slot();
        let Some(entry) = owner.and_then(|o| l.slots.get(o)) else {
            return false;
        };
        let h = &l.header;
        turn::shares_turn(
            owner,
            entry.state.load(Acquire) == crate::scheduling::shm::SLOT_ACTIVE,
            entry.tenant.load(Acquire) as usize,
            self.slot,
            self.tenant(),
        ) && turn::in_slice(
            now_ns(),
            h.grant_ns.load(Acquire),
            h.slice_ns.load(Acquire),
            crate::scheduling::arbiter::SLICE_NS,
        )
    }

    /// Whether we hold back our launches for a high-priority tenant: we are normal, a high-priority
    /// tenant is active (`beside_high`, from the ledger at refresh: a `preempt` word alone, which
    /// anyone can write, does not hold us back), and one of its processes asks for the device.
    pub(in crate::scheduling) fn yields_to_high(&self) -> bool {
        turn::holds_back(
            self.high.load(Relaxed),
            self.beside_high.load(Relaxed),
            self.ledger.layout().header.preempt.load(Acquire),
        )
    }

    /// Whether a launch of ours may reach the driver now: we own the device, or our tenant does
    /// through another of its processes.
    pub(in crate::scheduling) fn may_launch(&self) -> bool {
        self.owns_now() || self.tenant_turn()
    }

    pub(in crate::scheduling) fn gate(
        &self,
        streams: &[CUstream],
        ctx: CUcontext,
        per_thread: bool,
        launch: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if !self.contended() {
            return launch();
        }
        let key = streams.first().map_or(StreamKey::Legacy, |&s| {
            flow::stream_key(s as usize, per_thread)
        });
        // Launches into a capturing stream build a graph; nothing runs: they never wait. Asked
        // only before a wait (and before an event is recorded, `events`), at most once a launch.
        let mut capturing = None;
        let mut captured = || {
            *capturing.get_or_insert_with(|| streams.iter().any(|&s| cu::capturing(s, per_thread)))
        };
        let mut waited_from = 0;
        loop {
            if !self.contended() || runtime::stopped() {
                return launch();
            }
            // Paced in our tenant's window: a launch that would run past its end holds (bounded:
            // until our queue shrinks or the window ends, `evidence::fit`).
            if let Some(ns) = self.window_hold() {
                if captured() {
                    return launch();
                }
                std::thread::sleep(Duration::from_nanos(ns.min(WAITER_POLL_NS)));
                continue;
            }
            let owner = self.owns_now();
            if (owner || self.tenant_turn()) && self.yields_to_high() {
                if captured() {
                    return launch();
                }
                // A high-priority tenant waits: our scheduler thread is about to hand over (it
                // checks that the waiter is real); a launch now would only add a kernel ahead of
                // the high-priority work. Bounded: the word is cleared, or the device handed over.
                let h = &self.ledger.layout().header;
                futex_wait(&h.epoch, h.epoch.load(Acquire), YIELD_POLL_NS);
                continue;
            }
            if owner || self.tenant_turn() {
                // Before counting as launching: a drain does not wait for our queue to shrink.
                // Only a launch that begins a batch on its stream waits (`flow::stream_limit`).
                // (A launch into a capturing stream may wait here too: for our work already in
                // flight, bounded; no event of ours is recorded into a capturing stream.)
                // Counted in its stream's open batch now, if one is open (`batch::join`).
                let Some((joined, busy)) = self.enter_batch(key, ctx as usize) else {
                    continue;
                };
                self.launching.fetch_add(1, SeqCst);
                if !self.may_launch() || self.yields_to_high() {
                    self.launching.fetch_sub(1, SeqCst);
                    self.unjoin_batch(key, ctx as usize, joined);
                    continue;
                }
                if !owner {
                    self.member.store(true, Relaxed);
                }
                let r = self.launch_tracked(streams, ctx, per_thread, busy, Some(joined), launch);
                self.launching.fetch_sub(1, SeqCst);
                if waited_from != 0 {
                    if let Some(t) = self.ledger.layout().tenants.get(self.tenant()) {
                        t.wait_ns
                            .fetch_add(now_ns().saturating_sub(waited_from), Relaxed);
                    }
                }
                return r;
            }
            if self.peer_pass() {
                return self.launch_tracked(streams, ctx, per_thread, false, None, launch);
            }
            // Kept out past our due by an owner whose words lie: launch paced (`evidence`), with
            // flow control as an owner's launches (its waits bounded the same way).
            if self.evidence.paced() {
                let Some((joined, busy)) = self.enter_batch(key, ctx as usize) else {
                    continue;
                };
                return self.launch_tracked(streams, ctx, per_thread, busy, Some(joined), launch);
            }
            if captured() {
                return launch();
            }
            if waited_from == 0 {
                waited_from = now_ns();
            }
            self.wait_for_grant();
        }
    }

    /// While paced in our tenant's window: how long a launch holds so that it and our work queued
    /// ahead of it end in the window (`evidence::fit`); `None`: it may go on (not paced, outside
    /// the window, or it fits).
    /// Launches are counted at the low estimate of their device time (`drain::low_estimate`): an
    /// interval measured while another context time-sliced the device with ours is long, and
    /// taken for the launch's own it held a paced process to a launch or two a window.
    fn window_hold(&self) -> Option<u64> {
        // Not paced (every launch but a paced process's): no clock read.
        if !self.evidence.fallback() {
            return None;
        }
        let (left, len) = self.evidence.bounded_window(now_ns())?;
        let launch_ns = self.launch_low_ns.load(Relaxed);
        let backlog = self.queued_launches().saturating_mul(launch_ns);
        match evidence::fit(left, len, backlog, launch_ns) {
            evidence::Fit::Go => None,
            evidence::Fit::Hold(ns) => Some(ns),
        }
    }

    /// Keeps at most `flow::stream_limit` launches in flight on the launch's stream `key` (of
    /// context `ctx`), and [`flow::TOTAL_DEPTH`] over all streams of the process, for a launch that
    /// begins a batch there: waits for the oldest batch of the stream (`flow::pick`), each wait
    /// bounded (`Sched::wait_bounded`). After a wait (its queries already paid for the
    /// capture-mode exchange), one more query says whether the stream's newest batch still runs:
    /// the new batch then starts at its end (`Flow::Go`'s `busy`).
    /// Counts a launch into its stream's open batch or, when it begins one, lets flow control
    /// hold it first: `None` when the device was handed over meanwhile (look again), else the
    /// batch it joined and whether the stream's newest batch was seen running (`Flow::Go`).
    fn enter_batch(&self, key: StreamKey, ctx: usize) -> Option<(Joined<Open>, bool)> {
        let joined = self.join_batch(key, ctx);
        if !matches!(joined, Joined::Begins) {
            return Some((joined, false));
        }
        match self.flow_control(key, ctx) {
            Flow::Regrant => None,
            Flow::Go { busy } => Some((joined, busy)),
        }
    }

    fn flow_control(&self, key: StreamKey, ctx: usize) -> Flow {
        let q = self.queue_depth();
        let launch_ns = self.launch_ns.load(Relaxed);
        let batch = self.batch_len(key);
        let limit = flow::stream_limit(q, batch);
        // Entered before the first query: our event queries must not break another thread's
        // global-mode capture.
        let mut relaxed = None;
        loop {
            let (t, teardowns) = {
                let mut f = self.inflight.lock();
                let Pick::Wait(i) = flow::pick(
                    f.iter().map(Tracked::flow_entry),
                    &(key, ctx),
                    limit,
                    flow::TOTAL_DEPTH,
                ) else {
                    let busy =
                        relaxed.is_some() && Sched::newest_runs(&f, key, ctx, launch_ns, batch);
                    return Flow::Go { busy };
                };
                if relaxed.is_none() {
                    drop(f);
                    relaxed = Some(RelaxedCapture::when_needed());
                    continue;
                }
                let Some(t) = f.remove(i) else {
                    return Flow::Go { busy: false };
                };
                (t, self.teardowns.load(Acquire))
            };
            self.flow_waiting.fetch_add(1, SeqCst);
            // Launches of the stream queued behind the batch waited for: at least what exceeds
            // the limit less that batch (none known when it is another stream's).
            let behind = if t.flow_key() == (key, ctx) {
                limit.saturating_sub(t.launches as usize) as u32
            } else {
                0
            };
            let waited = self.wait_bounded(t, teardowns, behind, relaxed.as_mut());
            self.flow_waiting.fetch_sub(1, SeqCst);
            match waited {
                Waited::Completed => {}
                // Our work made no progress for the bound while we owned the device: it may wait
                // for something this very thread does later. This launch goes through, as it
                // would without us; the next batch waits again (past `flow::HARD_DEPTH` tracked
                // batches, a batch goes unmeasured: the queue's memory stays bounded).
                Waited::Pass => return Flow::Go { busy: false },
                Waited::Regrant => return Flow::Regrant,
            }
        }
    }
}

/// What flow control lets a launch do.
enum Flow {
    /// Go through (counted in its stream's batch); `busy`: the stream's newest batch was seen
    /// running just now (a batch beginning now starts at its end).
    Go { busy: bool },
    /// Back to the gate: we do not own the device (or it is no longer contended).
    Regrant,
}
