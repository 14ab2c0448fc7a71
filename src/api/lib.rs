//! The one description of the API surface gpuslice and simgpu touch: the CUDA driver and NVML entry
//! points (generated from NVIDIA's headers and the real driver by `scripts/gen-entry-points.py`), the
//! `cuGetProcAddress` resolution rule, error codes, the C types and structs both sides exchange, and
//! what a module image puts on a device (`image`: the shim reserves it, simgpu spends it).
//!
//! The tables are data (`*.tsv` beside this file); `build.rs` expands them. Everything that needs the
//! list of entry points -- the shim's hook registration, `cuGetProcAddress` handling, simgpu's exports
//! and lookup, the C stub, tests -- reads it from here.

pub mod entry_points;
pub mod image;
pub mod launch_types;
pub mod nvml;
pub mod procaddress;
pub mod result;
pub mod types;

pub use entry_points::{DriverEntryPoint, NvmlEntryPoint, Stream, SymbolKind};
pub use result::{CUerror, CUresult, NvmlError, NvmlReturn};
