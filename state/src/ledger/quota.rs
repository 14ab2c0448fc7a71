//! Reservation against the shared quota: the compare-and-swap on a device's `used` before the
//! driver is asked, release after a free, live limits, and the reports of impossible figures.

use super::*;

/// A reservation that would exceed the device's limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaExceeded {
    pub requested: u64,
    pub used: u64,
    /// `UNLIMITED` (u64::MAX) = no limit; 0 with nothing used also covers "denied" (bad device,
    /// read-only ledger, invalid configuration).
    pub limit: u64,
    /// Refused whatever the usage: the ledger is damaged or read-only, the device is not set up in
    /// it, or every process slot is taken (each logged when found).
    pub closed: bool,
}

/// Why a reservation was refused ([`Ledger::try_reserve_once`]).
#[derive(Clone, Copy, Debug)]
pub enum Refusal {
    /// Refused whatever the usage: a read-only or damaged ledger, a device not set up.
    Closed(QuotaExceeded),
    /// No room under the limit: counted as denied (once per call), after any retries.
    AtQuota(QuotaExceeded),
}

impl fmt::Display for QuotaExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.closed {
            return write!(
                f,
                "memory refused: requested {}; the tenant's ledger cannot be charged here",
                format_bytes(self.requested)
            );
        }
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

impl Ledger {
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
    #[inline]
    pub fn try_reserve(&self, dev: usize, bytes: u64) -> Result<(), QuotaExceeded> {
        self.try_reserve_once(dev, bytes)
            .map_err(|refusal| match refusal {
                Refusal::Closed(e) => e,
                Refusal::AtQuota(e) => {
                    self.layout().count_denied(dev);
                    e
                }
            })
    }

    /// [`Ledger::try_reserve`] without counting a refusal at the quota as denied: the caller may
    /// make room and try again, and counts the call once ([`Ledger::count_denied`]) if it gives up.
    #[inline]
    pub fn try_reserve_once(&self, dev: usize, bytes: u64) -> Result<(), Refusal> {
        if self.reserve_quickly(dev, bytes) {
            return Ok(());
        }
        self.try_reserve_checked(dev, bytes)
    }

    /// The common case of [`Ledger::try_reserve`], inline: no fork since the last look, no size
    /// check due, a file never found damaged that still looks sound, room left. `false`: nothing
    /// was reserved, and `try_reserve` (the same steps with their reports, sweeps and counts) must
    /// decide.
    #[inline]
    pub fn reserve_quickly(&self, dev: usize, bytes: u64) -> bool {
        self.reserve_quickly_within(dev, bytes, None)
    }

    /// [`Ledger::reserve_quickly`], also `false` when the node wrote a word for this process
    /// ([`Ledger::node_stamp_for_me`]) other than the one stamped `node_seen`: the allocation
    /// path's two questions with one read of this process's slot.
    #[inline]
    pub fn reserve_quickly_unless_node(&self, dev: usize, bytes: u64, node_seen: u64) -> bool {
        self.reserve_quickly_within(dev, bytes, Some(node_seen))
    }

    #[inline(always)]
    fn reserve_quickly_within(&self, dev: usize, bytes: u64, node_seen: Option<u64>) -> bool {
        let slot = self.slot.load(Ordering::Acquire);
        if !self.writable
            || dev >= MAX_DEVICES
            || slot == NO_SLOT
            || self.fork_pending()
            || self.warned_damage.load(Ordering::Relaxed)
            || now_ms().saturating_sub(self.last_size_check_ms.load(Ordering::Relaxed))
                >= SIZE_CHECK_MS
        {
            return false;
        }
        let l = self.layout();
        if let Some(seen) = node_seen {
            let stamp = l.slot_node_ms(slot);
            if stamp != 0 && stamp != seen {
                return false;
            }
        }
        if l.device_state(dev) != shm::DEV_READY || l.reserve(dev, bytes).is_err() {
            return false;
        }
        l.slot_add(slot, dev, bytes);
        // Checked once, after the updates: faults only add up and the header is read now, so this
        // also covers a file damaged before them, whose repaired (or private) zeros the updates
        // touched harmlessly.
        if self.looks_damaged() {
            // The numbers are gone: the checked path reports it and refuses.
            self.release(dev, bytes);
            return false;
        }
        true
    }

