//! Module and library loads: charged what loading cost the driver. What the code will take on
//! the device, read from the image, is reserved before the driver is asked: a load the quota has
//! no room for is refused before the driver spends the memory. A driver that loads lazily loads
//! nothing yet: the code is reserved and charged at its lookups ([`Tenant::load_lazy_code`]).
//! Where the process reads its own figure and has room, the cost known from the image is charged
//! up front without a measurement, verified by a reading every few operations (`up_front`).

use super::first_launch;
use super::measurement::{Expected, Measurement};
use super::overhead::{driver_pages as pages, Overhead};
use super::{Device, Tenant};
use gpuslice_api::image::Code;
use gpuslice_api::{CUerror, CUresult};

impl Tenant {
    /// Returns an object's driver memory (unloaded); a library's kernels are no longer pending at
    /// any first launch.
    pub fn forget_overhead(&self, kind: Overhead, handle: usize) {
        let mut records = self.records.lock();
        records.lazy_code.remove(&(kind as u8, handle));
        if kind == Overhead::Library {
            first_launch::forget_library(&mut records, handle);
        }
        let old = records.overhead.remove(&(kind as u8, handle));
        drop(records);
        if let Some(old) = old {
            self.release(old.charge);
        }
    }

    /// The device driver overhead is charged on: the current context's, or, for a library loaded
    /// without one (`need_context` false), the first device.
    pub fn overhead_device(&self, need_context: bool) -> Option<&Device> {
        match self.current_device() {
            Ok(d) => Some(d),
            Err(_) if !need_context => self.device(0).ok(),
            Err(_) => None,
        }
    }

    /// A module (in the current context, which it goes with) or a library (context-independent:
    /// it goes when unloaded) loaded by `call`, whose image is `size` bytes holding `code`;
    /// `unload` unloads it when the quota has no room for what it cost; `key` names its handle.
    pub fn load_code_object<H: Copy>(
        &self,
        device: &Device,
        kind: Overhead,
        (size, code): (u64, Code),
        call: impl FnOnce() -> Result<H, CUerror>,
        key: impl Fn(H) -> usize,
        unload: impl FnOnce(H),
    ) -> CUresult {
        let module = kind == Overhead::Module;
        let owner = if module { self.current_context() } else { 0 };
        let what = if module {
            "module load"
        } else {
            "library load"
        };
        let lazy = self.driver.lazy_module_loading();
        let expected = if lazy { 0 } else { pages(code.total()) };
        let fallback = match (lazy, code.total()) {
            (true, _) => 0,
            (false, 0) => size,
            (false, _) => expected,
        };
        // Charged its pages up front when the image says what the driver loads (a lazy load
        // loads nothing yet), else measured.
        if (lazy || code.total() > 0) && self.may_charge_up_front(device, expected) {
            let (loaded, charge) = self.charge_up_front(device, expected, what, call)?;
            self.record_overhead(kind, key(loaded), owner, charge);
            if lazy {
                self.record_lazy_code(kind, key(loaded), code);
            }
            self.settle_up_front(device);
            return Ok(());
        }
        let m = Measurement::new(what, fallback, Expected::Known(expected));
        let (loaded, charge, after) =
            self.charge_measured_sampled(device, &m, call, Some(unload))?;
        self.record_overhead(kind, key(loaded), owner, charge);
        if lazy {
            self.record_lazy_code(kind, key(loaded), code);
        }
        self.reconcile_with(device, after);
        Ok(())
    }

    /// A module or library the driver unloaded: its charge is returned, then the driver's figure
    /// read and reconciled (the driver gave memory back), unless the device takes operations
    /// charged up front ([`Tenant::may_charge_up_front`]; a library only in a process on one
    /// device, its code being loaded per context): then counted as one of them.
    pub fn unload_code_object(&self, kind: Overhead, handle: usize) {
        let charge = self
            .records
            .lock()
            .overhead
            .get(&(kind as u8, handle))
            .map(|o| o.charge);
        // Also a lazily loaded library with nothing loaded yet: its pending kernels go.
        self.forget_overhead(kind, handle);
        let Some(charge) = charge.filter(|c| c.bytes > 0) else {
            return;
        };
        let one_device = kind == Overhead::Module || self.known_devices().count() == 1;
        match self
            .known_devices()
            .find(|d| d.slot.as_ref().ok() == Some(&charge.device))
        {
            Some(d) if one_device && self.may_charge_up_front(d, 0) => self.settle_up_front(d),
            _ => self.reconcile_all(),
        }
    }

    /// The driver loads `kernel`'s code of lazily loaded module or library `handle` (and the
    /// module's data, on its first load) in `call`: what that adds is reserved before, then
    /// charged what the driver spent, with the module or library.
    pub fn load_lazy_code(
        &self,
        kind: Overhead,
        handle: usize,
        kernel: &[u8],
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let Some(expected) = self.lazy_code_expected(kind, handle, kernel) else {
            return call();
        };
        let Some(device) = self.overhead_device(kind == Overhead::Module) else {
            return call();
        };
        if self.may_charge_up_front(device, expected) {
            let ((), charge) = self.charge_up_front(device, expected, "kernel load", call)?;
            self.lazy_code_loaded(kind, handle, kernel, charge);
            self.settle_up_front(device);
            return Ok(());
        }
        let m = Measurement::new("kernel load", expected, Expected::Known(expected));
        let ((), charge, after) = self.charge_measured_sampled(
            device,
            &m,
            call,
            // Loaded code cannot be unloaded on its own, and the driver answered: the lookup
            // succeeds, what the quota has no room for beyond what was reserved is left to
            // reconciliation.
            None::<fn(())>,
        )?;
        self.lazy_code_loaded(kind, handle, kernel, charge);
        self.reconcile_with(device, after);
        Ok(())
    }
}
