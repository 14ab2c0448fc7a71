//! The layout of the shared-state file. Every field is an atomic integer, so any byte pattern is a
//! valid value (a corrupt file gives wrong figures, never undefined behaviour) and all-zero is a valid
//! initial state; indexes read from the file are bounds-checked before use.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8};

/// "SIMGPU" + layout generation; published last by the creator.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SIMGPUst");
/// Bumped whenever this layout changes.
pub const LAYOUT_VERSION: u32 = 2;
pub const MAX_DEVICES: usize = crate::config::MAX_DEVICES as usize;
pub const MAX_PROCESSES: usize = 256;
pub const MAX_GROUPS: usize = 64;
pub const GROUP_NAME_MAX: usize = 120;
/// Device utilization history: at most one sample every [`SAMPLE_NS`], so ~1.3 s of history.
pub const HISTORY: usize = 64;
pub const PROCESS_HISTORY: usize = 64;
pub const SAMPLE_NS: u64 = 20_000_000;
/// Ring of outstanding turns per device (tickets waiting or running).
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

/// Turn states (low 32 bits of [`Turn::word`], the ticket is the high 32 bits).
pub const TURN_WAITING: u64 = 1;
pub const TURN_RUNNING: u64 = 2;
pub const TURN_DONE: u64 = 3;

#[repr(C)]
pub struct Turn {
    /// ticket << 32 | state.
    pub word: AtomicU64,
    /// slot << 32 | slot generation of the ticket's owner (`u32::MAX` slot: unregistered owner).
    pub owner: AtomicU64,
    /// Realtime ns at which the turn was granted.
    pub granted_ns: AtomicU64,
    /// Realtime ns by which the kernel is over (0: not said). A GPU runs a kernel to its end whatever
    /// the process that launched it does, so a turn past its end is finished by whoever waits.
    pub deadline_ns: AtomicU64,
}

#[repr(C)]
pub struct Device {
    pub capacity: AtomicU64,
    pub used: AtomicU64,
    pub busy_ns: AtomicU64,
    pub kernels: AtomicU64,
    pub next_ticket: AtomicU32,
    /// Turns finished (or reclaimed from dead owners); the futex word waiters sleep on. Ticket `t` may
    /// run once `t - completed < concurrent_kernels` (wrapping).
    pub completed: AtomicU32,
    pub history: History<HISTORY>,
    pub turns: [Turn; TURNS],
}

#[repr(C)]
pub struct Usage {
    pub used: AtomicU64,
    pub peak: AtomicU64,
    pub busy_ns: AtomicU64,
    pub kernels: AtomicU64,
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
    pub slots: [Slot; MAX_PROCESSES],
    pub groups: [Group; MAX_GROUPS],
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
