//! One device ledger: a slot file (`crate::slotfile`: creation, validated join, slot locks with the
//! fork guard, truncation containment), the arbitration lock, tenants and process slots, liveness.
//! This file opens and maps it and holds the process slots; [`tenants`] holds the tenant entries,
//! [`repair`] the sweep, the repair of a truncated file and the health report.

mod attest;
#[cfg(test)]
mod claim_tests;
pub mod limit;
pub(super) mod lock;
mod repair;
mod slots;
mod tenants;

pub use repair::Health;

use super::arbiter::{self, TenantView, Waiter};
use super::policy::{Lookup, Overlay};

use super::shm::*;
use crate::slotfile::atomic::AtomicU32;
use crate::slotfile::{self, sys, CreateOptions, ReadOnly, Writable};
pub use lock::LockGuard;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering::*};

/// A process whose heartbeat is older than this is not chosen (stopped or hung).
const BEAT_STALE_NS: u64 = 50_000_000;

/// Monotonic clock in ns (shared by every process of the machine).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sleeps on a shared futex word while it equals `expected`, at most `timeout_ns`.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned 32-bit atomic (in a shared mapping: no FUTEX_PRIVATE_FLAG);
    // FUTEX_WAIT only reads it and the timespec.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        )
    };
}

/// Wakes every process sleeping on a shared futex word.
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: as in `futex_wait`; FUTEX_WAKE does not touch memory.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}

#[derive(Debug)]
pub enum DeviceLedgerError {
    Io(PathBuf, &'static str, std::io::Error),
    Invalid(PathBuf, String),
    /// The slot file could not be created or joined.
    File(slotfile::Error),
}

impl std::fmt::Display for DeviceLedgerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io(p, what, e) => write!(f, "device ledger {}: {what}: {e}", p.display()),
            Self::Invalid(p, why) => write!(f, "device ledger {}: {why}", p.display()),
            Self::File(e) => write!(f, "device {e}"),
        }
    }
}

impl From<slotfile::Error> for DeviceLedgerError {
    fn from(e: slotfile::Error) -> Self {
        Self::File(e)
    }
}

/// The device ledger of GPU `uuid` in `dir`.
pub fn path_for(dir: &Path, uuid: &str) -> PathBuf {
    dir.join(format!("{uuid}.dev"))
}

/// The per-tenant counters' file beside the device ledger at `ledger` ([`Tally`]).
pub fn tally_path_for(ledger: &Path) -> PathBuf {
    ledger.with_extension("tally")
}

/// What the creator of a device ledger writes besides the prefix: the epoch (a futex word, never
/// 0) and the GPU's UUID.
fn first_words(uuid: &str) -> impl FnOnce(&Layout) + '_ {
    move |l| {
        l.header.epoch.store(1, Relaxed);
        for (w, v) in l.header.uuid.iter().zip(pack(uuid).unwrap_or_default()) {
            w.store(v, Relaxed);
        }
    }
}

/// The file: shared and writable, or a private copy read once (`gpuslice status`).
enum Map {
    Shared(Writable<Layout>),
    Copy(ReadOnly<Layout>),
}

/// The per-tenant counters' file, as the ledger's.
enum TallyMap {
    Shared(Writable<Tally>),
    Copy(ReadOnly<Tally>),
}

impl TallyMap {
    fn layout(&self) -> &Tally {
        match self {
            TallyMap::Shared(w) => w.layout(),
            TallyMap::Copy(r) => r.layout(),
        }
    }
}

/// What this process put in the file, to put back if a truncation zeroed it.
#[derive(Default)]
struct Own {
    slot: Option<usize>,
    tenant: Option<(usize, TenantId, String, u32, u32, bool)>,
}

