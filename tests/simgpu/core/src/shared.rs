//! The state file every simgpu process on the machine shares: device memory, execution turns,
//! per-process and per-group figures.
//!
//! Creation: the first process builds a complete file under a temporary name and hard-links it into
//! place (`link` fails if someone else won), so an opener never sees half a file. The creator's
//! configuration (device count, capacity, concurrent kernels, time slice) is the file's for its
//! whole life: a later process's `SIMGPU_DEVICES`/`SIMGPU_MEMORY`/`SIMGPU_CONCURRENT_KERNELS`/
//! `SIMGPU_TIMESLICE_US` are ignored.
//!
//! Liveness is by OFD byte-range lock, not by PID: a registered process holds a write lock on its
//! slot's byte through a descriptor it never closes; the kernel drops the lock when the process dies
//! (or execs), and a slot whose byte nobody holds is dead. Dead slots are swept (their memory returned
//! to the device) when a process registers and when a reservation fails (at most every 100 ms).

use crate::config::Config;
use crate::layout::*;
use crate::sys::{self, Mapping};
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, IntoRawFd, RawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize};
use std::time::Duration;

#[path = "exec.rs"]
mod exec;
pub use exec::{DeviceTurn, KernelRun, Submission, Work};

/// Least spacing between sweeps triggered by failed reservations.
const SWEEP_SPACING_NS: u64 = 10_000_000;
/// Utilization window (NVML's "past sample period").
pub const UTILIZATION_WINDOW_NS: u64 = 1_000_000_000;

/// One process's usage; vectors indexed by device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessUsage {
    pub pid: u32,
    pub group: String,
    pub used: Vec<u64>,
    pub peak: Vec<u64>,
    pub busy_ns: Vec<u64>,
    pub kernels: Vec<u64>,
    pub contexts: Vec<u64>,
}

/// A process's accounting-mode record on one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AccountingRecord {
    pub pid: u32,
    pub running: bool,
    /// When it registered, and when it was found dead (0 while it runs); realtime ns.
    pub start_ns: u64,
    pub end_ns: u64,
    /// The most memory it held on the device.
    pub max_memory: u64,
    /// Its kernels' busy time on the device (union).
    pub busy_ns: u64,
    /// From its start to its end (or to now, while it runs).
    pub lifetime_ns: u64,
}

/// A read-only view of a state file.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub devices: Vec<DeviceSnapshot>,
    pub processes: Vec<ProcessUsage>,
    pub groups: Vec<GroupUsage>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceSnapshot {
    pub capacity: u64,
    pub used: u64,
    /// Time during which at least one kernel ran (never more than wall time).
    pub busy_ns: u64,
    pub kernels: u64,
    /// Time-slice context switches (a running context made to yield to another's waiting kernel).
    pub switches: u64,
    /// The context the device serves now (simgpu's tag; 0: idle) and its kernels running now.
    pub serving: u64,
    pub running: u32,
    /// Kernels queued or running now, by process id (for "who waits on what" reports).
    pub queued: Vec<(u32, u32)>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupUsage {
    pub name: String,
    pub used: Vec<u64>,
    pub peak: Vec<u64>,
    pub busy_ns: Vec<u64>,
}

/// A mapped state file, and this process's registration in it.
pub struct Shared {
    map: Mapping,
    /// The descriptor the file was opened with. It never holds a lock, so `F_OFD_GETLK` through it
    /// sees every process's locks, this process's own included.
    file: File,
    path: PathBuf,
    group: String,
    devices: u32,
    concurrent: u32,
    /// Context time slice (0: none).
    timeslice_ns: u64,
    /// (pid, context tag) of the context [`Shared::acquire_device`] turns belong to.
    process_context: std::sync::Mutex<(u32, u64)>,
    /// pid << 32 | slot of the current registration (`u32::MAX` slot: registration failed).
    registration: AtomicU64,
    /// pid of the process in which a thread is registering (0: none); a parent's value seen in a
    /// forked child is stale and taken over.
    registering: AtomicU32,
    /// Index into `sys::REGISTRATION_FDS` of this instance's registration descriptor.
    fd_index: Option<usize>,
}

fn err(path: &Path, what: impl std::fmt::Display) -> String {
    format!("simgpu state {}: {what}", path.display())
}

pub(crate) fn sub_saturating(a: &AtomicU64, n: u64) {
    let _ = a.fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(n)));
}

