//! The layout of the shared-state file. Every field is an atomic integer, so any byte pattern is a
//! valid value (a corrupt file gives wrong figures, never undefined behaviour) and all-zero is a valid
//! initial state; indexes read from the file are bounds-checked before use.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8};

/// "SIMGPU" + layout generation; published last by the creator.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SIMGPUst");
/// Bumped whenever this layout changes.
pub const LAYOUT_VERSION: u32 = 8;
pub const MAX_DEVICES: usize = crate::config::MAX_DEVICES as usize;
pub const MAX_PROCESSES: usize = 256;
pub const MAX_GROUPS: usize = 64;
pub const GROUP_NAME_MAX: usize = 120;
/// Device utilization history: at most one sample every [`SAMPLE_NS`], so ~1.3 s of history.
pub const HISTORY: usize = 64;
pub const PROCESS_HISTORY: usize = 64;
pub const SAMPLE_NS: u64 = 20_000_000;
/// Kernel entries per device (queued, running or just finished kernels).
pub const TURNS: usize = 1024;

/// Byte-range lock offsets (beyond the end of the file: fcntl locks need not cover real bytes).
pub const REGISTRY_LOCK: i64 = 1 << 30;
pub const SLOT_LOCK_BASE: i64 = REGISTRY_LOCK + 1;

#[repr(C)]
pub struct Header {
    pub magic: AtomicU64,
    pub layout_version: AtomicU32,
    pub devices: AtomicU32,
    pub file_size: AtomicU64,
    pub concurrent_kernels: AtomicU32,
    pub driver_version: AtomicU32,
    pub last_sweep_ns: AtomicU64,
    pub sweeps: AtomicU64,
    pub created_ns: AtomicU64,
    /// Context time slice in ns (0: none, kernels run to their end).
    pub timeslice_ns: AtomicU64,
    /// Source of context tags.
    pub next_context: AtomicU64,
}

/// One (realtime ns, cumulative busy ns) point of a busy curve. `ts == 0` marks a sample being written.
#[repr(C)]
pub struct Sample {
    pub ts_ns: AtomicU64,
    pub busy_ns: AtomicU64,
}

#[repr(C)]
pub struct History<const N: usize> {
    pub last_ns: AtomicU64,
    pub head: AtomicU64,
    pub samples: [Sample; N],
}

/// Kernel entry states (see [`crate::shared`]'s execution section).
pub const ENTRY_FREE: u32 = 0;
/// Queued on the device, not running (never started, or preempted by a time slice).
pub const ENTRY_WAITING: u32 = 1;
pub const ENTRY_RUNNING: u32 = 2;
/// Over; the launching thread frees the entry when it sees it (or anyone, a while later).
pub const ENTRY_DONE: u32 = 3;

/// `remaining_ns` of a kernel that runs until something ends it (a barrier not yet released, a held
/// turn): never over by time.
pub const UNTIL_ENDED: u64 = u64::MAX;

/// One kernel on a device: queued, running, or just finished. Fields other than `state`/`id` are
/// written under the device's lock.
#[repr(C)]
pub struct Entry {
    pub state: AtomicU32,
    /// Bit 0: the barrier this kernel waits on has been arrived at.
    pub flags: AtomicU32,
    /// Unique per device and use of the entry (0: never used).
    pub id: AtomicU64,
    /// The context (see `Shared::new_context_tag`) the kernel belongs to.
    pub context: AtomicU64,
    /// slot << 32 | slot generation of the launching process (`u32::MAX` slot: unregistered).
    pub owner: AtomicU64,
    /// Queue order: lower runs first (a preempted kernel goes to the back).
    pub seq: AtomicU64,
    /// Work left at the start of the current running segment ([`UNTIL_ENDED`]: no set end).
    pub remaining_ns: AtomicU64,
    /// Realtime ns at which the current running segment began.
    pub segment_ns: AtomicU64,
    /// Barrier slot + 1 in the low 16 bits, participants in the high 16 (0: not a barrier kernel).
    pub barrier: AtomicU32,
    /// Times the kernel was preempted.
    pub preempted: AtomicU32,
    /// The barrier's round when this kernel arrived.
    pub barrier_round: AtomicU64,
    /// Realtime ns at which the kernel ended (state DONE).
    pub done_ns: AtomicU64,
    /// Realtime ns at which the kernel was queued, and first started (0: not yet).
    pub queued_ns: AtomicU64,
    pub first_ns: AtomicU64,
}

