//! The process's side of compute sharing, decided once: the devices it may take part on, its identity,
//! and for each device it launches on, its participation there ([`Sched`]: a slot in that device's
//! ledger and a scheduler thread). The configuration, the deferral to a drop-in and the tenant's
//! identity come from the process runtime (`crate::process`), which also runs this module's fork
//! and exit steps. Nothing runs in a process that takes part nowhere. A forked child starts afresh;
//! at exit the scheduler threads hand their devices back and stop before the driver is torn down.

use super::Sched;
use crate::config::{self, Priority, Setting};
use crate::log;
use crate::scheduling::cu;
use crate::scheduling::device::{self, now_ns, DeviceLedger};
use crate::scheduling::{arbiter, TenantId};
use gpuslice_api::types::{CUcontext, CUdevice, CUstream};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::OnceLock;

/// Most device ordinals a process is scheduled on (launches on higher ordinals pass through).
pub const MAX_DEVICES: usize = 16;

/// True when no launch of this process needs the gate: every device it can see is decided, and none
/// it takes part on is contended (or it takes part nowhere). The launch hooks' one load.
pub(in crate::scheduling) static PASS: AtomicBool = AtomicBool::new(false);

/// Set by every launch hook (fast path included) when clear; the scheduler threads clear it at each
/// refresh: this process launched since (`demand`). Process-wide, so a process launching on one
/// device counts as wanting every device it takes part on (the fast path does not know the
/// device). On a line of its own: launching threads only read it between two refreshes.
pub(in crate::scheduling) static LAUNCHED: Launched = Launched(AtomicBool::new(false));
/// When a scheduler thread last took [`LAUNCHED`]'s note (monotonic ns): every device's thread
/// compares it with its own previous refresh, so that the note counts on each device once.
pub(in crate::scheduling) static LAUNCH_NOTED_NS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// Threads of this process now in a host wait for its own queued work (stream or context
/// synchronisation, [`crate::scheduling::host_wait`]): the scheduler threads count the process as active while
/// one is (`demand`).
pub(in crate::scheduling) static HOST_WAITS: std::sync::atomic::AtomicU32 =
    std::sync::atomic::AtomicU32::new(0);

#[repr(align(64))]
pub(in crate::scheduling) struct Launched(pub(in crate::scheduling) AtomicBool);

/// Per device ordinal: [`UNDECIDED`], [`NOT_PARTICIPATING`], or a leaked `&'static Sched`.
static DEVICES: [AtomicUsize; MAX_DEVICES] = [const { AtomicUsize::new(UNDECIDED) }; MAX_DEVICES];
const UNDECIDED: usize = 0;
const NOT_PARTICIPATING: usize = 1;

/// Serialises joins (cold path).
static INIT: Mutex<()> = Mutex::new(());
/// Serialises the recomputation of [`PASS`] (taken inside `INIT`, never the other way round).
static PASS_LOCK: Mutex<()> = Mutex::new(());
/// Set at exit: every launch passes, scheduler threads hand over and stop.
static STOPPED: AtomicBool = AtomicBool::new(false);

/// What the process decided once.
struct Runtime {
    cfg: &'static config::Config,
    /// Devices the process sees (capped at [`MAX_DEVICES`]).
    visible: usize,
    /// The tenant's identity and label (from its memory ledger), on first join.
    identity: OnceLock<(TenantId, String)>,
}

/// `None`: this process takes no part anywhere (a gpuslice drop-in below us enforces, or no device).
static RUNTIME: OnceLock<Option<Runtime>> = OnceLock::new();

fn runtime() -> Option<&'static Runtime> {
    RUNTIME.get_or_init(Runtime::load).as_ref()
}

impl Runtime {
    fn load() -> Option<Runtime> {
        let process = crate::process::get();
        // Preloaded over a gpuslice drop-in libcuda: the drop-in gates every launch; gating here too
        // would gate each launch twice.
        if process.deferring() {
            return None;
        }
        let cfg = &process.config;
        let dir = &cfg.device_dir;
        let visible = (cu::device_count() as usize).min(MAX_DEVICES);
        let mut any = false;
        for (ordinal, state) in DEVICES.iter().enumerate().take(visible) {
            // Configured for this device, or another tenant's ledger is there: decided at its first
            // launch. Otherwise it never takes part (no thread, no file).
            let candidate = cu::device_uuid(ordinal as u32).is_some_and(|uuid| {
                settings(cfg, ordinal as u32, &uuid).configured
                    || device::path_for(dir, &uuid).exists()
            });
            if candidate {
                any = true;
            } else {
                state.store(NOT_PARTICIPATING, Release);
            }
        }
        any.then_some(Runtime {
            cfg,
            visible,
            identity: OnceLock::new(),
        })
    }

