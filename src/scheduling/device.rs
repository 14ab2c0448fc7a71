//! One device ledger, mapped: creation and validation (the memory ledger's file primitives: no-follow
//! open, publish by `link`, OFD locks), the arbitration lock, tenants and process slots, liveness.

use super::arbiter::{self, TenantView, Waiter};

pub use super::lock::LockGuard;
use super::shm::*;
use crate::ledger::sys;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering::*};

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
    Io(PathBuf, &'static str, io::Error),
    Invalid(PathBuf, String),
}

impl std::fmt::Display for DeviceLedgerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io(p, what, e) => write!(f, "device ledger {}: {what}: {e}", p.display()),
            Self::Invalid(p, why) => write!(f, "device ledger {}: {why}", p.display()),
        }
    }
}

/// The device ledger of GPU `uuid` in `dir`.
pub fn path_for(dir: &Path, uuid: &str) -> PathBuf {
    dir.join(format!("{uuid}.dev"))
}

struct Map(NonNull<Layout>);
// SAFETY: shared memory made only of atomics.
unsafe impl Send for Map {}
// SAFETY: as above.
unsafe impl Sync for Map {}

impl Map {
    fn new(fd: &OwnedFd, writable: bool) -> io::Result<Map> {
        crate::ledger::sys::map_shared(fd, TOTAL_SIZE, writable).map(|p| Map(p.cast()))
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped; no reference outlives `self`.
        unsafe { libc::munmap(self.0.as_ptr().cast(), TOTAL_SIZE) };
    }
}

/// A mapped device ledger.
pub struct DeviceLedger {
    path: PathBuf,
    map: Map,
    fd: OwnedFd,
    pub writable: bool,
}