pub const ENTRY_ARRIVED: u32 = 1;
/// More work of the kernel's stream is already queued behind it (see `Shared::run_kernel`).
pub const ENTRY_FOLLOWED: u32 = 2;

/// A device's execution state. Scheduling fields are read and written under `lock`.
#[repr(C)]
pub struct Exec {
    /// 0: free; else the holder's pid << 32 | a nonzero acquisition number.
    pub lock: AtomicU64,
    /// Realtime ns at which the lock was taken.
    pub lock_ns: AtomicU64,
    /// Bumped at every scheduling change; the futex word kernels sleep on.
    pub epoch: AtomicU32,
    /// Kernels of the active context running now.
    pub running: AtomicU32,
    /// The context holding the device (0: none).
    pub active_context: AtomicU64,
    /// Owner (slot << 32 | generation) of the active context's process.
    pub active_owner: AtomicU64,
    /// Realtime ns at which the active context got the device.
    pub slice_start_ns: AtomicU64,
    /// Device time the active context has used since it got the device (finished busy intervals;
    /// the running one is added by readers). Its time slice is device time, not wall time.
    pub slice_used_ns: AtomicU64,
    /// Realtime ns at which `running` last rose from 0 (start of the current busy interval).
    pub busy_since_ns: AtomicU64,
    pub next_seq: AtomicU64,
    pub next_id: AtomicU64,
    /// Entries `[0, high)` may be in use.
    pub high: AtomicU32,
    pub _pad: AtomicU32,
    /// Realtime ns of the last look for kernels of dead processes.
    pub reaped_ns: AtomicU64,
    /// The serving context keeps the device until then although nothing of it runs or waits: a
    /// kernel of it ended with more work queued behind it on its stream.
    pub hold_until_ns: AtomicU64,
    /// When that kernel ended (0: no hold): the next kernel of the context, on a GPU already queued,
    /// would have started then.
    pub hold_from_ns: AtomicU64,
    /// Time-slice context switches (a running context made to yield to a waiting one).
    pub switches: AtomicU64,
    /// Realtime ns since which no context has held the device (valid while `active_context` is 0):
    /// a kernel that entered the device's queue since then starts when it entered, not when its
    /// waiter got to run (see `Shared::step`).
    pub idle_since_ns: AtomicU64,
    /// The context that gave the device up last (0: preempted), and until when it held the device
    /// after its last kernel (0: no hold): other contexts' kernels could not start before then.
    pub idle_context: AtomicU64,
    pub idle_hold_until_ns: AtomicU64,
    pub entries: [Entry; TURNS],
}

#[repr(C)]
pub struct Device {
    pub capacity: AtomicU64,
    pub used: AtomicU64,
    /// Time during which at least one kernel ran (the union of kernels' running intervals).
    pub busy_ns: AtomicU64,
    pub kernels: AtomicU64,
    pub history: History<HISTORY>,
    pub exec: Exec,
}

/// Barrier kernels' meeting points, shared by all devices.
pub const MAX_BARRIERS: usize = 256;

#[repr(C)]
pub struct Barrier {
    /// tag + 1 (0: free; tag `u64::MAX` shares the slot of tag 0).
    pub key: AtomicU64,
    /// round << 32 | kernels arrived in this round.
    pub word: AtomicU64,
    /// Realtime ns of the last release.
    pub released_ns: AtomicU64,
}