    /// The tenant is its memory ledger: its id, created with the ledger. A process without a ledger
    /// (nothing configured, or the ledger refused) is a tenant of its own.
    fn identity(&self) -> &(TenantId, String) {
        self.identity.get_or_init(|| {
            let id = crate::process::get().tenant_id().unwrap_or_else(|| {
                log::info(format_args!(
                    "compute: no memory ledger with an identity; this process is a tenant of its own"
                ));
                let mut r = [0u8; 16];
                // SAFETY: writes at most 16 bytes into `r`.
                unsafe { libc::getrandom(r.as_mut_ptr().cast(), 16, 0) };
                u128::from_ne_bytes(r) ^ (u128::from(now_ns()) << 32) ^ u128::from(std::process::id())
                    | 1
            });
            (TenantId(id), self.cfg.tenant.clone())
        })
    }
}

/// The tenant's memory ledger, when the process has one (compute scheduling publishes there what
/// the tenant's processes on other devices must know: `Sched::watch_stall`).
pub(in crate::scheduling) fn tenant_ledger() -> Option<&'static crate::ledger::Ledger> {
    let process = crate::process::get();
    if !process.quotas_apply() {
        return None;
    }
    process.ledger().ok()
}

/// A participating device's scheduler and the launch's context, for a launch on `stream`; `None` when
/// the launch passes straight through.
pub(in crate::scheduling) fn participation(
    stream: CUstream,
) -> Option<(&'static Sched, CUcontext)> {
    if STOPPED.load(Acquire) {
        return None;
    }
    let Some(rt) = runtime() else {
        update_pass();
        return None;
    };
    let (ctx, ordinal) = cu::stream_device(stream)?;
    let ordinal = ordinal as usize;
    if ordinal >= MAX_DEVICES {
        return None;
    }
    let sched = match DEVICES[ordinal].load(Acquire) {
        NOT_PARTICIPATING => None,
        UNDECIDED => join(rt, ordinal),
        // SAFETY: any other value is a leaked, never-freed `Sched` stored by `join`.
        p => Some(unsafe { &*(p as *const Sched) }),
    };
    sched.map(|s| (s, ctx))
}

/// Whether the process is exiting (scheduling is over).
pub(in crate::scheduling) fn stopped() -> bool {
    STOPPED.load(Acquire)
}

#[cold]
fn join(rt: &'static Runtime, ordinal: usize) -> Option<&'static Sched> {
    let _g = INIT.lock();
    match DEVICES[ordinal].load(Acquire) {
        UNDECIDED => {}
        NOT_PARTICIPATING => return None,
        // SAFETY: as in `participation`.
        p => return Some(unsafe { &*(p as *const Sched) }),
    }
    let s = try_join(rt, ordinal as u32);
    DEVICES[ordinal].store(
        s.map_or(NOT_PARTICIPATING, |s| s as *const Sched as usize),
        Release,
    );
    if let Some(s) = s {
        s.refresh(now_ns());
        s.start_thread();
        crate::process::on_exit(at_exit);
        crate::process::on_fork_child(in_forked_child);
    }
    update_pass();
    s
}

fn try_join(rt: &Runtime, ordinal: u32) -> Option<&'static Sched> {
    let uuid = cu::device_uuid(ordinal)?;
    let set = settings(rt.cfg, ordinal, &uuid);
    let path = device::path_for(&rt.cfg.device_dir, &uuid);
    if !set.configured && !path.exists() {
        return None;
    }
    let ledger = match DeviceLedger::open(&path, &uuid, set.configured) {
        Ok(l) => l,
        Err(e) => {
            log::error(format_args!(
                "{e}; compute shares are not enforced on device {ordinal} for this process"
            ));
            return None;
        }
    };
    let (id, label) = rt.identity();
    // Slots claimed with a lock in the tenant's own memory ledger: no other tenant can keep us out.
    if let Some(Err(e)) = tenant_ledger().map(|m| ledger.use_tenant_locks(m.path(), *id)) {
        log::info(format_args!(
            "compute: slot claimed in the device ledger only: {e}"
        ));
    }
    ledger.sweep(None);
    // A slot first (the lock needs a holder id), then the tenant under the lock.
    let Some(slot) = ledger.claim_slot(usize::MAX >> 1) else {
        return join_throttled(&ledger, &uuid, ordinal, &set, *id, label);
    };
    let tenant = {
        let g = ledger.lock(slot);
        ledger.find_or_add_tenant(&g, *id, label, set.share, set.cap, set.high)
    };
    let Some(tenant) = tenant else {
        log::error(format_args!(
            "device ledger {}: no room for tenant {label:?}; compute shares are not enforced",
            path.display()
        ));
        return None;
    };
    ledger.layout().slots[slot]
        .tenant
        .store(tenant as u32, Release);
    log::info(format_args!(
        "compute: joined {} as tenant {label:?} (slot {slot})",
        path.display()
    ));
    Some(Box::leak(Box::new(Sched::new(
        ledger, ordinal, slot, tenant, *id, set.high,
    ))))
}

