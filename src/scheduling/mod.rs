//! Compute shares (docs/COMPUTE.md): the tenants of one GPU time-slice its kernel launches through a
//! device ledger, without a daemon.
//!
//! * [`arbiter`]: the pure logic (virtual time, token bucket, choice of the next owner).
//! * [`device`]: the shared file (layout in `shm.rs`), its arbitration lock, tenants, slots, liveness.
//! * This module: the process's side. Launch hooks call [`gate`]: with no device ledger it is one atomic
//!   load; with one tenant and no cap, two; on a contended device only the owner's launches reach the
//!   driver (at most `Q` in flight, an event after each), the others wait for a grant. A per-process
//!   scheduler thread ends the owner's slice (over, idle, or preempted by a high-priority tenant),
//!   drains its work and hands the device over.

pub mod arbiter;
pub mod device;
mod shm;

pub use shm::{MAX_SLOTS, MAX_TENANTS};

use crate::config::{self, Priority, Setting};
use crate::hooks::calls::sched::real as cu;
use crate::log;
use arbiter::{Choice, GRACE_NS, IDLE_NS};
use device::{futex_wait, futex_wake, now_ns, DeviceLedger};
use gpuslice_api::types::{CUcontext, CUevent, CUstream};
use gpuslice_api::CUresult;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::time::Duration;

/// Default directory of the device ledgers.
pub const DEFAULT_DEVICE_DIR: &str = "/dev/shm/gpuslice/devices";

/// The directory of the device ledgers: the node policy's (`config::policy`), else `GPUSLICE_DEVICE_DIR`, else `devices/` in
/// `GPUSLICE_LEDGER_DIR`, else the default.
pub fn device_dir() -> PathBuf {
    // A node-created tenant joins the node's device ledgers, whatever its environment says.
    if let Some(dir) = config::policy::device_dir() {
        return dir;
    }
    std::env::var_os("GPUSLICE_DEVICE_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("GPUSLICE_LEDGER_DIR")
                .filter(|v| v.as_encoded_bytes().first() == Some(&b'/'))
                .map(|d| PathBuf::from(d).join("devices"))
        })
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DEVICE_DIR))
}

/// 0: not decided yet; 1: not participating; otherwise the `&'static Sched`.
static STATE: AtomicUsize = AtomicUsize::new(0);
const NOT_PARTICIPATING: usize = 1;
static INIT: Mutex<()> = Mutex::new(());

const CU_STREAM_CAPTURE_MODE_RELAXED: u32 = 2;
/// How often the scheduler thread re-reads the ledger (contention, settings, liveness).
const REFRESH_NS: u64 = 10_000_000;
const SWEEP_NS: u64 = 100_000_000;
/// Longest a waiter sleeps before checking the owner's liveness again.
const WAITER_POLL_NS: u64 = 2_000_000;
/// An owner whose heartbeat is older than this (and past its slice plus grace) is revoked.
const BEAT_STALE_NS: u64 = 20_000_000;
/// The owner's scheduler thread checks for idleness at least this often.
const OWNER_POLL_NS: u64 = 250_000;

/// Gates a launch on `streams` (`per_thread`: the `_ptsz` variant). The fast paths first.
#[inline]
pub fn gate(streams: &[CUstream], per_thread: bool, launch: impl FnOnce() -> CUresult) -> CUresult {
    match STATE.load(Acquire) {
        NOT_PARTICIPATING => launch(),
        0 => match init() {
            Some(s) => s.gate(streams, per_thread, launch),
            None => launch(),
        },
        p => {
            // SAFETY: a non-sentinel STATE is a leaked, never-freed `Sched`.
            let s = unsafe { &*(p as *const Sched) };
            if !s.contended.load(Relaxed) {
                return launch();
            }
            s.gate(streams, per_thread, launch)
        }
    }
}

/// Whether a launch may go straight to the driver: this process does not take part in compute
/// sharing, or its device is not contended. One or two atomic loads; the launch hooks' fast path.
#[inline(always)]
pub fn launch_passes() -> bool {
    match STATE.load(Acquire) {
        NOT_PARTICIPATING => true,
        0 => false,
        // SAFETY: a non-sentinel STATE is a leaked, never-freed `Sched`.
        p => !unsafe { &*(p as *const Sched) }.contended.load(Relaxed),
    }
}

