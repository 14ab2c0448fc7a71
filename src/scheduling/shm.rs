//! The device ledger's shared-memory layout: one file per GPU UUID, mapped by every participating
//! process of every tenant. Made only of atomics (any bit pattern is valid; other processes may write
//! at any time); indices come from Rust's fixed-size arrays, never from the mapping.

use std::mem::size_of;

use crate::slotfile::atomic::{AtomicI64, AtomicU32, AtomicU64};
use crate::slotfile::{pack_text, unpack_text, Prefix, SlotLayout};

pub const MAGIC: [u8; 8] = *b"GSLCDEV1";
pub const VERSION: u32 = 1;
pub const MAX_TENANTS: usize = 32;
pub const MAX_SLOTS: usize = 256;
/// Samples of every tenant's charged time kept for the "achieved share" of `gpuslice status`.
pub const HISTORY: usize = 16;
/// Interval between two samples.
pub const SAMPLE_NS: u64 = 1_000_000_000;

pub const TENANT_READY: u32 = 2;

pub const SLOT_FREE: u32 = 0;
pub const SLOT_ACTIVE: u32 = 1;

#[repr(C)]
pub struct Header {
    /// Magic, version, state (INITIALISING, READY) and size: the slot file's.
    pub prefix: Prefix,
    /// Canonical `GPU-...` text, NUL-padded.
    pub uuid: [AtomicU64; 8],
    /// The arbitration lock: 0, or the holder's slot + 1.
    pub lock: AtomicU32,
    /// Futex word: bumped on every change of ownership (never 0).
    pub epoch: AtomicU32,
    /// The owning slot + 1, or 0.
    pub owner: AtomicU32,
    /// Futex word: non-zero while a high-priority slot waits for a normal owner to yield.
    pub preempt: AtomicU32,
    /// When the arbitration lock was taken (monotonic ns).
    pub lock_ns: AtomicU64,
    /// Start of the current ownership, and its length.
    pub grant_ns: AtomicU64,
    pub slice_ns: AtomicU64,
    /// Time of each history sample (ring, `sample_seq % HISTORY`).
    pub sample_ns: [AtomicU64; HISTORY],
    pub sample_seq: AtomicU64,
    pub hand_overs: AtomicU64,
    /// The owner's heartbeat (monotonic ns): an owner that is draining stays fresh.
    pub owner_beat_ns: AtomicU64,
    pub revocations: AtomicU64,
    pub _reserved: [AtomicU64; 7],
}

#[repr(C)]
pub struct TenantEntry {
    pub state: AtomicU32,
    /// 1 = high priority.
    pub priority: AtomicU32,
    pub name: [AtomicU64; 8],
    pub share: AtomicU32,
    /// Percent, 0 = none.
    pub cap: AtomicU32,
    pub vtime: AtomicU64,
    pub tokens: AtomicI64,
    pub refill_ns: AtomicU64,
    pub last_active_ns: AtomicU64,
    /// Device time charged to the tenant so far (ns).
    pub charged_ns: AtomicU64,
    /// Time its launches spent waiting for the device (ns, summed over slots).
    pub wait_ns: AtomicU64,
    /// `charged_ns` at each history sample.
    pub samples: [AtomicU64; HISTORY],
}

#[repr(C)]
pub struct SlotEntry {
    pub state: AtomicU32,
    pub tenant: AtomicU32,
    pub pid: AtomicU32,
    /// Number of the process's threads waiting for the device.
    pub wants: AtomicU32,
    /// When the oldest of them started waiting (ns, 0 = none).
    pub wait_since: AtomicU64,
    /// The process's heartbeat (its scheduler thread): a stopped process is not chosen.
    pub beat_ns: AtomicU64,
}

#[repr(C)]
pub struct Layout {
    pub header: Header,
    pub tenants: [TenantEntry; MAX_TENANTS],
    pub slots: [SlotEntry; MAX_SLOTS],
}

pub const TOTAL_SIZE: usize = size_of::<Layout>();

// SAFETY: `#[repr(C)]`, only atomics, starts with the slot file's `Prefix`, 8-byte aligned.
unsafe impl SlotLayout for Layout {
    const MAGIC: [u8; 8] = MAGIC;
    const VERSION: u32 = VERSION;
    const HEADER_BYTES: usize = size_of::<Header>();
}

/// Bytes of a tenant name or UUID (the tenant ledger's and the configuration's limit too).
pub const NAME_BYTES: usize = 64;

/// A tenant name or UUID as NUL-padded words (`None` when empty or longer than 64 bytes).
pub fn pack(text: &str) -> Option<[u64; 8]> {
    pack_text::<{ NAME_BYTES / 8 }>(text)
}

pub fn unpack(words: &[AtomicU64; 8]) -> String {
    unpack_text(words)
}