/// Reads and checks a state file's header; the file must be a complete simgpu state of this layout.
fn validate(file: &File, path: &Path) -> Result<(), String> {
    let mut head = [0u8; 16];
    let len = file.metadata().map_err(|e| err(path, e))?.len();
    if len < 16 || file.read_exact_at(&mut head, 0).is_err() {
        return Err(err(path, format!("not a simgpu state file ({len} bytes)")));
    }
    let magic = u64::from_le_bytes(head[..8].try_into().unwrap_or_default());
    let version = u32::from_le_bytes(head[8..12].try_into().unwrap_or_default());
    let devices = u32::from_le_bytes(head[12..16].try_into().unwrap_or_default());
    if magic != MAGIC {
        return Err(err(path, "not a simgpu state file (bad magic)"));
    }
    if version != LAYOUT_VERSION {
        return Err(err(
            path,
            format!("layout version {version}, this simgpu reads {LAYOUT_VERSION}"),
        ));
    }
    if len != STATE_SIZE as u64 {
        return Err(err(path, format!("size {len}, expected {STATE_SIZE}")));
    }
    if devices == 0 || devices as usize > MAX_DEVICES {
        return Err(err(path, format!("corrupt: {devices} devices")));
    }
    Ok(())
}

/// Another open file description of `file`: a lock through it is distinct from locks through `file`.
fn reopen(file: &File, path: &Path) -> Result<File, String> {
    let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(&proc_path)
        .or_else(|_| OpenOptions::new().read(true).write(true).open(path))
        .map_err(|e| err(path, e))
}