/// This process's scheduler, when it participates.
pub fn current() -> Option<&'static Sched> {
    match STATE.load(Acquire) {
        0 | NOT_PARTICIPATING => None,
        // SAFETY: as in `gate`.
        p => Some(unsafe { &*(p as *const Sched) }),
    }
}

/// What the configuration says for this device: (share, cap, high, explicitly configured).
/// An invalid share or cap means the strictest setting, share 1% and cap 1%, both applied (the
/// configuration's error line says so: `config::effect::COMPUTE`).
fn settings(cfg: &config::Config, ordinal: u32, uuid: &str) -> (u32, u32, bool, bool) {
    let share = cfg.compute_share_for(ordinal, uuid);
    let cap = cfg.compute_limit_for(ordinal, uuid);
    let high = &cfg.priority;
    let configured =
        [&share, &cap].iter().any(|s| **s != Setting::Unset) || *high != Setting::Unset;
    let high = *high == Setting::Value(Priority::High);
    if matches!(share, Setting::Invalid(_)) || matches!(cap, Setting::Invalid(_)) {
        log::warn(format_args!(
            "compute on {uuid}: share 1% and cap 1% (strictest), because a compute setting is invalid"
        ));
        return (1, 1, high, true);
    }
    let share = match share {
        Setting::Value(v) => u32::from(v),
        _ => arbiter::DEFAULT_SHARE,
    };
    let cap = match cap {
        Setting::Value(v) => u32::from(v).min(100) % 100,
        _ => 0,
    };
    (share.max(1), cap, high, configured)
}

/// The device of the calling thread's context: (ordinal, UUID).
fn current_device() -> Option<(u32, String)> {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-parameter.
    unsafe { crate::hooks::calls::real::cuCtxGetCurrent(&mut ctx) }.ok()?;
    if ctx.is_null() {
        return None;
    }
    let mut ordinal = -1;
    // SAFETY: valid out-parameter.
    unsafe { crate::hooks::calls::real::cuCtxGetDevice(&mut ordinal) }.ok()?;
    let uuid = crate::hooks::calls::device_uuid(ordinal).ok()?;
    Some((ordinal as u32, uuid))
}

#[cold]
fn init() -> Option<&'static Sched> {
    let _g = INIT.lock();
    match STATE.load(Acquire) {
        0 => {}
        NOT_PARTICIPATING => return None,
        _ => return current(),
    }
    let Some((ordinal, uuid)) = current_device() else {
        // No context yet: the driver reports that; decide at the next launch.
        return None;
    };
    let cfg = config::load();
    let path = device::path_for(&device_dir(), &uuid);
    match try_join(&cfg, ordinal, &uuid, &path) {
        Some(s) => Some(s),
        None => {
            STATE.store(NOT_PARTICIPATING, Release);
            // Re-checked once a second: a device ledger created later (another tenant) is joined.
            let _ = std::thread::Builder::new()
                .name("gpuslice-watch".into())
                .spawn(move || loop {
                    std::thread::sleep(Duration::from_secs(1));
                    if path.exists() {
                        let _g = INIT.lock();
                        if let Some(s) = try_join(&cfg, ordinal, &uuid, &path) {
                            STATE.store(s as *const Sched as usize, Release);
                            return;
                        }
                    }
                });
            None
        }
    }
}

