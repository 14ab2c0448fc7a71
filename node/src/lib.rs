//! gpuslice on a node: tenants created by root with a policy the tenant cannot change
//! ([`tenant`], [`policy`]), the GPUs NVML reports ([`nvml`]), and CDI specs ([`cdi`]).
//! Used by the `gpuslice` command; never linked into the preloaded library.

pub mod cdi;
pub mod files;
pub mod host;
pub mod nvml;
pub mod plugin;
pub mod policy;
pub mod reconcile;
pub mod tenant;

/// The kubelet's gRPC APIs (node/proto, generated at build time).
pub mod api {
    /// Device plugins, v1beta1.
    #[allow(clippy::all, clippy::pedantic)]
    pub mod deviceplugin {
        tonic::include_proto!("v1beta1");
    }
    /// PodResources, v1 (`List`).
    #[allow(clippy::all, clippy::pedantic)]
    pub mod podresources {
        tonic::include_proto!("v1");
    }
}