impl Shared {
    /// Maps the state file at `path`, creating it from `config` if it does not exist. Does not
    /// register this process (that happens on first use, or with [`Shared::register`]).
    pub fn open(path: &Path, config: &Config) -> Result<Shared, String> {
        for _ in 0..200 {
            match OpenOptions::new().read(true).write(true).open(path) {
                Ok(file) => return Self::from_file(file, path, config),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if let Some(file) = Self::create(path, config)? {
                        return Self::from_file(file, path, config);
                    }
                    // Lost the race to another creator: open theirs.
                }
                Err(e) => return Err(err(path, e)),
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Err(err(path, "could not open or create"))
    }

    /// Builds a complete file under a temporary name and links it to `path`; `None` if another
    /// process created `path` first.
    fn create(path: &Path, config: &Config) -> Result<Option<File>, String> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let name = path
            .file_name()
            .ok_or_else(|| err(path, "not a file path"))?;
        let tmp = path.with_file_name(format!(
            "{}.tmp.{}.{}.{}",
            name.to_string_lossy(),
            std::process::id(),
            SEQ.fetch_add(1, Relaxed),
            sys::realtime_ns()
        ));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o666)
            .open(&tmp)
            .map_err(|e| err(&tmp, e))?;
        let result = (|| {
            // Regardless of umask: every process (container) on the machine shares the file.
            file.set_permissions(std::fs::Permissions::from_mode(0o666))
                .map_err(|e| err(&tmp, e))?;
            file.set_len(STATE_SIZE as u64).map_err(|e| err(&tmp, e))?;
            let map = Mapping::map(file.as_raw_fd(), true).map_err(|e| err(&tmp, e))?;
            let st = map.state();
            let gpus = config.devices.clamp(1, MAX_DEVICES as u32);
            let placements = crate::mig::placements(gpus, config.memory, &config.mig);
            let devices = placements.len() as u32;
            let t = &st.topology;
            t.gpus.store(gpus, Relaxed);
            for m in t.gpu_memory.iter().take(gpus as usize) {
                m.store(config.memory, Relaxed);
            }
            for (d, p) in placements.iter().enumerate() {
                t.device_gpu[d].store(p.gpu, Relaxed);
                t.device_instance[d].store(p.instance.map_or(0, |i| i + 1), Relaxed);
            }
            let h = &st.header;
            h.devices.store(devices, Relaxed);
            h.file_size.store(STATE_SIZE as u64, Relaxed);
            h.concurrent_kernels
                .store(config.concurrent_kernels.max(1), Relaxed);
            h.timeslice_ns.store(config.timeslice_ns, Relaxed);
            h.driver_version
                .store(config.driver_version as u32, Relaxed);
            h.created_ns.store(sys::realtime_ns(), Relaxed);
            for (d, p) in st.devices.iter().zip(&placements) {
                d.capacity.store(p.memory, Relaxed);
            }
            h.layout_version.store(LAYOUT_VERSION, Release);
            h.magic.store(MAGIC, Release);
            // What the kernel driver shows of these devices, before anyone can use them.
            if let Some(root) = &config.nvidia_root {
                crate::caps::populate(root, &placements).map_err(|e| err(root, e))?;
            }
            Ok::<(), String>(())
        })();
        let linked = result.and_then(|()| match std::fs::hard_link(&tmp, path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(err(path, e)),
        });
        let _ = std::fs::remove_file(&tmp);
        Ok(linked?.then_some(file))
    }

    fn from_file(file: File, path: &Path, config: &Config) -> Result<Shared, String> {
        validate(&file, path)?;
        let map = Mapping::map(file.as_raw_fd(), true).map_err(|e| err(path, e))?;
        let h = &map.state().header;
        let devices = h.devices.load(Acquire).clamp(1, MAX_DEVICES as u32);
        let concurrent = h.concurrent_kernels.load(Acquire).clamp(1, TURNS as u32);
        let timeslice_ns = h.timeslice_ns.load(Acquire);
        sys::install_fork_handler();
        static NEXT_FD_INDEX: AtomicUsize = AtomicUsize::new(0);
        let i = NEXT_FD_INDEX.fetch_add(1, Relaxed);
        Ok(Shared {
            map,
            file,
            path: path.to_owned(),
            group: config.group.clone(),
            devices,
            concurrent,
            timeslice_ns,
            process_context: std::sync::Mutex::new((0, 0)),
            registration: AtomicU64::new(0),
            registering: AtomicU32::new(0),
            fd_index: (i < sys::REGISTRATION_FDS.len()).then_some(i),
        })
    }

    fn st(&self) -> &State {
        self.map.state()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Devices in the state file (decided by its creator).
    pub fn device_count(&self) -> u32 {
        self.devices
    }

    /// Kernels of one context a device runs at once (decided by the file's creator).
    pub fn concurrent_kernels(&self) -> u32 {
        self.concurrent
    }

    fn device(&self, device: u32) -> Option<&Device> {
        (device < self.devices).then(|| &self.st().devices[device as usize])
    }

    // ---- registration and liveness -------------------------------------------------------------

    /// Registers this process (idempotent; a forked child gets its own slot). Returns the slot.
    pub fn register(&self) -> Result<usize, String> {
        self.slot()
            .ok_or_else(|| err(&self.path, "no free process slot"))
    }

    /// This process's slot, registering on first use.
    fn slot(&self) -> Option<usize> {
        let pid = std::process::id();
        loop {
            let r = self.registration.load(Acquire);
            if (r >> 32) as u32 == pid {
                let s = r as u32;
                return (s != u32::MAX).then_some(s as usize);
            }
            let cur = self.registering.load(Acquire);
            if cur == pid {
                // Another thread of this process is registering.
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            if self
                .registering
                .compare_exchange(cur, pid, AcqRel, Acquire)
                .is_err()
            {
                continue;
            }
            let r = self.registration.load(Acquire);
            if (r >> 32) as u32 != pid {
                let slot = match self.register_slot() {
                    Ok(s) => s as u32,
                    Err(e) => {
                        eprintln!("simgpu: {e}");
                        u32::MAX
                    }
                };
                self.registration
                    .store(((pid as u64) << 32) | slot as u64, Release);
            }
            self.registering.store(0, Release);
        }
    }

    fn register_slot(&self) -> Result<usize, String> {
        let registry = reopen(&self.file, &self.path)?;
        sys::lock_wait(registry.as_raw_fd(), REGISTRY_LOCK).map_err(|e| err(&self.path, e))?;
        self.sweep_locked();
        let group = self.group_index_locked();
        let own = reopen(&self.file, &self.path)?;
        let st = self.st();
        for (i, s) in st.slots.iter().enumerate() {
            if s.state.load(Acquire) != SLOT_FREE {
                continue;
            }
            match sys::try_lock(own.as_raw_fd(), SLOT_LOCK_BASE + i as i64) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => return Err(err(&self.path, e)),
            }
            s.state.store(SLOT_CLAIMING, Release);
            s.generation.fetch_add(1, AcqRel);
            // What NVML lists: the PID in the initial PID namespace, as a real driver reports it.
            s.pid.store(sys::host_pid(), Relaxed);
            s.group.store(group, Relaxed);
            s.start_ns.store(sys::realtime_ns(), Relaxed);
            s.end_ns.store(0, Relaxed);
            for u in &s.usage {
                for a in [&u.used, &u.peak, &u.busy_ns, &u.kernels, &u.contexts] {
                    a.store(0, Relaxed);
                }
            }
            for h in &s.history {
                h.last_ns.store(0, Relaxed);
                h.head.store(0, Relaxed);
                for x in &h.samples {
                    x.ts_ns.store(0, Relaxed);
                    x.busy_ns.store(0, Relaxed);
                }
            }
            s.state.store(SLOT_LIVE, Release);
            let fd = own.into_raw_fd();
            // Closed in a forked child so it does not keep this process's slot alive.
            if let Some(k) = self.fd_index {
                sys::REGISTRATION_FDS[k].store(fd, Release);
            }
            return Ok(i);
        }
        Err(err(
            &self.path,
            format!("all {MAX_PROCESSES} process slots are in use"),
        ))
        // `registry` closes here, releasing the registry lock.
    }

    /// Index + 1 of this process's group, creating it (caller holds the registry lock).
    fn group_index_locked(&self) -> u32 {
        let st = self.st();
        if let Some(i) = st
            .groups
            .iter()
            .position(|g| g.state.load(Acquire) == GROUP_READY && g.name() == self.group)
        {
            return i as u32 + 1;
        }
        let Some(i) = st
            .groups
            .iter()
            .position(|g| g.state.load(Acquire) == GROUP_EMPTY)
        else {
            eprintln!(
                "simgpu: all {MAX_GROUPS} groups are in use; group {:?} is not accounted",
                self.group
            );
            return 0;
        };
        let g = &st.groups[i];
        for (b, c) in g.name.iter().zip(self.group.bytes()) {
            b.store(c, Relaxed);
        }
        g.name_len
            .store(self.group.len().min(GROUP_NAME_MAX) as u32, Relaxed);
        g.state.store(GROUP_READY, Release);
        i as u32 + 1
    }

    fn group_of(&self, slot: usize) -> Option<&Group> {
        let g = self.st().slots[slot].group.load(Relaxed) as usize;
        (1..=MAX_GROUPS)
            .contains(&g)
            .then(|| &self.st().groups[g - 1])
    }

    fn slot_alive(&self, slot: usize) -> bool {
        sys::locked_by_other(self.file.as_raw_fd(), SLOT_LOCK_BASE + slot as i64)
    }

    /// Reclaims dead slots: their memory goes back to the device (as a real driver frees a dead
    /// process's memory); their busy figures stay in their group. Caller holds the registry lock.
    fn sweep_locked(&self) {
        let st = self.st();
        st.header.last_sweep_ns.store(sys::realtime_ns(), Relaxed);
        st.header.sweeps.fetch_add(1, Relaxed);
        for (i, s) in st.slots.iter().enumerate() {
            let state = s.state.load(Acquire);
            if state == SLOT_FREE || self.slot_alive(i) {
                continue;
            }
            // Exactly one reclaimer per dead slot.
            if s.state
                .compare_exchange(state, SLOT_RECLAIMING, AcqRel, Acquire)
                .is_err()
            {
                continue;
            }
            self.ipc_slot_gone_locked(i);
            let group = self.group_of(i);
            for (d, u) in s.usage.iter().enumerate().take(self.devices as usize) {
                let bytes = u.used.swap(0, AcqRel);
                sub_saturating(&st.devices[d].used, bytes);
                if let Some(g) = group {
                    sub_saturating(&g.usage[d].used, bytes);
                }
            }
            s.end_ns.store(sys::realtime_ns(), Relaxed);
            s.state.store(SLOT_FREE, Release);
        }
    }

    /// Sweeps after a failed reservation, spaced at least [`SWEEP_SPACING_NS`] after the previous
    /// sweep (so an out-of-memory loop costs little) but never skipped: memory of a process that
    /// just died must come back, as with a real driver. True if it swept.
    fn sweep_after_failure(&self) -> bool {
        let last = self.st().header.last_sweep_ns.load(Relaxed);
        let since = sys::realtime_ns().saturating_sub(last);
        if since < SWEEP_SPACING_NS {
            std::thread::sleep(Duration::from_nanos(SWEEP_SPACING_NS - since));
        }
        self.sweep().is_ok()
    }

    /// Reclaims dead processes' memory unless a sweep ran in the last 10 ms (for readers such as
    /// NVML, which must not report memory a dead process no longer holds).
    pub fn reclaim_dead(&self) {
        let last = self.st().header.last_sweep_ns.load(Relaxed);
        if sys::realtime_ns().saturating_sub(last) >= SWEEP_SPACING_NS {
            let _ = self.sweep();
        }
    }

    /// Sweeps dead slots now (tests and tools).
    pub fn sweep(&self) -> Result<(), String> {
        let registry = reopen(&self.file, &self.path)?;
        sys::lock_wait(registry.as_raw_fd(), REGISTRY_LOCK).map_err(|e| err(&self.path, e))?;
        self.sweep_locked();
        Ok(())
    }

    // ---- memory ---------------------------------------------------------------------------------

    /// Atomically reserves `bytes` on `device` if that keeps it within capacity; accounts them to this
    /// process and its group. Dead processes' memory is reclaimed first unless a sweep ran in the
    /// last 10 ms (a driver frees a killed process's memory as its device files close, not when
    /// someone next runs short), and again on a failure, after which the reservation is retried
    /// once.
    pub fn try_reserve(&self, device: u32, bytes: u64) -> bool {
        let Some(dev) = self.device(device) else {
            return false;
        };
        self.reclaim_dead();
        let slot = self.slot();
        let cap = dev.capacity.load(Relaxed);
        let mut swept = false;
        while dev
            .used
            .fetch_update(AcqRel, Acquire, |u| {
                u.checked_add(bytes).filter(|n| *n <= cap)
            })
            .is_err()
        {
            if swept || !self.sweep_after_failure() {
                return false;
            }
            swept = true;
        }
        if let Some(s) = slot {
            let add = |u: &Usage| {
                let now = u.used.fetch_add(bytes, AcqRel) + bytes;
                u.peak.fetch_max(now, AcqRel);
            };
            add(&self.st().slots[s].usage[device as usize]);
            if let Some(g) = self.group_of(s) {
                add(&g.usage[device as usize]);
            }
        }
        true
    }

    /// Returns `bytes` reserved by this process on `device`.
    pub fn release(&self, device: u32, bytes: u64) {
        let Some(dev) = self.device(device) else {
            return;
        };
        // Process and group figures drop before the device's (and rise after it, in `try_reserve`),
        // so they never exceed what the device counts: their peaks stay exact.
        if let Some(s) = self.slot() {
            sub_saturating(&self.st().slots[s].usage[device as usize].used, bytes);
            if let Some(g) = self.group_of(s) {
                sub_saturating(&g.usage[device as usize].used, bytes);
            }
        }
        sub_saturating(&dev.used, bytes);
    }

    /// A context of this process came to life on `device` (`created`), or went.
    pub fn count_context(&self, device: u32, created: bool) {
        if device >= self.devices {
            return;
        }
        if let Some(s) = self.slot() {
            let contexts = &self.st().slots[s].usage[device as usize].contexts;
            if created {
                contexts.fetch_add(1, AcqRel);
            } else {
                sub_saturating(contexts, 1);
            }
        }
    }

    /// Returns everything this process holds on every device (it is exiting).
    pub fn release_process_memory(&self) {
        let Some(s) = self.slot() else {
            return;
        };
        self.ipc_process_gone();
        for device in 0..self.devices {
            let held = self.st().slots[s].usage[device as usize].used.load(Acquire);
            self.release(device, held);
        }
    }

    /// This process's slot (registering on first use).
    pub(crate) fn my_slot(&self) -> Option<usize> {
        self.slot()
    }

    pub(crate) fn state(&self) -> &State {
        self.st()
    }

    pub(crate) fn group_of_slot(&self, slot: usize) -> Option<&Group> {
        self.group_of(slot)
    }

    /// Another open file description of the state file (for the registry lock).
    pub(crate) fn reopen_file(&self) -> Result<File, String> {
        reopen(&self.file, &self.path)
    }

    pub fn device_used(&self, device: u32) -> u64 {
        self.device(device).map_or(0, |d| d.used.load(Acquire))
    }

    /// The devices of the state file: each one's GPU, MIG instance (`None`: the whole GPU) and
    /// memory; and each GPU's memory. Every value read is bounds-checked.
    pub fn topology(&self) -> (Vec<crate::mig::Placement>, Vec<u64>) {
        let t = &self.st().topology;
        let gpus = t.gpus.load(Acquire).min(MAX_DEVICES as u32);
        if gpus == 0 {
            // A file made without a topology: one GPU per device.
            let devices = (0..self.devices)
                .map(|d| crate::mig::Placement {
                    gpu: d,
                    instance: None,
                    memory: self.device_capacity(d),
                })
                .collect();
            let memory = (0..self.devices).map(|d| self.device_capacity(d)).collect();
            return (devices, memory);
        }
        let devices = (0..self.devices)
            .map(|d| crate::mig::Placement {
                gpu: t.device_gpu[d as usize].load(Relaxed).min(gpus - 1),
                instance: t.device_instance[d as usize]
                    .load(Relaxed)
                    .checked_sub(1)
                    .map(|i| i.min(crate::mig::MAX_INSTANCES)),
                memory: self.device_capacity(d),
            })
            .collect();
        let memory = t.gpu_memory[..gpus as usize]
            .iter()
            .map(|m| m.load(Relaxed))
            .collect();
        (devices, memory)
    }

    pub fn device_capacity(&self, device: u32) -> u64 {
        self.device(device).map_or(0, |d| d.capacity.load(Relaxed))
    }

    // ---- execution (see exec.rs) ------------------------------------------------------------------

    fn owner_alive(&self, owner: u64) -> bool {
        let slot = (owner >> 32) as usize;
        let Some(s) = self.st().slots.get(slot) else {
            // An unregistered owner cannot be checked: never declared dead.
            return true;
        };
        let state = s.state.load(Acquire);
        s.generation.load(Acquire) == owner as u32
            && matches!(state, SLOT_LIVE | SLOT_CLAIMING)
            && self.slot_alive(slot)
    }

    /// Busy ns of `device` (union of kernels' running intervals), finished busy intervals only.
    pub fn device_busy_ns(&self, device: u32) -> u64 {
        self.device(device).map_or(0, |d| d.busy_ns.load(Acquire))
    }

    /// Kernels finished on `device`.
    pub fn device_kernels(&self, device: u32) -> u64 {
        self.device(device).map_or(0, |d| d.kernels.load(Acquire))
    }

    /// Percent of the last second during which `device` ran kernels (NVML `utilization.gpu`).
    pub fn utilization(&self, device: u32) -> u32 {
        let Some(dev) = self.device(device) else {
            return 0;
        };
        let now = sys::realtime_ns();
        let busy_now = dev.busy_ns.load(Acquire) + self.inflight_ns(dev, None, now);
        let start = now - UTILIZATION_WINDOW_NS;
        let busy_then = busy_at(&dev.history, start, now, busy_now);
        percent(busy_now.saturating_sub(busy_then), UTILIZATION_WINDOW_NS)
    }

    /// Per live process using `device`: (pid, SM utilization percent since `since_ns` (realtime ns;
    /// at most the last second)). Processes with neither memory nor kernels on the device are left out.
    pub fn process_utilization(&self, device: u32, since_ns: u64) -> Vec<(u32, u32)> {
        let Some(dev) = self.device(device) else {
            return Vec::new();
        };
        let now = sys::realtime_ns();
        let start = since_ns
            .max(now - UTILIZATION_WINDOW_NS)
            .min(now.saturating_sub(1));
        let mut out = Vec::new();
        for (i, s) in self.st().slots.iter().enumerate() {
            if s.state.load(Acquire) != SLOT_LIVE || !self.slot_alive(i) {
                continue;
            }
            let u = &s.usage[device as usize];
            if u.used.load(Acquire) == 0 && u.kernels.load(Acquire) == 0 {
                continue;
            }
            let busy_now = u.busy_ns.load(Acquire) + self.inflight_ns(dev, Some(i), now);
            let busy_then = busy_at(&s.history[device as usize], start, now, busy_now);
            out.push((
                s.pid.load(Relaxed),
                percent(busy_now.saturating_sub(busy_then), now - start),
            ));
        }
        out
    }

    /// Accounting mode's records of `device`: every process that used it (held memory or ran a
    /// kernel there), running or terminated, as long as its slot has not been taken by a new
    /// process (a real driver's circular buffer of records). Processes found dead are swept first,
    /// so that a process that ended is reported as terminated. One record per pid: the running
    /// process, else the one that ended last (nvml.h: "in case of pid collision stats of only the
    /// latest process (that terminated last) will be reported").
    pub fn accounting(&self, device: u32) -> Vec<AccountingRecord> {
        if device >= self.devices {
            return Vec::new();
        }
        self.reclaim_dead();
        let now = sys::realtime_ns();
        let d = device as usize;
        let mut records: Vec<AccountingRecord> = Vec::new();
        for (i, s) in self.st().slots.iter().enumerate() {
            let start_ns = s.start_ns.load(Relaxed);
            let running = match s.state.load(Acquire) {
                SLOT_LIVE => self.slot_alive(i),
                SLOT_FREE => false,
                _ => continue,
            };
            // A dead process not swept yet (a sweep ran in the last 10 ms) ended by now.
            let end_ns = match (running, s.end_ns.load(Relaxed)) {
                (true, _) => 0,
                (false, 0) => now,
                (false, end) => end,
            };
            let u = &s.usage[d];
            let (peak, kernels) = (u.peak.load(Acquire), u.kernels.load(Acquire));
            if start_ns == 0 || (peak == 0 && kernels == 0) {
                continue;
            }
            let record = AccountingRecord {
                pid: s.pid.load(Relaxed),
                running,
                start_ns,
                end_ns,
                max_memory: peak.max(u.used.load(Acquire)),
                busy_ns: u.busy_ns.load(Acquire),
                lifetime_ns: if running { now } else { end_ns }.saturating_sub(start_ns),
            };
            match records.iter_mut().find(|r| r.pid == record.pid) {
                Some(r) if (record.running, record.end_ns) > (r.running, r.end_ns) => *r = record,
                Some(_) => {}
                None => records.push(record),
            }
        }
        records.sort_by_key(|r| r.start_ns);
        records
    }

    /// Live processes registered in the state.
    pub fn processes(&self) -> Vec<ProcessUsage> {
        processes(self.st(), self.devices as usize, |i| self.slot_alive(i))
    }

    /// A snapshot of this state.
    pub fn snapshot(&self) -> Snapshot {
        snapshot_of(self.st(), self.devices as usize, |i| self.slot_alive(i))
    }
}