fn try_join(
    cfg: &config::Config,
    ordinal: u32,
    uuid: &str,
    path: &std::path::Path,
) -> Option<&'static Sched> {
    let (share, cap, high, configured) = settings(cfg, ordinal, uuid);
    if !configured && !path.exists() {
        return None;
    }
    let ledger = match DeviceLedger::open(path, uuid, configured) {
        Ok(l) => l,
        Err(e) => {
            log::error(format_args!(
                "{e}; compute shares are not enforced for this process"
            ));
            return None;
        }
    };
    ledger.sweep(None);
    // A slot first (the lock needs a holder id), then the tenant under the lock.
    let slot = ledger.claim_slot(usize::MAX >> 1)?;
    let tenant = {
        let g = ledger.lock(slot);
        ledger.find_or_add_tenant(&g, &cfg.tenant, share, cap, high)
    };
    let Some(tenant) = tenant else {
        log::error(format_args!(
            "device ledger {}: no room for tenant {:?}; compute shares are not enforced",
            path.display(),
            cfg.tenant
        ));
        return None;
    };
    ledger.layout().slots[slot]
        .tenant
        .store(tenant as u32, Release);
    log::info(format_args!(
        "compute: joined {} as tenant {:?} (slot {slot})",
        path.display(),
        cfg.tenant
    ));
    let s: &'static Sched = Box::leak(Box::new(Sched {
        ledger,
        slot,
        tenant,
        contended: AtomicBool::new(true),
        high: AtomicBool::new(high),
        beside_high: AtomicBool::new(false),
        owned: AtomicU32::new(0),
        stopping: AtomicBool::new(false),
        launching: AtomicU32::new(0),
        last_submit_ns: AtomicU64::new(0),
        launch_ns: AtomicU64::new(250_000),
        last_completion_ns: AtomicU64::new(0),
        inflight: Mutex::new(VecDeque::new()),
        measured_ns: AtomicU64::new(0),
        event_overhead_ns: AtomicU64::new(0),
        last_calibration_ns: AtomicU64::new(0),
        free_events: Mutex::new(Vec::new()),
    }));
    s.refresh(now_ns());
    let _ = std::thread::Builder::new()
        .name("gpuslice-sched".into())
        .spawn(move || s.run());
    STATE.store(s as *const Sched as usize, Release);
    Some(s)
}

/// An event recorded after a launch.
struct Pending {
    event: usize,
    ctx: usize,
}

/// Recorded events: around one launch, or back to back to calibrate what an empty pair measures. A
/// high-priority tenant records only the end of each launch (`start` is `None`): it is charged by
/// wall time, and a second event per launch would lengthen exactly the latency it asks to keep short.
struct Tracked {
    start: Option<Pending>,
    end: Pending,
    calibration: bool,
}

/// How often an empty event pair is recorded to re-measure the per-launch event overhead.
const CALIBRATION_NS: u64 = 250_000_000;

/// The process's participation in one device's scheduling.
pub struct Sched {
    ledger: DeviceLedger,
    slot: usize,
    tenant: usize,
    /// More than one tenant attached, or our tenant is capped: launches take the slow path.
    contended: AtomicBool,
    high: AtomicBool,
    /// Another tenant has high priority: keep one launch in flight.
    beside_high: AtomicBool,
    /// The epoch under which we own the device (0 = we do not).
    owned: AtomicU32,
    /// Our slice is ending: launches wait.
    stopping: AtomicBool,
    /// Launch hooks between their ownership check and the end of their launch.
    launching: AtomicU32,
    last_submit_ns: AtomicU64,
    /// Estimated device time of one launch (EWMA), for `Q`.
    launch_ns: AtomicU64,
    last_completion_ns: AtomicU64,
    /// Event pairs in flight: around a launch, or empty (`Tracked::calibration`).
    inflight: Mutex<VecDeque<Tracked>>,
    /// Device time of our completed launches not charged yet (ns).
    measured_ns: AtomicU64,
    /// What an empty event pair measures (the driver's own step from one stream operation to the
    /// next, not device time): taken off each launch's two steps. Running low estimate.
    event_overhead_ns: AtomicU64,
    last_calibration_ns: AtomicU64,
    free_events: Mutex<Vec<Pending>>,
}

impl Sched {
    fn me(&self) -> u32 {
        self.slot as u32 + 1
    }

    fn owns_now(&self) -> bool {
        let h = &self.ledger.layout().header;
        let e = self.owned.load(SeqCst);
        e != 0
            && !self.stopping.load(SeqCst)
            && h.owner.load(Acquire) == self.me()
            && h.epoch.load(Acquire) == e
    }

