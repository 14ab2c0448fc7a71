//! What every tenant gets, read from the ledgers at the moment it is asked for: the Prometheus
//! exporter (`gpuslice exporter`, [`exporter`]) and the terminal view (`gpuslice top`, [`top`]).
//!
//! Nothing here is in a CUDA program's path: ledgers are opened read-only, each reading is
//! independent, and a ledger that is missing, corrupt or being created costs only its own figures
//! ([`collect`]). Metric names and labels are documented in docs/OBSERVABILITY.md.

pub mod collect;
pub mod exporter;
pub mod gpus;
pub mod metrics;
pub mod procs;
pub mod top;

pub use collect::{Reading, Sources};