fn percent(busy: u64, window: u64) -> u32 {
    if window == 0 {
        return 0;
    }
    ((busy as u128 * 100 + window as u128 / 2) / window as u128).min(100) as u32
}

/// Appends a (now, busy) sample unless one was written in the last [`SAMPLE_NS`].
fn record<const N: usize>(h: &History<N>, now: u64, busy: u64) {
    let last = h.last_ns.load(Relaxed);
    if last != 0 && now.saturating_sub(last) < SAMPLE_NS {
        return;
    }
    if h.last_ns
        .compare_exchange(last, now, AcqRel, Relaxed)
        .is_err()
    {
        return;
    }
    let s = &h.samples[h.head.fetch_add(1, AcqRel) as usize % N];
    s.ts_ns.store(0, Release);
    s.busy_ns.store(busy, Release);
    s.ts_ns.store(now, Release);
}

/// Cumulative busy ns at time `t`, interpolated from the history (samples are taken at turn grants
/// and completions at most every 20 ms, so the error is within ~20 ms). `busy_now` is the exact
/// figure at `now`.
fn busy_at<const N: usize>(h: &History<N>, t: u64, now: u64, busy_now: u64) -> u64 {
    let mut samples: Vec<(u64, u64)> = h
        .samples
        .iter()
        .filter_map(|s| {
            let ts = s.ts_ns.load(Acquire);
            let busy = s.busy_ns.load(Acquire);
            (ts != 0 && ts == s.ts_ns.load(Acquire) && ts <= now).then_some((ts, busy))
        })
        .collect();
    samples.push((now, busy_now));
    samples.sort_unstable();
    let after = samples.partition_point(|s| s.0 <= t);
    if after == 0 {
        return samples[0].1.min(busy_now);
    }
    let (t0, b0) = samples[after - 1];
    if after == samples.len() {
        return b0.min(busy_now);
    }
    let (t1, b1) = samples[after];
    if b1 <= b0 || t1 <= t0 {
        return b0.min(busy_now);
    }
    if after == samples.len() - 1 {
        // Between the last sample and now: growth happened at unknown times; take the middle of what
        // a device running one kernel at a time allows.
        let lo = b0.max(b1.saturating_sub(t1 - t));
        let hi = b1.min(b0 + (t - t0));
        return (lo + hi.max(lo)) / 2;
    }
    b0 + ((b1 - b0) as u128 * (t - t0) as u128 / (t1 - t0) as u128) as u64
}

