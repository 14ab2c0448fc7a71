//! The tenant as this process sees it: its configuration, its ledger (joined on first use), and the
//! devices by ordinal with their ledger slots.

use super::records::{ChargeTable, Records};
use super::spin::SpinMutex;
use crate::config::{self, Config, Limit};
use crate::driver::seam::{self, Driver};
use crate::ledger::Ledger;
use crate::log;
use crate::process::Process;
use gpuslice_api::types::{CUdevice, CUstream};
use gpuslice_api::CUerror;
use parking_lot::{Mutex, ReentrantMutex};
use std::sync::OnceLock;

/// One device as this process sees it.
#[derive(Clone, Debug)]
pub struct Device {
    pub ordinal: CUdevice,
    pub uuid: String,
    /// Ledger index, or why allocations on this device are refused.
    pub slot: Result<usize, String>,
    /// The node policy's ceiling for this device (`None` without a policy), worked out once: the
    /// configuration is fixed for the process's life, and every reservation compares against it.
    pub ceiling: Option<u64>,
}

pub struct Tenant {
    pub config: &'static Config,
    /// The driver, as accounting asks it (`driver::seam`): the real one, or a fake in unit tests.
    pub(super) driver: &'static dyn Driver,
    /// The process runtime's: opened on first use, when the process's devices are known (a creator
    /// records their limits).
    pub(super) ledger: LedgerCell,
    /// Devices by ordinal, resolved once each.
    devices: [OnceLock<Device>; MAX_ORDINALS],
    /// The process sees exactly one device (then every allocation is on it): `Some(true)`.
    single_device: OnceLock<bool>,
    /// Device pointer -> charge (cuMemAlloc*, pitch, managed, stream-ordered without a pool).
    pub(super) allocations: SpinMutex<ChargeTable>,
    pub(super) records: Mutex<Records>,
    /// Bytes charged per context when nothing can be measured, or always when
    /// `GPUSLICE_CONTEXT_RESERVE` is set ([`Tenant::context_reserve_is_explicit`]).
    pub context_reserve: u64,
    /// When the last refusal was logged, and how many were not logged since (rate limit).
    pub(super) last_refusal_log: Mutex<Option<(std::time::Instant, u32)>>,
    pub(super) refusals_unlogged: std::sync::atomic::AtomicU64,
    /// Serialises the pool bookkeeping (reserve, driver call, read of the pool's size, settle): the
    /// charge is derived from the pool's size before and after, which another thread's allocation or
    /// settle must not change in between. Reentrant: a refused reservation settles the pools.
    pub(super) pools_serial: ReentrantMutex<()>,
    /// Driver overhead found by reconciliation per device (see `reconcile`).
    pub(super) overhead: Mutex<super::reconcile::State>,
}

/// Where the tenant's ledger is: the process runtime's (joined on first use), or, in unit tests,
/// the tenant's own (unmapped when the tenant is dropped).
pub(crate) enum LedgerCell {
    Shared(&'static OnceLock<Result<Ledger, String>>),
    #[cfg(test)]
    Own(OnceLock<Result<Ledger, String>>),
}

impl std::ops::Deref for LedgerCell {
    type Target = OnceLock<Result<Ledger, String>>;

    #[inline(always)]
    fn deref(&self) -> &Self::Target {
        match self {
            LedgerCell::Shared(cell) => cell,
            #[cfg(test)]
            LedgerCell::Own(cell) => cell,
        }
    }
}

/// Device ordinals a process can see (CUDA has no more on one machine).
pub(super) const MAX_ORDINALS: usize = 64;

/// A context of this process was destroyed: cached context -> device answers are asked again.
pub(super) fn context_destroyed() {
    seam::context_destroyed();
}

impl Tenant {
    pub(super) fn new(process: &'static Process) -> Tenant {
        Tenant::with_driver(
            &process.config,
            LedgerCell::Shared(process.ledger_cell()),
            &seam::REAL,
        )
    }

    /// A tenant of `config` charging `ledger`, asking `driver` (a fake one in unit tests).
    pub(crate) fn with_driver(
        config: &'static Config,
        ledger: LedgerCell,
        driver: &'static dyn Driver,
    ) -> Tenant {
        let context_reserve = config
            .context_reserve
            .unwrap_or(config::DEFAULT_CONTEXT_RESERVE);
        Tenant {
            config,
            driver,
            ledger,
            devices: [const { OnceLock::new() }; MAX_ORDINALS],
            single_device: OnceLock::new(),
            allocations: SpinMutex::new(ChargeTable::default()),
            records: Mutex::new(Records::default()),
            context_reserve,
            pools_serial: ReentrantMutex::new(()),
            last_refusal_log: Mutex::new(None),
            refusals_unlogged: std::sync::atomic::AtomicU64::new(0),
            overhead: Mutex::new(Default::default()),
        }
    }

