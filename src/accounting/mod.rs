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
//! [`overhead`] (driver memory measured around contexts, modules and limits), [`views`] (what the
//! program and `gpuslice status` are shown). The driver is reached through `crate::driver`, never
//! through the hooks.

use crate::config;
use crate::log;
use std::sync::OnceLock;

pub mod contexts;
pub mod graphs;
pub mod overhead;
pub mod pools;
pub mod records;
pub mod reservation;
pub mod tenant;
pub mod views;
pub mod vmm;

pub use reservation::{Reservation, REFUSALS_LOGGED_PER_SECOND};
pub use tenant::{Device, Tenant};

/// What the shim does in this process.
pub enum Mode {
    /// Nothing is configured anywhere and there is no ledger to join: every call is the driver's own.
    Transparent,
    /// Quotas apply.
    Enforcing(Box<Tenant>),
}

static MODE: OnceLock<Mode> = OnceLock::new();

/// The process's mode, decided once (configuration, quota file, ledger).
pub fn mode() -> &'static Mode {
    MODE.get_or_init(|| {
        let config = config::load();
        log::set_level(config.log_level);
        for note in &config.notes {
            log::info(format_args!("{note}"));
        }
        for warning in &config.warnings {
            log::warn(format_args!("{warning}"));
        }
        for line in config.error_lines() {
            log::error(format_args!("{line}"));
        }
        if !config.is_configured() && !config.ledger_path.exists() {
            return Mode::Transparent;
        }
        // Preloaded over a gpuslice drop-in libcuda: the drop-in enforces; counting here too would
        // charge everything twice. Finding the driver decides it, so find it now.
        if crate::driver::role() == crate::driver::Role::Preload {
            crate::driver::library_handle(crate::driver::Library::Cuda);
            if crate::driver::deferring() {
                return Mode::Transparent;
            }
        }
        Mode::Enforcing(Box::new(Tenant::new(config)))
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
