//! Words a process publishes for the others and the node reads or writes: its wait, its driver
//! overhead, how it reconciled its driver memory, and the node's word for each process.

use super::*;

impl Ledger {
    /// Publishes that this tenant's work on device `device` (a key common to every process of the
    /// machine) has waited without completing since `since` (CLOCK_MONOTONIC ns), seen at `now`.
    /// A ledger read from a private copy publishes nothing.
    pub fn publish_stall(&self, device: u64, since: u64, now: u64) {
        if let Map::Shared(_) = &self.map {
            if !self.damaged(false) {
                self.layout().publish_stall(device, since, now);
            }
        }
    }

    /// The tenant's last published wait: (device key, since, last seen); untrusted words.
    pub fn stall(&self) -> (u64, u64, u64) {
        self.layout().stall()
    }

    /// Publishes how much of this process's usage on a device is driver overhead (for status).
    pub fn set_overhead_by_me(&self, dev: usize, bytes: u64) {
        if let Some(s) = self.slot() {
            if self.writable && dev < MAX_DEVICES {
                self.layout().set_slot_overhead(s, dev, bytes);
            }
        }
    }

    /// The node's word for this process on `dev`: (driver memory beyond its allocations, when the
    /// node read it, unix ms). Untrusted (the tenant can write it): a hint.
    pub fn node_word_for_me(&self, dev: usize) -> Option<(u64, u64)> {
        match self.slot() {
            Some(s) if dev < MAX_DEVICES && !self.fork_pending() => self
                .layout()
                .node_word(s, dev)
                .filter(|&(figure, _, _)| figure != NODE_NOT_LISTED)
                .map(|(figure, ms, _)| (figure, ms)),
            _ => None,
        }
    }

    /// When the node last wrote a word for this process (unix ms; 0: never): cheap enough for
    /// the allocation path to notice a new one.
    #[inline]
    pub fn node_stamp_for_me(&self) -> u64 {
        match self.slot() {
            Some(s) => self.layout().slot_node_ms(s),
            None => 0,
        }
    }

    /// Publishes how this process knows its driver memory (`RECONCILED_*`, for status).
    pub fn set_reconciled_by_me(&self, how: u32) {
        if let Some(s) = self.slot() {
            if self.writable && self.layout().slot_reconciled(s) != how {
                self.layout().set_slot_reconciled(s, how);
            }
        }
    }

    /// The node: a READY device's index by UUID, never adding one.
    pub fn find_device(&self, uuid: &str) -> Option<usize> {
        self.layout().find_device(&device_key(uuid)?)
    }

    /// The node: the claim number of `slot`'s holder and what the slot is charged on `dev`
    /// (everything, and the part the holder published as driver overhead). `None`: a free slot.
    pub fn slot_charges(&self, slot: usize, dev: usize) -> Option<(u64, u64, u64)> {
        let l = self.layout();
        if slot >= MAX_SLOTS || dev >= MAX_DEVICES || l.slot_state(slot) != shm::SLOT_ACTIVE {
            return None;
        }
        Some((
            l.slot_claims(slot),
            l.slot_used(slot, dev),
            l.slot_overhead(slot, dev),
        ))
    }

    /// The node: publishes its word for the holder of a claim of `slot` (see
    /// `shm::Layout::publish_node_word`). Nothing on a read-only ledger or a free slot.
    pub fn publish_node_word(&self, slot: usize, word: &shm::NodeWord) {
        if self.writable {
            self.layout().publish_node_word(slot, word);
        }
    }

    /// The node: records that its reconciliation went through this ledger at `now_ms`.
    pub fn publish_node_pass(&self, now_ms: u64) {
        if self.writable {
            self.layout().set_node_pass_ms(now_ms);
        }
    }
}
