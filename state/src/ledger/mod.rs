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
//! The files, by subject: this one opens the file, holds the process's slot and reads the limits;
//! `quota.rs` reserves and releases; `liveness.rs` reclaims dead processes' slots and handles
//! forks; `published.rs` holds the words processes and the node publish for each other;
//! `snapshot.rs` is the read API ([`Ledger::snapshot`]); `options.rs` what a creator puts in;
//! `shm.rs` the layout and every atomic operation on it. The protocol they share (the slot file)
//! is `crate::slotfile`'s.

mod liveness;
mod options;
mod published;
mod quota;
mod shm;
mod snapshot;

use std::fmt;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
// The handle's own words are process-local; they use the shared memory's facade types all the same
// (one set of atomics in this crate, `clippy.toml`).
use crate::slotfile::atomic::{AtomicU32, AtomicU64};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::{canonical_uuid, format_bytes, Config, Limit};
use crate::log;
use crate::slotfile::{self, io_err, sys, CreateOptions, ReadOnly, Writable};
use options::{device_key, stored};
pub use options::{unmatched_keys, LedgerOptions};
pub use quota::{QuotaExceeded, Refusal};
pub use shm::Layout;
#[cfg(test)]
use shm::TOTAL_SIZE;
pub use shm::{
    NodeWord, LAYOUT_VERSION, MAX_DEVICES, MAX_SLOTS, NODE_NOT_LISTED, RECONCILED_ESTIMATED,
    RECONCILED_NODE, RECONCILED_OWN, RECONCILED_UNKNOWN, UNLIMITED,
};
pub use snapshot::{slot_of_lock_offset, DeviceSnapshot, ProcessSnapshot, Snapshot};

/// Why a ledger could not be opened (the slot file's errors). Each message names the path; the
/// caller denies allocations.
pub type LedgerError = slotfile::Error;
/// Minimum time between two sweeps triggered by refused reservations (per process).
const SWEEP_INTERVAL_MS: u64 = 200;
/// Longest time between two comparisons of the file's size with the layout's on reservations.
const SIZE_CHECK_MS: u64 = 50;
const NO_SLOT: usize = usize::MAX;

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
#[inline]
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

    pub(super) fn layout(&self) -> &Layout {
        match &self.map {
            Map::Shared(w) => w.layout(),
            Map::Copy(r) => r.layout(),
        }
    }

    /// Whether the shared file still holds what this process joined: a truncation (repaired with
    /// zeros) fails closed from then on. With `check_size`, `fstat` as well (slow paths, paced);
    /// otherwise what is seen without a system call (`Writable::looks_sound`).
    #[inline]
    pub(super) fn damaged(&self, check_size: bool) -> bool {
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
    pub(super) fn looks_damaged(&self) -> bool {
        matches!(&self.map, Map::Shared(w) if !w.looks_sound())
    }

    #[cold]
    pub(super) fn report_damage(&self) {
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

    pub(super) fn raw_fd(&self) -> RawFd {
        self.fd.load(Ordering::Acquire)
    }

    /// Our slot, claimed now if this process has none yet (one thread claims; the others wait for
    /// it). `None`: every slot is in use (logged once).
    #[cold]
    pub(super) fn own_slot(&self) -> Option<usize> {
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
    pub(super) fn claim(&self) -> Result<(), LedgerError> {
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
    /// Our process slot, if we hold one.
    #[inline]
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

    /// Bytes this process has reserved on a device.
    pub fn used_by_me(&self, dev: usize) -> u64 {
        match self.slot() {
            Some(s) if dev < MAX_DEVICES => self.layout().slot_used(s, dev),
            _ => 0,
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
