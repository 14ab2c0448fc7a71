//! The ledger's shared-memory layout and every atomic operation on it (kept in this one file so the
//! protocol can be reviewed and model-checked in one place).
//!
//! Every field is an atomic: the mapping is shared with other processes, which may write anything at
//! any time, so no plain (racy) access is ever made, and any bit pattern is a valid value. Indices
//! come from Rust's fixed-size arrays, never from the mapping.

use std::mem::{offset_of, size_of};

use crate::slotfile::atomic::{self, AtomicU32, AtomicU64, Ordering};
use crate::slotfile::{pack_text, unpack_text, Prefix, SlotLayout};

/// First 8 bytes of every ledger.
pub const MAGIC: [u8; 8] = *b"GPUSLICE";
/// Layout version; bumped on any change of this file's structs (2: per-device `denied`; 3: per-slot
/// `overhead`; 4: the node's word per slot, `claims`, `reconciled`, the header's `node_ms`).
pub const LAYOUT_VERSION: u32 = 4;
/// Devices a ledger can track.
pub const MAX_DEVICES: usize = 16;
/// Processes that can share a ledger at once.
pub const MAX_SLOTS: usize = 256;
/// Bytes of a device key (canonical `GPU-<uuid>` text, NUL-padded).
pub const KEY_BYTES: usize = 64;
/// A limit meaning "no limit".
pub const UNLIMITED: u64 = u64::MAX;

#[cfg(test)]
pub use crate::slotfile::STATE_INITIALISING;

/// Device entry states.
pub const DEV_EMPTY: u32 = 0;
pub const DEV_CLAIMING: u32 = 1;
pub const DEV_READY: u32 = 2;
/// Device flag: the creator's configuration for this device was invalid (limit 0 = deny all).
pub const DEV_FLAG_INVALID: u32 = 1;

/// Process slot states.
pub const SLOT_FREE: u32 = 0;
pub const SLOT_ACTIVE: u32 = 1;
pub const SLOT_RECLAIMING: u32 = 2;

#[repr(C)]
pub struct Header {
    /// Magic, version, state (INITIALISING, READY) and size: the slot file's.
    pub prefix: Prefix,
    pub header_size: AtomicU32,
    pub max_devices: AtomicU32,
    pub max_slots: AtomicU32,
    pub creator_pid: AtomicU32,
    pub device_table_offset: AtomicU64,
    pub slot_table_offset: AtomicU64,
    pub created_unix_ms: AtomicU64,
    /// Limit the creator's configuration gives devices it did not list (joiners adding a device use it).
    pub default_limit: AtomicU64,
    pub default_flags: AtomicU32,
    pub _pad: AtomicU32,
    /// Number of dead process slots reclaimed so far.
    pub reclaims: AtomicU64,
    pub tenant: [AtomicU64; 8],
    /// The tenant's identity: 128 random bits drawn when the ledger is created (0 in ledgers made
    /// before it existed). Compute shares tell tenants apart by it; the name is only a label.
    pub id: [AtomicU64; 2],
    /// Work of this tenant that waits without completing on one device (a collective whose peer
    /// ranks wait at other devices' gates): the device's key, when the wait began and when it was
    /// last seen (CLOCK_MONOTONIC ns). Compute scheduling lets the tenant's ranks on other devices
    /// through their gates for one round (docs/COMPUTE.md). Zero in ledgers made before it: no wait.
    pub stall: [AtomicU64; 3],
    /// When a node's reconciliation (`gpuslice node reconcile`) last went through this ledger
    /// (unix ms; 0: never). Written by the node, read by `gpuslice doctor` and `status`.
    pub node_ms: AtomicU64,
    pub _reserved: [AtomicU64; 7],
}

#[repr(C)]
pub struct DeviceEntry {
    pub state: AtomicU32,
    pub flags: AtomicU32,
    pub key: [AtomicU64; KEY_BYTES / 8],
    pub limit: AtomicU64,
    pub used: AtomicU64,
    pub peak: AtomicU64,
    /// Reservations refused at the quota so far.
    pub denied: AtomicU64,
}

