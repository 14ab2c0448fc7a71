//! Measuring what an operation makes the driver spend (a context, module code, a limit's
//! memory) and charging it: [`Measurement`] says what is known before the operation,
//! [`Tenant::charge_measured`] reserves, runs it under the device's measurement lock, reads the
//! driver's figures around it (through the driver seam) and settles the charge.

use super::measure_lock::MeasureLock;
use super::overhead::{warn_once, Sample, WARNED_DISTURBED, WARNED_NEIGHBOUR, WARNED_UNDOABLE};
use super::{Charge, Device, Tenant};
use crate::driver::measure::ProcessFigure;
use gpuslice_api::CUerror;

/// What an operation is expected to cost, reserved before the driver is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expected {
    /// This many bytes (0: unknown).
    Known(u64),
    /// As a context on the device: worked out under the measurement lock, so that the previous
    /// process's context on the device has been charged ([`Tenant::expected_context_cost`]).
    Context,
}

/// What is known of an operation's cost before it runs.
#[derive(Clone, Copy, Debug)]
pub struct Measurement<'a> {
    /// What the operation is, for the log.
    pub what: &'a str,
    /// Charged whatever the driver spends, never measured (`GPUSLICE_CONTEXT_RESERVE`).
    pub explicit: Option<u64>,
    /// Charged when nothing can be measured, and the most a figure that also moves with other
    /// processes is believed (with `expected`).
    pub fallback: u64,
    /// The least the change takes (what NVIDIA documents; negative: it gives memory back).
    pub floor: Option<i128>,
    pub expected: Expected,
    /// What the object is charged already (a limit changed again).
    pub current: u64,
}

impl<'a> Measurement<'a> {
    /// A new object: measured, `fallback` when nothing can be measured, expected to cost `expected`.
    pub fn new(what: &'a str, fallback: u64, expected: Expected) -> Measurement<'a> {
        Measurement {
            what,
            explicit: None,
            fallback,
            floor: None,
            expected,
            current: 0,
        }
    }
}

impl Tenant {
    /// Runs `call` (an operation that makes the driver spend memory on `device`) and charges what it
    /// spent: `m.explicit` when given (never measured), else the measured change, else `fallback`;
    /// never less than `floor` (a change the driver documents, such as a larger heap, which a driver
    /// may reserve only later: the larger figure is charged). `m.expected` (what the operation is
    /// expected to cost; 0: unknown) is reserved before the driver is asked, so that an operation
    /// the quota has no room for is refused before the driver spends memory on it; the charge is
    /// then brought to what was measured. Both are asked and the charge published under the
    /// device's measurement lock, so that the next process's operation on the device (serialised by
    /// the lock) sees this one's charge and can expect what it cost.
    /// `current` is what the object is charged already (a limit changed again): the result is the
    /// object's new charge, the ledger moved by the difference. Over the quota, `undo` reverses the
    /// operation and the call fails with out-of-memory; without `undo` (an operation that cannot be
    /// undone) the call succeeds as the driver answered, charged what was reserved for it.
    /// Measured from the device's used memory (another PID namespace), the charge never passes
    /// what the operation can cost: `m.expected`, else `fallback`. The caller records the charge, then calls
    /// [`Tenant::reconcile_device`].
    pub fn charge_measured<T: Copy>(
        &self,
        device: &Device,
        m: &Measurement<'_>,
        call: impl FnOnce() -> Result<T, CUerror>,
        undo: Option<impl FnOnce(T)>,
    ) -> Result<(T, Charge), CUerror> {
        self.charge_measured_sampled(device, m, call, undo)
            .map(|(value, charge, _)| (value, charge))
    }

