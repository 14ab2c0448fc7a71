//! gpuslice on a node: tenants created by root with a policy the tenant cannot change
//! ([`tenant`], [`policy`]), the GPUs NVML reports ([`nvml`]), and CDI specs ([`cdi`]).
//! Used by the `gpuslice` command; never linked into the preloaded library.

pub mod cdi;
pub mod nvml;
pub mod policy;
pub mod tenant;