#[repr(C)]
pub struct Usage {
    pub used: AtomicU64,
    pub peak: AtomicU64,
    pub busy_ns: AtomicU64,
    pub kernels: AtomicU64,
    /// Live contexts (a process's, on a device): what puts a process in NVML's process lists.
    pub contexts: AtomicU64,
}

/// Slot states.
pub const SLOT_FREE: u32 = 0;
pub const SLOT_CLAIMING: u32 = 1;
pub const SLOT_LIVE: u32 = 2;
pub const SLOT_RECLAIMING: u32 = 3;

#[repr(C)]
pub struct Slot {
    pub state: AtomicU32,
    pub pid: AtomicU32,
    pub generation: AtomicU32,
    /// Group index + 1 (0: none).
    pub group: AtomicU32,
    /// When the process registered, and when it was found dead (realtime ns; 0: not yet): its
    /// accounting-mode record, kept after it ends until a new process takes the slot.
    pub start_ns: AtomicU64,
    pub end_ns: AtomicU64,
    pub usage: [Usage; MAX_DEVICES],
    pub history: [History<PROCESS_HISTORY>; MAX_DEVICES],
}

pub const GROUP_EMPTY: u32 = 0;
pub const GROUP_READY: u32 = 2;

#[repr(C)]
pub struct Group {
    pub state: AtomicU32,
    pub name_len: AtomicU32,
    pub name: [AtomicU8; GROUP_NAME_MAX],
    pub usage: [Usage; MAX_DEVICES],
}

#[repr(C)]
pub struct State {
    pub header: Header,
    pub devices: [Device; MAX_DEVICES],
    pub barriers: [Barrier; MAX_BARRIERS],
    pub slots: [Slot; MAX_PROCESSES],
    pub groups: [Group; MAX_GROUPS],
    pub topology: Topology,
    pub ipc: [IpcEntry; MAX_IPC],
}

/// Exported IPC memory handles (`crate::ipc`).
pub const MAX_IPC: usize = 256;
pub const IPC_FREE: u32 = 0;
/// The exporter holds the allocation (it counts against the exporter).
pub const IPC_EXPORTED: u32 = 1;
/// The exporter freed it (or ended) while importers map it: it counts against `holder`.
pub const IPC_ORPHANED: u32 = 2;

#[repr(C)]
pub struct IpcEntry {
    /// generation << 16 | index + 1 (0: free): what a handle names.
    pub key: AtomicU64,
    pub state: AtomicU32,
    pub device: AtomicU32,
    /// Bytes the allocation takes on the device (its charged span).
    pub bytes: AtomicU64,
    pub base: AtomicU64,
    /// Slot of the exporting process, and of the process the bytes count against.
    pub exporter: AtomicU32,
    pub holder: AtomicU32,
    /// Slots of the processes that map it (one bit each).
    pub mappers: [AtomicU64; MAX_PROCESSES / 64],
}

/// Which GPU each device is, or is a MIG instance of (`crate::mig`). All zero in a file whose
/// creator knew no MIG: `gpus` 0 reads as one GPU per device.
#[repr(C)]
pub struct Topology {
    pub gpus: AtomicU32,
    pub _pad: AtomicU32,
    /// Each GPU's memory (a GPU in MIG mode: all of it, its instances' and the rest).
    pub gpu_memory: [AtomicU64; MAX_DEVICES],
    /// Per device: its GPU, and its MIG instance index + 1 (0: the whole GPU).
    pub device_gpu: [AtomicU32; MAX_DEVICES],
    pub device_instance: [AtomicU32; MAX_DEVICES],
}

pub const STATE_SIZE: usize = std::mem::size_of::<State>();

impl Group {
    pub fn name(&self) -> String {
        let len =
            (self.name_len.load(std::sync::atomic::Ordering::Acquire) as usize).min(GROUP_NAME_MAX);
        let bytes: Vec<u8> = self.name[..len]
            .iter()
            .map(|b| b.load(std::sync::atomic::Ordering::Relaxed))
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}
