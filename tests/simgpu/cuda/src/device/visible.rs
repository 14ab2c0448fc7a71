//! CUDA_VISIBLE_DEVICES: which physical devices this process sees, in which order, and the
//! translation between its ordinals and physical ones.

use super::*;

/// Parses CUDA_VISIBLE_DEVICES as the real driver does: a comma list of indices or UUIDs (full or a
/// unique prefix, `GPU-` or `MIG-` included); the list ends at the first invalid, out-of-range or
/// duplicate entry. An index or a `GPU-` UUID names a GPU (NVML's index), which is its MIG instances
/// when it is in MIG mode; a `MIG-` UUID names one instance (drivers R470 and later; the older
/// `MIG-GPU-<uuid>/<gi>/<ci>` form is not modelled). Returns physical ordinals in visible order,
/// with the MIG rule applied ([`mig_rule`]).
#[cfg(test)]
pub(super) fn parse_visible(spec: &str, devices: &[DeviceInfo], gpus: &[GpuInfo]) -> Vec<u32> {
    mig_rule(named(spec, devices, gpus), devices)
}

/// The physical ordinals `spec` names, in order, before the MIG rule.
fn named(spec: &str, devices: &[DeviceInfo], gpus: &[GpuInfo]) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::new();
    let gpu_devices = |gpu: u32| -> Vec<u32> {
        gpus.get(gpu as usize)
            .map_or_else(Vec::new, |g| g.devices.clone())
    };
    for entry in spec.split(',') {
        let entry = entry.trim();
        let found: Vec<u32> = if let Ok(i) = entry.parse::<u32>() {
            gpu_devices(i)
        } else if entry.len() > 4
            && (entry[..4].eq_ignore_ascii_case("GPU-") || entry[..4].eq_ignore_ascii_case("MIG-"))
        {
            let wanted = entry.to_ascii_lowercase();
            let mut matches = gpus
                .iter()
                .map(|g| (g.info.uuid_text(), gpu_devices(g.index)))
                .chain(
                    devices
                        .iter()
                        .filter(|d| d.mig.is_some())
                        .map(|d| (d.uuid_text(), vec![d.ordinal])),
                )
                .filter(|(uuid, _)| uuid.to_ascii_lowercase().starts_with(&wanted));
            match (matches.next(), matches.next()) {
                (Some((_, d)), None) => d,
                _ => Vec::new(),
            }
        } else {
            Vec::new()
        };
        if found.is_empty() || found.iter().any(|o| out.contains(o)) {
            break;
        }
        out.extend(found);
    }
    out
}

/// The MIG user guide ("CUDA Device Enumeration"): "CUDA can only enumerate a single compute
/// instance" and "will not enumerate non-MIG GPU if any compute instance is enumerated on any other
/// GPU": of a list with MIG instances, the first instance alone.
pub(super) fn mig_rule(visible: Vec<u32>, devices: &[DeviceInfo]) -> Vec<u32> {
    let is_mig = |o: &u32| devices.get(*o as usize).is_some_and(|d| d.mig.is_some());
    match visible.iter().find(|o| is_mig(o)) {
        Some(&first) => vec![first],
        None => visible,
    }
}

/// The visible devices this process may use: a MIG instance needs access to its capabilities
/// (MIG user guide, "Device Nodes and Capabilities": without access "the action will fail"; see
/// `simgpu_core::caps`). The MIG rule picks among the usable instances: the first instance the
/// list names that this process can use.
fn accessible(visible: Vec<u32>, devices: &[DeviceInfo], root: &std::path::Path) -> Vec<u32> {
    let usable = |o: &u32| {
        devices.get(*o as usize).is_some_and(|d| {
            let mig = d.mig.as_ref();
            simgpu_core::caps::usable(root, mig.map_or(0, |m| m.gpu), mig.map(|m| m.index))
        })
    };
    visible.into_iter().filter(usable).collect()
}

/// Physical ordinals of the visible devices, indexed by visible ordinal (CUdevice).
pub fn visible() -> &'static [u32] {
    static VISIBLE: OnceLock<Vec<u32>> = OnceLock::new();
    VISIBLE.get_or_init(|| {
        let devices = simgpu_core::physical_devices();
        let named = match std::env::var("CUDA_VISIBLE_DEVICES") {
            Ok(spec) => named(&spec, devices, simgpu_core::gpus()),
            Err(_) => devices.iter().map(|d| d.ordinal).collect(),
        };
        let usable = match &simgpu_core::config().nvidia_root {
            Some(root) => accessible(named, devices, root),
            None => named,
        };
        mig_rule(usable, devices)
    })
}

/// The physical ordinal behind a `CUdevice` (checks cuInit, then the ordinal).
pub fn physical(dev: CUdevice) -> Result<u32, CUerror> {
    crate::entry::initialized()?;
    usize::try_from(dev)
        .ok()
        .and_then(|i| visible().get(i).copied())
        .ok_or(CUerror::INVALID_DEVICE)
}

/// The `CUdevice` (visible ordinal) of a physical device.
pub fn visible_ordinal(physical: u32) -> CUdevice {
    visible()
        .iter()
        .position(|&p| p == physical)
        .map_or(-1, |i| i as CUdevice)
}
