//! One device ledger: a slot file (`crate::slotfile`: creation, validated join, slot locks with the
//! fork guard, truncation containment), the arbitration lock, tenants and process slots, liveness.

use super::arbiter::{self, Choice, TenantView, Waiter};
use super::shm::*;
use crate::slotfile::{self, sys, CreateOptions, ReadOnly, Writable};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::*};
use std::time::Duration;

/// A held arbitration lock older than this is taken over when its holder is dead or stopped.
const LOCK_STALE_NS: u64 = 50_000_000;

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

/// The file: shared and writable, or a private copy read once (`gpuslice status`).
enum Map {
    Shared(Writable<Layout>),
    Copy(ReadOnly<Layout>),
}

/// What this process put in the file, to put back if a truncation zeroed it.
#[derive(Default)]
struct Own {
    slot: Option<usize>,
    tenant: Option<(usize, String, u32, u32, bool)>,
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
    /// Truncations repaired so far (logged once each).
    repairs: AtomicUsize,
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
        Ok(Self::new(path, Map::Shared(file), Some(lock_fd)))
    }

    /// Opens an existing ledger read-only (`gpuslice status`): a copy read at open, which nothing
    /// can store through and a truncation cannot fault.
    pub fn open_readonly(path: &Path) -> Result<DeviceLedger, DeviceLedgerError> {
        let file = ReadOnly::<Layout>::open(path)?;
        Ok(Self::new(path, Map::Copy(file), None))
    }

    fn new(path: &Path, map: Map, lock_fd: Option<OwnedFd>) -> DeviceLedger {
        sys::count_forks();
        DeviceLedger {
            path: path.to_path_buf(),
            map,
            lock_fd,
            forks_at_open: sys::forks_seen(),
            own: parking_lot::Mutex::new(Own::default()),
            repairs: AtomicUsize::new(0),
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

    fn raw_fd(&self) -> RawFd {
        match (&self.lock_fd, &self.map) {
            (Some(fd), _) => fd.as_raw_fd(),
            (None, Map::Shared(w)) => w.fd().as_raw_fd(),
            (None, Map::Copy(r)) => r.fd(),
        }
    }

    /// Whether the process holding `slot` is alive (another open file description holds its lock).
    /// A fork child gave its lock descriptor up and cannot tell: everyone counts as alive.
    pub fn slot_alive(&self, slot: usize, mine: Option<usize>) -> bool {
        if Some(slot) == mine || self.forked() {
            return true;
        }
        slotfile::slot_alive::<Layout>(self.raw_fd(), slot)
    }

    /// Takes the arbitration lock (`me` = our slot), taking over a dead or stopped holder's.
    pub fn lock(&self, me: usize) -> LockGuard<'_> {
        let h = &self.layout().header;
        let mut spins = 0u32;
        loop {
            let cur = h.lock.load(Acquire);
            if cur == 0 {
                if h.lock
                    .compare_exchange(0, me as u32 + 1, AcqRel, Acquire)
                    .is_ok()
                {
                    h.lock_ns.store(now_ns(), Release);
                    return LockGuard { l: self, me };
                }
                continue;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
                continue;
            }
            let holder = cur as usize - 1;
            let stale = now_ns().saturating_sub(h.lock_ns.load(Acquire)) > LOCK_STALE_NS;
            if (holder >= MAX_SLOTS || stale || !self.slot_alive(holder, Some(me)))
                && h.lock
                    .compare_exchange(cur, me as u32 + 1, AcqRel, Acquire)
                    .is_ok()
            {
                h.lock_ns.store(now_ns(), Release);
                return LockGuard { l: self, me };
            }
            std::thread::sleep(Duration::from_micros(20));
        }
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

    /// Changes tenant `name`'s settings (`gpuslice set`) under the arbitration lock, from a process
    /// that does not schedule: it holds a process slot (the lock's holder id) only meanwhile.
    /// `Ok(false)`: no tenant of that name here.
    pub fn update_tenant(
        &self,
        name: &str,
        share: Option<u32>,
        cap: Option<u32>,
        high: Option<bool>,
    ) -> Result<bool, DeviceLedgerError> {
        let slot = self.claim_slot(usize::MAX >> 1).ok_or_else(|| {
            DeviceLedgerError::Invalid(self.path.clone(), "no free process slot".into())
        })?;
        let found = {
            let _g = self.lock(slot);
            let t = self.find_tenant(name);
            if let Some(t) = t {
                let e = &self.layout().tenants[t];
                if let Some(v) = share {
                    e.share.store(v.clamp(1, 100), Release);
                }
                if let Some(v) = cap {
                    e.cap.store(v.min(100) % 100, Release);
                }
                if let Some(v) = high {
                    e.priority.store(v as u32, Release);
                }
            }
            t.is_some()
        };
        self.layout().slots[slot].state.store(SLOT_FREE, Release);
        slotfile::release_slot::<Layout>(self.raw_fd(), slot);
        self.own.lock().slot = None;
        Ok(found)
    }

    /// Frees the slots of dead processes (the cleaner holds the dead slot's lock while it does).
    /// First checks the file's size: a truncated file is repaired (`slotfile`), and what this
    /// process had in it (its slot, its tenant) is put back, so arbitration resumes within one
    /// sweep. A fork child does not sweep (it gave up the descriptor the locks are tested on).
    pub fn sweep(&self, me: Option<usize>) {
        if !self.writable() || self.forked() {
            return;
        }
        self.repair();
        let l = self.layout();
        for i in 0..MAX_SLOTS {
            if Some(i) == me || l.slots[i].state.load(Acquire) != SLOT_ACTIVE {
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
        if w.check_size()
            && self.layout().header.prefix.state.load(Acquire) == slotfile::STATE_READY
        {
            return;
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
        if let Some((i, name, share, cap, high)) = &own.tenant {
            let t = &l.tenants[*i];
            if t.state.load(Acquire) != TENANT_READY {
                fill_tenant(t, name, *share, *cap, *high);
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

    /// Finds the tenant `name`, or adds it with these settings. Caller holds the lock.
    pub fn find_or_add_tenant(
        &self,
        _g: &LockGuard<'_>,
        name: &str,
        share: u32,
        cap: u32,
        high: bool,
    ) -> Option<usize> {
        let key = pack(name)?;
        let l = self.layout();
        let mut free = None;
        for (i, t) in l.tenants.iter().enumerate() {
            if t.state.load(Acquire) == TENANT_READY {
                if t.name.iter().zip(&key).all(|(a, b)| a.load(Acquire) == *b) {
                    self.own.lock().tenant = Some((i, name.to_string(), share, cap, high));
                    return Some(i);
                }
            } else if free.is_none() {
                free = Some(i);
            }
        }
        let i = free?;
        fill_tenant(&l.tenants[i], name, share, cap, high);
        self.own.lock().tenant = Some((i, name.to_string(), share, cap, high));
        Some(i)
    }

    /// Finds a tenant by name (admin and status).
    pub fn find_tenant(&self, name: &str) -> Option<usize> {
        let key = pack(name)?;
        self.layout().tenants.iter().position(|t| {
            t.state.load(Acquire) == TENANT_READY
                && t.name.iter().zip(&key).all(|(a, b)| a.load(Acquire) == *b)
        })
    }

    pub fn view(&self, i: usize) -> TenantView {
        let t = &self.layout().tenants[i];
        TenantView {
            share: t.share.load(Acquire),
            cap: t.cap.load(Acquire),
            high: t.priority.load(Acquire) == 1,
            vtime: t.vtime.load(Acquire),
            tokens: t.tokens.load(Acquire),
            refill_ns: t.refill_ns.load(Acquire),
            last_active_ns: t.last_active_ns.load(Acquire),
        }
    }

    fn store_view(&self, i: usize, v: &TenantView) {
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
                        since: s.wait_since.load(Acquire),
                    })
            })
            .filter(|w| w.tenant < MAX_TENANTS)
            .collect()
    }

    fn views(&self) -> Vec<TenantView> {
        (0..MAX_TENANTS).map(|i| self.view(i)).collect()
    }
}

/// Writes a new tenant entry (READY last).
fn fill_tenant(t: &TenantEntry, name: &str, share: u32, cap: u32, high: bool) {
    for (w, v) in t.name.iter().zip(pack(name).unwrap_or_default()) {
        w.store(v, Release);
    }
    t.share.store(share, Release);
    t.cap.store(cap, Release);
    t.priority.store(high as u32, Release);
    t.vtime.store(0, Release);
    t.tokens.store(arbiter::BUCKET_NS, Release);
    t.refill_ns.store(now_ns(), Release);
    t.last_active_ns.store(0, Release);
    t.charged_ns.store(0, Release);
    t.wait_ns.store(0, Release);
    t.state.store(TENANT_READY, Release);
}

/// The held arbitration lock; every decision about ownership is taken under it.
pub struct LockGuard<'a> {
    l: &'a DeviceLedger,
    me: usize,
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        let _ =
            self.l
                .layout()
                .header
                .lock
                .compare_exchange(self.me as u32 + 1, 0, AcqRel, Acquire);
    }
}

impl LockGuard<'_> {
    /// Charges `ns` to tenant `t`.
    pub fn charge(&self, t: usize, ns: u64, now: u64) {
        let mut v = self.l.view(t);
        arbiter::charge(&mut v, ns, now);
        self.l.store_view(t, &v);
        self.l.layout().tenants[t].charged_ns.fetch_add(ns, AcqRel);
    }

    /// Chooses among the waiters and installs the result as the new ownership (bumping the epoch).
    /// Returns the choice; the caller wakes the waiters.
    pub fn hand_over(&self, now: u64) -> Choice {
        let l = self.l.layout();
        let waiters = self.l.waiters(None);
        let mut views = self.l.views();
        let choice = arbiter::choose(&mut views, &waiters, now);
        for w in &waiters {
            self.l.store_view(w.tenant, &views[w.tenant]);
        }
        let h = &l.header;
        match choice {
            Choice::Grant { slot, slice_ns } => {
                h.grant_ns.store(now, Release);
                h.owner_beat_ns.store(now, Release);
                h.slice_ns.store(slice_ns, Release);
                h.owner.store(slot as u32 + 1, Release);
                let t = l.slots[slot].tenant.load(Acquire) as usize;
                if t < MAX_TENANTS && views[t].high {
                    h.preempt.store(0, Release);
                }
            }
            _ => h.owner.store(0, Release),
        }
        let mut e = h.epoch.load(Acquire).wrapping_add(1);
        if e == 0 {
            e = 1;
        }
        h.epoch.store(e, Release);
        h.hand_overs.fetch_add(1, Relaxed);
        choice
    }

    /// Renews the owner's slice in place (nobody else waits). Returns false when its tenant is out of
    /// tokens (it must hand over instead).
    pub fn renew(&self, tenant: usize, now: u64) -> bool {
        let mut v = self.l.view(tenant);
        arbiter::refill(&mut v, now);
        self.l.store_view(tenant, &v);
        let h = &self.l.layout().header;
        if !arbiter::eligible(&v) {
            // Charged up to now already: the release that follows charges only what comes after.
            h.grant_ns.store(now, Release);
            return false;
        }
        h.grant_ns.store(now, Release);
        h.slice_ns.store(arbiter::slice_for(&v), Release);
        true
    }

    /// Takes a history sample when one is due.
    pub fn sample(&self, now: u64) {
        let l = self.l.layout();
        let seq = l.header.sample_seq.load(Acquire);
        let last = l.header.sample_ns[(seq as usize + HISTORY - 1) % HISTORY].load(Acquire);
        if seq != 0 && now.saturating_sub(last) < SAMPLE_NS {
            return;
        }
        let k = seq as usize % HISTORY;
        for t in &l.tenants {
            t.samples[k].store(t.charged_ns.load(Acquire), Release);
        }
        l.header.sample_ns[k].store(now, Release);
        l.header.sample_seq.store(seq + 1, Release);
    }
}

/// Number of history samples kept (for `gpuslice status`).
pub const HISTORY_LEN: usize = HISTORY;

/// The name of tenant `t`.
pub fn tenant_name(l: &DeviceLedger, t: usize) -> String {
    unpack(&l.layout().tenants[t].name)
}
