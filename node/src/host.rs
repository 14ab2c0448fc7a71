//! The node itself: where it keeps things and which groups it gives out. Below the tenant,
//! CDI and plugin modules, which all build on it.

use crate::policy::Layout;
use std::path::PathBuf;

/// Group of the device directory and device ledgers (given to every tenant's container).
pub const DEVICE_GID: u32 = 61000;
/// Tenants' own groups are taken from this range, one per tenant.
pub const TENANT_GIDS: std::ops::RangeInclusive<u32> = 61001..=61999;

/// Where the node keeps things.
#[derive(Clone, Debug)]
pub struct Node {
    pub layout: Layout,
    /// CDI spec directory; `None`: no spec is written.
    pub cdi_dir: Option<PathBuf>,
    /// The library as containers get it (host path).
    pub library: PathBuf,
    /// Put the groups in the spec (`additionalGids`, cdiVersion 0.7.0); without, the runtime must
    /// add them (`podman --group-add`, a pod's `supplementalGroups`) and the spec stays 0.3.0/0.5.0
    /// for runtimes whose CDI library is older (podman 4.3 in Debian 12).
    pub cdi_groups: bool,
    /// Directory holding `gpuslice` and `gpuslice-probe`, mounted into containers (if it exists).
    pub tools: Option<PathBuf>,
}
