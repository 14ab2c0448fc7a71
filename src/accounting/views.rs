//! What the program and the tools are shown: the quota as the device's size, the tenant's usage as
//! its used memory, its own processes only, and (for `gpuslice status`) this process's allocations
//! and driver overhead separately.

use super::nvml_view::TenantProcess;
use super::{Device, Tenant};
use crate::config::Limit;
use crate::ledger::UNLIMITED;

/// This process's charges on one device, split by what they are for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessCharges {
    pub uuid: String,
    /// Everything this process is charged on the device.
    pub total: u64,
    /// Driver overhead: contexts, module code, limits, and what the driver holds beyond them.
    pub overhead: u64,
    /// The rest: allocations (including pools, arrays and VMM).
    pub allocations: u64,
}

impl Tenant {
    /// What the program is shown as the device's size and free memory: (free, total), or `None` when
    /// the device has no limit (the driver's own figures stand).
    pub fn shown_memory(
        &self,
        device: &Device,
        driver_free: u64,
        driver_total: u64,
    ) -> Option<(u64, u64)> {
        let slot = *device.slot.as_ref().ok()?;
        let ledger = self.ledger().ok()?;
        ledger.sweep_before_showing();
        if ledger.found_damaged() {
            // Its figures are gone and nothing can be allocated: no room, out of the quota this
            // process was configured with (else the node's ceiling), never the whole card.
            let limit = match self
                .config
                .memory_limit_for(device.ordinal as u32, &device.uuid)
            {
                Limit::Bytes(limit) => Some(limit),
                _ => device.ceiling,
            };
            return Some((0, limit.unwrap_or(driver_total).min(driver_total)));
        }
        let limit = self.effective_limit(ledger, slot, device.ordinal as u32, &device.uuid);
        if limit == UNLIMITED {
            return None;
        }
        let used = ledger.used(slot);
        let total = limit.min(driver_total);
        let free = total.saturating_sub(used).min(driver_free);
        Some((free, total))
    }

    /// (used, limit) of the device with this UUID, when it has a limit.
    pub fn usage_by_uuid(&self, uuid: &str) -> Option<(u64, u64)> {
        let Some(ledger) = self.existing_ledger() else {
            return self.limit_before_any_charge(uuid).map(|limit| (0, limit));
        };
        ledger.sweep_before_showing();
        if ledger.found_damaged() {
            // As `shown_memory`: all of the configured quota in use, none of it free.
            return self
                .limit_before_any_charge(uuid)
                .map(|limit| (limit, limit));
        }
        let dev = ledger.device_index(uuid)?;
        let limit = self.effective_limit(ledger, dev, u32::MAX, uuid);
        (limit != UNLIMITED).then(|| (ledger.used(dev), limit))
    }

    /// The tenant's live processes charged on the device with this UUID, when it has a limit.
    pub fn processes_by_uuid(&self, uuid: &str) -> Option<Vec<TenantProcess>> {
        let Some(ledger) = self.existing_ledger() else {
            return self.limit_before_any_charge(uuid).map(|_| Vec::new());
        };
        let dev = ledger.device_index(uuid)?;
        if ledger.limit(dev) == UNLIMITED {
            return None;
        }
        let snapshot = ledger.snapshot();
        Some(
            snapshot
                .processes
                .iter()
                .filter(|p| p.alive)
                .filter_map(|p| {
                    let used = p.used.iter().find(|(d, _)| *d == dev)?.1;
                    Some(TenantProcess { pid: p.pid, used })
                })
                .collect(),
        )
    }

    /// The device's limit while the tenant has no ledger (nothing charged yet: the first charge
    /// creates it; a process that only asks NVML never does, as it cannot tell which devices CUDA
    /// will show): what the configuration gives the device by its UUID or for every device. `None`
    /// when nothing is configured for it that way (a limit by CUDA ordinal alone cannot be matched
    /// to an NVML handle), and the driver's answer stands.
    fn limit_before_any_charge(&self, uuid: &str) -> Option<u64> {
        let Limit::Bytes(limit) = self.config.memory_limit_for(u32::MAX, uuid) else {
            return None;
        };
        Some(
            self.config
                .memory_ceiling(u32::MAX, uuid)
                .map_or(limit, |c| c.min(limit)),
        )
    }

    /// This process's charges per device it used: allocations and driver overhead apart.
    pub fn process_charges(&self) -> Vec<ProcessCharges> {
        let Some(Ok(ledger)) = self.ledger.get() else {
            return Vec::new();
        };
        self.known_devices()
            .filter_map(|d| {
                let slot = *d.slot.as_ref().ok()?;
                let total = ledger.used_by_me(slot);
                let overhead = self.overhead_on(Some(slot)).min(total);
                Some(ProcessCharges {
                    uuid: d.uuid.clone(),
                    total,
                    overhead,
                    allocations: total - overhead,
                })
            })
            .collect()
    }
}

/// This process's charges (allocations and driver overhead per device); empty when quotas do not
/// apply here.
pub fn process_charges() -> Vec<ProcessCharges> {
    super::tenant().map_or_else(Vec::new, Tenant::process_charges)
}