fn processes(st: &State, devices: usize, alive: impl Fn(usize) -> bool) -> Vec<ProcessUsage> {
    let mut out = Vec::new();
    for (i, s) in st.slots.iter().enumerate() {
        if s.state.load(Acquire) != SLOT_LIVE || !alive(i) {
            continue;
        }
        let g = s.group.load(Relaxed) as usize;
        let usage = &s.usage[..devices];
        out.push(ProcessUsage {
            pid: s.pid.load(Relaxed),
            group: if (1..=MAX_GROUPS).contains(&g) {
                st.groups[g - 1].name()
            } else {
                String::new()
            },
            used: usage.iter().map(|u| u.used.load(Acquire)).collect(),
            peak: usage.iter().map(|u| u.peak.load(Acquire)).collect(),
            busy_ns: usage.iter().map(|u| u.busy_ns.load(Acquire)).collect(),
            kernels: usage.iter().map(|u| u.kernels.load(Acquire)).collect(),
            contexts: usage.iter().map(|u| u.contexts.load(Acquire)).collect(),
        });
    }
    out
}

/// A snapshot. Memory of dead processes not yet swept is left out of `used` (device and group): a
/// real driver frees it when the process dies, and the next failing reservation reclaims it.
fn snapshot_of(st: &State, devices: usize, alive: impl Fn(usize) -> bool) -> Snapshot {
    let mut dead_device = vec![0u64; devices];
    let mut dead_group = vec![vec![0u64; devices]; MAX_GROUPS];
    for (i, s) in st.slots.iter().enumerate() {
        if s.state.load(Acquire) == SLOT_FREE || alive(i) {
            continue;
        }
        let g = s.group.load(Relaxed) as usize;
        for d in 0..devices {
            let u = s.usage[d].used.load(Acquire);
            dead_device[d] += u;
            if (1..=MAX_GROUPS).contains(&g) {
                dead_group[g - 1][d] += u;
            }
        }
    }
    let load = |v: &[Usage], f: fn(&Usage) -> &AtomicU64| {
        v[..devices].iter().map(|u| f(u).load(Acquire)).collect()
    };
    Snapshot {
        devices: st.devices[..devices]
            .iter()
            .zip(&dead_device)
            .map(|(d, dead)| DeviceSnapshot {
                capacity: d.capacity.load(Relaxed),
                used: d.used.load(Acquire).saturating_sub(*dead),
                busy_ns: d.busy_ns.load(Acquire),
                kernels: d.kernels.load(Acquire),
                switches: d.exec.switches.load(Acquire),
                serving: d.exec.active_context.load(Acquire),
                running: d.exec.running.load(Acquire),
                queued: queued_by_pid(st, d),
            })
            .collect(),
        processes: processes(st, devices, alive),
        groups: st
            .groups
            .iter()
            .zip(&dead_group)
            .filter(|(g, _)| g.state.load(Acquire) == GROUP_READY)
            .map(|(g, dead)| GroupUsage {
                name: g.name(),
                used: g.usage[..devices]
                    .iter()
                    .zip(dead)
                    .map(|(u, x)| u.used.load(Acquire).saturating_sub(*x))
                    .collect(),
                peak: load(&g.usage, |u| &u.peak),
                busy_ns: load(&g.usage, |u| &u.busy_ns),
            })
            .collect(),
    }
}

