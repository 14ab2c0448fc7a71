//! The ledger: a file in shared memory, mapped by every process of a tenant, holding one memory quota
//! per device that all of them share.
//!
//! * Layout (`shm.rs`): header (magic `GPUSLICE`, layout version, size, state, creator...), a table
//!   of 16 devices (key = GPU UUID, limit, used, peak) and 256 process slots (state, pid, per-device
//!   used, and how much of it is driver overhead). Fixed size, `#[repr(C)]`, made only of atomics.
//! * Creation: written under a temporary name, published READY, then `link`ed into place, so nobody
//!   maps half a ledger. Whoever creates it sets the limits; a joiner obeys them, whatever its own
//!   configuration says. [`Ledger::set_limit`] changes a limit live.
//! * Reservation: [`Ledger::try_reserve`] is one compare-and-swap loop on the device's `used`, done
//!   *before* the driver is asked; [`Ledger::release`] after a free, or to roll back a failed call.
//! * Liveness: each process holds an OFD write lock on byte `LOCK_BASE + slot`. A slot whose lock can
//!   be taken belongs to a dead process (works across PID namespaces and PID reuse); its usage is
//!   given back by exactly one cleaner (the one holding that lock), on join, and when a reservation
//!   fails (at most every 200 ms per process).
//! * Anything wrong with an existing file is a [`LedgerError`]; the caller must then deny
//!   allocations (fail closed). Nothing read from the mapping is used as an index.
//!
//! Why this file is long (about 700 lines): it is the tenant ledger's whole API (open, reserve,
//! release, reclaim, limits, views), each a short method over the layout in `shm.rs`; the protocol
//! they share (the slot file) is `crate::slotfile`'s.

mod shm;

use std::fmt;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::{canonical_uuid, format_bytes, Config, Limit};
use crate::log;
use crate::slotfile::{self, io_err, sys, CreateOptions, ReadOnly, Writable};
pub use shm::Layout;
#[cfg(test)]
use shm::TOTAL_SIZE;
pub use shm::{
    LAYOUT_VERSION, MAX_DEVICES, MAX_SLOTS, NODE_NOT_LISTED, RECONCILED_ESTIMATED, RECONCILED_NODE,
    RECONCILED_OWN, RECONCILED_UNKNOWN, UNLIMITED,
};

/// Why a ledger could not be opened (the slot file's errors). Each message names the path; the
/// caller denies allocations.
pub type LedgerError = slotfile::Error;
/// Minimum time between two sweeps triggered by refused reservations (per process).
const SWEEP_INTERVAL_MS: u64 = 200;
/// Longest time between two comparisons of the file's size with the layout's on reservations.
const SIZE_CHECK_MS: u64 = 50;
const NO_SLOT: usize = usize::MAX;

/// A reservation that would exceed the device's limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaExceeded {
    pub requested: u64,
    pub used: u64,
    /// `UNLIMITED` (u64::MAX) = no limit; 0 with nothing used also covers "denied" (bad device,
    /// read-only ledger, invalid configuration).
    pub limit: u64,
    /// Refused whatever the usage: the ledger is damaged or read-only, the device is not set up in
    /// it, or every process slot is taken (each logged when found).
    pub closed: bool,
}

/// Why a reservation was refused ([`Ledger::try_reserve_once`]).
#[derive(Clone, Copy, Debug)]
pub enum Refusal {
    /// Refused whatever the usage: a read-only or damaged ledger, a device not set up.
    Closed(QuotaExceeded),
    /// No room under the limit: counted as denied (once per call), after any retries.
    AtQuota(QuotaExceeded),
}

impl fmt::Display for QuotaExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.closed {
            return write!(
                f,
                "memory refused: requested {}; the tenant's ledger cannot be charged here",
                format_bytes(self.requested)
            );
        }
        write!(
            f,
            "memory quota exceeded: requested {}, {} of {} in use",
            format_bytes(self.requested),
            format_bytes(self.used),
            format_bytes(self.limit)
        )
    }
}

impl std::error::Error for QuotaExceeded {}

/// What the creator of a ledger puts in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerOptions {
    pub tenant: String,
    /// Limit for devices not in `devices` (a joiner adding a device gets this).
    pub default_limit: Limit,
    /// Known devices (UUID) and their limits.
    pub devices: Vec<(String, Limit)>,
    /// Group (name or gid) sharing the ledger: mode 0660 instead of 0600.
    pub group: Option<String>,
}

