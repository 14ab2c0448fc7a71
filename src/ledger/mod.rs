//! The ledger: a file in shared memory, mapped by every process of a tenant, holding one memory quota
//! per device that all of them share.
//!
//! * Layout (`shm.rs`): header (magic `GPUSLICE`, layout version, size, state, creator...), a table
//!   of 16 devices (key = GPU UUID, limit, used, peak) and 256 process slots (state, pid, per-device
//!   used). Fixed size, `#[repr(C)]`, made only of atomics.
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

mod shm;
pub(crate) mod sys;

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::config::{canonical_uuid, format_bytes, Config, Limit};
use shm::{Layout, LOCK_BASE, TOTAL_SIZE};
pub use shm::{LAYOUT_VERSION, MAX_DEVICES, MAX_SLOTS, UNLIMITED};

/// How long an opener waits for a ledger another process is still initialising.
const READY_WAIT: Duration = Duration::from_secs(1);
/// Minimum time between two sweeps triggered by refused reservations (per process).
const SWEEP_INTERVAL_MS: u64 = 200;
const NO_SLOT: usize = usize::MAX;

/// A reservation that would exceed the device's limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaExceeded {
    pub requested: u64,
    pub used: u64,
    /// `UNLIMITED` (u64::MAX) = no limit; 0 with nothing used also covers "denied" (bad device,
    /// read-only ledger, invalid configuration).
    pub limit: u64,
}

impl fmt::Display for QuotaExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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

/// Why a ledger could not be opened. Each message names the path; the caller denies allocations.
#[derive(Debug)]
pub enum LedgerError {
    Io {
        path: PathBuf,
        what: &'static str,
        err: io::Error,
    },
    /// The path is a symbolic link (refused: O_NOFOLLOW).
    Symlink {
        path: PathBuf,
    },
    /// Owned by another user and not group-shared, world-writable, or not a regular file.
    Insecure {
        path: PathBuf,
        why: String,
    },
    /// Shorter than a ledger.
    Truncated {
        path: PathBuf,
        size: u64,
        expected: u64,
    },
    BadMagic {
        path: PathBuf,
    },
    WrongVersion {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    Corrupt {
        path: PathBuf,
        what: String,
    },
    /// Still INITIALISING after the wait (its creator probably died).
    NotReady {
        path: PathBuf,
        waited: Duration,
    },
    /// Every process slot is taken by a live process.
    Full {
        path: PathBuf,
    },
}

impl fmt::Display for LedgerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LedgerError::Io { path, what, err } => {
                write!(f, "ledger {}: {what}: {err}", path.display())
            }
            LedgerError::Symlink { path } => write!(
                f,
                "ledger {}: is a symbolic link (refused; point GPUSLICE_LEDGER at the file itself)",
                path.display()
            ),
            LedgerError::Insecure { path, why } => {
                write!(f, "ledger {}: refused: {why}", path.display())
            }
            LedgerError::Truncated {
                path,
                size,
                expected,
            } => write!(
                f,
                "ledger {}: truncated ({size} bytes, a ledger has {expected})",
                path.display()
            ),
            LedgerError::BadMagic { path } => write!(
                f,
                "ledger {}: not a gpuslice ledger (bad magic)",
                path.display()
            ),
            LedgerError::WrongVersion {
                path,
                found,
                expected,
            } => write!(
                f,
                "ledger {}: layout version {found}, this gpuslice uses {expected} (all processes of a tenant must run the same gpuslice)",
                path.display()
            ),
            LedgerError::Corrupt { path, what } => {
                write!(f, "ledger {}: corrupt: {what}", path.display())
            }
            LedgerError::NotReady { path, waited } => write!(
                f,
                "ledger {}: still being initialised after {} ms (its creator probably died; remove the file)",
                path.display(),
                waited.as_millis()
            ),
            LedgerError::Full { path } => write!(
                f,
                "ledger {}: all {MAX_SLOTS} process slots are in use",
                path.display()
            ),
        }
    }
}

impl std::error::Error for LedgerError {}

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
        LedgerOptions {
            tenant: cfg.tenant.clone(),
            default_limit: cfg.default_memory_limit(),
            devices,
            group: cfg.ledger_group.clone(),
        }
    }
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
    pub devices: Vec<DeviceSnapshot>,
    pub processes: Vec<ProcessSnapshot>,
}