/// A mapped device ledger.
pub struct DeviceLedger {
    path: PathBuf,
    map: Map,
    /// Slot locks: a description never mapped, which a fork child gives up (`sys::guard_slot_fd`).
    lock_fd: Option<OwnedFd>,
    /// `sys::forks_seen()` at open: a fork child neither sweeps nor judges liveness on the
    /// descriptor it gave up.
    forks_at_open: u32,
    own: parking_lot::Mutex<Own>,
    /// Held with the arbitration lock: this process's threads share one slot, so the lock word
    /// (which names the slot) cannot tell them apart; they take turns here first.
    pub(crate) arbitration: parking_lot::ReentrantMutex<()>,
    /// Truncations repaired so far (logged once each).
    repairs: AtomicUsize,
    /// The node's compute policy of this GPU (root's file beside the ledger), if any: it overrides
    /// the ledger's share, cap and class words of the tenants it lists.
    policy: Overlay,
    /// The per-tenant counters, when their file could be opened (`None`: not counted).
    tally: Option<TallyMap>,
    /// Slots claimed with a lock in the tenant's own memory ledger, which no other tenant can
    /// take ([`slots`]); unset: with the ledger's own slot bytes.
    tenant_locks: std::sync::OnceLock<slots::TenantLocks>,
    /// Which slots count for the tenant entry they are labelled with ([`attest`]).
    attest: attest::Attest,
}

impl Drop for DeviceLedger {
    /// Takes the slot-lock descriptor out of the fork guard before it is closed: a stale entry would
    /// make a later fork child swap for /dev/null whatever descriptor reuses its number on a file
    /// that reuses its inode.
    fn drop(&mut self) {
        sys::unguard_slot_fd(self.raw_fd());
        if let Some(fd) = self.tenant_lock_fd() {
            sys::unguard_slot_fd(fd);
        }
    }
}

impl DeviceLedger {
    /// Opens the ledger at `path`; creates it (directory included) when `create` and it is missing.
    /// A file still being initialised by another process is waited for (1 s).
    pub fn open(path: &Path, uuid: &str, create: bool) -> Result<DeviceLedger, DeviceLedgerError> {
        let opts = create.then_some(CreateOptions {
            mode: 0o600,
            gid: None,
            // Every tenant of the GPU, of whichever user, creates its ledger there.
            shared_dir: true,
        });
        let file = Writable::<Layout>::open(path, opts, first_words(uuid))?;
        let repaired = file.repaired_at_join().map(str::to_string);
        let mut l = Self::shared(path, file, Overlay::new(path))?;
        l.tally = Self::open_tally(path, create);
        if let Some(what) = repaired {
            l.repaired_header(uuid);
            l.layout().header.size_repairs.fetch_add(1, Relaxed);
            crate::log::error(format_args!(
                "device ledger {}: found {what}; repaired in place (the processes using it write their entries again)",
                path.display()
            ));
        }
        Ok(l)
    }

    /// A device ledger of this process's own, in memory (nobody else can open it), for arbitrating
    /// alone: a process that could not get a slot in the shared one is throttled through it.
    /// `path` (the shared ledger's) names it in messages. No node policy applies to its words.
    pub fn private(path: &Path, uuid: &str) -> Result<DeviceLedger, DeviceLedgerError> {
        let file = Writable::<Layout>::anonymous(path, first_words(uuid))?;
        Self::shared(path, file, Overlay::none())
    }

    /// A handle on a shared (or private) writable file, with its slot-lock descriptor.
    fn shared(
        path: &Path,
        file: Writable<Layout>,
        policy: Overlay,
    ) -> Result<DeviceLedger, DeviceLedgerError> {
        let lock_fd = file
            .lock_fd()
            .map_err(|e| DeviceLedgerError::Io(path.to_path_buf(), "reopen", e))?;
        Ok(Self::new(path, Map::Shared(file), Some(lock_fd), policy))
    }

    /// The per-tenant counters' file beside the ledger at `path`, created with it (same options).
    /// Without it arbitration works the same and the counters are not kept: a container given the
    /// ledger but not this file, a file another user created, an older node.
    fn open_tally(path: &Path, create: bool) -> Option<TallyMap> {
        let at = tally_path_for(path);
        let opts = create.then_some(CreateOptions {
            mode: 0o600,
            gid: None,
            shared_dir: true,
        });
        match Writable::<Tally>::open(&at, opts, |_| {}) {
            Ok(t) => Some(TallyMap::Shared(t)),
            Err(e) => {
                crate::log::info(format_args!("{e}; per-tenant hand-overs not counted"));
                None
            }
        }
    }