#[repr(C)]
pub struct Slot {
    pub state: AtomicU32,
    /// Holder's pid as the holder sees it (informational: liveness is the slot's file lock).
    pub pid: AtomicU32,
    pub started_unix_ms: AtomicU64,
    pub used: [AtomicU64; MAX_DEVICES],
    /// The part of `used` that is driver overhead (contexts, module code, limits), as the holder
    /// last published it (informational: for `gpuslice status`; never released from).
    pub overhead: [AtomicU64; MAX_DEVICES],
    /// Times this slot was claimed: each holder's own number, which the node's word names.
    pub claims: AtomicU64,
    /// How the holder knows its driver memory (`RECONCILED_*`), as it last published it.
    pub reconciled: AtomicU32,
    /// The PID the driver lists the holder under, as the node found it (0: not found).
    pub node_pid: AtomicU32,
    /// The claim (`claims`) the node's word below was read for; 0 while it is being written.
    pub node_claim: AtomicU64,
    /// When the node read it (unix ms).
    pub node_ms: AtomicU64,
    /// Per device: the driver memory the node found the holder using beyond its allocations (NVML's
    /// per-process used memory, by host PID, less what the slot was charged for allocations when
    /// it was read); `NODE_NOT_LISTED`: not listed there. Tenant-writable: a hint.
    pub node_overhead: [AtomicU64; MAX_DEVICES],
}

/// `Slot::node_overhead` of a device the node did not find the process on.
pub const NODE_NOT_LISTED: u64 = u64::MAX;

/// What the node found for the holder of claim `claim` of a slot (docs/MEMORY.md, "Reconciled by
/// the node"): its driver memory beyond its allocations per device (`NODE_NOT_LISTED` where not
/// listed), read at `now_ms`, the driver listing it as `host_pid`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeWord {
    pub claim: u64,
    pub host_pid: u32,
    pub overhead: [u64; MAX_DEVICES],
    pub now_ms: u64,
}

/// `Slot::reconciled`: nothing published yet (no driver overhead measured).
pub const RECONCILED_UNKNOWN: u32 = 0;
/// From the process's own line in NVML's lists (it knows the PID the driver lists it under).
pub const RECONCILED_OWN: u32 = 1;
/// From the node's word (another PID namespace, a node reconciling).
pub const RECONCILED_NODE: u32 = 2;
/// Not reconciled: measured from the device's used memory, estimated where it cannot be.
pub const RECONCILED_ESTIMATED: u32 = 3;

/// The whole file.
#[repr(C)]
pub struct Layout {
    pub header: Header,
    pub devices: [DeviceEntry; MAX_DEVICES],
    pub slots: [Slot; MAX_SLOTS],
}

pub const HEADER_SIZE: usize = size_of::<Header>();
#[cfg(test)]
pub const TOTAL_SIZE: usize = size_of::<Layout>();
pub const DEVICE_TABLE_OFFSET: usize = offset_of!(Layout, devices);
pub const SLOT_TABLE_OFFSET: usize = offset_of!(Layout, slots);

fn u32_at(buf: &[u8], at: usize) -> u64 {
    u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap_or([0; 4])) as u64
}

fn u64_at(buf: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(buf[at..at + 8].try_into().unwrap_or([0; 8]))
}

// SAFETY: `#[repr(C)]`, only atomics, starts with the slot file's `Prefix`, 8-byte aligned.
unsafe impl SlotLayout for Layout {
    const MAGIC: [u8; 8] = MAGIC;
    const VERSION: u32 = LAYOUT_VERSION;
    const HEADER_BYTES: usize = HEADER_SIZE;

    fn check_header(h: &[u8]) -> Result<(), (&'static str, u64, u64)> {
        let checks: [(&str, u64, u64); 5] = [
            (
                "header size",
                u32_at(h, offset_of!(Header, header_size)),
                HEADER_SIZE as u64,
            ),
            (
                "device count",
                u32_at(h, offset_of!(Header, max_devices)),
                MAX_DEVICES as u64,
            ),
            (
                "slot count",
                u32_at(h, offset_of!(Header, max_slots)),
                MAX_SLOTS as u64,
            ),
            (
                "device table offset",
                u64_at(h, offset_of!(Header, device_table_offset)),
                DEVICE_TABLE_OFFSET as u64,
            ),
            (
                "slot table offset",
                u64_at(h, offset_of!(Header, slot_table_offset)),
                SLOT_TABLE_OFFSET as u64,
            ),
        ];
        match checks.into_iter().find(|(_, found, want)| found != want) {
            Some(bad) => Err(bad),
            None => Ok(()),
        }
    }