/// An open ledger. Thread-safe; cheap to check against on every allocation.
pub struct Ledger {
    path: PathBuf,
    map: sys::Mapping,
    writable: bool,
    created: bool,
    /// Our open file description (owns our slot lock). Replaced after a fork.
    fd: AtomicI32,
    /// Our slot (`NO_SLOT` if none: read-only or admin).
    slot: AtomicUsize,
    /// Process that owns `slot`; differs from getpid() in a fork child until it reattaches.
    owner_pid: AtomicU32,
    /// `sys::forks_seen()` when `owner_pid` was last checked.
    forks_seen: AtomicU32,
    /// A sweep is running in this process (sweeps share one OFD, so they must not overlap).
    sweeping: AtomicBool,
    last_sweep_ms: AtomicU64,
    warned_underflow: AtomicBool,
    /// Keeps the fd open: closing it would drop our lock. Only touched at open, fork and drop.
    fds: parking_lot::Mutex<Vec<OwnedFd>>,
}

fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn io_err<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(io::Error) -> LedgerError + 'a {
    move |err| {
        if err.raw_os_error() == Some(libc::ELOOP) {
            LedgerError::Symlink {
                path: path.to_path_buf(),
            }
        } else {
            LedgerError::Io {
                path: path.to_path_buf(),
                what,
                err,
            }
        }
    }
}

impl Ledger {
    /// Joins the ledger at `path`, creating it with `opts` if it does not exist, and claims a
    /// process slot. A joiner ignores `opts` except to find its devices: the ledger's limits rule.
    pub fn open(path: &Path, opts: &LedgerOptions) -> Result<Ledger, LedgerError> {
        let ledger = match sys::open(path, libc::O_RDWR, 0) {
            Ok(fd) => Self::join(path, fd, true)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Self::create(path, opts)?,
            Err(e) => return Err(io_err(path, "open")(e)),
        };
        if !ledger.created {
            // Devices the creator did not know: the joiner adds them with the creator's default.
            for (uuid, _) in &opts.devices {
                ledger.device_index(uuid);
            }
        }
        ledger.sweep();
        ledger.claim()?;
        ledger.owner_pid.store(sys::getpid(), Ordering::Release);
        Ok(ledger)
    }

    /// Opens an existing ledger read-write without claiming a slot (admin: `gpuslice set`).
    pub fn open_existing(path: &Path) -> Result<Ledger, LedgerError> {
        let fd = sys::open(path, libc::O_RDWR, 0).map_err(io_err(path, "open"))?;
        Self::join(path, fd, true)
    }

    /// Opens an existing ledger read-only, without a slot (`gpuslice status`).
    pub fn open_readonly(path: &Path) -> Result<Ledger, LedgerError> {
        let fd = sys::open(path, libc::O_RDONLY, 0).map_err(io_err(path, "open"))?;
        Self::join(path, fd, false)
    }

    fn new(path: &Path, fd: OwnedFd, map: sys::Mapping, writable: bool, created: bool) -> Ledger {
        // A mapping keeps the description it was made from open in every fork child, and OFD locks
        // live as long as their description: slot locks go on a description that is never mapped,
        // which a fork child gives up (`sys::guard_slot_fd`).
        let fd = sys::reopen(&fd, writable).unwrap_or(fd);
        Ledger {
            path: path.to_path_buf(),
            map,
            writable,
            created,
            fd: AtomicI32::new(fd.as_raw_fd()),
            slot: AtomicUsize::new(NO_SLOT),
            owner_pid: AtomicU32::new(sys::getpid()),
            forks_seen: AtomicU32::new({
                sys::count_forks();
                sys::forks_seen()
            }),
            sweeping: AtomicBool::new(false),
            last_sweep_ms: AtomicU64::new(0),
            warned_underflow: AtomicBool::new(false),
            fds: parking_lot::Mutex::new(vec![fd]),
        }
    }

