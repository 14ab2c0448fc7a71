//! What the program and the tools are shown: the quota as the device's size, the tenant's usage as
//! its used memory, its own processes only, and (for `gpuslice status`) this process's allocations
//! and driver overhead separately.

use super::{Device, Tenant};
use crate::config::Limit;
use crate::ledger::UNLIMITED;

/// One of the tenant's processes as NVML's process lists show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantProcess {
    /// As the process sees itself (its own PID namespace).
    pub pid: u32,
    /// What it is charged on the device.
    pub used: u64,
}

/// Which of NVML's process lists a view is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessList {
    /// Processes with a compute context.
    Compute,
    /// Processes with a graphics context (OpenGL, Vulkan, ...).
    Graphics,
    /// Clients of an MPS server.
    Mps,
}

impl ProcessList {
    /// Whether the tenant's view of this list depends on what the driver lists.
    pub fn follows_driver(self) -> bool {
        self != ProcessList::Compute
    }
}

/// The entries of one of NVML's process lists that a tenant is shown, from its own processes on the
/// device (`mine`, each with its charge) and the pids the driver lists there. The compute list is the
/// tenant's charged processes whatever the driver lists (they are the processes with a CUDA context,
/// and the driver's own answer would name other tenants'); graphics and MPS clients are those of the
/// driver's entries that are the tenant's processes, each with its charge (what a process holds is
/// one figure, whichever list names it). A process not charged to the tenant is never shown: it
/// may be anyone's.
pub fn shown_processes(
    list: ProcessList,
    mine: &[TenantProcess],
    driver_pids: &[u32],
) -> Vec<TenantProcess> {
    match list {
        ProcessList::Compute => mine.to_vec(),
        ProcessList::Graphics | ProcessList::Mps => mine
            .iter()
            .filter(|p| driver_pids.contains(&p.pid))
            .copied()
            .collect(),
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    const MINE: [TenantProcess; 2] = [
        TenantProcess { pid: 10, used: 100 },
        TenantProcess { pid: 11, used: 200 },
    ];

    #[test]
    fn the_compute_list_is_the_tenants_charged_processes() {
        assert_eq!(
            shown_processes(ProcessList::Compute, &MINE, &[10, 99]),
            MINE
        );
        assert_eq!(shown_processes(ProcessList::Compute, &[], &[10, 99]), []);
    }

    #[test]
    fn graphics_and_mps_lists_keep_only_the_tenants_own_entries_with_their_charge() {
        for list in [ProcessList::Graphics, ProcessList::Mps] {
            // 99 and 98 are another tenant's (or anyone's): never shown.
            assert_eq!(
                shown_processes(list, &MINE, &[99, 11, 98]),
                [TenantProcess { pid: 11, used: 200 }],
                "{list:?}"
            );
            assert_eq!(shown_processes(list, &MINE, &[99, 98]), [], "{list:?}");
            assert_eq!(shown_processes(list, &[], &[99]), [], "{list:?}");
        }
    }
}