impl LedgerOptions {
    /// From the configuration and the process's visible devices `(index, uuid)`. Devices named by
    /// UUID in the configuration are added too, so a joiner that sees them gets their limit.
    pub fn from_config(cfg: &Config, visible: &[(u32, String)]) -> LedgerOptions {
        let mut devices: Vec<(String, Limit)> = visible
            .iter()
            .map(|(i, uuid)| (uuid.clone(), cfg.memory_limit_for(*i, uuid)))
            .collect();
        for uuid in cfg.memory.by_uuid.keys() {
            if !devices
                .iter()
                .any(|(u, _)| canonical_uuid(u).as_deref() == Some(uuid))
            {
                // Index u32::MAX: an index key cannot match a device this process does not see.
                devices.push((uuid.clone(), cfg.memory_limit_for(u32::MAX, uuid)));
            }
        }
        let mut default_limit = cfg.default_memory_limit();
        if let Some(msg) = unmatched_keys(cfg, visible) {
            // Limits were configured, none for a device this process can use: refuse, say why.
            for (uuid, limit) in devices.iter_mut() {
                if visible.iter().any(|(_, u)| u == uuid) {
                    *limit = Limit::Invalid(msg.clone());
                }
            }
            default_limit = Limit::Invalid(msg);
        }
        LedgerOptions {
            tenant: cfg.tenant.clone(),
            default_limit,
            devices,
            group: cfg.ledger_group.clone(),
        }
    }
}

/// When the memory limit is a list of per-device keys none of which names a visible device (a
/// typo in a UUID, index 1 on a one-GPU machine, a MIG key), the message that refuses allocations:
/// the keys given and the devices visible. A list that matches at least one visible device is valid.
pub(crate) fn unmatched_keys(cfg: &Config, visible: &[(u32, String)]) -> Option<String> {
    let m = &cfg.memory;
    if m.poison.is_some() || m.all.is_some() || (m.by_index.is_empty() && m.by_uuid.is_empty()) {
        return None;
    }
    if visible.is_empty() {
        return None;
    }
    let matched = visible.iter().any(|(i, u)| {
        m.by_index.contains_key(i) || canonical_uuid(u).is_some_and(|c| m.by_uuid.contains_key(&c))
    });
    if matched {
        return None;
    }
    let keys: Vec<String> = m
        .by_index
        .keys()
        .map(|i| i.to_string())
        .chain(m.by_uuid.keys().cloned())
        .collect();
    let seen: Vec<String> = visible.iter().map(|(i, u)| format!("{i}={u}")).collect();
    Some(format!(
        "{}: the memory limit lists devices {} but none of them is visible to this process (visible: {}); no device would have a limit",
        cfg.memory_source,
        keys.join(", "),
        seen.join(", ")
    ))
}

/// `Limit` as stored: (bytes, flags). Invalid configuration = limit 0 (deny all) + a flag saying why.
fn stored(limit: &Limit) -> (u64, u32) {
    match limit {
        Limit::Bytes(b) => (*b, 0),
        Limit::Unlimited => (UNLIMITED, 0),
        Limit::Invalid(_) => (0, shm::DEV_FLAG_INVALID),
    }
}

/// The ledger key of a device: its canonical UUID (or the string as given if it is not a UUID).
fn device_key(uuid: &str) -> Option<[u64; 8]> {
    shm::pack_key(&canonical_uuid(uuid).unwrap_or_else(|| uuid.trim().to_string()))
}

/// Per-device line of a [`Snapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSnapshot {
    pub index: usize,
    pub uuid: String,
    /// `UNLIMITED` = no limit.
    pub limit: u64,
    /// The creator's configuration for the device was invalid (limit 0 until `set_limit`).
    pub invalid_config: bool,
    pub used: u64,
    pub peak: u64,
    /// Reservations refused at the quota so far.
    pub denied: u64,
}

/// Per-process line of a [`Snapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSnapshot {
    pub slot: usize,
    /// As seen by the process itself (may be in another PID namespace).
    pub pid: u32,
    /// Holds its lock (false: dead, not yet reclaimed).
    pub alive: bool,
    /// `(device index, bytes)` for every device it uses.
    pub used: Vec<(usize, u64)>,
    /// `(device index, bytes)`: the part of `used` that is driver overhead (contexts, module code,
    /// limits); the rest is allocations.
    pub overhead: Vec<(usize, u64)>,
    /// How the process knows its driver memory, as it published it (`RECONCILED_*`).
    pub reconciled: u32,
    /// The node's word for this process: the PID the driver lists it under and when the node
    /// read it (unix ms).
    pub node: Option<(u32, u64)>,
}

/// A read-only view for `gpuslice status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub path: PathBuf,
    pub tenant: String,
    pub creator_pid: u32,
    /// Limit for devices first seen later (`UNLIMITED` = none).
    pub default_limit: u64,
    pub reclaims: u64,
    /// When a node's reconciliation last went through the ledger (unix ms).
    pub node_ms: Option<u64>,
    pub devices: Vec<DeviceSnapshot>,
    pub processes: Vec<ProcessSnapshot>,
}

/// The slot whose liveness lock is the byte at `offset` of a ledger (as `/proc/<pid>/fdinfo`
/// lists a process's locks), if it is one.
pub fn slot_of_lock_offset(offset: u64) -> Option<usize> {
    use crate::slotfile::SlotLayout;
    let base = Layout::lock_offset(0);
    let slot = usize::try_from(offset.checked_sub(base)?).ok()?;
    (slot < MAX_SLOTS).then_some(slot)
}