    fn create(path: &Path, opts: &LedgerOptions) -> Result<Ledger, LedgerError> {
        let dir = path.parent().unwrap_or(Path::new("/"));
        let name = path
            .file_name()
            .ok_or_else(|| LedgerError::Corrupt {
                path: path.to_path_buf(),
                what: "not a file path".into(),
            })?
            .to_string_lossy()
            .into_owned();
        let gid = match &opts.group {
            Some(g) => Some(sys::group_id(g).map_err(io_err(path, "GPUSLICE_LEDGER_GROUP"))?),
            None => None,
        };
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(if gid.is_some() { 0o770 } else { 0o700 })
                .create(dir)
                .map_err(io_err(path, "creating its directory"))?;
            let dir_fd = sys::open(dir, libc::O_RDONLY | libc::O_DIRECTORY, 0)
                .map_err(io_err(path, "opening its directory"))?;
            if let Some(g) = gid {
                // umask may have removed group bits; the group must be able to create the file too.
                sys::fchown_group(&dir_fd, g).map_err(io_err(path, "chown of its directory"))?;
                sys::fchmod(&dir_fd, 0o770).map_err(io_err(path, "chmod of its directory"))?;
            }
        }
        let tmp = dir.join(format!(
            ".{name}.{}.{}.tmp",
            sys::getpid(),
            unix_ms() ^ (now_ms() << 20)
        ));
        let mode = if gid.is_some() { 0o660 } else { 0o600 };
        let fd = sys::open(&tmp, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, mode)
            .map_err(io_err(path, "creating a temporary file beside it"))?;
        // Everything else happens under the temporary name; remove it whatever the outcome.
        let result = (|| {
            sys::fchmod(&fd, mode).map_err(io_err(path, "chmod"))?;
            if let Some(g) = gid {
                sys::fchown_group(&fd, g)
                    .map_err(io_err(path, "chown to GPUSLICE_LEDGER_GROUP"))?;
            }
            sys::ftruncate(&fd, TOTAL_SIZE as u64).map_err(io_err(path, "ftruncate"))?;
            let map = sys::Mapping::new(&fd, true).map_err(io_err(path, "mmap"))?;
            let l = map.layout();
            let (dl, df) = stored(&opts.default_limit);
            l.initialise(sys::getpid(), unix_ms(), &opts.tenant, dl, df);
            for (uuid, limit) in &opts.devices {
                let (b, f) = stored(limit);
                if let Some(key) = device_key(uuid) {
                    l.find_or_add_device(&key, b, f, 0);
                }
            }
            l.publish();
            match sys::publish(&tmp, path) {
                Ok(()) => Ok(Some(map)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(None),
                Err(e) => Err(io_err(path, "publishing (link)")(e)),
            }
        })();
        let _ = std::fs::remove_file(&tmp);
        match result? {
            Some(map) => Ok(Self::new(path, fd, map, true, true)),
            // Someone else created it first: theirs is the ledger, with their limits.
            None => {
                drop(fd);
                let fd = sys::open(path, libc::O_RDWR, 0).map_err(io_err(path, "open"))?;
                Self::join(path, fd, true)
            }
        }
    }