/// Kernels waiting or running on `d`, counted by their process's pid.
fn queued_by_pid(st: &State, d: &Device) -> Vec<(u32, u32)> {
    let ex = &d.exec;
    let mut out: Vec<(u32, u32)> = Vec::new();
    let high = (ex.high.load(Acquire) as usize).min(TURNS);
    for e in &ex.entries[..high] {
        if !matches!(e.state.load(Acquire), ENTRY_WAITING | ENTRY_RUNNING) {
            continue;
        }
        let slot = (e.owner.load(Relaxed) >> 32) as usize;
        let pid = st.slots.get(slot).map_or(0, |s| s.pid.load(Relaxed));
        match out.iter_mut().find(|p| p.0 == pid) {
            Some(p) => p.1 += 1,
            None => out.push((pid, 1)),
        }
    }
    out
}

/// A read-only view of the state file at `path`, for tests and tools: does not create or register.
pub fn snapshot(path: &Path) -> Result<Snapshot, String> {
    let file = File::open(path).map_err(|e| err(path, e))?;
    validate(&file, path)?;
    let map = Mapping::map(file.as_raw_fd(), false).map_err(|e| err(path, e))?;
    let devices = (map.state().header.devices.load(Acquire) as usize).clamp(1, MAX_DEVICES);
    let fd: RawFd = file.as_raw_fd();
    Ok(snapshot_of(map.state(), devices, |i| {
        sys::locked_by_other(fd, SLOT_LOCK_BASE + i as i64)
    }))
}