    /// After an in-place repair of a zeroed header: the words the creator wrote besides the
    /// prefix (the epoch, a futex word, is never 0; the UUID).
    fn repaired_header(&self, uuid: &str) {
        let h = &self.layout().header;
        let _ = h.epoch.compare_exchange(0, 1, AcqRel, Acquire);
        if h.uuid[0].load(Acquire) == 0 {
            for (w, v) in h.uuid.iter().zip(pack(uuid).unwrap_or_default()) {
                w.store(v, Release);
            }
        }
    }

    /// Opens an existing ledger read-only (`gpuslice status`): a copy read at open, which nothing
    /// can store through and a truncation cannot fault.
    pub fn open_readonly(path: &Path) -> Result<DeviceLedger, DeviceLedgerError> {
        let file = ReadOnly::<Layout>::open(path)?;
        let mut l = Self::new(path, Map::Copy(file), None, Overlay::new(path));
        l.tally = ReadOnly::<Tally>::open(&tally_path_for(path))
            .ok()
            .map(TallyMap::Copy);
        Ok(l)
    }

    fn new(path: &Path, map: Map, lock_fd: Option<OwnedFd>, policy: Overlay) -> DeviceLedger {
        sys::count_forks();
        DeviceLedger {
            path: path.to_path_buf(),
            map,
            lock_fd,
            forks_at_open: sys::forks_seen(),
            own: parking_lot::Mutex::new(Own::default()),
            arbitration: parking_lot::ReentrantMutex::new(()),
            repairs: AtomicUsize::new(0),
            policy,
            tally: None,
            tenant_locks: std::sync::OnceLock::new(),
            attest: attest::Attest::new(),
        }
    }

    /// Whether this handle can change the file (a read-only one holds a private copy).
    pub fn writable(&self) -> bool {
        matches!(self.map, Map::Shared(_))
    }

    /// This process is a fork child of the one that opened the ledger.
    fn forked(&self) -> bool {
        sys::forks_seen() != self.forks_at_open
    }

