//! The tenant's memory accounting in this process: which device a call concerns, the charge it
//! reserves in the ledger before the driver is called, and the record that returns it on free.
//!
//! Every charge follows reserve -> call the driver -> commit (record it) or roll back (release it),
//! written once as the [`Reservation`] guard: dropping it releases, `commit` hands the charge to a
//! record. Any number of threads and processes allocating at once never pass the limit together.
//! Only what was charged is ever released: a free of memory the shim never counted (allocated before
//! it was active, or through a path it cannot size) leaves the ledger alone.
//!
//! The modules each do one job: [`tenant`] (the tenant, its ledger and devices), [`reservation`]
//! (reserve, refuse, release), [`records`] (allocations and arrays), [`vmm`] (physical allocations
//! and their mappings), [`pools`] (stream-ordered pools), [`contexts`] (contexts, primary contexts),
//! [`overhead`] (driver memory measured around contexts, modules and limits), [`reconcile`] (what
//! the driver holds beyond the records), [`views`] (what the program and `gpuslice status` are
//! shown), [`nvml_view`] (what NVML shows: the quota as the card, the tenant's own processes). The
//! driver is reached through `crate::driver`, never through the hooks; the configuration and the
//! tenant's ledger come from the process runtime (`crate::process`), which scheduling reads too.

use std::sync::OnceLock;

pub mod contexts;
pub mod first_launch;
pub mod graph_plan;
pub mod graphs;
pub mod ipc;
mod lazy_code;
pub mod limits;
pub mod measure_lock;
pub mod measurement;
pub mod modules;
pub mod nvml_view;
pub mod overhead;
pub mod pool_alloc;
pub mod pools;
pub mod reconcile;
pub mod records;
pub mod reservation;
pub mod sizes;
mod spin;
pub mod tenant;
pub mod up_front;
pub mod views;
pub mod vmm;

pub use pool_alloc::PoolRequest;
pub use pools::{FreedOn, PendingFree};
pub use reservation::{Reservation, REFUSALS_LOGGED_PER_SECOND};
pub use tenant::{Device, Tenant};

/// What an allocation of `bytes` takes on the device: every address the driver's allocation
/// routines return "is always aligned to at least 256 bytes" (CUDA C++ Programming Guide, "Device
/// Memory Accesses"), so the driver spends at least that per allocation. Charging the request
/// alone would let many small allocations take the tenant past its quota.
#[inline(always)]
pub const fn allocation_size(bytes: u64) -> u64 {
    const ALIGNMENT: u64 = 256;
    match bytes.checked_add(ALIGNMENT - 1) {
        Some(b) => b & !(ALIGNMENT - 1),
        None => u64::MAX,
    }
}

/// What the shim does in this process.
pub enum Mode {
    /// Nothing is configured anywhere and there is no ledger to join: every call is the driver's own.
    Transparent,
    /// Quotas apply.
    Enforcing(Box<Tenant>),
}

static MODE: OnceLock<Mode> = OnceLock::new();

/// The process's mode, decided once from the process runtime (`crate::process`: configuration,
/// quota file, ledger, a drop-in below).
pub fn mode() -> &'static Mode {
    MODE.get_or_init(|| {
        let process = crate::process::get();
        if process.quotas_apply() {
            Mode::Enforcing(Box::new(Tenant::new(process)))
        } else {
            Mode::Transparent
        }
    })
}

/// The tenant, when quotas apply.
#[inline]
pub fn tenant() -> Option<&'static Tenant> {
    match mode() {
        Mode::Enforcing(t) => Some(t),
        Mode::Transparent => None,
    }
}

/// Where a charge was made: a device of the ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Charge {
    pub device: usize,
    pub bytes: u64,
}

#[cfg(test)]
mod tests;