/// The share a process without a slot holds itself to, as a cap: its share (the node's policy's,
/// or the configuration's), under its own cap if lower; `None` for a share of the whole device.
pub(in crate::scheduling) fn throttle_cap(share: u32, cap: u32) -> Option<u32> {
    let share = share.clamp(1, 100);
    let c = if cap == 0 { share } else { cap.min(share) };
    (c < 100).then_some(c)
}

/// No slot in the shared device ledger (every free one locked by someone not in it, or all in
/// use): the process never runs unscheduled. It arbitrates alone through a private ledger, capped
/// at its share of the device, until it exits; the shared ledger counts it, and the log says so.
fn join_throttled(
    shared: &DeviceLedger,
    uuid: &str,
    ordinal: u32,
    set: &Settings,
    id: TenantId,
    label: &str,
) -> Option<&'static Sched> {
    let path = shared.path();
    let health = shared.health();
    let (share, cap) = shared.policy_settings(id, set.share, set.cap);
    if shared.writable() {
        shared.layout().header.slot_denials.fetch_add(1, AcqRel);
    }
    let Some(limit) = throttle_cap(share, cap) else {
        log::error(format_args!(
            "device ledger {}: no process slot could be claimed ({}); share 100 on device {ordinal}: the whole device, as its policy gives",
            path.display(),
            health.describe()
        ));
        return None;
    };
    log::error(format_args!(
        "device ledger {}: no process slot could be claimed ({}); this process runs throttled to {limit}% of device {ordinal} (its share) until it exits",
        path.display(),
        health.describe()
    ));
    let private = match DeviceLedger::private(path, uuid) {
        Ok(l) => l,
        Err(e) => {
            // No memory for 100 KiB: the launches wait for nothing, but the log says so.
            log::error(format_args!(
                "{e}; compute shares are not enforced on device {ordinal} for this process"
            ));
            return None;
        }
    };
    let slot = private.claim_slot(usize::MAX >> 1)?;
    let tenant = {
        let g = private.lock(slot);
        private.find_or_add_tenant(&g, id, label, share, limit, false)
    }?;
    private.layout().slots[slot]
        .tenant
        .store(tenant as u32, Release);
    Some(Box::leak(Box::new(Sched::new(
        private, ordinal, slot, tenant, id, false,
    ))))
}

/// Recomputes [`PASS`].
pub(in crate::scheduling) fn update_pass() {
    let _g = PASS_LOCK.lock();
    let pass = STOPPED.load(Acquire)
        || match RUNTIME.get() {
            None => false,
            Some(None) => true,
            Some(Some(rt)) => DEVICES[..rt.visible].iter().all(|d| match d.load(Acquire) {
                UNDECIDED => false,
                NOT_PARTICIPATING => true,
                // SAFETY: as in `participation`.
                p => !unsafe { &*(p as *const Sched) }.contended(),
            }),
        };
    PASS.store(pass, Release);
}