    /// [`Ledger::try_reserve`] with every check: after a fork, when the file's size is due to be
    /// compared, on a refusal (sweeps dead processes). A refusal at the quota is counted by the
    /// caller, once per refused call.
    #[inline(never)]
    fn try_reserve_checked(&self, dev: usize, bytes: u64) -> Result<(), Refusal> {
        let deny = Refusal::Closed(QuotaExceeded {
            requested: bytes,
            used: 0,
            limit: 0,
            closed: true,
        });
        if !self.writable || dev >= MAX_DEVICES {
            return Err(deny);
        }
        self.check_fork();
        let l = self.layout();
        // A truncated file fails closed. Any access to a truncated mapping is contained (the fault
        // handler marks the file damaged), so the size is compared (`fstat`, a system call) only
        // every SIZE_CHECK_MS; the state word is read every time.
        let now = now_ms();
        let check_size =
            now.saturating_sub(self.last_size_check_ms.load(Ordering::Relaxed)) >= SIZE_CHECK_MS;
        if check_size {
            self.last_size_check_ms.store(now, Ordering::Relaxed);
        }
        // Once found damaged, refused for good: the next size check would find it so again, and
        // until then the device table may still look intact.
        if self.warned_damage.load(Ordering::Relaxed) || self.damaged(check_size) {
            return Err(deny);
        }
        if l.device_state(dev) != shm::DEV_READY {
            // A device never set up, or a file truncated or scribbled since the last size check
            // (then named in the log now).
            if !check_size {
                self.damaged(true);
            }
            return Err(deny);
        }
        // This process's first reservation claims its slot.
        if self.own_slot().is_none() {
            return Err(deny);
        }
        let refused = match l.reserve(dev, bytes) {
            Ok(_) => {
                self.charge_slot(dev, bytes);
                // A truncation repaired meanwhile (fault handler): the numbers are gone, fail closed.
                if self.damaged(false) {
                    self.release(dev, bytes);
                    return Err(deny);
                }
                return Ok(());
            }
            Err(r) => r,
        };
        // A refusal is the slow path: a file truncated since the last size check is named now.
        if !check_size && self.damaged(true) {
            return Err(deny);
        }
        if self.sweep_if_due(now) > 0 && l.reserve(dev, bytes).is_ok() {
            self.charge_slot(dev, bytes);
            return Ok(());
        }
        Err(Refusal::AtQuota(QuotaExceeded {
            requested: bytes,
            used: refused.used,
            limit: refused.limit,
            closed: false,
        }))
    }

    /// Counts a reservation refused at the quota that the caller refused itself (the node policy's
    /// ceiling, which the ledger does not know).
    pub fn count_denied(&self, dev: usize) {
        if self.writable && dev < MAX_DEVICES {
            self.layout().count_denied(dev);
        }
    }

    #[inline]
    fn charge_slot(&self, dev: usize, bytes: u64) {
        if let Some(s) = self.slot() {
            self.layout().slot_add(s, dev, bytes);
        }
    }

    /// Gives back `bytes` on `dev` (after a free, or to roll back a reservation the driver then
    /// refused). Saturating: more than was recorded is clamped, and reported once.
    #[inline]
    pub fn release(&self, dev: usize, bytes: u64) {
        // A damaged file's numbers mean nothing any more (and it refuses everything).
        if !self.writable || dev >= MAX_DEVICES || self.warned_damage.load(Ordering::Relaxed) {
            return;
        }
        self.check_fork();
        let l = self.layout();
        // Slot first: dying between the two leaves the device over-counted (fails closed), never under.
        // Only what the slot held leaves the device: the rest is charged to another process's slot
        // (a fork child freeing its parent's allocation), and its sweep gives that back.
        // No slot: this process (a fork child) reserved nothing, so nothing of it leaves.
        let short = match self.slot() {
            Some(s) => l.slot_sub(s, dev, bytes),
            None => bytes,
        };
        let dev_short = l.release(dev, bytes - short);
        if short > 0 || dev_short > 0 {
            self.report_underflow(dev, bytes);
        }
    }

    #[cold]
    pub(super) fn report_impossible_slot(&self, slot: usize, excess: u64) {
        if !self.warned_impossible_slot.swap(true, Ordering::Relaxed) {
            log::warn(format_args!(
                "ledger {}: the dead process of slot {slot} claimed {excess} bytes more than its \
                 devices count beyond the other processes (the file was written by something else): \
                 only what it could hold was given back, the live processes' charges stay \
                 (reported once)",
                self.path.display()
            ));
        }
    }

    #[cold]
    fn report_underflow(&self, dev: usize, bytes: u64) {
        if !self.warned_underflow.swap(true, Ordering::Relaxed) {
            log::warn(format_args!(
                "ledger {}: device {dev}: released {bytes} bytes, more than was recorded (clamped at 0; reported once)",
                self.path.display()
            ));
        }
    }
}

impl Ledger {
    /// This process's slot and its claim number (what [`Ledger::hand_over`] is told of a
    /// receiver), once it holds one.
    pub fn my_claim(&self) -> Option<(usize, u64)> {
        let s = self.slot()?;
        Some((s, self.layout().slot_claims(s)))
    }

    /// Moves `bytes` on `dev` from this process's slot to `to`'s, when `to` is still the live
    /// holder of claim `claim` (another process of the tenant: IPC memory it maps outlives this
    /// process's free, `accounting::ipc`). The device's total is unchanged, so the tenant never
    /// passes its limit by it. False (nothing moved) when `to` is not that process any more.
    pub fn hand_over(&self, dev: usize, to: usize, claim: u64, bytes: u64) -> bool {
        if !self.writable || dev >= MAX_DEVICES || to >= MAX_SLOTS {
            return false;
        }
        let Some(me) = self.slot() else { return false };
        let l = self.layout();
        if to == me
            || l.slot_state(to) != shm::SLOT_ACTIVE
            || l.slot_claims(to) != claim
            || !slotfile::slot_alive::<shm::Layout>(self.raw_fd(), to)
        {
            return false;
        }
        // Mine first: dying between the two leaves the device charged to nobody's slot until the
        // receiver's own release, never twice.
        let short = l.slot_sub(me, dev, bytes);
        l.slot_add(to, dev, bytes - short);
        true
    }
}