    /// [`Tenant::charge_measured`], also returning the driver's figures read after the operation
    /// (`None` when none were read), its ledger readings brought to the settled charge: what the
    /// caller reconciles with once it recorded the charge ([`Tenant::reconcile_with`]), instead of
    /// reading the driver's figures a third time.
    pub(super) fn charge_measured_sampled<T: Copy>(
        &self,
        device: &Device,
        m: &Measurement<'_>,
        call: impl FnOnce() -> Result<T, CUerror>,
        undo: Option<impl FnOnce(T)>,
    ) -> Result<(T, Charge, Option<Sample>), CUerror> {
        let Measurement {
            what,
            explicit,
            fallback,
            floor,
            expected,
            current,
        } = *m;
        // An explicit charge, or the least the change takes, is reserved before the driver is asked,
        // as any allocation: over the quota, the driver never sees the call.
        let known = match (explicit, floor) {
            (Some(e), _) => e.saturating_sub(current),
            (None, Some(f)) => u64::try_from(f.max(0)).unwrap_or(u64::MAX),
            (None, None) => 0,
        };
        let upfront = match (&device.slot, known) {
            // Nothing to reserve yet: no ledger operation (a lowered limit must not refuse 0 bytes).
            (Ok(slot), 0) => self.reserved(Charge {
                device: *slot,
                bytes: 0,
            }),
            _ => self.reserve(device, known, what)?,
        };
        let slot = upfront.charge().device;
        if let Some(bytes) = explicit {
            // An explicit charge is never measured: no lock, no driver figures.
            let value = call()?;
            upfront.commit();
            return Ok((
                value,
                Charge {
                    device: slot,
                    bytes,
                },
                None,
            ));
        }
        // A cost known beforehand is reserved before any lock; a context's is worked out under
        // the exclusive lock (the previous context on the device charged by then).
        let mut predicted = match expected {
            Expected::Known(bytes) => match bytes.saturating_sub(known) {
                0 => None,
                more => Some(self.reserve(device, more, what)?),
            },
            Expected::Context => None,
        };
        // A known cost read from this process's own figure: the shared lock (see `MeasureLock`),
        // found by the first sample under it; otherwise the exclusive lock, sampled under it.
        let mut shared = None;
        if let Expected::Known(_) = expected {
            let lock =
                MeasureLock::acquire_as(&self.config.device_dir, &device.uuid, libc::LOCK_SH);
            let reserved = upfront
                .charge()
                .bytes
                .saturating_add(predicted.as_ref().map_or(0, |p| p.charge().bytes));
            let settled = (current == 0 && floor.is_none())
                .then(|| self.settled_figure(device, slot, reserved))
                .flatten();
            let sample = settled.unwrap_or_else(|| self.sample(device));
            if sample.is_own() {
                shared = Some((lock, sample));
            }
        }
        let (lock, before) = match shared {
            Some((lock, sample)) => (lock, Some(sample)),
            None => (
                MeasureLock::acquire(&self.config.device_dir, &device.uuid),
                None,
            ),
        };
        let expected = match expected {
            Expected::Known(bytes) => bytes,
            Expected::Context => {
                let bytes = self.expected_context_cost(device, fallback);
                if let more @ 1.. = bytes.saturating_sub(known) {
                    predicted = Some(self.reserve(device, more, what)?);
                }
                bytes
            }
        };
        let reserved = upfront
            .charge()
            .bytes
            .saturating_add(predicted.as_ref().map_or(0, |p| p.charge().bytes));
        let before = before
            .or_else(|| self.nothing_held_before_first_context(device, m.expected, reserved))
            .unwrap_or_else(|| self.sample(device));
        let value = call()?;
        let mut after = self.sample(device);
        // What the operation can cost at most, for a figure that also moves with other processes:
        // what it is expected to cost (a context as this tenant's others on the GPU, a module its
        // image's pages, a limit what NVIDIA documents), else the fallback estimate.
        let cap = expected.max(fallback);
        let delta = match self.spent(device, &before, &after, reserved) {
            // A new object (a context, a module) cannot have given memory back: the figures moved
            // with another process's frees (the device figure), and are not believed.
            Some(s) if s.bytes < 0 && current == 0 && floor.is_none() => {
                warn_once(
                    &WARNED_DISTURBED,
                    format_args!(
                        "{what} on {} measured {} bytes (memory freed by another process \
                         meanwhile): charged the estimate of {fallback} bytes instead",
                        device.uuid, s.bytes
                    ),
                );
                i128::from(fallback)
            }
            // The device's used memory also grew by what other processes allocated meanwhile
            // (a neighbour loading its weights while this context is created): never charged
            // beyond what the operation can cost.
            Some(s) if !s.exact && s.bytes > i128::from(s.bound.unwrap_or(u64::MAX).min(cap)) => {
                let most = s.bound.unwrap_or(u64::MAX).min(cap);
                warn_once(
                    &WARNED_NEIGHBOUR,
                    format_args!(
                        "{what} on {} measured {} bytes from the device's used memory (other \
                         processes allocated meanwhile): charged at most {most} bytes, what it can \
                         cost",
                        device.uuid, s.bytes
                    ),
                );
                i128::from(most) - i128::from(current)
            }
            Some(s) => s.bytes,
            None => i128::from(fallback),
        };
        let delta = floor.map_or(delta, |f| delta.max(f));
        let cost = u64::try_from((i128::from(current) + delta).max(0)).unwrap_or(u64::MAX);
        let have = current.saturating_add(reserved);
        let mut cost = cost;
        if cost > have {
            match self.reserve(device, cost - have, what) {
                Ok(more) => {
                    more.commit();
                }
                Err(e) => match undo {
                    Some(undo) => {
                        undo(value);
                        return Err(e);
                    }
                    None => {
                        // Done, and cannot be undone (code the driver loaded for a lookup that
                        // succeeded): the call succeeds as the driver answered; what the quota has
                        // no room for is left to reconciliation.
                        warn_once(
                            &WARNED_UNDOABLE,
                            format_args!(
                                "{what} on {} cost {} bytes beyond the {have} reserved for it, \
                                 and the quota has no room for them: charged what was reserved",
                                device.uuid,
                                cost - have
                            ),
                        );
                        cost = have;
                    }
                },
            }
        }
        upfront.commit();
        if let Some(p) = predicted {
            p.commit();
        }
        if cost < have {
            self.release(Charge {
                device: slot,
                bytes: have - cost,
            });
        }
        // The ledger moved by the settlement since the figures were read.
        let settle = |charged: u64| {
            if cost >= have {
                charged.saturating_add(cost - have)
            } else {
                charged.saturating_sub(have - cost)
            }
        };
        after.charged = settle(after.charged);
        after.charged_low = settle(after.charged_low);
        if let Some(Ok(ledger)) = self.ledger.get() {
            // The caller records the object (and publishes again) once the lock is released.
            let overhead = self.overhead_on(Some(slot)).saturating_sub(current);
            ledger.set_overhead_by_me(slot, overhead.saturating_add(cost));
        }
        drop(lock);
        Ok((
            value,
            Charge {
                device: slot,
                bytes: cost,
            },
            Some(after),
        ))
    }