/// The file behind a [`Ledger`]: shared and writable, or a private copy read once.
enum Map {
    Shared(Writable<Layout>),
    Copy(ReadOnly<Layout>),
}

/// An open ledger. Thread-safe; cheap to check against on every allocation.
pub struct Ledger {
    path: PathBuf,
    map: Map,
    writable: bool,
    created: bool,
    /// Our open file description (owns our slot lock). Replaced after a fork.
    fd: AtomicI32,
    /// Our slot (`NO_SLOT` if none: read-only, admin, or nothing reserved yet). Claimed at the
    /// first reservation: a process that only reads (NVML alone, the drop-in NVML library beside
    /// the drop-in CUDA one) takes none of the ledger's slots.
    slot: AtomicUsize,
    /// A thread of this process is claiming `slot` (reset in a fork child).
    claiming: AtomicBool,
    /// Process that owns `slot`; differs from getpid() in a fork child until it reattaches.
    owner_pid: AtomicU32,
    /// `sys::forks_seen()` when `owner_pid` was last checked.
    forks_seen: AtomicU32,
    /// A sweep is running in this process (sweeps share one OFD, so they must not overlap).
    sweeping: AtomicBool,
    last_sweep_ms: AtomicU64,
    /// When the file's size was last compared with the layout's (`fstat`).
    last_size_check_ms: AtomicU64,
    warned_underflow: AtomicBool,
    warned_impossible_slot: AtomicBool,
    warned_full: AtomicBool,
    warned_damage: AtomicBool,
    /// Keeps the fd open: closing it would drop our lock. Only touched at open, fork and drop.
    fds: parking_lot::Mutex<Vec<OwnedFd>>,
}

