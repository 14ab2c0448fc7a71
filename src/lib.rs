//! gpuslice: device-memory quotas and compute shares for unmodified CUDA programs, enforced by a
//! library preloaded into them. See docs/ARCHITECTURE.md.

pub mod config;
pub mod ledger;
pub mod scheduling;
pub mod slotfile;

pub mod accounting;
pub mod driver;
pub mod hooks;
pub mod log;
