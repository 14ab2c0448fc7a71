//! Module code charged up front, without a measurement: a module or library load, or a lazily
//! loaded kernel's lookup, whose cost is known from the image (its pages) is charged that cost,
//! reserved before the driver is asked as an allocation is, with no measurement lock and no
//! reading of the driver's figures around the call, when the process reads its own figure and its
//! last reading agreed with the ledger ([`Tenant::agreed`]) and the quota keeps room beyond it.
//! Every [`VERIFY_EVERY`]-th such operation on a device (a load, a lookup, an unload) reads the
//! process's own figure once and reconciles: what the driver spent beyond the images is charged as
//! unattributed overhead, and until the reading agrees again every operation is measured. Near the
//! quota (less than [`MARGIN`] left after the charge) every operation is measured as before
//! (docs/MEMORY.md, "Module code charged up front").

use super::{Charge, Device, Tenant};
use gpuslice_api::CUerror;

/// Operations charged up front on a device between two readings of the process's own figure: the
/// last of them reads it and reconciles.
pub const VERIFY_EVERY: u32 = 32;

/// Room the quota must keep beyond an operation charged up front: what the driver may spend
/// beyond the images of the operations not yet verified (at most [`VERIFY_EVERY`] of them) without
/// taking the tenant past its quota.
pub const MARGIN: u64 = 64 << 20;

impl Tenant {
    /// Whether an operation of `expected` bytes known beforehand (module code, from the image) on
    /// `device` is charged that without a measurement: the process's last reconciliation there
    /// read its own figure and left the ledger agreeing with it, fewer than [`VERIFY_EVERY`]
    /// operations were charged so since, and the quota keeps [`MARGIN`] of room beyond it.
    pub(super) fn may_charge_up_front(&self, device: &Device, expected: u64) -> bool {
        let Ok(slot) = device.slot else {
            return false;
        };
        if self.context_reserve_is_explicit()
            || !self.agreed(slot)
            || self.unmeasured_on(slot) >= VERIFY_EVERY
        {
            return false;
        }
        let Some(Ok(ledger)) = self.ledger.get() else {
            return false;
        };
        let limit = ledger.limit(slot);
        let limit = device.ceiling.map_or(limit, |c| c.min(limit));
        let room = limit.saturating_sub(ledger.used(slot));
        room >= expected.saturating_add(MARGIN)
    }

    /// Runs `call` charged `expected`, reserved before the driver is asked (over the quota the
    /// driver never sees the call), without a lock or a reading ([`Tenant::may_charge_up_front`]
    /// said so). The caller records the charge, then calls [`Tenant::settle_up_front`].
    pub(super) fn charge_up_front<T>(
        &self,
        device: &Device,
        expected: u64,
        what: &str,
        call: impl FnOnce() -> Result<T, CUerror>,
    ) -> Result<(T, Charge), CUerror> {
        let slot = device.slot.as_ref().map_or(0, |s| *s);
        let reservation = match expected {
            0 => None,
            bytes => Some(self.reserve(device, bytes, what)?),
        };
        let value = call()?;
        let charge = reservation.map_or(
            Charge {
                device: slot,
                bytes: 0,
            },
            |r| r.commit(),
        );
        Ok((value, charge))
    }

    /// After an operation charged up front (recorded) or an object unloaded without a reading:
    /// counts it and publishes the process's overhead; the [`VERIFY_EVERY`]-th reads the process's
    /// own figure and reconciles ([`Tenant::reconcile_device`]).
    pub(super) fn settle_up_front(&self, device: &Device) {
        let Ok(slot) = device.slot else { return };
        if self.note_unmeasured(slot) >= VERIFY_EVERY {
            return self.reconcile_device(device);
        }
        if let Some(Ok(ledger)) = self.ledger.get() {
            ledger.set_overhead_by_me(slot, self.overhead_on(Some(slot)));
        }
    }
}