    /// Validates an existing file (waiting for READY) and maps it.
    fn join(path: &Path, fd: OwnedFd, writable: bool) -> Result<Ledger, LedgerError> {
        let p = || path.to_path_buf();
        let st = sys::fstat(&fd).map_err(io_err(path, "fstat"))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(LedgerError::Insecure {
                path: p(),
                why: "not a regular file".into(),
            });
        }
        if st.st_mode & 0o002 != 0 {
            return Err(LedgerError::Insecure {
                path: p(),
                why: "world-writable".into(),
            });
        }
        // Anyone may look (read-only); only the owner or a sharing group may take part.
        if writable && st.st_uid != sys::geteuid() {
            let group_shared = st.st_mode & 0o060 == 0o060 && sys::in_group(st.st_gid);
            if !group_shared {
                return Err(LedgerError::Insecure {
                    path: p(),
                    why: format!(
                        "owned by uid {} (not us, {}) and not shared with one of our groups (mode 0660 via GPUSLICE_LEDGER_GROUP)",
                        st.st_uid,
                        sys::geteuid()
                    ),
                });
            }
        }
        let start = Instant::now();
        loop {
            let size = sys::fstat(&fd).map_err(io_err(path, "fstat"))?.st_size as u64;
            let mut h = [0u8; shm::HEADER_SIZE];
            let n = sys::pread(&fd, &mut h, 0).map_err(io_err(path, "read"))?;
            if n < shm::HEADER_SIZE {
                return Err(LedgerError::Truncated {
                    path: p(),
                    size,
                    expected: TOTAL_SIZE as u64,
                });
            }
            use shm::raw::*;
            if h[MAGIC_AT..MAGIC_AT + 8] != shm::MAGIC {
                return Err(LedgerError::BadMagic { path: p() });
            }
            let version = u32_at(&h, VERSION_AT);
            if version != LAYOUT_VERSION {
                return Err(LedgerError::WrongVersion {
                    path: p(),
                    found: version,
                    expected: LAYOUT_VERSION,
                });
            }
            match u32_at(&h, STATE_AT) {
                shm::STATE_READY => {}
                shm::STATE_INITIALISING if start.elapsed() < READY_WAIT => {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                shm::STATE_INITIALISING => {
                    return Err(LedgerError::NotReady {
                        path: p(),
                        waited: start.elapsed(),
                    })
                }
                s => {
                    return Err(LedgerError::Corrupt {
                        path: p(),
                        what: format!("state word {s:#010x}"),
                    })
                }
            }
            let checks: [(&str, u64, u64); 6] = [
                (
                    "header size",
                    u32_at(&h, HEADER_SIZE_AT) as u64,
                    shm::HEADER_SIZE as u64,
                ),
                (
                    "device count",
                    u32_at(&h, MAX_DEVICES_AT) as u64,
                    MAX_DEVICES as u64,
                ),
                (
                    "slot count",
                    u32_at(&h, MAX_SLOTS_AT) as u64,
                    MAX_SLOTS as u64,
                ),
                (
                    "device table offset",
                    u64_at(&h, DEVICE_TABLE_AT),
                    shm::DEVICE_TABLE_OFFSET as u64,
                ),
                (
                    "slot table offset",
                    u64_at(&h, SLOT_TABLE_AT),
                    shm::SLOT_TABLE_OFFSET as u64,
                ),
                (
                    "declared size",
                    u64_at(&h, TOTAL_SIZE_AT),
                    TOTAL_SIZE as u64,
                ),
            ];
            for (what, found, want) in checks {
                if found != want {
                    return Err(LedgerError::Corrupt {
                        path: p(),
                        what: format!("{what} is {found}, expected {want}"),
                    });
                }
            }
            if size < TOTAL_SIZE as u64 {
                return Err(LedgerError::Truncated {
                    path: p(),
                    size,
                    expected: TOTAL_SIZE as u64,
                });
            }
            if size != TOTAL_SIZE as u64 {
                return Err(LedgerError::Corrupt {
                    path: p(),
                    what: format!("file is {size} bytes, its header declares {TOTAL_SIZE}"),
                });
            }
            break;
        }
        let map = sys::Mapping::new(&fd, writable).map_err(io_err(path, "mmap"))?;
        let l = map.layout();
        for d in 0..MAX_DEVICES {
            let s = l.device_state(d);
            if s > shm::DEV_READY {
                return Err(LedgerError::Corrupt {
                    path: p(),
                    what: format!("device entry {d} has state {s:#x}"),
                });
            }
        }
        for i in 0..MAX_SLOTS {
            let s = l.slot_state(i);
            if s > shm::SLOT_RECLAIMING {
                return Err(LedgerError::Corrupt {
                    path: p(),
                    what: format!("process slot {i} has state {s:#x}"),
                });
            }
        }
        Ok(Self::new(path, fd, map, writable, false))
    }

    fn layout(&self) -> &Layout {
        self.map.layout()
    }

    fn raw_fd(&self) -> RawFd {
        self.fd.load(Ordering::Acquire)
    }