    fn check(&self) -> Result<(), String> {
        for d in 0..MAX_DEVICES {
            let s = self.device_state(d);
            if s > DEV_READY {
                return Err(format!("device entry {d} has state {s:#x}"));
            }
        }
        for i in 0..MAX_SLOTS {
            let s = self.slot_state(i);
            if s > SLOT_RECLAIMING {
                return Err(format!("process slot {i} has state {s:#x}"));
            }
        }
        Ok(())
    }
}

/// Why a reservation was refused: `used + requested > limit` (all values at the time of the check).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused {
    pub used: u64,
    pub limit: u64,
}

/// Packs a key string into the entry's words (NUL-padded). `None` if it is empty or too long.
pub fn pack_key(key: &str) -> Option<[u64; KEY_BYTES / 8]> {
    pack_text(key)
}

/// 128 bits from the kernel's random source (never 0; the clock and pid if getrandom fails).
fn random_id() -> [u64; 2] {
    let mut id = [0u64; 2];
    // SAFETY: writes at most 16 bytes into `id`.
    let n = unsafe { libc::getrandom(id.as_mut_ptr().cast(), 16, 0) };
    if n != 16 || id == [0, 0] {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid out-parameter.
        unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u64;
        id = [(ts.tv_sec as u64) << 32 ^ ts.tv_nsec as u64, pid | 1 << 63];
    }
    id
}

impl Layout {
    // ---- creation (the file is private to its creator until published) ----

    /// Fills in a fresh zeroed ledger (the slot file writes the prefix and publishes it).
    pub fn initialise(
        &self,
        creator_pid: u32,
        now_ms: u64,
        tenant: &str,
        default_limit: u64,
        default_flags: u32,
    ) {
        let h = &self.header;
        h.header_size.store(HEADER_SIZE as u32, Ordering::Relaxed);
        h.max_devices.store(MAX_DEVICES as u32, Ordering::Relaxed);
        h.max_slots.store(MAX_SLOTS as u32, Ordering::Relaxed);
        h.creator_pid.store(creator_pid, Ordering::Relaxed);
        h.device_table_offset
            .store(DEVICE_TABLE_OFFSET as u64, Ordering::Relaxed);
        h.slot_table_offset
            .store(SLOT_TABLE_OFFSET as u64, Ordering::Relaxed);
        h.created_unix_ms.store(now_ms, Ordering::Relaxed);
        h.default_limit.store(default_limit, Ordering::Relaxed);
        h.default_flags.store(default_flags, Ordering::Relaxed);
        let name = pack_key(tenant).unwrap_or_default();
        for (dst, w) in h.tenant.iter().zip(name) {
            dst.store(w, Ordering::Relaxed);
        }
        for (dst, w) in h.id.iter().zip(random_id()) {
            dst.store(w, Ordering::Relaxed);
        }
    }

    // ---- header ----

    pub fn tenant(&self) -> String {
        unpack_text(&self.header.tenant)
    }

    /// The tenant's identity (`None` for a ledger created before identities existed).
    pub fn id(&self) -> Option<u128> {
        let [a, b] = [0, 1].map(|i| self.header.id[i].load(Ordering::Acquire));
        let id = (u128::from(a) << 64) | u128::from(b);
        (id != 0).then_some(id)
    }

    /// Publishes that this tenant's work on device `device` has waited since `since` (seen `now`).
    pub fn publish_stall(&self, device: u64, since: u64, now: u64) {
        let s = &self.header.stall;
        s[0].store(device, Ordering::Release);
        s[1].store(since, Ordering::Release);
        s[2].store(now, Ordering::Release);
    }

    /// The last published wait: (device, since, last seen). Untrusted words.
    pub fn stall(&self) -> (u64, u64, u64) {
        let s = &self.header.stall;
        (
            s[0].load(Ordering::Acquire),
            s[1].load(Ordering::Acquire),
            s[2].load(Ordering::Acquire),
        )
    }

    pub fn creator_pid(&self) -> u32 {
        self.header.creator_pid.load(Ordering::Relaxed)
    }

    pub fn default_limit(&self) -> (u64, u32) {
        (
            self.header.default_limit.load(Ordering::Acquire),
            self.header.default_flags.load(Ordering::Acquire),
        )
    }

    pub fn reclaims(&self) -> u64 {
        self.header.reclaims.load(Ordering::Acquire)
    }

    // ---- devices ----