    /// `GPUSLICE_CONTEXT_RESERVE` was given: contexts are charged that, never measured.
    pub fn context_reserve_is_explicit(&self) -> bool {
        self.config.context_reserve.is_some()
    }

    /// The tenant's ledger, joined (or created) on first use.
    #[inline]
    pub fn ledger(&self) -> Result<&Ledger, &str> {
        match self.ledger.get() {
            Some(joined) => joined.as_ref().map_err(String::as_str),
            None => crate::process::get().ledger(),
        }
    }

    /// The ledger if this process has joined it, or if it exists (never created from here).
    pub(super) fn existing_ledger(&self) -> Option<&Ledger> {
        if self.ledger.get().is_none() && !self.config.ledger_path.exists() {
            return None;
        }
        self.ledger().ok()
    }

    /// The device of the calling thread's current context. When the process sees one device, that is
    /// the device (a call without a current context then fails in the driver, and is rolled back).
    #[inline]
    pub fn current_device(&self) -> Result<&Device, CUerror> {
        // Every allocation asks: the one-device case is two loads.
        if let (Some(true), Some(only)) = (self.single_device.get(), self.devices[0].get()) {
            return Ok(only);
        }
        self.current_device_resolved()
    }

    #[inline(never)]
    fn current_device_resolved(&self) -> Result<&Device, CUerror> {
        if self.sees_one_device() {
            return self.device(0);
        }
        self.device(self.driver.current_device()?)
    }

    /// The device of `stream`'s context: stream-ordered allocation takes its memory from "the
    /// current mempool of the provided stream's device" (NVIDIA's `cuMemAllocAsync`), which need
    /// not be the current context's. The current context's device when the stream's cannot be told.
    pub fn stream_device(&self, stream: CUstream) -> Result<&Device, CUerror> {
        if self.sees_one_device() {
            return self.device(0);
        }
        match self.driver.stream_device(stream as usize) {
            Some((_, ordinal)) => self.device(ordinal as CUdevice),
            None => self.current_device(),
        }
    }

    fn sees_one_device(&self) -> bool {
        if let Some(one) = self.single_device.get() {
            return *one;
        }
        match self.driver.device_count() {
            // The count is fixed once the driver is initialised.
            Some(count) => *self.single_device.get_or_init(|| count == 1),
            None => false,
        }
    }

    /// A device by ordinal (in this process's visible order): its UUID and ledger slot.
    #[inline]
    pub fn device(&self, ordinal: CUdevice) -> Result<&Device, CUerror> {
        let cell = usize::try_from(ordinal)
            .ok()
            .and_then(|i| self.devices.get(i))
            .ok_or(CUerror::INVALID_DEVICE)?;
        match cell.get() {
            Some(d) => Ok(d),
            None => self.resolve_device(cell, ordinal),
        }
    }

    #[cold]
    fn resolve_device<'a>(
        &'a self,
        cell: &'a OnceLock<Device>,
        ordinal: CUdevice,
    ) -> Result<&'a Device, CUerror> {
        let uuid = self.driver.device_uuid(ordinal)?;
        let slot = self.resolve_slot(ordinal, &uuid);
        if let Err(why) = &slot {
            log::error(format_args!(
                "device {ordinal} ({uuid}): {why}; allocations there are refused"
            ));
        }
        let ceiling = self.config.memory_ceiling(ordinal as u32, &uuid);
        Ok(cell.get_or_init(|| Device {
            ordinal,
            uuid,
            slot,
            ceiling,
        }))
    }

    /// Devices resolved so far.
    pub(super) fn known_devices(&self) -> impl Iterator<Item = &Device> {
        self.devices.iter().filter_map(OnceLock::get)
    }

    fn resolve_slot(&self, ordinal: CUdevice, uuid: &str) -> Result<usize, String> {
        if let Limit::Invalid(why) = self.config.memory_limit_for(ordinal as u32, uuid) {
            return Err(why);
        }
        if let Some(why) = crate::ledger::unmatched_keys(self.config, &self.visible_devices()) {
            return Err(why);
        }
        let ledger = self.ledger().map_err(str::to_owned)?;
        ledger.device_index(uuid).ok_or_else(|| {
            format!(
                "the ledger {} has no room for this device",
                ledger.path().display()
            )
        })
    }
}

impl Tenant {
    /// The devices this process sees, as (ordinal, UUID).
    fn visible_devices(&self) -> Vec<(u32, String)> {
        (0..self.driver.device_count().unwrap_or(0))
            .filter_map(|i| self.driver.device_uuid(i).ok().map(|u| (i as u32, u)))
            .collect()
    }

    /// The driver accounting asks.
    pub fn driver(&self) -> &'static dyn Driver {
        self.driver
    }
}