    /// Claims a free slot (taking its lock first, so no cleaner can mistake it for dead).
    fn claim(&self) -> Result<(), LedgerError> {
        let fd = self.raw_fd();
        let l = self.layout();
        for i in 0..MAX_SLOTS {
            if l.slot_state(i) != shm::SLOT_FREE {
                continue;
            }
            if !matches!(sys::try_lock(fd, LOCK_BASE + i as u64), Ok(true)) {
                continue;
            }
            if l.claim_slot(i, sys::getpid(), unix_ms()) {
                self.slot.store(i, Ordering::Release);
                sys::guard_slot_fd(fd);
                return Ok(());
            }
            sys::unlock(fd, LOCK_BASE + i as u64);
        }
        Err(LedgerError::Full {
            path: self.path.clone(),
        })
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
    pub fn try_reserve(&self, dev: usize, bytes: u64) -> Result<(), QuotaExceeded> {
        let deny = QuotaExceeded {
            requested: bytes,
            used: 0,
            limit: 0,
        };
        if !self.writable || dev >= MAX_DEVICES {
            return Err(deny);
        }
        self.check_fork();
        let l = self.layout();
        if l.device_state(dev) != shm::DEV_READY {
            return Err(deny);
        }
        let refused = match l.reserve(dev, bytes) {
            Ok(_) => {
                self.charge_slot(dev, bytes);
                return Ok(());
            }
            Err(r) => r,
        };
        let now = now_ms();
        let last = self.last_sweep_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= SWEEP_INTERVAL_MS
            && self
                .last_sweep_ms
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            && self.sweep() > 0
            && l.reserve(dev, bytes).is_ok()
        {
            self.charge_slot(dev, bytes);
            return Ok(());
        }
        Err(QuotaExceeded {
            requested: bytes,
            used: refused.used,
            limit: refused.limit,
        })
    }

    fn charge_slot(&self, dev: usize, bytes: u64) {
        if let Some(s) = self.slot() {
            self.layout().slot_add(s, dev, bytes);
        }
    }

    /// Gives back `bytes` on `dev` (after a free, or to roll back a reservation the driver then
    /// refused). Saturating: more than was recorded is clamped, and reported once.
    pub fn release(&self, dev: usize, bytes: u64) {
        if !self.writable || dev >= MAX_DEVICES {
            return;
        }
        self.check_fork();
        let l = self.layout();
        // Slot first: dying between the two leaves the device over-counted (fails closed), never under.
        let mut short = 0;
        if let Some(s) = self.slot() {
            short = l.slot_sub(s, dev, bytes);
        }
        let dev_short = l.release(dev, bytes);
        if (short > 0 || dev_short > 0) && !self.warned_underflow.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                ledger = %self.path.display(),
                device = dev,
                bytes,
                "gpuslice: released more memory than was recorded (clamped at 0; reported once)"
            );
        }
    }

    /// Reclaims the slots of dead processes; returns how many. Never waits on another process.
    pub fn sweep(&self) -> usize {
        if !self.writable || self.sweeping.swap(true, Ordering::AcqRel) {
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
            let off = LOCK_BASE + i as u64;
            if let Ok(true) = sys::try_lock(fd, off) {
                // Its holder is gone (the kernel dropped its lock): we alone hold it now.
                if l.reclaim_slot(i) {
                    n += 1;
                }
                sys::unlock(fd, off);
            }
        }
        self.sweeping.store(false, Ordering::Release);
        if n > 0 {
            tracing::info!(ledger = %self.path.display(), slots = n, "gpuslice: reclaimed dead processes' memory");
        }
        n
    }

    fn check_fork(&self) {
        // getpid() is a system call (glibc no longer caches it): compare it only after a fork.
        if sys::forks_seen() == self.forks_seen.load(Ordering::Relaxed) {
            return;
        }
        self.forks_seen.store(sys::forks_seen(), Ordering::Relaxed);
        if self.owner_pid.load(Ordering::Acquire) != sys::getpid() && self.slot().is_some() {
            if let Err(e) = self.reattach_after_fork() {
                tracing::error!("gpuslice: {e}");
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
        let fd = sys::open(&self.path, libc::O_RDWR, 0)
            .map_err(io_err(&self.path, "reopen after fork"))?;
        // Locks taken by other threads of the parent at fork time do not matter in the child.
        self.sweeping.store(false, Ordering::Release);
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
        self.claim()
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
            })
            .collect();
        let me = self.slot();
        let processes = (0..MAX_SLOTS)
            .filter(|&i| l.slot_state(i) != shm::SLOT_FREE)
            .map(|i| ProcessSnapshot {
                slot: i,
                pid: l.slot_pid(i),
                alive: Some(i) == me || sys::is_locked(fd, LOCK_BASE + i as u64).unwrap_or(true),
                used: (0..MAX_DEVICES)
                    .map(|d| (d, l.slot_used(i, d)))
                    .filter(|&(_, n)| n > 0)
                    .collect(),
            })
            .collect();
        Snapshot {
            path: self.path.clone(),
            tenant: l.tenant(),
            creator_pid: l.creator_pid(),
            default_limit: l.default_limit().0,
            reclaims: l.reclaims(),
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
                sys::unlock(self.raw_fd(), LOCK_BASE + s as u64);
            }
        }
    }
}

#[cfg(test)]
mod tests;
