//! One device ledger: a slot file (`crate::slotfile`: creation, validated join, slot locks with the
//! fork guard, truncation containment), the arbitration lock, tenants and process slots, liveness.
//! (About 850 lines in one file: every function here reads or repairs the same untrusted words of
//! one mapping, and splitting them would only spread its private accessors.)

use super::arbiter::{self, TenantView, Waiter};
use super::policy::{Lookup, Overlay};

pub use super::lock::LockGuard;
use super::shm::*;
use crate::slotfile::atomic::AtomicU32;
use crate::slotfile::{self, sys, CreateOptions, ReadOnly, Writable};
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
}

impl Drop for DeviceLedger {
    /// Takes the slot-lock descriptor out of the fork guard before it is closed: a stale entry would
    /// make a later fork child swap for /dev/null whatever descriptor reuses its number on a file
    /// that reuses its inode.
    fn drop(&mut self) {
        sys::unguard_slot_fd(self.raw_fd());
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
        let file = Writable::<Layout>::open(path, opts, |l| {
            l.header.epoch.store(1, Relaxed);
            for (w, v) in l.header.uuid.iter().zip(pack(uuid).unwrap_or_default()) {
                w.store(v, Relaxed);
            }
        })?;
        let lock_fd = file
            .lock_fd()
            .map_err(|e| DeviceLedgerError::Io(path.to_path_buf(), "reopen", e))?;
        let repaired = file.repaired_at_join().map(str::to_string);
        let mut l = Self::new(path, Map::Shared(file), Some(lock_fd), Overlay::new(path));
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
        let file = Writable::<Layout>::anonymous(path, |l| {
            l.header.epoch.store(1, Relaxed);
            for (w, v) in l.header.uuid.iter().zip(pack(uuid).unwrap_or_default()) {
                w.store(v, Relaxed);
            }
        })?;
        let lock_fd = file
            .lock_fd()
            .map_err(|e| DeviceLedgerError::Io(path.to_path_buf(), "reopen", e))?;
        Ok(Self::new(
            path,
            Map::Shared(file),
            Some(lock_fd),
            Overlay::none(),
        ))
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
    pub fn claim_slot(&self, tenant: usize) -> Option<usize> {
        if !self.writable() || self.forked() {
            return None;
        }
        let l = self.layout();
        let got = slotfile::claim_slot::<Layout>(
            self.raw_fd(),
            MAX_SLOTS,
            |i| l.slots[i].state.load(Acquire) == SLOT_FREE,
            |i| {
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
            },
        );
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

    /// What the file looks like from the kernel's evidence and its counters: for
    /// `gpuslice status --compute`, the exporter and the decision to throttle.
    pub fn health(&self) -> Health {
        let l = self.layout();
        let h = &l.header;
        let mut free = 0;
        let mut squatted = 0;
        for i in 0..MAX_SLOTS {
            if l.slots[i].state.load(Acquire) != SLOT_FREE {
                continue;
            }
            // A free slot whose lock is held: nobody in it, yet nobody can claim it (a claimant
            // holds the lock only for the instant between its lock and its state word).
            if slotfile::slot_alive::<Layout>(self.raw_fd(), i) {
                squatted += 1;
            } else {
                free += 1;
            }
        }
        let size = match &self.map {
            Map::Shared(w) => sys::fstat(w.fd()).map(|st| st.st_size as u64).ok(),
            Map::Copy(r) => std::fs::metadata(r.path()).map(|m| m.len()).ok(),
        };
        Health {
            free_slots: free,
            squatted_slots: squatted,
            size,
            expected_size: TOTAL_SIZE as u64,
            lock_takeovers: h.lock_takeovers.load(Acquire),
            slot_denials: h.slot_denials.load(Acquire),
            size_repairs: h.size_repairs.load(Acquire),
            forged_owner: h.forged_owner.load(Acquire),
        }
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

    /// Frees the slots of dead processes (the cleaner holds the dead slot's lock while it does).
    /// First checks the file's size: a truncated file is repaired (`slotfile`), and what this
    /// process had in it (its slot, its tenant) is put back, so arbitration resumes within one
    /// sweep. A fork child does not sweep (it gave up the descriptor the locks are tested on).
    pub fn sweep(&self, me: Option<usize>) {
        // The node's policy, re-read when root replaced it (`gpuslice set`): a `stat` otherwise.
        self.policy.reload();
        if !self.writable() || self.forked() {
            return;
        }
        self.repair();
        if let Some(TallyMap::Shared(t)) = &self.tally {
            t.trim_excess();
        }
        let l = self.layout();
        for i in 0..MAX_SLOTS {
            // Any state but FREE counts: a scribbled state word must not keep a slot forever.
            if Some(i) == me || l.slots[i].state.load(Acquire) == SLOT_FREE {
                continue;
            }
            slotfile::take_dead_slot::<Layout, _>(self.raw_fd(), i, || {
                let s = &l.slots[i];
                s.wants.store(0, Release);
                s.wait_since.store(0, Release);
                s.state.store(SLOT_FREE, Release);
            });
        }
    }

    /// After a truncation: the header, our slot and our tenant written again (others do the same
    /// with theirs). Logged once per repair.
    fn repair(&self) {
        let Map::Shared(w) = &self.map else {
            return;
        };
        if let Some(size) = w.trim_excess() {
            self.layout().header.size_repairs.fetch_add(1, Relaxed);
            crate::log::error(format_args!(
                "device ledger {}: grown to {size} bytes while in use (joiners would refuse it); cut back to {TOTAL_SIZE}",
                self.path.display()
            ));
        }
        if w.check_size()
            && self.layout().header.prefix.state.load(Acquire) == slotfile::STATE_READY
        {
            return;
        }
        if w.descriptor_lost() {
            return; // the program closed our descriptor: nothing to tell about the file
        }
        if w.detached() {
            return; // private zeros: nothing to share any more; the next process start rejoins
        }
        let l = self.layout();
        let h = &l.header;
        let uuid = self
            .path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if h.prefix.magic.load(Acquire) != u64::from_ne_bytes(MAGIC) {
            for (w, v) in h.uuid.iter().zip(pack(&uuid).unwrap_or_default()) {
                w.store(v, Release);
            }
            if h.epoch.load(Acquire) == 0 {
                h.epoch.store(1, Release);
            }
            h.prefix.version.store(VERSION, Release);
            h.prefix.total_size.store(TOTAL_SIZE as u64, Release);
            h.prefix.magic.store(u64::from_ne_bytes(MAGIC), Release);
        }
        let own = self.own.lock();
        if let Some(i) = own.slot {
            let s = &l.slots[i];
            if s.state.load(Acquire) != SLOT_ACTIVE {
                s.pid.store(sys::getpid(), Release);
                s.beat_ns.store(now_ns(), Release);
                if let Some((t, ..)) = &own.tenant {
                    s.tenant.store(*t as u32, Release);
                }
                s.state.store(SLOT_ACTIVE, Release);
            }
        }
        if let Some((i, id, name, share, cap, high)) = &own.tenant {
            let t = &l.tenants[*i];
            if t.state.load(Acquire) != TENANT_READY {
                fill_tenant(t, *id, name, *share, *cap, *high);
            }
        }
        h.prefix.state.store(slotfile::STATE_READY, Release);
        if self.repairs.fetch_add(1, Relaxed) == 0 {
            crate::log::error(format_args!(
                "device ledger {}: the file was truncated while in use; repaired (this process's slot and tenant written again)",
                self.path.display()
            ));
        }
    }

    /// Finds the tenant `id`, or adds it with these settings (an entry that no live process uses is
    /// recycled when the table is full). Its label is refreshed. Caller holds the lock.
    pub fn find_or_add_tenant(
        &self,
        _g: &LockGuard<'_>,
        id: TenantId,
        label: &str,
        share: u32,
        cap: u32,
        high: bool,
    ) -> Option<usize> {
        let l = self.layout();
        let mut free = None;
        for (i, t) in l.tenants.iter().enumerate() {
            if t.state.load(Acquire) == TENANT_READY {
                if TenantId::load(&t.id) == id {
                    for (w, v) in t.name.iter().zip(pack_truncated(label)) {
                        w.store(v, Release);
                    }
                    self.own.lock().tenant = Some((i, id, label.to_string(), share, cap, high));
                    return Some(i);
                }
            } else if free.is_none() {
                free = Some(i);
            }
        }
        let i = free.or_else(|| self.unused_tenant())?;
        fill_tenant(&l.tenants[i], id, label, share, cap, high);
        self.own.lock().tenant = Some((i, id, label.to_string(), share, cap, high));
        Some(i)
    }

    /// A tenant entry no live process slot refers to (the table is full: recycle it).
    fn unused_tenant(&self) -> Option<usize> {
        let l = self.layout();
        let mut used = [false; MAX_TENANTS];
        for (i, s) in l.slots.iter().enumerate() {
            let t = s.tenant.load(Acquire) as usize;
            if s.state.load(Acquire) != SLOT_FREE && t < MAX_TENANTS && self.slot_alive(i, None) {
                used[t] = true;
            }
        }
        (0..MAX_TENANTS).find(|&t| !used[t])
    }

    /// Writes tenant entry `i` afresh (our own, found damaged). Caller holds the lock.
    pub fn rewrite_tenant(&self, i: usize, id: TenantId, label: &str, v: &TenantView) {
        if let Some(t) = self.layout().tenants.get(i) {
            fill_tenant(t, id, label, v.share, v.cap, v.high);
        }
    }

    /// Counts a hand-over to (or, `revocation`, a revocation from) tenant entry `t`, in the
    /// per-tenant counters' file when there is one. Caller holds the arbitration lock. The entry is
    /// taken over from a tenant that no longer holds `t` (from zero); the words are anybody's, so
    /// the count saturates instead of wrapping.
    pub fn count(&self, t: usize, revocation: bool) {
        let Some(TallyMap::Shared(w)) = &self.tally else {
            return;
        };
        let Some(e) = w.layout().tenants.get(t) else {
            return;
        };
        let id = self.tenant_id(t);
        if id.0 == 0 {
            return;
        }
        if TenantId::load(&e.id) != id {
            e.hand_overs.store(0, Release);
            e.revocations.store(0, Release);
            id.store(&e.id);
        }
        let c = if revocation {
            &e.revocations
        } else {
            &e.hand_overs
        };
        c.store(c.load(Acquire).saturating_add(1), Release);
    }

    /// Tenant entry `t`'s hand-overs and revocations (`count`): `None` without the counters'
    /// file; zeros when the file's entry counts for another tenant (or nobody) still.
    pub fn tenant_counts(&self, t: usize) -> Option<(u64, u64)> {
        let e = self.tally.as_ref()?.layout().tenants.get(t)?;
        let id = self.tenant_id(t);
        if id.0 == 0 || TenantId::load(&e.id) != id {
            return Some((0, 0));
        }
        Some((e.hand_overs.load(Acquire), e.revocations.load(Acquire)))
    }

    /// The identity of tenant entry `i`.
    pub fn tenant_id(&self, i: usize) -> TenantId {
        self.layout()
            .tenants
            .get(i)
            .map_or(TenantId(0), |t| TenantId::load(&t.id))
    }

    /// Every tenant that carries the label `name` (admin).
    pub fn find_tenants(&self, name: &str) -> Vec<usize> {
        let Some(key) = pack(name) else {
            return Vec::new();
        };
        (0..MAX_TENANTS)
            .filter(|&i| {
                let t = &self.layout().tenants[i];
                t.state.load(Acquire) == TENANT_READY
                    && t.name.iter().zip(&key).all(|(a, b)| a.load(Acquire) == *b)
            })
            .collect()
    }

    /// The tenant with identity `id`.
    pub fn find_tenant_by_id(&self, id: TenantId) -> Option<usize> {
        (0..MAX_TENANTS).find(|&i| {
            let t = &self.layout().tenants[i];
            t.state.load(Acquire) == TENANT_READY && TenantId::load(&t.id) == id
        })
    }

    /// Finds a tenant by its label (the first one that carries it).
    pub fn find_tenant(&self, name: &str) -> Option<usize> {
        let key = pack(name)?;
        self.layout().tenants.iter().position(|t| {
            t.state.load(Acquire) == TENANT_READY
                && t.name.iter().zip(&key).all(|(a, b)| a.load(Acquire) == *b)
        })
    }

    /// Tenant `i`'s scheduling state, made sane: the file is untrusted (shares and caps within their
    /// ranges, tokens within the bucket's bounds, no time stamp ahead of the clock).
    pub fn view(&self, i: usize) -> TenantView {
        let t = &self.layout().tenants[i % MAX_TENANTS];
        let now = now_ns();
        let (share, cap, high) = self.settings(t);
        TenantView {
            share,
            cap,
            high,
            vtime: t.vtime.load(Acquire),
            tokens: t
                .tokens
                .load(Acquire)
                .clamp(arbiter::MIN_TOKENS_NS, arbiter::BUCKET_NS),
            refill_ns: t.refill_ns.load(Acquire).min(now),
            last_active_ns: t.last_active_ns.load(Acquire).min(now),
        }
    }

    /// Whether tenant `i` is of the high-priority class.
    pub fn is_high(&self, i: usize) -> bool {
        self.layout()
            .tenants
            .get(i)
            .is_some_and(|t| self.settings(t).2)
    }

    /// A tenant entry's share, cap and class: the node's policy for a tenant it lists; share 1 and
    /// the normal class for one it does not list (the ledger's words are anybody's to write); the
    /// ledger's words, bounded, when there is no policy.
    fn settings(&self, t: &TenantEntry) -> (u32, u32, bool) {
        let cap = t.cap.load(Acquire);
        let cap = if cap >= 100 { 0 } else { cap };
        match self.policy.lookup(TenantId::load(&t.id)) {
            Lookup::Listed { share, cap, high } => (share, cap, high),
            Lookup::Unlisted => (1, cap, false),
            Lookup::NoPolicy => (
                t.share.load(Acquire).clamp(1, arbiter::MAX_SHARE),
                cap,
                PriorityClass::from_word(t.priority.load(Acquire)) == PriorityClass::High,
            ),
        }
    }

    pub fn store_view(&self, i: usize, v: &TenantView) {
        let t = &self.layout().tenants[i];
        t.vtime.store(v.vtime, Release);
        t.tokens.store(v.tokens, Release);
        t.refill_ns.store(v.refill_ns, Release);
        t.last_active_ns.store(v.last_active_ns, Release);
    }

    /// The live waiting slots (`except` left out).
    pub fn waiters(&self, except: Option<usize>) -> Vec<Waiter> {
        let l = self.layout();
        let now = now_ns();
        (0..MAX_SLOTS)
            .filter(|&i| Some(i) != except)
            .filter_map(|i| {
                let s = &l.slots[i];
                (s.state.load(Acquire) == SLOT_ACTIVE
                    && s.wants.load(Acquire) > 0
                    && now.saturating_sub(s.beat_ns.load(Acquire)) < BEAT_STALE_NS)
                    .then(|| Waiter {
                        slot: i,
                        tenant: s.tenant.load(Acquire) as usize,
                        // Untrusted: a stamp ahead of the clock would put it behind every
                        // other waiter of its tenant for good.
                        since: s.wait_since.load(Acquire).min(now),
                    })
            })
            .filter(|w| w.tenant < MAX_TENANTS)
            .collect()
    }

    pub fn views(&self) -> Vec<TenantView> {
        (0..MAX_TENANTS).map(|i| self.view(i)).collect()
    }
}

/// Writes a new tenant entry (READY last).
fn fill_tenant(t: &TenantEntry, id: TenantId, label: &str, share: u32, cap: u32, high: bool) {
    t.state.store(0, Release);
    id.store(&t.id);
    for (w, v) in t.name.iter().zip(pack_truncated(label)) {
        w.store(v, Release);
    }
    t.share.store(share, Release);
    t.cap.store(cap, Release);
    t.priority.store(PriorityClass::of(high).word(), Release);
    t.vtime.store(0, Release);
    t.tokens.store(arbiter::BUCKET_NS, Release);
    t.refill_ns.store(now_ns(), Release);
    t.last_active_ns.store(0, Release);
    t.charged_ns.store(0, Release);
    t.wait_ns.store(0, Release);
    for w in &t.samples {
        w.store(0, Release);
    }
    t.state.store(TENANT_READY, Release);
}

/// A device ledger's health ([`DeviceLedger::health`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// Free process slots a process can claim.
    pub free_slots: usize,
    /// Free process slots whose lock is held by someone not in them: nobody can claim them.
    pub squatted_slots: usize,
    /// The file's size now (`None`: could not be read), and its layout's.
    pub size: Option<u64>,
    pub expected_size: u64,
    /// Counters kept in the file (anybody can write them: a report, not evidence).
    pub lock_takeovers: u64,
    pub slot_denials: u64,
    pub size_repairs: u64,
    /// Times a process found itself kept from its due by an owner whose words lie and launched
    /// paced (`Header::forged_owner`).
    pub forged_owner: u64,
}

impl Health {
    /// Whether processes starting now may find no slot, or a file they must repair first.
    pub fn unhealthy(&self) -> bool {
        self.free_slots == 0 || self.squatted_slots > 0 || self.size != Some(self.expected_size)
    }

    /// One line for people.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.squatted_slots > 0 {
            parts.push(format!(
                "{} free process slot(s) locked by someone not in them",
                self.squatted_slots
            ));
        }
        if self.free_slots == 0 {
            parts.push("no process slot free: new processes run throttled to their share".into());
        }
        match self.size {
            Some(s) if s != self.expected_size => parts.push(format!(
                "{s} bytes instead of {} (repaired by the next process that joins)",
                self.expected_size
            )),
            None => parts.push("size unreadable".into()),
            _ => {}
        }
        if parts.is_empty() {
            parts.push("healthy".into());
        }
        format!(
            "{}; {} free slot(s), {} process(es) throttled without a slot, {} arbitration lock take-over(s), {} size repair(s), {} forged-owner episode(s) so far",
            parts.join("; "),
            self.free_slots,
            self.slot_denials,
            self.lock_takeovers,
            self.size_repairs,
            self.forged_owner
        )
    }
}

/// Number of history samples kept (for `gpuslice status`).
pub const HISTORY_LEN: usize = HISTORY;

/// The label of tenant `t`.
pub fn tenant_name(l: &DeviceLedger, t: usize) -> String {
    unpack(&l.layout().tenants[t % MAX_TENANTS].name)
}
