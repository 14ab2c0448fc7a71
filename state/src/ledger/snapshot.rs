//! The read API: a consistent-enough view of a whole ledger, for `gpuslice status`, the exporter
//! and the node (each number read atomically; a read-only handle reads a private copy).

use super::*;

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

impl Ledger {
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