/// Per device ordinal: the handle of its primary context, as `cuDevicePrimaryCtxRetain` last
/// gave it (0: never seen).
static PRIMARY: [AtomicUsize; MAX_DEVICES] = [const { AtomicUsize::new(0) }; MAX_DEVICES];

pub(in crate::scheduling) fn primary_retained(dev: CUdevice, ctx: CUcontext) {
    if let Some(p) = usize::try_from(dev).ok().and_then(|d| PRIMARY.get(d)) {
        p.store(ctx as usize, Release);
    }
}

/// Device `dev`'s primary context, if it was retained through us.
pub(in crate::scheduling) fn primary_of(dev: CUdevice) -> Option<usize> {
    let p = PRIMARY.get(usize::try_from(dev).ok()?)?.load(Acquire);
    (p != 0).then_some(p)
}

/// Whether the process takes part on any device.
pub(in crate::scheduling) fn participating() -> bool {
    let mut any = false;
    each_sched(|_| any = true);
    any
}

/// Every participation of this process.
pub(in crate::scheduling) fn each_sched(mut f: impl FnMut(&'static Sched)) {
    for d in &DEVICES {
        match d.load(Acquire) {
            UNDECIDED | NOT_PARTICIPATING => {}
            // SAFETY: as in `participation`.
            p => f(unsafe { &*(p as *const Sched) }),
        }
    }
}

/// At exit, before the driver's own teardown (the process runtime's exit handler is registered after
/// the driver was loaded, so it runs before the driver's destructors): every scheduler thread hands its device over without waiting for queued work,
/// and stops; launches from then on pass through.
extern "C" fn at_exit() {
    STOPPED.store(true, Release);
    PASS.store(true, Release);
    each_sched(|s| s.stop());
    let deadline = now_ns().saturating_add(200_000_000);
    each_sched(|s| {
        while !s.thread_done() && now_ns() < deadline {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    });
}

/// In a child forked without exec: the parent's participations are not ours (their threads do not
/// exist here, their slot locks were dropped by the ledger's fork guard); decide again at the next
/// launch. Only atomic stores (async-signal-safe).
extern "C" fn in_forked_child() {
    for d in &DEVICES {
        if d.load(Relaxed) != NOT_PARTICIPATING {
            d.store(UNDECIDED, Relaxed);
        }
    }
    PASS.store(false, Relaxed);
    crate::driver::capture::fork_child();
}

/// What the configuration says for one device.
pub(in crate::scheduling) struct Settings {
    pub share: u32,
    pub cap: u32,
    pub high: bool,
    /// Some compute setting was given (even an invalid one): the process creates the device ledger.
    pub configured: bool,
}

pub(in crate::scheduling) fn settings(cfg: &config::Config, ordinal: u32, uuid: &str) -> Settings {
    let mut configured = false;
    let share = match cfg.compute_share_for(ordinal, uuid) {
        Setting::Value(v) => {
            configured = true;
            u32::from(v)
        }
        Setting::Unset => arbiter::DEFAULT_SHARE,
        Setting::Invalid(e) => {
            configured = true;
            log::error(format_args!(
                "{e}; compute share 1% and cap 1% on {uuid} (strictest)"
            ));
            1
        }
    };
    let cap = match cfg.compute_limit_for(ordinal, uuid) {
        Setting::Value(v) => {
            configured = true;
            u32::from(v).min(100) % 100
        }
        Setting::Unset => 0,
        Setting::Invalid(_) => {
            configured = true;
            1
        }
    };
    let high = match &cfg.priority {
        Setting::Value(p) => {
            configured = true;
            *p == Priority::High
        }
        Setting::Unset => false,
        Setting::Invalid(_) => {
            configured = true;
            false
        }
    };
    // An invalid share or cap means the strictest setting, share 1% and cap 1%, both applied (the
    // configuration's error line says so: `config::effect`).
    let invalid = matches!(cfg.compute_share_for(ordinal, uuid), Setting::Invalid(_))
        || matches!(cfg.compute_limit_for(ordinal, uuid), Setting::Invalid(_));
    let (share, cap) = if invalid { (1, 1) } else { (share, cap) };
    Settings {
        share: share.max(1),
        cap,
        high,
        configured,
    }
}