/// A monotonic clock in ms for the per-process intervals (size checks, sweeps): the coarse clock,
/// as it is read on every reservation (a few instructions, where `Instant` takes about a hundred).
fn now_ms() -> u64 {
    sys::coarse_ms()
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Ledger {
    /// Joins the ledger at `path`, creating it with `opts` if it does not exist, and claims a
    /// process slot. A joiner ignores `opts` except to find its devices: the ledger's limits rule.
    pub fn open(path: &Path, opts: &LedgerOptions) -> Result<Ledger, LedgerError> {
        let gid = match &opts.group {
            Some(g) => Some(sys::group_id(g).map_err(io_err(path, "GPUSLICE_LEDGER_GROUP"))?),
            None => None,
        };
        let create = CreateOptions {
            mode: if gid.is_some() { 0o660 } else { 0o600 },
            gid,
            shared_dir: false,
        };
        let file = Writable::<Layout>::open(path, Some(create), |l| {
            let (dl, df) = stored(&opts.default_limit);
            l.initialise(sys::getpid(), unix_ms(), &opts.tenant, dl, df);
            for (uuid, limit) in &opts.devices {
                let (b, f) = stored(limit);
                if let Some(key) = device_key(uuid) {
                    l.find_or_add_device(&key, b, f, 0);
                }
            }
        })?;
        let ledger = Self::new(path, Map::Shared(file), true);
        if !ledger.created {
            // Devices the creator did not know: the joiner adds them with the creator's default.
            for (uuid, _) in &opts.devices {
                ledger.device_index(uuid);
            }
        }
        ledger.sweep();
        ledger.owner_pid.store(sys::getpid(), Ordering::Release);
        Ok(ledger)
    }

    /// Opens an existing ledger read-write without claiming a slot (admin: `gpuslice set`).
    pub fn open_existing(path: &Path) -> Result<Ledger, LedgerError> {
        let file = Writable::<Layout>::open(path, None, |_| {})?;
        Ok(Self::new(path, Map::Shared(file), true))
    }

    /// Opens an existing ledger read-only, without a slot (`gpuslice status`): a copy read at open,
    /// which nothing can store through and a truncation cannot fault.
    pub fn open_readonly(path: &Path) -> Result<Ledger, LedgerError> {
        let file = ReadOnly::<Layout>::open(path)?;
        Ok(Self::new(path, Map::Copy(file), false))
    }

    fn new(path: &Path, map: Map, writable: bool) -> Ledger {
        // A mapping keeps the description it was made from open in every fork child, and OFD locks
        // live as long as their description: slot locks go on a description that is never mapped,
        // which a fork child gives up (`sys::guard_slot_fd`).
        let (created, fd) = match &map {
            Map::Shared(w) => (w.created(), w.lock_fd().ok()),
            Map::Copy(_) => (false, None),
        };
        let raw = match (&fd, &map) {
            (Some(fd), _) => fd.as_raw_fd(),
            (None, Map::Shared(w)) => w.fd().as_raw_fd(),
            (None, Map::Copy(r)) => r.fd(),
        };
        Ledger {
            path: path.to_path_buf(),
            map,
            writable,
            created,
            fd: AtomicI32::new(raw),
            slot: AtomicUsize::new(NO_SLOT),
            owner_pid: AtomicU32::new(sys::getpid()),
            forks_seen: AtomicU32::new({
                sys::count_forks();
                sys::forks_seen()
            }),
            sweeping: AtomicBool::new(false),
            last_sweep_ms: AtomicU64::new(0),
            last_size_check_ms: AtomicU64::new(0),
            warned_underflow: AtomicBool::new(false),
            warned_impossible_slot: AtomicBool::new(false),
            warned_full: AtomicBool::new(false),
            claiming: AtomicBool::new(false),
            warned_damage: AtomicBool::new(false),
            fds: parking_lot::Mutex::new(fd.into_iter().collect()),
        }
    }

    fn layout(&self) -> &Layout {
        match &self.map {
            Map::Shared(w) => w.layout(),
            Map::Copy(r) => r.layout(),
        }
    }

    /// Whether the shared file still holds what this process joined: a truncation (repaired with
    /// zeros) fails closed from then on. With `check_size`, `fstat` as well (slow paths, paced);
    /// otherwise what is seen without a system call (`Writable::looks_sound`).
    #[inline]
    fn damaged(&self, check_size: bool) -> bool {
        let Map::Shared(w) = &self.map else {
            return false;
        };
        let bad = if check_size {
            !w.check_size()
        } else {
            !w.looks_sound()
        };
        if bad {
            self.report_damage();
        }
        bad
    }

    /// The quick path's damage check, no system call (`Writable::looks_sound`).
    #[inline(always)]
    fn looks_damaged(&self) -> bool {
        matches!(&self.map, Map::Shared(w) if !w.looks_sound())
    }

    #[cold]
    fn report_damage(&self) {
        if let Map::Shared(w) = &self.map {
            if w.descriptor_lost() {
                if !self.warned_damage.swap(true, Ordering::Relaxed) {
                    log::error(format_args!(
                        "ledger {}: the program closed gpuslice's descriptor of this file (or opened another file under its number); allocations in this process are refused, and the tenant's other processes are unaffected",
                        self.path.display()
                    ));
                }
                return;
            }
        }
        if !self.warned_damage.swap(true, Ordering::Relaxed) {
            log::error(format_args!(
                "ledger {}: the file was truncated or replaced while in use; allocations are refused until the ledger is recreated (remove it and restart the tenant's programs)",
                self.path.display()
            ));
        }
    }

    fn raw_fd(&self) -> RawFd {
        self.fd.load(Ordering::Acquire)
    }

    /// Our slot, claimed now if this process has none yet (one thread claims; the others wait for
    /// it). `None`: every slot is in use (logged once).
    #[cold]
    fn own_slot(&self) -> Option<usize> {
        loop {
            if let Some(s) = self.slot() {
                return Some(s);
            }
            if self
                .claiming
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                let claimed = match self.slot() {
                    Some(s) => Ok(s),
                    None => self.claim().map(|()| self.slot().unwrap_or(NO_SLOT)),
                };
                self.claiming.store(false, Ordering::Release);
                return match claimed {
                    Ok(s) => Some(s),
                    Err(e) => {
                        if !self.warned_full.swap(true, Ordering::Relaxed) {
                            log::error(format_args!(
                                "{e}; allocations in this process are refused"
                            ));
                        }
                        None
                    }
                };
            }
            std::thread::yield_now();
        }
    }

    /// Claims a free slot (taking its lock first, so no cleaner can mistake it for dead).
    fn claim(&self) -> Result<(), LedgerError> {
        let l = self.layout();
        let got = slotfile::claim_slot::<Layout>(
            self.raw_fd(),
            MAX_SLOTS,
            |i| l.slot_state(i) == shm::SLOT_FREE,
            |i| l.claim_slot(i, sys::getpid(), unix_ms()),
        );
        match got {
            Some(i) => {
                self.slot.store(i, Ordering::Release);
                Ok(())
            }
            None => Err(LedgerError::Full {
                path: self.path.clone(),
                slots: MAX_SLOTS,
            }),
        }
    }

    /// This process found the file damaged (truncated, replaced, overwritten): its numbers mean
    /// nothing any more, and every reservation is refused.
    pub fn found_damaged(&self) -> bool {
        self.warned_damage.load(Ordering::Relaxed)
    }

    /// The ledger's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this process created the ledger (and so set its limits).
    pub fn created(&self) -> bool {
        self.created
    }

    /// The tenant's identity, created with the ledger (`None` for a ledger made before identities).
    pub fn id(&self) -> Option<u128> {
        self.layout().id()
    }

    /// Publishes that this tenant's work on device `device` (a key common to every process of the
    /// machine) has waited without completing since `since` (CLOCK_MONOTONIC ns), seen at `now`.
    /// A ledger read from a private copy publishes nothing.
    pub fn publish_stall(&self, device: u64, since: u64, now: u64) {
        if let Map::Shared(_) = &self.map {
            if !self.damaged(false) {
                self.layout().publish_stall(device, since, now);
            }
        }
    }

    /// The tenant's last published wait: (device key, since, last seen); untrusted words.
    pub fn stall(&self) -> (u64, u64, u64) {
        self.layout().stall()
    }

    /// Our process slot, if we hold one.
    pub fn slot(&self) -> Option<usize> {
        match self.slot.load(Ordering::Acquire) {
            NO_SLOT => None,
            s => Some(s),
        }
    }

    /// Finds the device with this UUID (`GPU-...`), adding it if new with the limit the creator's
    /// configuration gives unlisted devices. `None`: table full, bad UUID or read-only ledger — deny.
    pub fn device_index(&self, uuid: &str) -> Option<usize> {
        let key = device_key(uuid)?;
        let l = self.layout();
        if let Some(d) = l.find_device(&key) {
            return Some(d);
        }
        if !self.writable {
            return None;
        }
        let (limit, flags) = l.default_limit();
        l.find_or_add_device(&key, limit, flags, 100)
    }

    /// Current limit of a device (`UNLIMITED` = none; 0 for an unknown index).
    pub fn limit(&self, dev: usize) -> u64 {
        if dev < MAX_DEVICES {
            self.layout().limit(dev)
        } else {
            0
        }
    }

    /// Bytes of a device in use by all processes of the ledger.
    pub fn used(&self, dev: usize) -> u64 {
        if dev < MAX_DEVICES {
            self.layout().used(dev)
        } else {
            0
        }
    }

    /// Publishes how much of this process's usage on a device is driver overhead (for status).
    pub fn set_overhead_by_me(&self, dev: usize, bytes: u64) {
        if let Some(s) = self.slot() {
            if self.writable && dev < MAX_DEVICES {
                self.layout().set_slot_overhead(s, dev, bytes);
            }
        }
    }

    /// The node's word for this process on `dev`: (driver memory beyond its allocations, when the
    /// node read it, unix ms). Untrusted (the tenant can write it): a hint.
    pub fn node_word_for_me(&self, dev: usize) -> Option<(u64, u64)> {
        match self.slot() {
            Some(s) if dev < MAX_DEVICES && !self.fork_pending() => self
                .layout()
                .node_word(s, dev)
                .filter(|&(figure, _, _)| figure != NODE_NOT_LISTED)
                .map(|(figure, ms, _)| (figure, ms)),
            _ => None,
        }
    }

    /// When the node last wrote a word for this process (unix ms; 0: never): cheap enough for
    /// the allocation path to notice a new one.
    pub fn node_stamp_for_me(&self) -> u64 {
        match self.slot() {
            Some(s) => self.layout().slots[s]
                .node_ms
                .load(std::sync::atomic::Ordering::Relaxed),
            None => 0,
        }
    }

    /// Publishes how this process knows its driver memory (`RECONCILED_*`, for status).
    pub fn set_reconciled_by_me(&self, how: u32) {
        if let Some(s) = self.slot() {
            if self.writable && self.layout().slot_reconciled(s) != how {
                self.layout().set_slot_reconciled(s, how);
            }
        }
    }

    /// The node: a READY device's index by UUID, never adding one.
    pub fn find_device(&self, uuid: &str) -> Option<usize> {
        self.layout().find_device(&device_key(uuid)?)
    }

    /// The node: the claim number of `slot`'s holder and what the slot is charged on `dev`
    /// (everything, and the part the holder published as driver overhead). `None`: a free slot.
    pub fn slot_charges(&self, slot: usize, dev: usize) -> Option<(u64, u64, u64)> {
        let l = self.layout();
        if slot >= MAX_SLOTS || dev >= MAX_DEVICES || l.slot_state(slot) != shm::SLOT_ACTIVE {
            return None;
        }
        Some((
            l.slot_claims(slot),
            l.slot_used(slot, dev),
            l.slot_overhead(slot, dev),
        ))
    }

    /// The node: publishes its word for the holder of claim `claim` of `slot` (see
    /// `shm::Layout::publish_node_word`). Nothing on a read-only ledger or a free slot.
    pub fn publish_node_word(
        &self,
        slot: usize,
        claim: u64,
        host_pid: u32,
        overhead: &[u64; MAX_DEVICES],
        now_ms: u64,
    ) {
        let l = self.layout();
        if self.writable && slot < MAX_SLOTS && l.slot_state(slot) == shm::SLOT_ACTIVE {
            l.publish_node_word(slot, claim, host_pid, overhead, now_ms);
        }
    }

    /// The node: records that its reconciliation went through this ledger at `now_ms`.
    pub fn publish_node_pass(&self, now_ms: u64) {
        if self.writable {
            self.layout().set_node_pass_ms(now_ms);
        }
    }

    /// Bytes this process has reserved on a device.
    pub fn used_by_me(&self, dev: usize) -> u64 {
        match self.slot() {
            Some(s) if dev < MAX_DEVICES => self.layout().slot_used(s, dev),
            _ => 0,
        }
    }

    /// Changes a device's limit live (`UNLIMITED` removes it); applies to the next reservation.
    /// Existing usage above a lowered limit stays until freed.
    pub fn set_limit(&self, dev: usize, bytes: u64) -> Result<(), LedgerError> {
        if !self.writable || dev >= MAX_DEVICES || self.layout().device_state(dev) != shm::DEV_READY
        {
            return Err(LedgerError::Corrupt {
                path: self.path.clone(),
                what: format!(
                    "cannot set the limit of device {dev} (read-only ledger or no such device)"
                ),
            });
        }
        self.layout().set_limit(dev, bytes);
        Ok(())
    }

    /// Reserves `bytes` on `dev` against the shared quota, before the driver is asked for them.
    /// On refusal, dead processes' usage is reclaimed (at most every 200 ms) and the reservation
    /// retried once.
    #[inline]
    pub fn try_reserve(&self, dev: usize, bytes: u64) -> Result<(), QuotaExceeded> {
        self.try_reserve_once(dev, bytes)
            .map_err(|refusal| match refusal {
                Refusal::Closed(e) => e,
                Refusal::AtQuota(e) => {
                    self.layout().count_denied(dev);
                    e
                }
            })
    }

    /// [`Ledger::try_reserve`] without counting a refusal at the quota as denied: the caller may
    /// make room and try again, and counts the call once ([`Ledger::count_denied`]) if it gives up.
    #[inline]
    pub fn try_reserve_once(&self, dev: usize, bytes: u64) -> Result<(), Refusal> {
        if self.reserve_quickly(dev, bytes) {
            return Ok(());
        }
        self.try_reserve_checked(dev, bytes)
    }

    /// The common case of [`Ledger::try_reserve`], inline: no fork since the last look, no size
    /// check due, a file never found damaged that still looks sound, room left. `false`: nothing
    /// was reserved, and `try_reserve` (the same steps with their reports, sweeps and counts) must
    /// decide.
    #[inline]
    pub fn reserve_quickly(&self, dev: usize, bytes: u64) -> bool {
        let slot = self.slot.load(Ordering::Acquire);
        if !self.writable
            || dev >= MAX_DEVICES
            || slot == NO_SLOT
            || self.fork_pending()
            || self.warned_damage.load(Ordering::Relaxed)
            || now_ms().saturating_sub(self.last_size_check_ms.load(Ordering::Relaxed))
                >= SIZE_CHECK_MS
        {
            return false;
        }
        let l = self.layout();
        if l.device_state(dev) != shm::DEV_READY || l.reserve(dev, bytes).is_err() {
            return false;
        }
        l.slot_add(slot, dev, bytes);
        // Checked once, after the updates: faults only add up and the header is read now, so this
        // also covers a file damaged before them, whose repaired (or private) zeros the updates
        // touched harmlessly.
        if self.looks_damaged() {
            // The numbers are gone: the checked path reports it and refuses.
            self.release(dev, bytes);
            return false;
        }
        true
    }

    /// [`Ledger::try_reserve`] with every check: after a fork, when the file's size is due to be
    /// compared, on a refusal (sweeps dead processes). A refusal at the quota is counted by the
    /// caller, once per refused call.
    #[inline(never)]
    fn try_reserve_checked(&self, dev: usize, bytes: u64) -> Result<(), Refusal> {
        let deny = Refusal::Closed(QuotaExceeded {
            requested: bytes,
            used: 0,
            limit: 0,
            closed: true,
        });
        if !self.writable || dev >= MAX_DEVICES {
            return Err(deny);
        }
        self.check_fork();
        let l = self.layout();
        // A truncated file fails closed. Any access to a truncated mapping is contained (the fault
        // handler marks the file damaged), so the size is compared (`fstat`, a system call) only
        // every SIZE_CHECK_MS; the state word is read every time.
        let now = now_ms();
        let check_size =
            now.saturating_sub(self.last_size_check_ms.load(Ordering::Relaxed)) >= SIZE_CHECK_MS;
        if check_size {
            self.last_size_check_ms.store(now, Ordering::Relaxed);
        }
        // Once found damaged, refused for good: the next size check would find it so again, and
        // until then the device table may still look intact.
        if self.warned_damage.load(Ordering::Relaxed) || self.damaged(check_size) {
            return Err(deny);
        }
        if l.device_state(dev) != shm::DEV_READY {
            // A device never set up, or a file truncated or scribbled since the last size check
            // (then named in the log now).
            if !check_size {
                self.damaged(true);
            }
            return Err(deny);
        }
        // This process's first reservation claims its slot.
        if self.own_slot().is_none() {
            return Err(deny);
        }
        let refused = match l.reserve(dev, bytes) {
            Ok(_) => {
                self.charge_slot(dev, bytes);
                // A truncation repaired meanwhile (fault handler): the numbers are gone, fail closed.
                if self.damaged(false) {
                    self.release(dev, bytes);
                    return Err(deny);
                }
                return Ok(());
            }
            Err(r) => r,
        };
        // A refusal is the slow path: a file truncated since the last size check is named now.
        if !check_size && self.damaged(true) {
            return Err(deny);
        }
        if self.sweep_if_due(now) > 0 && l.reserve(dev, bytes).is_ok() {
            self.charge_slot(dev, bytes);
            return Ok(());
        }
        Err(Refusal::AtQuota(QuotaExceeded {
            requested: bytes,
            used: refused.used,
            limit: refused.limit,
            closed: false,
        }))
    }

    /// Counts a reservation refused at the quota that the caller refused itself (the node policy's
    /// ceiling, which the ledger does not know).
    pub fn count_denied(&self, dev: usize) {
        if self.writable && dev < MAX_DEVICES {
            self.layout().count_denied(dev);
        }
    }

    #[inline]
    fn charge_slot(&self, dev: usize, bytes: u64) {
        if let Some(s) = self.slot() {
            self.layout().slot_add(s, dev, bytes);
        }
    }

    /// Gives back `bytes` on `dev` (after a free, or to roll back a reservation the driver then
    /// refused). Saturating: more than was recorded is clamped, and reported once.
    #[inline]
    pub fn release(&self, dev: usize, bytes: u64) {
        // A damaged file's numbers mean nothing any more (and it refuses everything).
        if !self.writable || dev >= MAX_DEVICES || self.warned_damage.load(Ordering::Relaxed) {
            return;
        }
        self.check_fork();
        let l = self.layout();
        // Slot first: dying between the two leaves the device over-counted (fails closed), never under.
        // Only what the slot held leaves the device: the rest is charged to another process's slot
        // (a fork child freeing its parent's allocation), and its sweep gives that back.
        // No slot: this process (a fork child) reserved nothing, so nothing of it leaves.
        let short = match self.slot() {
            Some(s) => l.slot_sub(s, dev, bytes),
            None => bytes,
        };
        let dev_short = l.release(dev, bytes - short);
        if short > 0 || dev_short > 0 {
            self.report_underflow(dev, bytes);
        }
    }

    #[cold]
    fn report_impossible_slot(&self, slot: usize, excess: u64) {
        if !self.warned_impossible_slot.swap(true, Ordering::Relaxed) {
            log::warn(format_args!(
                "ledger {}: the dead process of slot {slot} claimed {excess} bytes more than its \
                 devices count beyond the other processes (the file was written by something else): \
                 only what it could hold was given back, the live processes' charges stay \
                 (reported once)",
                self.path.display()
            ));
        }
    }

    #[cold]
    fn report_underflow(&self, dev: usize, bytes: u64) {
        if !self.warned_underflow.swap(true, Ordering::Relaxed) {
            log::warn(format_args!(
                "ledger {}: device {dev}: released {bytes} bytes, more than was recorded (clamped at 0; reported once)",
                self.path.display()
            ));
        }
    }

    /// [`Ledger::sweep`], at most once per `SWEEP_INTERVAL_MS` in this process (`now`: `now_ms`).
    fn sweep_if_due(&self, now: u64) -> usize {
        let last = self.last_sweep_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= SWEEP_INTERVAL_MS
            && self
                .last_sweep_ms
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            return self.sweep();
        }
        0
    }

    /// Before the tenant's usage is shown (`cuMemGetInfo`, NVML): the memory of its processes that
    /// died is given back first (at most every `SWEEP_INTERVAL_MS`), so that what is shown free is
    /// what can be had.
    pub fn sweep_before_showing(&self) {
        self.sweep_if_due(now_ms());
    }

    /// Reclaims the slots of dead processes; returns how many. Never waits on another process.
    pub fn sweep(&self) -> usize {
        if !self.writable || self.damaged(true) || self.sweeping.swap(true, Ordering::AcqRel) {
            return 0;
        }
        let fd = self.raw_fd();
        let me = self.slot();
        let l = self.layout();
        let mut n = 0;
        for i in 0..MAX_SLOTS {
            if Some(i) == me || l.slot_state(i) == shm::SLOT_FREE {
                continue;
            }
            // Its holder is gone when its lock can be taken: we alone hold it then.
            if let Some(Some(excess)) =
                slotfile::take_dead_slot::<Layout, _>(fd, i, || l.reclaim_slot(i))
            {
                n += 1;
                if excess > 0 {
                    self.report_impossible_slot(i, excess);
                }
            }
        }
        self.sweeping.store(false, Ordering::Release);
        if n > 0 {
            log::info(format_args!(
                "ledger {}: reclaimed the memory of {n} dead process(es)",
                self.path.display()
            ));
        }
        n
    }

    #[inline]
    fn check_fork(&self) {
        // getpid() is a system call (glibc no longer caches it): compare it only after a fork.
        if self.fork_pending() {
            self.after_fork();
        }
    }

    /// A fork happened since this process last looked (its slot may be its parent's).
    #[inline]
    fn fork_pending(&self) -> bool {
        sys::forks_seen() != self.forks_seen.load(Ordering::Relaxed)
    }

    #[cold]
    fn after_fork(&self) {
        self.forks_seen.store(sys::forks_seen(), Ordering::Relaxed);
        if self.owner_pid.load(Ordering::Acquire) != sys::getpid() && self.slot().is_some() {
            if let Err(e) = self.reattach_after_fork() {
                log::error(format_args!(
                    "{e}; this fork child's allocations are refused"
                ));
            }
        }
    }

    /// In a fork child: opens the file anew (OFD locks belong to the open file description, which
    /// the child shares with its parent) and claims a slot of its own. Idempotent; called
    /// automatically by `try_reserve`/`release` when the pid changed.
    pub fn reattach_after_fork(&self) -> Result<(), LedgerError> {
        let me = sys::getpid();
        let old = self.owner_pid.load(Ordering::Acquire);
        if old == me || !self.writable {
            return Ok(());
        }
        if self
            .owner_pid
            .compare_exchange(old, me, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Ok(()); // another thread of this child is doing it
        }
        // The same file as the mapping's, even if the path now names another one.
        let fd = match &self.map {
            Map::Shared(w) => w.lock_fd(),
            Map::Copy(_) => return Ok(()),
        }
        .map_err(io_err(&self.path, "reopen after fork"))?;
        // Locks taken by other threads of the parent at fork time do not matter in the child.
        self.sweeping.store(false, Ordering::Release);
        self.claiming.store(false, Ordering::Release);
        self.slot.store(NO_SLOT, Ordering::Release);
        self.fd.store(fd.as_raw_fd(), Ordering::Release);
        {
            // Closing our copy of the parent's fd keeps the parent's lock (the parent still has it
            // open) while letting the parent's slot die with the parent.
            let mut fds = self.fds.try_lock().ok_or_else(|| LedgerError::Corrupt {
                path: self.path.clone(),
                what: "fd list locked at fork".into(),
            })?;
            fds.clear();
            fds.push(fd);
        }
        // The child's own slot is claimed at its first reservation.
        Ok(())
    }

    /// A consistent-enough view of everything (each number is read atomically).
    pub fn snapshot(&self) -> Snapshot {
        let l = self.layout();
        let fd = self.raw_fd();
        let devices = (0..MAX_DEVICES)
            .filter(|&d| l.device_state(d) == shm::DEV_READY)
            .map(|d| DeviceSnapshot {
                index: d,
                uuid: l.device_key(d),
                limit: l.limit(d),
                invalid_config: l.flags(d) & shm::DEV_FLAG_INVALID != 0,
                used: l.used(d),
                peak: l.peak(d),
                denied: l.denied(d),
            })
            .collect();
        let me = self.slot();
        let processes = (0..MAX_SLOTS)
            .filter(|&i| l.slot_state(i) != shm::SLOT_FREE)
            .map(|i| ProcessSnapshot {
                slot: i,
                pid: l.slot_pid(i),
                alive: Some(i) == me || slotfile::slot_alive::<Layout>(fd, i),
                used: (0..MAX_DEVICES)
                    .map(|d| (d, l.slot_used(i, d)))
                    .filter(|&(_, n)| n > 0)
                    .collect(),
                overhead: (0..MAX_DEVICES)
                    .map(|d| (d, l.slot_overhead(i, d).min(l.slot_used(i, d))))
                    .filter(|&(_, n)| n > 0)
                    .collect(),
                reconciled: l.slot_reconciled(i),
                node: l.node_word(i, 0).map(|(_, ms, pid)| (pid, ms)),
            })
            .collect();
        Snapshot {
            path: self.path.clone(),
            tenant: l.tenant(),
            creator_pid: l.creator_pid(),
            default_limit: l.default_limit().0,
            reclaims: l.reclaims(),
            node_ms: Some(l.node_pass_ms()).filter(|&ms| ms != 0),
            devices,
            processes,
        }
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        sys::unguard_slot_fd(self.raw_fd());
        // Give our leftovers back now rather than waiting for a sweep (we hold our slot's lock).
        if let Some(s) = self.slot() {
            if self.owner_pid.load(Ordering::Acquire) == sys::getpid() {
                self.layout().reclaim_slot(s);
                slotfile::release_slot::<Layout>(self.raw_fd(), s);
            }
        }
    }
}

#[cfg(test)]
mod tests;