impl DeviceLedger {
    /// Opens the ledger at `path`; creates it (directory included) when `create` and it is missing.
    pub fn open(path: &Path, uuid: &str, create: bool) -> Result<DeviceLedger, DeviceLedgerError> {
        let io_err = |what| move |e| DeviceLedgerError::Io(path.to_path_buf(), what, e);
        match sys::open(path, libc::O_RDWR, 0) {
            Ok(fd) => Self::join(path, fd, true),
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                let dir = path.parent().unwrap_or(Path::new("/"));
                std::fs::create_dir_all(dir).map_err(io_err("creating its directory"))?;
                let tmp = dir.join(format!(".{}.{}.tmp", sys::getpid(), now_ns()));
                let fd = sys::open(&tmp, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o600)
                    .map_err(io_err("creating a temporary file beside it"))?;
                let result = (|| {
                    sys::ftruncate(&fd, TOTAL_SIZE as u64).map_err(io_err("ftruncate"))?;
                    let map = Map::new(&fd, true).map_err(io_err("mmap"))?;
                    // SAFETY: the mapping lives in `map`, which outlives this reference.
                    let l = unsafe { map.0.as_ref() };
                    l.header.magic.store(u64::from_le_bytes(MAGIC), Relaxed);
                    l.header.version.store(VERSION, Relaxed);
                    l.header.total_size.store(TOTAL_SIZE as u64, Relaxed);
                    l.header.epoch.store(1, Relaxed);
                    for (w, v) in l.header.uuid.iter().zip(pack(uuid).unwrap_or_default()) {
                        w.store(v, Relaxed);
                    }
                    l.header.state.store(STATE_READY, Release);
                    match sys::publish(&tmp, path) {
                        Ok(()) => Ok(true),
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
                        Err(e) => Err(io_err("publishing (link)")(e)),
                    }
                })();
                let _ = std::fs::remove_file(&tmp);
                if result? {
                    Self::join(path, fd, true)
                } else {
                    let fd = sys::open(path, libc::O_RDWR, 0).map_err(io_err("open"))?;
                    Self::join(path, fd, true)
                }
            }
            Err(e) => Err(io_err("open")(e)),
        }
    }

    /// Opens an existing ledger read-only (`gpuslice status`).
    pub fn open_readonly(path: &Path) -> Result<DeviceLedger, DeviceLedgerError> {
        let fd = sys::open(path, libc::O_RDONLY, 0)
            .map_err(|e| DeviceLedgerError::Io(path.to_path_buf(), "open", e))?;
        Self::join(path, fd, false)
    }

    fn join(path: &Path, fd: OwnedFd, writable: bool) -> Result<DeviceLedger, DeviceLedgerError> {
        let bad = |why: String| DeviceLedgerError::Invalid(path.to_path_buf(), why);
        let st =
            sys::fstat(&fd).map_err(|e| DeviceLedgerError::Io(path.to_path_buf(), "fstat", e))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_mode & 0o002 != 0 {
            return Err(bad("not a regular file, or world-writable".into()));
        }
        if st.st_size as u64 != TOTAL_SIZE as u64 {
            return Err(bad(format!(
                "file is {} bytes, expected {TOTAL_SIZE} (truncated, or another layout version)",
                st.st_size
            )));
        }
        let map = Map::new(&fd, writable)
            .map_err(|e| DeviceLedgerError::Io(path.to_path_buf(), "mmap", e))?;
        let l = DeviceLedger {
            path: path.to_path_buf(),
            map,
            fd,
            writable,
        };
        if writable {
            // A child forked without exec must not hold our slot locks (it would keep a dead
            // parent's slot alive).
            sys::guard_slot_fd(l.raw_fd());
        }
        let h = &l.layout().header;
        if h.magic.load(Acquire) != u64::from_le_bytes(MAGIC) {
            return Err(bad("bad magic (not a gpuslice device ledger)".into()));
        }
        if h.version.load(Acquire) != VERSION {
            return Err(bad(format!(
                "layout version {}, expected {VERSION}",
                h.version.load(Acquire)
            )));
        }
        if h.state.load(Acquire) != STATE_READY {
            return Err(bad("not initialised".into()));
        }
        Ok(l)
    }

    pub fn layout(&self) -> &Layout {
        // SAFETY: the mapping is TOTAL_SIZE bytes, page-aligned, lives as long as `self`, and is made
        // only of atomics (every bit pattern valid, shared mutation allowed). A read-only mapping is
        // only loaded from (`writable` guards every store path).
        unsafe { self.map.0.as_ref() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn uuid(&self) -> String {
        unpack(&self.layout().header.uuid)
    }

    pub(super) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Whether the process holding `slot` is alive (another open file description holds its lock).
    pub fn slot_alive(&self, slot: usize, mine: Option<usize>) -> bool {
        if Some(slot) == mine {
            return true;
        }
        sys::is_locked(self.raw_fd(), LOCK_BASE + slot as u64).unwrap_or(true)
    }

    /// Claims a free process slot for `tenant` (its lock first, so nobody mistakes it for dead).
    pub fn claim_slot(&self, tenant: usize) -> Option<usize> {
        let l = self.layout();
        for i in 0..MAX_SLOTS {
            let s = &l.slots[i];
            if s.state.load(Acquire) != SLOT_FREE {
                continue;
            }
            if !matches!(sys::try_lock(self.raw_fd(), LOCK_BASE + i as u64), Ok(true)) {
                continue;
            }
            if s.state
                .compare_exchange(SLOT_FREE, SLOT_ACTIVE, AcqRel, Acquire)
                .is_ok()
            {
                s.tenant.store(tenant as u32, Release);
                s.pid.store(sys::getpid(), Release);
                s.wants.store(0, Release);
                s.wait_since.store(0, Release);
                s.beat_ns.store(now_ns(), Release);
                return Some(i);
            }
            sys::unlock(self.raw_fd(), LOCK_BASE + i as u64);
        }
        None
    }

    /// Frees the slots of dead processes (the cleaner holds the dead slot's lock while it does).
    pub fn sweep(&self, me: Option<usize>) {
        let l = self.layout();
        for i in 0..MAX_SLOTS {
            // Any state but FREE counts: a scribbled state word must not keep a slot forever.
            if Some(i) == me || l.slots[i].state.load(Acquire) == SLOT_FREE {
                continue;
            }
            if matches!(sys::try_lock(self.raw_fd(), LOCK_BASE + i as u64), Ok(true)) {
                let s = &l.slots[i];
                s.wants.store(0, Release);
                s.wait_since.store(0, Release);
                s.state.store(SLOT_FREE, Release);
                sys::unlock(self.raw_fd(), LOCK_BASE + i as u64);
            }
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
        let label = pack_truncated(label);
        let mut free = None;
        for (i, t) in l.tenants.iter().enumerate() {
            if t.state.load(Acquire) == TENANT_READY {
                if TenantId::load(&t.id) == id {
                    for (w, v) in t.name.iter().zip(label) {
                        w.store(v, Release);
                    }
                    return Some(i);
                }
            } else if free.is_none() {
                free = Some(i);
            }
        }
        let i = free.or_else(|| self.unused_tenant())?;
        self.install_tenant(i, id, label, share, cap, high);
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

    /// Writes a fresh tenant entry `i`. Caller holds the lock.
    pub fn install_tenant(
        &self,
        i: usize,
        id: TenantId,
        label: [u64; 8],
        share: u32,
        cap: u32,
        high: bool,
    ) {
        let Some(t) = self.layout().tenants.get(i) else {
            return;
        };
        t.state.store(0, Release);
        id.store(&t.id);
        for (w, v) in t.name.iter().zip(label) {
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
        let cap = t.cap.load(Acquire);
        TenantView {
            share: t.share.load(Acquire).clamp(1, arbiter::MAX_SHARE),
            cap: if cap >= 100 { 0 } else { cap },
            high: PriorityClass::from_word(t.priority.load(Acquire)) == PriorityClass::High,
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
        self.layout().tenants.get(i).is_some_and(|t| {
            PriorityClass::from_word(t.priority.load(Acquire)) == PriorityClass::High
        })
    }

    pub(super) fn store_view(&self, i: usize, v: &TenantView) {
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

    pub(super) fn views(&self) -> Vec<TenantView> {
        (0..MAX_TENANTS).map(|i| self.view(i)).collect()
    }
}

/// Number of history samples kept (for `gpuslice status`).
pub const HISTORY_LEN: usize = HISTORY;

/// The label of tenant `t`.
pub fn tenant_name(l: &DeviceLedger, t: usize) -> String {
    unpack(&l.layout().tenants[t % MAX_TENANTS].name)
}