    /// This process's figure on `device` before a new object of known cost is made, known without
    /// reading it: the driver's last reading for this process there agreed with the ledger (the
    /// reconciliation after it found nothing beyond the charges, and no surplus), and nothing was
    /// charged or given back since but through the ledger, so the driver holds what the process
    /// has charged, less what was reserved for this operation. Spares each module load and kernel
    /// lookup one NVML reading. What the driver spent on the device outside any measured
    /// operation since (code loaded at a first launch) is then measured with this object: the
    /// totals stay the driver's, and reconciliation at the object's unload gives it back to the
    /// unattributed charge. `None` when the last reading did not agree (the figure is read).
    fn settled_figure(&self, device: &Device, slot: usize, reserved: u64) -> Option<Sample> {
        // Operations charged up front since (`up_front`) may have made the driver spend more
        // than they were charged: the figure is read.
        if !self.agreed(slot) || self.context_reserve_is_explicit() || self.unmeasured_on(slot) > 0
        {
            return None;
        }
        let Some(Ok(ledger)) = self.ledger.get() else {
            return None;
        };
        let _ = device;
        let charged = ledger.used_by_me(slot);
        Some(Sample {
            process: ProcessFigure::Listed(charged.saturating_sub(reserved)),
            device: None,
            listed: None,
            charged_low: charged,
            charged,
        })
    }

    /// What the driver's figures were before this process's first context on `device`, known
    /// without reading them: in the PID namespace the driver lists processes in, a process with
    /// nothing charged on the device (no context, no allocation, no overhead) holds nothing there,
    /// and NVML does not list it. Spares the first context (the start-up's) a reading of NVML's
    /// process list (the device's used memory is still read). `None` otherwise (the figures are
    /// read).
    fn nothing_held_before_first_context(
        &self,
        device: &Device,
        expected: Expected,
        reserved: u64,
    ) -> Option<Sample> {
        if expected != Expected::Context || self.driver.driver_pid_unknown() {
            return None;
        }
        let slot = *device.slot.as_ref().ok()?;
        let Some(Ok(ledger)) = self.ledger.get() else {
            return None;
        };
        let r = self.records.lock();
        let context_there = r.contexts.values().any(|c| c.device == slot)
            || r.primary
                .values()
                .any(|p| p.live.is_some_and(|(c, _)| c.device == slot));
        drop(r);
        if context_there || self.overhead_on(Some(slot)) != 0 {
            return None;
        }
        // Only what this operation reserved before the driver is asked: no allocation of this
        // process is on the device.
        let charged = ledger.used_by_me(slot);
        if charged != reserved {
            return None;
        }
        Some(Sample {
            process: ProcessFigure::NotListed,
            // Read for a driver that lists this process without a figure (then the device's
            // used memory measures the context).
            device: self.driver.device_used(&device.uuid),
            listed: None,
            charged_low: charged,
            charged,
        })
    }
}