    #[inline]
    pub fn device_state(&self, dev: usize) -> u32 {
        self.devices[dev].state.load(Ordering::Acquire)
    }

    pub fn device_key(&self, dev: usize) -> String {
        unpack_text(&self.devices[dev].key)
    }

    fn key_equals(&self, dev: usize, key: &[u64; KEY_BYTES / 8]) -> bool {
        self.devices[dev]
            .key
            .iter()
            .zip(key)
            .all(|(a, b)| a.load(Ordering::Relaxed) == *b)
    }

    /// Finds the READY entry with `key`, or claims an empty one (CAS EMPTY -> CLAIMING, fill, READY).
    /// Waits (up to `patience` spins of ~1 ms) while another process is claiming an entry, so the same
    /// device is never added twice. `None` if the table is full.
    pub fn find_or_add_device(
        &self,
        key: &[u64; KEY_BYTES / 8],
        limit: u64,
        flags: u32,
        patience: u32,
    ) -> Option<usize> {
        let mut waited = 0;
        loop {
            let mut claiming = false;
            let mut empty = None;
            for dev in 0..MAX_DEVICES {
                match self.device_state(dev) {
                    DEV_READY if self.key_equals(dev, key) => return Some(dev),
                    DEV_CLAIMING => claiming = true,
                    DEV_EMPTY if empty.is_none() => empty = Some(dev),
                    _ => {}
                }
            }
            // A claimer that died mid-claim leaves CLAIMING forever: after `patience`, carry on past it.
            if claiming && waited < patience {
                waited += 1;
                std::thread::sleep(std::time::Duration::from_millis(1));
                continue;
            }
            let dev = empty?;
            let e = &self.devices[dev];
            if e.state
                .compare_exchange(DEV_EMPTY, DEV_CLAIMING, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            for (dst, w) in e.key.iter().zip(key) {
                dst.store(*w, Ordering::Relaxed);
            }
            e.limit.store(limit, Ordering::Relaxed);
            e.flags.store(flags, Ordering::Relaxed);
            e.used.store(0, Ordering::Relaxed);
            e.peak.store(0, Ordering::Relaxed);
            e.denied.store(0, Ordering::Relaxed);
            e.state.store(DEV_READY, Ordering::Release);
            return Some(dev);
        }
    }

    /// Finds a READY entry without adding one.
    pub fn find_device(&self, key: &[u64; KEY_BYTES / 8]) -> Option<usize> {
        (0..MAX_DEVICES).find(|&d| self.device_state(d) == DEV_READY && self.key_equals(d, key))
    }

    pub fn limit(&self, dev: usize) -> u64 {
        self.devices[dev].limit.load(Ordering::Acquire)
    }

    pub fn flags(&self, dev: usize) -> u32 {
        self.devices[dev].flags.load(Ordering::Acquire)
    }

    pub fn used(&self, dev: usize) -> u64 {
        self.devices[dev].used.load(Ordering::Acquire)
    }

    pub fn peak(&self, dev: usize) -> u64 {
        self.devices[dev].peak.load(Ordering::Acquire)
    }

    pub fn denied(&self, dev: usize) -> u64 {
        self.devices[dev].denied.load(Ordering::Acquire)
    }

    /// Counts a reservation refused at the quota.
    pub fn count_denied(&self, dev: usize) {
        self.devices[dev].denied.fetch_add(1, Ordering::Relaxed);
    }

    pub fn set_limit(&self, dev: usize, limit: u64) {
        let e = &self.devices[dev];
        e.limit.store(limit, Ordering::Release);
        e.flags.fetch_and(!DEV_FLAG_INVALID, Ordering::AcqRel);
    }

    /// The one compare-and-swap loop of the quota: `used += bytes` iff `used + bytes <= limit`.
    /// The limit is read on every call, so a changed limit applies to the next reservation.
    #[inline]
    pub fn reserve(&self, dev: usize, bytes: u64) -> Result<u64, Refused> {
        let e = &self.devices[dev];
        let limit = e.limit.load(Ordering::Acquire);
        let new =
            atomic::add_within(&e.used, bytes, limit).map_err(|used| Refused { used, limit })?;
        // Read first: a locked read-modify-write on every reservation costs more than the rest of
        // it, and the peak rarely moves.
        if new > e.peak.load(Ordering::Relaxed) {
            e.peak.fetch_max(new, Ordering::AcqRel);
        }
        Ok(new)
    }

    /// `used -= bytes`, saturating at 0. Returns the amount that could not be subtracted.
    #[inline]
    pub fn release(&self, dev: usize, bytes: u64) -> u64 {
        saturating_sub(&self.devices[dev].used, bytes)
    }

    // ---- process slots ----

    pub fn slot_state(&self, slot: usize) -> u32 {
        self.slots[slot].state.load(Ordering::Acquire)
    }

    pub fn slot_pid(&self, slot: usize) -> u32 {
        self.slots[slot].pid.load(Ordering::Relaxed)
    }

    pub fn slot_used(&self, slot: usize, dev: usize) -> u64 {
        self.slots[slot].used[dev].load(Ordering::Acquire)
    }

    /// Claims a FREE slot; the caller holds the slot's lock.
    pub fn claim_slot(&self, slot: usize, pid: u32, now_ms: u64) -> bool {
        let s = &self.slots[slot];
        if !atomic::take(&s.state, SLOT_FREE, SLOT_ACTIVE) {
            return false;
        }
        s.pid.store(pid, Ordering::Relaxed);
        s.started_unix_ms.store(now_ms, Ordering::Relaxed);
        for u in s.used.iter().chain(&s.overhead) {
            u.store(0, Ordering::Relaxed);
        }
        s.reconciled.store(RECONCILED_UNKNOWN, Ordering::Relaxed);
        s.node_claim.store(0, Ordering::Relaxed);
        s.node_pid.store(0, Ordering::Relaxed);
        s.claims.fetch_add(1, Ordering::AcqRel);
        true
    }

    // ---- the node's word (docs/MEMORY.md, "Reconciled by the node") ----

    /// The claim number of the slot's current holder.
    pub fn slot_claims(&self, slot: usize) -> u64 {
        self.slots[slot].claims.load(Ordering::Acquire)
    }

    pub fn slot_reconciled(&self, slot: usize) -> u32 {
        self.slots[slot].reconciled.load(Ordering::Relaxed)
    }

    pub fn set_slot_reconciled(&self, slot: usize, how: u32) {
        self.slots[slot].reconciled.store(how, Ordering::Relaxed);
    }

    /// The node writes what it found for the holder of a claim of `slot` ([`NodeWord`]). The claim
    /// is cleared first and written last, so a reader that sees the same claim before and after
    /// reading the figures read them whole. Nothing for a slot out of range or free.
    pub fn publish_node_word(&self, slot: usize, word: &NodeWord) {
        let Some(s) = self.slots.get(slot) else {
            return;
        };
        if s.state.load(Ordering::Acquire) != SLOT_ACTIVE {
            return;
        }
        s.node_claim.store(0, Ordering::Release);
        for (dst, v) in s.node_overhead.iter().zip(&word.overhead) {
            dst.store(*v, Ordering::Release);
        }
        s.node_ms.store(word.now_ms, Ordering::Release);
        s.node_pid.store(word.host_pid, Ordering::Release);
        s.node_claim.store(word.claim, Ordering::Release);
    }

    /// The node's word for the slot's current holder: (figure on `dev`, when read, host PID);
    /// `None` when there is none for this claim, or it changed while read. Untrusted words.
    pub fn node_word(&self, slot: usize, dev: usize) -> Option<(u64, u64, u32)> {
        let s = &self.slots[slot];
        let claim = s.claims.load(Ordering::Acquire);
        if claim == 0 || s.node_claim.load(Ordering::Acquire) != claim {
            return None;
        }
        let figure = s.node_overhead[dev].load(Ordering::Acquire);
        let ms = s.node_ms.load(Ordering::Acquire);
        let pid = s.node_pid.load(Ordering::Acquire);
        (s.node_claim.load(Ordering::Acquire) == claim).then_some((figure, ms, pid))
    }

    pub fn node_pass_ms(&self) -> u64 {
        self.header.node_ms.load(Ordering::Acquire)
    }

    pub fn set_node_pass_ms(&self, ms: u64) {
        self.header.node_ms.store(ms, Ordering::Release);
    }

    pub fn slot_overhead(&self, slot: usize, dev: usize) -> u64 {
        self.slots[slot].overhead[dev].load(Ordering::Relaxed)
    }

    pub fn set_slot_overhead(&self, slot: usize, dev: usize, bytes: u64) {
        self.slots[slot].overhead[dev].store(bytes, Ordering::Relaxed);
    }

    /// When the node last wrote a word for slot `slot`'s process (unix ms; 0: never).
    #[inline]
    pub fn slot_node_ms(&self, slot: usize) -> u64 {
        self.slots[slot].node_ms.load(Ordering::Relaxed)
    }

    #[inline]
    pub fn slot_add(&self, slot: usize, dev: usize, bytes: u64) {
        let u = &self.slots[slot].used[dev];
        // Saturating: a garbage counter must not wrap.
        let mut cur = u.load(Ordering::Relaxed);
        while let Err(now) = u.compare_exchange_weak(
            cur,
            cur.saturating_add(bytes),
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            cur = now;
        }
    }

    /// Returns the amount that could not be subtracted (the slot recorded less).
    #[inline]
    pub fn slot_sub(&self, slot: usize, dev: usize, bytes: u64) -> u64 {
        saturating_sub(&self.slots[slot].used[dev], bytes)
    }

    /// Gives a dead (or our own, on exit) slot's usage back to the devices and frees it. The caller
    /// holds the slot's lock, so no other process can be reclaiming or claiming it. Returns `None`
    /// if the slot was FREE, else the bytes the slot claimed beyond what its devices could owe it
    /// (0 unless the file was written by something else).
    pub fn reclaim_slot(&self, slot: usize) -> Option<u64> {
        let s = &self.slots[slot];
        let state = s.state.load(Ordering::Acquire);
        if state == SLOT_FREE {
            return None;
        }
        // ACTIVE -> RECLAIMING; a slot already RECLAIMING was left by a cleaner that died: finish it.
        if state != SLOT_RECLAIMING
            && s.state
                .compare_exchange(state, SLOT_RECLAIMING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return None;
        }
        // swap(0) first: whatever happens next, no amount is given back twice.
        let mut excess = 0u64;
        for dev in 0..MAX_DEVICES {
            let n = s.used[dev].swap(0, Ordering::AcqRel);
            if n > 0 {
                let owed = n.min(self.unowned(dev, slot));
                excess = excess.saturating_add(n - owed);
                saturating_sub(&self.devices[dev].used, owed);
            }
        }
        s.pid.store(0, Ordering::Relaxed);
        s.state.store(SLOT_FREE, Ordering::Release);
        self.header.reclaims.fetch_add(1, Ordering::AcqRel);
        Some(excess)
    }

    /// What device `dev` counts beyond the other slots' (all but `slot`) usage: the most `slot` can
    /// hold there. Reservations raise the device before the slot and releases lower the slot
    /// first, so the slots never add up to more than the device: a slot claiming more (a value
    /// written into the file) is given back only this much, and the live processes' charges stay.
    fn unowned(&self, dev: usize, slot: usize) -> u64 {
        let others = self
            .slots
            .iter()
            .enumerate()
            .filter(|&(i, s)| i != slot && s.state.load(Ordering::Acquire) != SLOT_FREE)
            .fold(0u64, |sum, (_, s)| {
                sum.saturating_add(s.used[dev].load(Ordering::Acquire))
            });
        self.devices[dev]
            .used
            .load(Ordering::Acquire)
            .saturating_sub(others)
    }
}

/// `a -= bytes` saturating at 0; returns the shortfall.
#[inline]
fn saturating_sub(a: &AtomicU64, bytes: u64) -> u64 {
    atomic::sub_saturating(a, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_stable() {
        // Offsets are part of the file format (LAYOUT_VERSION 4).
        assert_eq!(HEADER_SIZE, 256);
        assert_eq!(size_of::<DeviceEntry>(), 104);
        assert_eq!(size_of::<Slot>(), 16 + 3 * 8 * MAX_DEVICES + 32);
        assert_eq!(DEVICE_TABLE_OFFSET, HEADER_SIZE);
        assert_eq!(SLOT_TABLE_OFFSET, HEADER_SIZE + MAX_DEVICES * 104);
        assert_eq!(
            TOTAL_SIZE,
            SLOT_TABLE_OFFSET + MAX_SLOTS * size_of::<Slot>()
        );
        assert_eq!(&u64::from_ne_bytes(MAGIC).to_ne_bytes(), b"GPUSLICE");
    }

    #[test]
    fn keys() {
        assert!(pack_key("").is_none());
        assert!(pack_key(&"x".repeat(65)).is_none());
        assert!(pack_key(&"x".repeat(64)).is_some());
    }
}
