//! Contexts cost device memory: each one is charged what the driver spent creating it (measured,
//! see `overhead`), or `GPUSLICE_CONTEXT_RESERVE` when that is set or nothing can be measured, until
//! it is destroyed. A primary context is charged on its first retain and returned on its last
//! release or reset. A context's modules and limits go with it.

use super::first_launch;
use super::measurement::{Expected, Measurement};
use super::overhead::Sample;
use super::tenant::{context_destroyed, Device};
use super::{Charge, Tenant};
use gpuslice_api::types::{CUcontext, CUdevice};
use gpuslice_api::{CUerror, CUresult};

impl Tenant {
    /// What a context is charged when nothing is measured.
    fn context_estimate(&self) -> (Option<u64>, u64) {
        let explicit = self
            .context_reserve_is_explicit()
            .then_some(self.context_reserve);
        (explicit, self.context_reserve)
    }

    /// A context creation (`call` returns the new context): charged what it cost the driver.
    pub fn create_context(
        &self,
        device: &Device,
        call: impl FnOnce() -> Result<CUcontext, CUerror>,
        destroy: impl FnOnce(CUcontext),
    ) -> CUresult {
        let (ctx, charge, after) = self.charge_context(device, call, destroy)?;
        let mut records = self.records.lock();
        records.contexts.insert(ctx as usize, charge);
        first_launch::context_appeared(&records);
        drop(records);
        self.reconcile_with(device, after);
        Ok(())
    }

    /// Creates a context through `call`, charged what it cost the driver (or the explicit or
    /// fallback estimate); `undo` destroys it when the quota has no room for that cost.
    fn charge_context(
        &self,
        device: &Device,
        call: impl FnOnce() -> Result<CUcontext, CUerror>,
        undo: impl FnOnce(CUcontext),
    ) -> Result<(CUcontext, Charge, Option<Sample>), CUerror> {
        let (explicit, fallback) = self.context_estimate();
        let m = Measurement {
            explicit,
            ..Measurement::new("context creation", fallback, Expected::Context)
        };
        self.charge_measured_sampled(device, &m, call, Some(undo))
    }

    /// What a new context on `device` is expected to cost, reserved before the driver is asked so
    /// that a context the quota has no room for is refused before the driver spends memory on it
    /// (the tenant would pass its quota while it is undone): the least one of this process's
    /// contexts on the device was charged, else the least driver overhead another live process of
    /// the tenant has there (each of them holds a context; its modules and limits only make the
    /// figure larger), never more than the fallback estimate; 0 when nothing is known (the tenant's
    /// first context on the device is only measured).
    pub(super) fn expected_context_cost(&self, device: &Device, fallback: u64) -> u64 {
        let Ok(slot) = device.slot else { return 0 };
        let r = self.records.lock();
        let own = r
            .contexts
            .values()
            .chain(r.primary.values().filter_map(|p| p.charge()))
            .filter(|c| c.device == slot && c.bytes > 0)
            .map(|c| c.bytes)
            .min();
        drop(r);
        let expected = own.or_else(|| {
            let ledger = self.ledger().ok()?;
            let me = ledger.slot();
            ledger
                .snapshot()
                .processes
                .iter()
                .filter(|p| p.alive && Some(p.slot) != me)
                .filter_map(|p| p.overhead.iter().find(|(d, _)| *d == slot).map(|o| o.1))
                .filter(|&bytes| bytes > 0)
                .min()
        });
        expected.unwrap_or(0).min(fallback)
    }

    /// A context destroyed: its charge, and its modules' and limits', are returned.
    pub fn forget_context(&self, ctx: usize) {
        let charge = self.records.lock().contexts.remove(&ctx);
        if let Some(charge) = charge {
            self.release(charge);
        }
        context_destroyed();
        self.forget_owned_by(ctx);
        first_launch::context_gone(&mut self.records.lock(), ctx);
        self.graph_memory_context_gone(ctx);
        self.release_freed_allocations(ctx);
        self.reconcile_all();
    }

    /// A primary context retain: the one that creates it (the first, or the first after a reset)
    /// is measured and charged.
    pub fn primary_retain(
        &self,
        device: &Device,
        call: impl FnOnce() -> Result<CUcontext, CUerror>,
        release: impl FnOnce(CUcontext),
    ) -> CUresult {
        let live =
            (self.records.lock().primary.get(&device.ordinal)).is_some_and(|p| p.live.is_some());
        if live {
            call()?;
            self.records
                .lock()
                .primary
                .entry(device.ordinal)
                .or_default()
                .refs += 1;
            return Ok(());
        }
        let (ctx, charge, after) = self.charge_context(device, call, release)?;
        let mut r = self.records.lock();
        let primary = r.primary.entry(device.ordinal).or_default();
        primary.refs = primary.refs.saturating_add(1);
        if primary.live.is_some() {
            // Another thread retained it meanwhile and charged it first.
            drop(r);
            self.release(charge);
        } else {
            primary.live = Some((charge, ctx as usize));
            first_launch::context_appeared(&r);
            drop(r);
            self.reconcile_with(device, after);
        }
        Ok(())
    }

    /// A primary context released, or reset (`reset`: destroyed, its references kept). A release
    /// destroys it when it drops the last reference, which the driver tells; by the references
    /// counted here when it cannot.
    pub fn primary_release(&self, ordinal: CUdevice, reset: bool) {
        let mut r = self.records.lock();
        let Some(primary) = r.primary.get_mut(&ordinal) else {
            return;
        };
        let destroyed = if reset {
            true
        } else {
            primary.refs = primary.refs.saturating_sub(1);
            let refs = primary.refs;
            drop(r);
            let destroyed = self
                .driver
                .primary_context_active(ordinal)
                .map_or(refs == 0, |a| !a);
            r = self.records.lock();
            destroyed
        };
        let Some(primary) = r.primary.get_mut(&ordinal) else {
            return;
        };
        let gone = if destroyed { primary.live.take() } else { None };
        if primary.refs == 0 && primary.live.is_none() {
            r.primary.remove(&ordinal);
        }
        drop(r);
        if let Some((charge, ctx)) = gone {
            context_destroyed();
            self.release(charge);
            self.forget_owned_by(ctx);
            first_launch::context_gone(&mut self.records.lock(), ctx);
            self.graph_memory_context_gone(ctx);
            self.release_freed_allocations(ctx);
            self.reconcile_all();
        }
    }

    /// A green context created on `device` (`call` creates it and returns the primary context it
    /// retains, `green` then names it): the driver retains the device's primary context for it
    /// ("This API will retain the primary context on device dev, which will is released when the
    /// green context is destroyed", `cuGreenCtxCreate`), charged as any retain, once while it
    /// lives; `undo` destroys the green context when the quota has no room for a primary context
    /// it created.
    pub fn green_create(
        &self,
        device: &Device,
        call: impl FnOnce() -> Result<CUcontext, CUerror>,
        green: impl FnOnce() -> usize,
        undo: impl FnOnce(CUcontext),
    ) -> CUresult {
        self.primary_retain(device, call, undo)?;
        self.records.lock().green.insert(green(), device.ordinal);
        Ok(())
    }

    /// A green context destroyed: the primary context it retained is released. `None` for a green
    /// context this process never saw created.
    pub fn green_destroyed(&self, green: usize) -> Option<CUdevice> {
        let ordinal = self.records.lock().green.remove(&green)?;
        self.primary_release(ordinal, false);
        Some(ordinal)
    }

    /// The context a module or limit belongs to: the calling thread's current one (0: none).
    pub fn current_context(&self) -> usize {
        self.driver.current_context().ok().flatten().unwrap_or(0)
    }
}
