//! The device ledger's shared-memory layout: one file per GPU UUID, mapped by every participating
//! process of every tenant. Made only of atomics (any bit pattern is valid; other processes may write
//! at any time); indices come from Rust's fixed-size arrays, never from the mapping.

use std::mem::size_of;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64};

pub const MAGIC: [u8; 8] = *b"GSLCDEV1";
/// 2: tenants are identified by their memory ledger's id (`TenantEntry::id`), names are labels.
pub const VERSION: u32 = 2;
pub const MAX_TENANTS: usize = 32;
pub const MAX_SLOTS: usize = 256;
/// Samples of every tenant's charged time kept for the "achieved share" of `gpuslice status`.
pub const HISTORY: usize = 16;
/// Interval between two samples.
pub const SAMPLE_NS: u64 = 1_000_000_000;

pub const STATE_READY: u32 = u32::from_le_bytes(*b"REDY");

pub const TENANT_READY: u32 = 2;

pub const SLOT_FREE: u32 = 0;
pub const SLOT_ACTIVE: u32 = 1;

#[repr(C)]
pub struct Header {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    pub state: AtomicU32,
    pub total_size: AtomicU64,
    /// Canonical `GPU-...` text, NUL-padded.
    pub uuid: [AtomicU64; 8],
    /// The arbitration lock: a [`Holder`] word.
    pub lock: AtomicU32,
    /// Futex word: bumped on every change of ownership (never 0).
    pub epoch: AtomicU32,
    /// The owning slot: a [`Holder`] word.
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
    /// A [`PriorityClass`] word.
    pub priority: AtomicU32,
    /// The tenant's identity ([`TenantId`]): its memory ledger's id.
    pub id: [AtomicU64; 2],
    /// A label for people (`GPUSLICE_TENANT`); two tenants may carry the same one.
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
/// Slot `i` is held by an OFD write lock on byte `LOCK_BASE + i` (past the data).
pub const LOCK_BASE: u64 = TOTAL_SIZE as u64;

/// Who holds the arbitration lock or owns the device, as stored in `Header::lock` / `Header::owner`:
/// the slot index plus one, 0 for nobody. A word read from the file may name no slot at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holder(u32);

impl Holder {
    pub const NONE: Holder = Holder(0);

    pub fn of(slot: usize) -> Holder {
        Holder(u32::try_from(slot).map_or(u32::MAX, |s| s.saturating_add(1)))
    }

    pub fn from_word(word: u32) -> Holder {
        Holder(word)
    }

    pub fn word(self) -> u32 {
        self.0
    }

    pub fn is_none(self) -> bool {
        self.0 == 0
    }

    /// The slot it names, when it names a real one (`None` for nobody and for garbage).
    pub fn slot(self) -> Option<usize> {
        let s = (self.0 as usize).checked_sub(1)?;
        (s < MAX_SLOTS).then_some(s)
    }
}

/// A tenant's class, as stored in `TenantEntry::priority`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PriorityClass {
    Normal = 0,
    High = 1,
}

impl PriorityClass {
    pub fn from_word(word: u32) -> PriorityClass {
        if word == PriorityClass::High as u32 {
            PriorityClass::High
        } else {
            PriorityClass::Normal
        }
    }

    pub fn of(high: bool) -> PriorityClass {
        if high {
            PriorityClass::High
        } else {
            PriorityClass::Normal
        }
    }

    pub fn word(self) -> u32 {
        self as u32
    }
}

/// A tenant's identity: 128 bits created with its memory ledger (0 is nobody).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TenantId(pub u128);

impl TenantId {
    pub fn words(self) -> [u64; 2] {
        [(self.0 >> 64) as u64, self.0 as u64]
    }

    pub fn load(words: &[AtomicU64; 2]) -> TenantId {
        let [a, b] = [0, 1].map(|i| words[i].load(std::sync::atomic::Ordering::Acquire));
        TenantId((u128::from(a) << 64) | u128::from(b))
    }

    pub fn store(self, words: &[AtomicU64; 2]) {
        for (w, v) in words.iter().zip(self.words()) {
            w.store(v, std::sync::atomic::Ordering::Release);
        }
    }
}

/// A tenant name or UUID as NUL-padded words (`None` when longer than 63 bytes).
pub fn pack(text: &str) -> Option<[u64; 8]> {
    let b = text.as_bytes();
    if b.len() >= 64 || b.contains(&0) {
        return None;
    }
    Some(pack_truncated(text))
}

/// A label as NUL-padded words, cut to 63 bytes (at a character boundary).
pub fn pack_truncated(text: &str) -> [u64; 8] {
    let mut end = text.len().min(63);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let b = &text.as_bytes()[..end];
    let mut bytes = [0u8; 64];
    bytes[..b.len()].copy_from_slice(b);
    let mut out = [0u64; 8];
    for (i, w) in out.iter_mut().enumerate() {
        *w = u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
    }
    out
}

pub fn unpack(words: &[AtomicU64; 8]) -> String {
    let mut bytes = Vec::with_capacity(64);
    for w in words {
        bytes.extend_from_slice(&w.load(std::sync::atomic::Ordering::Acquire).to_le_bytes());
    }
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}
