//! The device ledger (docs/COMPUTE.md): the shared file through which the tenants of one GPU
//! time-slice its kernel launches, without a daemon. The scheduler (`gpuslice::scheduling`) drives
//! it; the tools read it and the node writes its tenants.
//!
//! * [`shm`]: the layout and its encodings; [`device`]: the mapped file (slot file protocol,
//!   tenants, process slots, liveness, health); `lock`: the arbitration lock and what is decided
//!   under it, through [`arbiter`], the pure logic (virtual time, token bucket, choice of the next
//!   owner); [`policy`]: the node's compute policy beside the ledger. Every word read from the file
//!   is untrusted.

pub mod arbiter;
pub mod device;
#[cfg(test)]
mod hostile_tests;

/// A private directory for one test's ledgers (`gpuslice-<tag>-<pid>-<ns>` under the temp
/// directory): tests of one process never share one, nor do repeated runs.
#[cfg(test)]
pub(crate) fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "gpuslice-{tag}-{}-{}",
        std::process::id(),
        device::now_ns()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}
pub mod policy;
pub mod shm;

pub use shm::{Holder, PriorityClass, TenantId, MAX_SLOTS, MAX_TENANTS};

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::*};

pub use crate::config::DEFAULT_DEVICE_DIR;

/// The directory of the device ledgers, from the configuration (`config::Config::device_dir`: the
/// node policy's, else `GPUSLICE_DEVICE_DIR`, else `devices/` in `GPUSLICE_LEDGER_DIR`, else the
/// default). For tools: the library reads it from the process runtime.
pub fn device_dir() -> PathBuf {
    crate::config::load().device_dir
}

/// Kinds of damage found in a device ledger, each logged once per process.
#[derive(Clone, Copy, Debug)]
pub enum Incident {
    /// An arbitration lock word naming no live holder, or stamped in the future.
    Lock,
    /// An owner word naming no slot.
    Owner,
    /// A grant, slice or heartbeat that cannot be genuine (in the future, or too long).
    Time,
    /// Our own slot or tenant entry was overwritten.
    OwnEntry,
}

/// Logs a ledger incident, once per kind and process; the repair happens whether logged or not.
pub fn incident(kind: Incident, what: std::fmt::Arguments<'_>) {
    static LOGGED: [AtomicBool; 4] = [const { AtomicBool::new(false) }; 4];
    if !LOGGED[kind as usize].swap(true, Relaxed) {
        crate::log::error(format_args!(
            "{what}: the device ledger was damaged (a bug or another program wrote it); repaired, \
             compute sharing goes on (further incidents of this kind are not logged)"
        ));
    }
}
