//! Reserving in the ledger before the driver is asked: the [`Reservation`] guard, refusals (one
//! rate-limited log line each) and releases.

use super::{Charge, Device, Tenant};
use crate::config;
use crate::ledger::{Ledger, QuotaExceeded, Refusal};
use crate::log;
use gpuslice_api::CUerror;
use std::sync::atomic::Ordering::Relaxed;

/// Refusal lines logged per second at most (a program retrying in a loop must not flood its log).
pub const REFUSALS_LOGGED_PER_SECOND: u32 = 20;

/// Bytes reserved in the ledger for a driver call that has not happened yet. Dropping it gives them
/// back (the call failed, or the caller returned early); [`Reservation::commit`] keeps them, and
/// hands the charge to whatever record returns it later.
#[must_use = "a reservation is released when dropped: commit it once the driver succeeded"]
pub struct Reservation<'t> {
    tenant: &'t Tenant,
    charge: Option<Charge>,
}

impl<'t> Reservation<'t> {
    /// The charge being held.
    pub fn charge(&self) -> Charge {
        self.charge.unwrap_or(Charge {
            device: 0,
            bytes: 0,
        })
    }

    /// Keeps the reserved bytes charged; the caller now owns their release.
    pub fn commit(mut self) -> Charge {
        self.charge.take().unwrap_or(Charge {
            device: 0,
            bytes: 0,
        })
    }
}

impl Drop for Reservation<'_> {
    #[inline]
    fn drop(&mut self) {
        // Inline, so that a committed reservation (`charge` taken) costs nothing here.
        if let Some(charge) = self.charge.take() {
            self.tenant.roll_back(charge);
        }
    }
}

