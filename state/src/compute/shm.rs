//! The device ledger's shared-memory layout: one file per GPU UUID, mapped by every participating
//! process of every tenant. Made only of atomics (any bit pattern is valid; other processes may write
//! at any time); indices come from Rust's fixed-size arrays, never from the mapping.

use std::mem::size_of;

use crate::slotfile::atomic::{AtomicI64, AtomicU32, AtomicU64};
use crate::slotfile::{pack_text, unpack_text, Prefix, SlotLayout};

pub const MAGIC: [u8; 8] = *b"GSLCDEV1";
/// 2: tenants are identified by their memory ledger's id (`TenantEntry::id`), names are labels.
pub const VERSION: u32 = 2;
pub const MAX_TENANTS: usize = 32;
pub const MAX_SLOTS: usize = 256;
/// Samples of every tenant's charged time kept for the "achieved share" of `gpuslice status`.
pub const HISTORY: usize = 16;
/// Interval between two samples.
pub const SAMPLE_NS: u64 = 1_000_000_000;

pub const TENANT_READY: u32 = 2;

pub const SLOT_FREE: u32 = 0;
pub const SLOT_ACTIVE: u32 = 1;

/// The longest a waiter lets another holder keep the arbitration lock, measured by the waiter's own
/// clock from when it started waiting: then it proceeds as the holder, whoever holds the word and
/// however fresh its stamp. Decisions under the lock take microseconds; this only leaves room for a
/// holder preempted by the host's scheduler.
pub const LOCK_HOLD_MAX_NS: u64 = 5_000_000;

#[repr(C)]
pub struct Header {
    /// Magic, version, state (INITIALISING, READY) and size: the slot file's.
    pub prefix: Prefix,
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
    /// Arbitration locks taken from a holder that kept the lock past [`LOCK_HOLD_MAX_NS`] of the
    /// taker's own waiting (a live holder included): counted, never trusted for safety.
    pub lock_takeovers: AtomicU64,
    /// Processes that could not get a process slot and run throttled to their share instead
    /// (counted by themselves when they start).
    pub slot_denials: AtomicU64,
    /// Times the file was found with the wrong size or marked damaged and repaired in place.
    pub size_repairs: AtomicU64,
    /// Times a process found itself kept from its due by an owner whose words it cannot trust and
    /// launched paced instead (`evidence`): counted by the victims, a report only.
    pub forged_owner: AtomicU64,
    /// Slots taken back from a tenant holding more than its limit (`device::limit`) by a process
    /// that found every slot in use: counted by the taker, a report only.
    pub slot_reclaims: AtomicU64,
    pub _reserved: [AtomicU64; 2],
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

// SAFETY: `#[repr(C)]`, only atomics, starts with the slot file's `Prefix`, 8-byte aligned.
unsafe impl SlotLayout for Layout {
    const MAGIC: [u8; 8] = MAGIC;
    const VERSION: u32 = VERSION;
    const HEADER_BYTES: usize = size_of::<Header>();
    /// Soft state every process writes again: a device ledger grown, shrunk or marked damaged is
    /// repaired by the next process that joins it (and by the node), never left refusing them.
    const REPAIRABLE: bool = true;
}

/// The counters kept per tenant of a device ledger, in a file of their own beside it
/// (`<GPU-UUID>.tally`): the device ledger's layout has no room for them, and a new layout would
/// keep processes of this version and of the last out of each other's arbitration. Entry `i`
/// counts for the device ledger's tenant entry `i` while its `id` is that entry's tenant's (a
/// recycled entry starts from zero). Written under the arbitration lock, by whoever decides;
/// read as untrusted words like the rest (any process of any tenant can write them).
pub const TALLY_MAGIC: [u8; 8] = *b"GSLCTLY1";
pub const TALLY_VERSION: u32 = 1;

#[repr(C)]
pub struct TallyEntry {
    /// The tenant counted here ([`TenantId`]); 0: nobody yet.
    pub id: [AtomicU64; 2],
    /// Ownerships of the device granted to the tenant's processes.
    pub hand_overs: AtomicU64,
    /// Ownerships taken back from a process of the tenant that died or stopped.
    pub revocations: AtomicU64,
}

#[repr(C)]
pub struct Tally {
    pub prefix: Prefix,
    pub tenants: [TallyEntry; MAX_TENANTS],
}

// SAFETY: `#[repr(C)]`, only atomics, starts with the slot file's `Prefix`, 8-byte aligned.
unsafe impl SlotLayout for Tally {
    const MAGIC: [u8; 8] = TALLY_MAGIC;
    const VERSION: u32 = TALLY_VERSION;
    const HEADER_BYTES: usize = size_of::<Prefix>();
    /// Soft state, like the device ledger's: repaired in place, never refusing a joiner.
    const REPAIRABLE: bool = true;
}

/// Bytes of a tenant name or UUID (the tenant ledger's and the configuration's limit too).
pub const NAME_BYTES: usize = 64;

/// A tenant name or UUID as NUL-padded words (`None` when empty or longer than 64 bytes).
pub fn pack(text: &str) -> Option<[u64; 8]> {
    pack_text::<{ NAME_BYTES / 8 }>(text)
}

/// A label as NUL-padded words, cut to [`NAME_BYTES`] (at a character boundary).
pub fn pack_truncated(text: &str) -> [u64; 8] {
    let mut end = text.len().min(NAME_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    pack(&text[..end]).unwrap_or_default()
}

pub fn unpack(words: &[AtomicU64; 8]) -> String {
    unpack_text(words)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_round_trip_and_reject_garbage() {
        assert_eq!(Holder::of(0).word(), 1);
        assert_eq!(Holder::of(7).slot(), Some(7));
        assert_eq!(Holder::from_word(0).slot(), None);
        assert!(Holder::from_word(0).is_none());
        // A word naming no slot: not nobody, and no slot either (revoked by whoever reads it).
        let garbage = Holder::from_word(0xffff_fff0);
        assert!(!garbage.is_none());
        assert_eq!(garbage.slot(), None);
        assert_eq!(Holder::from_word(MAX_SLOTS as u32 + 1).slot(), None);
        assert_eq!(
            Holder::from_word(MAX_SLOTS as u32).slot(),
            Some(MAX_SLOTS - 1)
        );
        assert_eq!(PriorityClass::from_word(1), PriorityClass::High);
        assert_eq!(PriorityClass::from_word(7), PriorityClass::Normal);
        assert_eq!(PriorityClass::of(true).word(), 1);
        let words: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
        let id = TenantId(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210);
        id.store(&words);
        assert_eq!(TenantId::load(&words), id);
        assert_eq!(
            unpack(&pack(&"x".repeat(70)).map_or_else(
                || pack_truncated(&"x".repeat(70)).map(AtomicU64::new),
                |w| w.map(AtomicU64::new),
            )),
            "x".repeat(NAME_BYTES)
        );
        assert_eq!(
            unpack(&pack_truncated("é".repeat(40).as_str()).map(AtomicU64::new)).len(),
            64
        );
    }
}
