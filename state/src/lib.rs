//! gpuslice's shared state: what the preloaded library (`gpuslice`) and the tools (the CLI, the
//! node, the exporter) both read and write. The tools link this crate, never the preloaded one.
//!
//! * [`slotfile`]: the one protocol of every file in shared memory (create, validated join, slots).
//! * [`ledger`]: the tenant ledger (memory quota), its layout and its reader ([`ledger::Ledger::snapshot`]).
//! * [`compute`]: the device ledger (compute shares), its layout, arbitration lock and the node's
//!   compute policy overlay.
//! * [`config`]: the settings table, its loader, sizes, and the node policy format.
//! * [`log`]: the logger both sides use.
//!
//! Lean on purpose: the preloaded library links it into every CUDA process (libc and
//! parking_lot only).

pub mod compute;
pub mod config;
pub mod ledger;
pub mod log;
pub mod slotfile;