    fn gate(
        &self,
        streams: &[CUstream],
        per_thread: bool,
        launch: impl FnOnce() -> CUresult,
    ) -> CUresult {
        // Launches into a capturing stream build a graph; nothing runs.
        if streams.iter().any(|&s| capturing(s, per_thread)) {
            return launch();
        }
        let mut waited_from = 0;
        loop {
            if !self.contended.load(Relaxed) {
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
                let high = self.high.load(Relaxed);
                let starts: Vec<Option<Pending>> = streams
                    .iter()
                    .map(|&s| {
                        if high {
                            None
                        } else {
                            self.record(s, per_thread)
                        }
                    })
                    .collect();
                let r = launch();
                for (&s, start) in streams.iter().zip(starts) {
                    if start.is_none() && !high {
                        continue;
                    }
                    match r.is_ok().then(|| self.record(s, per_thread)).flatten() {
                        Some(end) => self.inflight.lock().push_back(Tracked {
                            start,
                            end,
                            calibration: false,
                        }),
                        None => self.free_events.lock().extend(start),
                    }
                }
                if r.is_ok() && !high {
                    self.calibrate(streams, per_thread);
                }
                self.last_submit_ns.store(now_ns(), Release);
                self.launching.fetch_sub(1, SeqCst);
                if waited_from != 0 {
                    self.ledger.layout().tenants[self.tenant]
                        .wait_ns
                        .fetch_add(now_ns().saturating_sub(waited_from), Relaxed);
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
        if slot.wants.fetch_add(1, AcqRel) == 0 {
            slot.wait_since.store(now_ns(), Release);
        }
        loop {
            if !self.contended.load(Relaxed) {
                break;
            }
            if slot.wants.load(Acquire) == 0 {
                // The file was zeroed under us (truncated and repaired, or scribbled): we still
                // wait, and a hand-over only picks slots that say so.
                slot.wants.store(1, Release);
                slot.wait_since.store(now_ns(), Release);
            }
            let e = h.epoch.load(Acquire);
            let o = h.owner.load(Acquire);
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
            let mut timeout = WAITER_POLL_NS;
            if o == 0 {
                let g = self.ledger.lock(self.slot);
                if h.owner.load(Acquire) == 0 {
                    let c = g.hand_over(now_ns());
                    drop(g);
                    futex_wake(&h.epoch);
                    if let Choice::Wait { retry_ns } = c {
                        timeout = retry_ns.min(WAITER_POLL_NS);
                    }
                }
                continue_if_changed(h, e, timeout);
                continue;
            }
            let owner = (o - 1) as usize;
            if owner < MAX_SLOTS {
                let ot = l.slots[owner].tenant.load(Acquire) as usize;
                if self.high.load(Relaxed)
                    && ot < MAX_TENANTS
                    && l.tenants[ot].priority.load(Acquire) != 1
                    && h.preempt.swap(1, AcqRel) == 0
                {
                    futex_wake(&h.preempt);
                }
                let now = now_ns();
                // Stopped or hung: past its slice plus the grace, and silent (a draining owner beats).
                let overdue = now > h.grant_ns.load(Acquire) + h.slice_ns.load(Acquire) + GRACE_NS
                    && now.saturating_sub(h.owner_beat_ns.load(Acquire)) > BEAT_STALE_NS;
                if overdue || !self.ledger.slot_alive(owner, Some(self.slot)) {
                    self.revoke(o, e);
                    continue;
                }
            }
            futex_wait(&h.epoch, e, timeout);
        }
        // Saturating: the count may have been zeroed (and set to 1 above) meanwhile.
        let before = slot
            .wants
            .fetch_update(AcqRel, Acquire, |w| Some(w.saturating_sub(1)))
            .unwrap_or(0);
        if before <= 1 {
            slot.wait_since.store(0, Release);
        }
    }

    /// Takes the device from a dead or stopped owner (still `owner` under `epoch`).
    fn revoke(&self, owner: u32, epoch: u32) {
        let l = self.ledger.layout();
        let h = &l.header;
        let g = self.ledger.lock(self.slot);
        if h.owner.load(Acquire) != owner || h.epoch.load(Acquire) != epoch {
            return;
        }
        let now = now_ns();
        let slot = (owner - 1) as usize;
        let t = l.slots[slot].tenant.load(Acquire) as usize;
        if t < MAX_TENANTS {
            let held = now.saturating_sub(h.grant_ns.load(Acquire));
            g.charge(t, held.min(h.slice_ns.load(Acquire) + GRACE_NS), now);
        }
        h.revocations.fetch_add(1, Relaxed);
        log::info(format_args!(
            "compute: revoked the device from slot {slot} (dead or stopped)"
        ));
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
                // SAFETY: an event we created and recorded.
                let _ = unsafe { cu::cuEventSynchronize(p.end.event as CUevent) };
                if !p.calibration {
                    // With the queue full the device runs our work back to back: the interval
                    // between two completions seen here is one launch's work.
                    let now = now_ns();
                    let prev = self.last_completion_ns.swap(now, AcqRel);
                    let gap = now.saturating_sub(prev);
                    if prev != 0 && gap < 200_000_000 {
                        let old = self.launch_ns.load(Relaxed);
                        self.launch_ns.store((old * 7 + gap) / 8, Relaxed);
                    }
                }
                self.completed_launch(p);
            }
        }
    }

    /// Records one of our events on `stream` (before and after each launch: their interval is the
    /// device time the launch took).
    fn record(&self, stream: CUstream, per_thread: bool) -> Option<Pending> {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-parameter.
        let _ = unsafe { crate::hooks::calls::real::cuCtxGetCurrent(&mut ctx) };
        let ctx = ctx as usize;
        let reuse = {
            let mut free = self.free_events.lock();
            free.iter()
                .position(|p| p.ctx == ctx)
                .map(|i| free.swap_remove(i))
        };
        let p = match reuse {
            Some(p) => p,
            None => {
                let mut ev: CUevent = std::ptr::null_mut();
                // SAFETY: valid out-parameter; the event belongs to the current context.
                if unsafe { cu::cuEventCreate(&mut ev, 0) }.is_err() {
                    return None;
                }
                Pending {
                    event: ev as usize,
                    ctx,
                }
            }
        };
        // SAFETY: our event and the caller's stream.
        let r = unsafe {
            if per_thread {
                cu::cuEventRecord_ptsz(p.event as CUevent, stream)
            } else {
                cu::cuEventRecord(p.event as CUevent, stream)
            }
        };
        if r.is_ok() {
            Some(p)
        } else {
            self.free_events.lock().push(p);
            None
        }
    }

    /// Now and then, two events back to back after a launch: what they measure is the driver's step
    /// between stream operations, which a launch's event pair measures twice besides its device time.
    fn calibrate(&self, streams: &[CUstream], per_thread: bool) {
        let now = now_ns();
        let last = self.last_calibration_ns.load(Relaxed);
        let Some(&stream) = streams.first() else {
            return;
        };
        if now.saturating_sub(last) < CALIBRATION_NS
            || self
                .last_calibration_ns
                .compare_exchange(last, now, AcqRel, Relaxed)
                .is_err()
        {
            return;
        }
        let Some(start) = self.record(stream, per_thread) else {
            return;
        };
        match self.record(stream, per_thread) {
            Some(end) => self.inflight.lock().push_back(Tracked {
                start: Some(start),
                end,
                calibration: true,
            }),
            None => self.free_events.lock().push(start),
        }
    }

    /// Adds a completed launch's device time to what the next charge takes (or, for an empty pair,
    /// updates the event overhead), and recycles its events.
    fn completed_launch(&self, t: Tracked) {
        if let Some(start) = &t.start {
            let mut ms = 0f32;
            // SAFETY: two of our events, both completed.
            let measured = unsafe {
                cu::cuEventElapsedTime(&mut ms, start.event as CUevent, t.end.event as CUevent)
            }
            .is_ok()
            .then(|| (ms.max(0.0) as f64 * 1e6) as u64);
            if let Some(ns) = measured {
                if t.calibration {
                    // Low estimate: follow decreases at once, increases slowly (a busy host only adds).
                    let old = self.event_overhead_ns.load(Relaxed);
                    let new = if old == 0 || ns < old {
                        ns
                    } else {
                        old + (ns - old) / 16
                    };
                    self.event_overhead_ns.store(new, Relaxed);
                } else {
                    let overhead = 2 * self.event_overhead_ns.load(Relaxed);
                    self.measured_ns
                        .fetch_add(ns.saturating_sub(overhead), AcqRel);
                }
            }
        }
        let mut free = self.free_events.lock();
        free.extend(t.start);
        free.push(t.end);
    }

    /// What this ownership is charged: measured device time, or for a high-priority tenant the wall
    /// time since the grant (or renewal).
    fn take_charge(&self, now: u64) -> u64 {
        let measured = self.measured_ns.swap(0, AcqRel);
        if self.high.load(Relaxed) {
            let grant = self.ledger.layout().header.grant_ns.load(Acquire);
            now.saturating_sub(grant)
        } else {
            measured
        }
    }

    /// Whether every tracked launch has completed (completed ones are accounted and recycled).
    fn completed(&self) -> bool {
        let mut done = Vec::new();
        let all = {
            let mut f = self.inflight.lock();
            // In order per stream: stop at the first one still running.
            while let Some(p) = f.front() {
                // SAFETY: our event.
                if unsafe { cu::cuEventQuery(p.end.event as CUevent) }.is_err() {
                    break;
                }
                done.extend(f.pop_front());
            }
            f.is_empty()
        };
        for p in done {
            self.completed_launch(p);
        }
        all
    }

    /// Waits for every tracked launch.
    fn drain(&self) {
        let h = &self.ledger.layout().header;
        let pending: Vec<Tracked> = self.inflight.lock().drain(..).collect();
        for p in &pending {
            // Polled, with a heartbeat, so waiters can tell a long drain from a stopped owner.
            // SAFETY: our event.
            while unsafe { cu::cuEventQuery(p.end.event as CUevent) }
                == Err(gpuslice_api::CUerror::NOT_READY)
            {
                h.owner_beat_ns.store(now_ns(), Release);
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        self.last_completion_ns.store(0, Release);
        for p in pending {
            self.completed_launch(p);
        }
    }

    /// Ends our ownership: stop submitting, drain, charge grant..drained, hand over.
    /// With `drain` false (a high-priority tenant preempts us) the device is handed over as soon as
    /// we stop submitting: what we have in flight (at most one launch beside a high-priority tenant)
    /// runs before the new owner's work in the device's order anyway, and it is charged to us when it
    /// completes; waiting for it here would only add wake-up latency to the high-priority request.
    fn release(&self, drain: bool) {
        let epoch = self.owned.load(SeqCst);
        self.stopping.store(true, SeqCst);
        while self.launching.load(SeqCst) != 0 {
            std::thread::sleep(Duration::from_micros(20));
        }
        if drain {
            self.drain();
        }
        let h = &self.ledger.layout().header;
        let g = self.ledger.lock(self.slot);
        if h.owner.load(Acquire) == self.me() && h.epoch.load(Acquire) == epoch {
            let now = now_ns();
            let charge = self.take_charge(now);
            g.charge(self.tenant, charge, now);
            let c = g.hand_over(now);
            log::debug(format_args!("compute: released after {charge} ns -> {c:?}"));
        }
        drop(g);
        futex_wake(&h.epoch);
        self.owned.store(0, SeqCst);
        self.stopping.store(false, SeqCst);
    }

    /// Re-reads the ledger: contention, priorities, caps; frees dead slots now and then.
    fn refresh(&self, now: u64) {
        let l = self.ledger.layout();
        let mut present = [false; MAX_TENANTS];
        for s in &l.slots {
            if s.state.load(Acquire) == shm::SLOT_ACTIVE {
                let t = s.tenant.load(Acquire) as usize;
                if t < MAX_TENANTS {
                    present[t] = true;
                }
            }
        }
        let mine = &l.tenants[self.tenant];
        let high = mine.priority.load(Acquire) == 1;
        let others = (0..MAX_TENANTS)
            .filter(|&t| present[t] && t != self.tenant)
            .count();
        let beside_high = (0..MAX_TENANTS)
            .any(|t| present[t] && t != self.tenant && l.tenants[t].priority.load(Acquire) == 1);
        self.high.store(high, Relaxed);
        self.beside_high.store(beside_high, Relaxed);
        self.contended
            .store(others > 0 || mine.cap.load(Acquire) != 0, Relaxed);
        let _ = now;
    }

    /// The scheduler thread.
    fn run(&self) {
        // Hand-overs wait in short sleeps: keep the kernel's default 50 us timer slack off them.
        // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
        let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: valid in/out parameter. Relaxed: our event calls must not disturb the
        // application's stream captures.
        let _ = unsafe { cu::cuThreadExchangeStreamCaptureMode(&mut mode) };
        let h = &self.ledger.layout().header;
        let (mut last_refresh, mut last_sweep) = (0u64, 0u64);
        let beat = &self.ledger.layout().slots[self.slot].beat_ns;
        loop {
            let now = now_ns();
            beat.store(now, Release);
            if now - last_refresh >= REFRESH_NS {
                last_refresh = now;
                self.refresh(now);
                if now - last_sweep >= SWEEP_NS {
                    last_sweep = now;
                    self.ledger.sweep(Some(self.slot));
                    self.ledger.lock(self.slot).sample(now);
                }
            }
            let owned = self.owned.load(SeqCst);
            if owned == 0 {
                let e = h.epoch.load(Acquire);
                if h.owner.load(Acquire) == self.me() && !self.stopping.load(SeqCst) {
                    // Granted while none of our threads waited: adopt it (idleness hands it on).
                    self.owned.store(e, SeqCst);
                    continue;
                }
                futex_wait(&h.epoch, e, REFRESH_NS / 2);
                continue;
            }
            if h.owner.load(Acquire) != self.me() || h.epoch.load(Acquire) != owned {
                // Revoked (we were stopped or too slow): queue like everyone else.
                self.owned.store(0, SeqCst);
                continue;
            }
            h.owner_beat_ns.store(now, Release);
            let grant = h.grant_ns.load(Acquire);
            let end = grant + h.slice_ns.load(Acquire);
            let high = self.high.load(Relaxed);
            let quiet = now.saturating_sub(self.last_submit_ns.load(Acquire).max(grant)) > IDLE_NS
                && self.launching.load(SeqCst) == 0;
            let idle = quiet && self.completed();
            let preempted = !high && h.preempt.load(Acquire) != 0 && {
                let l = self.ledger.layout();
                let real = self
                    .ledger
                    .waiters(Some(self.slot))
                    .iter()
                    .any(|w| l.tenants[w.tenant].priority.load(Acquire) == 1);
                if !real {
                    h.preempt.store(0, Release);
                }
                real
            };
            if idle || preempted || !self.contended.load(Relaxed) {
                self.release(!preempted);
                continue;
            }
            if now >= end {
                let g = self.ledger.lock(self.slot);
                let l = self.ledger.layout();
                let rivals = self
                    .ledger
                    .waiters(Some(self.slot))
                    .into_iter()
                    .any(|w| !high || l.tenants[w.tenant].priority.load(Acquire) == 1);
                if !rivals {
                    let charge = self.take_charge(now);
                    log::debug(format_args!("compute: renewed after {charge} ns"));
                    g.charge(self.tenant, charge, now);
                    if g.renew(self.tenant, now) {
                        continue;
                    }
                }
                drop(g);
                self.release(true);
                continue;
            }
            let wait = (end - now).clamp(20_000, OWNER_POLL_NS);
            if high {
                std::thread::sleep(Duration::from_nanos(wait));
            } else {
                futex_wait(&h.preempt, 0, wait);
            }
        }
    }
}

fn continue_if_changed(h: &shm::Header, e: u32, timeout: u64) {
    if h.epoch.load(Acquire) == e && h.owner.load(Acquire) == 0 {
        futex_wait(&h.epoch, e, timeout);
    }
}

/// Whether `stream` is capturing (a failed query counts as not capturing).
fn capturing(stream: CUstream, per_thread: bool) -> bool {
    let mut status = 0u32;
    // SAFETY: valid out-parameter; the caller's stream handle.
    let r = unsafe {
        if per_thread {
            cu::cuStreamIsCapturing_ptsz(stream, &mut status)
        } else {
            cu::cuStreamIsCapturing(stream, &mut status)
        }
    };
    r.is_ok() && status != 0
}