    pub fn layout(&self) -> &Layout {
        match &self.map {
            Map::Shared(w) => w.layout(),
            Map::Copy(r) => r.layout(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn uuid(&self) -> String {
        unpack(&self.layout().header.uuid)
    }

    /// The descriptor slot and demand locks are taken and tested on.
    pub fn raw_fd(&self) -> RawFd {
        match (&self.lock_fd, &self.map) {
            (Some(fd), _) => fd.as_raw_fd(),
            (None, Map::Shared(w)) => w.fd().as_raw_fd(),
            (None, Map::Copy(r)) => r.fd(),
        }
    }

    /// The descriptor slot locks are tested on (unit tests).
    #[cfg(test)]
    pub(crate) fn lock_fd_for_tests(&self) -> RawFd {
        self.raw_fd()
    }

    /// Whether the process holding `slot` is alive (another open file description holds its lock).
    /// A fork child gave its lock descriptor up and cannot tell: everyone counts as alive.
    pub fn slot_alive(&self, slot: usize, mine: Option<usize>) -> bool {
        if Some(slot) == mine || self.forked() {
            return true;
        }
        slotfile::slot_alive::<Layout>(self.raw_fd(), slot)
    }

    /// Byte of slot `slot`'s demand lock (`demand`): past the slot locks, beyond the data.
    pub fn demand_offset(slot: usize) -> u64 {
        <Layout as slotfile::SlotLayout>::lock_offset(MAX_SLOTS + slot)
    }

    /// Says (`wants`) or stops saying that the process holding our slot `slot` wants the device:
    /// an OFD lock on the slot's demand byte, which only this process can release and which dies
    /// with it. A fork child has given the descriptor up and says nothing.
    pub fn set_demand(&self, slot: usize, wants: bool) {
        if slot >= MAX_SLOTS || self.forked() {
            return;
        }
        let at = Self::demand_offset(slot);
        if wants {
            let _ = sys::try_lock(self.raw_fd(), at);
        } else {
            sys::unlock(self.raw_fd(), at);
        }
    }

    /// Whether the process of slot `slot` (not ours) says it wants the device. An error, or a fork
    /// child that cannot tell, counts as wanting: contention is the safe side.
    pub fn slot_wants(&self, slot: usize) -> bool {
        if slot >= MAX_SLOTS || self.forked() {
            return true;
        }
        sys::is_locked(self.raw_fd(), Self::demand_offset(slot)).unwrap_or(true)
    }

    /// Claims a free process slot for `tenant` (its lock first, so nobody mistakes it for dead).
    /// With a tenant lock ([`use_tenant_locks`](Self::use_tenant_locks)) the lock is taken in the
    /// tenant's own file, which no other tenant can hold: a tenant locking the ledger's slot bytes
    /// keeps nobody else out.
    pub fn claim_slot(&self, tenant: usize) -> Option<usize> {
        if !self.writable() || self.forked() {
            return None;
        }
        let l = self.layout();
        let take = |i: usize| {
            let s = &l.slots[i];
            if s.state
                .compare_exchange(SLOT_FREE, SLOT_ACTIVE, AcqRel, Acquire)
                .is_err()
            {
                return false;
            }
            s.tenant.store(tenant as u32, Release);
            s.pid.store(sys::getpid(), Release);
            s.wants.store(0, Release);
            s.wait_since.store(0, Release);
            s.beat_ns.store(now_ns(), Release);
            true
        };
        let got = match self.claim_with_tenant_lock(take) {
            Some(got) => got,
            None => slotfile::claim_slot::<Layout>(
                self.raw_fd(),
                MAX_SLOTS,
                |i| l.slots[i].state.load(Acquire) == SLOT_FREE,
                take,
            ),
        };
        self.own.lock().slot = got;
        got
    }

    /// Changes tenant `name`'s settings (`gpuslice set`). Each is one word, stored on its own, so
    /// neither a process slot nor the arbitration lock is needed: a command never waits on what a
    /// tenant holds. The tenants changed (none: no tenant of that name here).
    pub fn update_tenant(
        &self,
        name: &str,
        share: Option<u32>,
        cap: Option<u32>,
        high: Option<bool>,
    ) -> Result<Vec<usize>, DeviceLedgerError> {
        if !self.writable() {
            return Err(DeviceLedgerError::Invalid(
                self.path.clone(),
                "opened read-only".into(),
            ));
        }
        // A tenant is its memory ledger; the name is a label: every tenant carrying it changes.
        let found = self.find_tenants(name);
        for &t in &found {
            let e = &self.layout().tenants[t];
            if let Some(v) = share {
                e.share.store(v.clamp(1, 100), Release);
            }
            if let Some(v) = cap {
                e.cap.store(v.min(100) % 100, Release);
            }
            if let Some(v) = high {
                e.priority.store(PriorityClass::of(v).word(), Release);
            }
        }
        Ok(found)
    }

    /// Runs `f` under the arbitration lock for a process that does not schedule (the node's
    /// tools): it holds a process slot meanwhile when one can be claimed, and otherwise holds the
    /// lock under a word naming no slot (which a waiter takes over at once: `f` must be short and
    /// its stores each sound on their own). Either way it waits at most the lock's bound
    /// ([`LOCK_HOLD_MAX_NS`]) for whoever holds it, and never fails for want of a slot.
    pub fn with_admin_lock<T>(&self, f: impl FnOnce(&LockGuard<'_>) -> T) -> T {
        let slot = self.claim_slot(usize::MAX >> 1);
        let r = {
            let g = self.lock(slot.unwrap_or(MAX_SLOTS));
            f(&g)
        };
        if let Some(slot) = slot {
            self.layout().slots[slot].state.store(SLOT_FREE, Release);
            slotfile::release_slot::<Layout>(self.raw_fd(), slot);
            self.own.lock().slot = None;
        }
        r
    }

    /// The share and cap the node's policy gives tenant `id` (the configuration's, `share` and
    /// `cap`, when there is no policy): what a process throttled without a slot holds itself to.
    pub fn policy_settings(&self, id: TenantId, share: u32, cap: u32) -> (u32, u32) {
        match self.policy.lookup(id) {
            Lookup::Listed { share, cap, .. } => (share, cap),
            Lookup::Unlisted => (1, cap),
            Lookup::NoPolicy => (share, cap),
        }
    }
}

/// Number of history samples kept (for `gpuslice status`).
pub const HISTORY_LEN: usize = HISTORY;

/// The label of tenant `t`.
pub fn tenant_name(l: &DeviceLedger, t: usize) -> String {
    unpack(&l.layout().tenants[t % MAX_TENANTS].name)
}