impl Tenant {
    /// Reserves `bytes` on `device` before the driver is asked for them. A new word of the node
    /// for this process is applied first ([`Tenant::node_word_due`]).
    ///
    /// Inlined into the allocation hooks: the common case (a device with a ledger slot, no node
    /// ceiling, no new word of the node, room left) reads the ledger's handle once and makes no
    /// call; any other case takes [`Tenant::reserve_slowly`], whose steps are the same.
    #[inline(always)]
    pub fn reserve(
        &self,
        device: &Device,
        bytes: u64,
        what: &str,
    ) -> Result<Reservation<'_>, CUerror> {
        if let (Ok(slot), None, Some(Ok(ledger))) =
            (&device.slot, device.ceiling, self.ledger.get())
        {
            if ledger.reserve_quickly_unless_node(*slot, bytes, Self::node_word_applied()) {
                return Ok(self.reserved(Charge {
                    device: *slot,
                    bytes,
                }));
            }
        }
        self.reserve_slowly(device, bytes, what)
    }

    /// [`Tenant::reserve`] off its common case: the node's new word applied, then the checked
    /// reservation.
    #[inline(never)]
    fn reserve_slowly(
        &self,
        device: &Device,
        bytes: u64,
        what: &str,
    ) -> Result<Reservation<'_>, CUerror> {
        if self.node_word_due() {
            self.apply_node_word(device);
        }
        self.reserve_or_make_room(device, bytes, what, || false)
    }

    /// [`Tenant::reserve`], calling `make_room` once before refusing; when it returns true (it gave
    /// memory back), the reservation is tried again.
    #[inline(never)]
    pub fn reserve_or_make_room(
        &self,
        device: &Device,
        bytes: u64,
        what: &str,
        make_room: impl FnOnce() -> bool,
    ) -> Result<Reservation<'_>, CUerror> {
        let slot = match &device.slot {
            Ok(slot) => *slot,
            Err(why) => {
                log::warn(format_args!(
                    "tenant {}: {what} of {} on {} (device {}) refused: {why}",
                    self.config.tenant,
                    config::format_bytes(bytes),
                    device.uuid,
                    device.ordinal
                ));
                return Err(CUerror::OUT_OF_MEMORY);
            }
        };
        let ledger = self.ledger().map_err(|_| CUerror::OUT_OF_MEMORY)?;
        // Refused at the quota: memory pools may hold less than was charged for them since the
        // last look (settled, then tried again); then `make_room`, once. The loop is here, never
        // in the ledger: making room calls the driver and re-enters the bookkeeping.
        let mut settled = false;
        let mut make_room = Some(make_room);
        let mut attempt = loop {
            let e = match ledger.try_reserve_once(slot, bytes) {
                Ok(()) => break Ok(()),
                Err(Refusal::Closed(e)) => break Err(e),
                Err(Refusal::AtQuota(e)) => e,
            };
            let again = if settled {
                make_room.take().is_some_and(|f| f())
            } else {
                settled = true;
                self.room_from_finished_work() || make_room.take().is_some_and(|f| f())
            };
            if !again {
                // Counted once per refused call, however many tries it took.
                ledger.count_denied(slot);
                break Err(e);
            }
        };
        if attempt.is_ok() {
            // Reserve, then check the node's ceiling: of reservations racing past it, none proceeds.
            if let Err(e) = self.within_policy(device, ledger, slot, bytes) {
                ledger.release(slot, bytes);
                // A refusal at the node's ceiling is a refusal at the quota: counted as denied.
                ledger.count_denied(slot);
                attempt = Err(e);
            }
        }
        match attempt {
            Ok(()) => Ok(self.reserved(Charge {
                device: slot,
                bytes,
            })),
            Err(e) => {
                self.refused(device, bytes, what, e);
                Err(CUerror::OUT_OF_MEMORY)
            }
        }
    }

    /// Gives back what finished work no longer holds (graphs' memory, pools' released memory)
    /// before a refusal; true when the reservation is worth trying again.
    fn room_from_finished_work(&self) -> bool {
        let graphs = self.release_finished_graph_memory();
        if self.has_pools() {
            self.settle_pools();
            return true;
        }
        graphs
    }

    /// A guard for bytes already reserved in the ledger.
    #[inline]
    pub fn reserved(&self, charge: Charge) -> Reservation<'_> {
        Reservation {
            tenant: self,
            charge: Some(charge),
        }
    }

    /// Reserves `bytes`, runs `call`, and commits the charge if it succeeded (released otherwise).
    /// Inlined: `call` is the driver's, and a frame around it costs a mispredicted return.
    #[inline(always)]
    pub fn charge_around<T>(
        &self,
        device: &Device,
        bytes: u64,
        what: &str,
        call: impl FnOnce() -> Result<T, CUerror>,
    ) -> Result<(T, Charge), CUerror> {
        let reservation = self.reserve(device, bytes, what)?;
        let value = call()?;
        Ok((value, reservation.commit()))
    }

    /// The warn line of a refused allocation: tenant, device, requested, used and limit. A program
    /// that keeps retrying gets at most [`REFUSALS_LOGGED_PER_SECOND`] lines a second; the next line
    /// logged says how many were left out.
    pub fn refused(&self, device: &Device, requested: u64, what: &str, e: QuotaExceeded) {
        let now = std::time::Instant::now();
        {
            let mut window = self.last_refusal_log.lock();
            match &mut *window {
                Some((start, n))
                    if now.duration_since(*start) < std::time::Duration::from_secs(1) =>
                {
                    if *n >= REFUSALS_LOGGED_PER_SECOND {
                        self.refusals_unlogged.fetch_add(1, Relaxed);
                        return;
                    }
                    *n += 1;
                }
                _ => *window = Some((now, 1)),
            }
        }
        let more = match self.refusals_unlogged.swap(0, Relaxed) {
            0 => String::new(),
            n => format!(" ({n} earlier refusals not logged)"),
        };
        if e.closed {
            let ledger = self
                .ledger()
                .map_or_else(|_| "its ledger".into(), |l| l.path().display().to_string());
            log::warn(format_args!(
                "tenant {}: {what} of {} on {} (device {}) refused: {ledger} cannot be charged \
                 here (damaged, read-only, or every process slot taken: see the error logged \
                 before){more}",
                self.config.tenant,
                config::format_bytes(requested),
                device.uuid,
                device.ordinal,
            ));
            return;
        }
        log::warn(format_args!(
            "tenant {}: {what} of {} on {} (device {}) refused: {} of {} in use{more}",
            self.config.tenant,
            config::format_bytes(requested),
            device.uuid,
            device.ordinal,
            config::format_bytes(e.used),
            config::format_bytes(e.limit)
        ));
    }

    /// Returns a reservation the driver call did not use.
    #[inline(never)]
    fn roll_back(&self, charge: Charge) {
        self.release(charge);
    }

    /// Returns a charge to the quota.
    #[inline]
    pub fn release(&self, charge: Charge) {
        if charge.bytes == 0 {
            return;
        }
        if let Some(Ok(ledger)) = self.ledger.get() {
            ledger.release(charge.device, charge.bytes);
        }
    }
}

impl Tenant {
    /// With a node policy, the ledger's usage (this reservation included) must stay within the
    /// policy's ceiling whatever the ledger's own limit says: the ledger is writable by the tenant.
    #[inline]
    fn within_policy(
        &self,
        device: &Device,
        ledger: &Ledger,
        slot: usize,
        bytes: u64,
    ) -> Result<(), QuotaExceeded> {
        let Some(ceiling) = device.ceiling else {
            return Ok(());
        };
        let used = ledger.used(slot);
        if used <= ceiling {
            return Ok(());
        }
        Err(QuotaExceeded {
            requested: bytes,
            used: used.saturating_sub(bytes),
            limit: ceiling,
            closed: false,
        })
    }

    /// The ledger's limit of a device, lowered to the node policy's ceiling.
    pub(super) fn effective_limit(
        &self,
        ledger: &Ledger,
        slot: usize,
        ordinal: u32,
        uuid: &str,
    ) -> u64 {
        let limit = ledger.limit(slot);
        self.config
            .memory_ceiling(ordinal, uuid)
            .map_or(limit, |c| c.min(limit))
    }
}
