//! CUDA_VISIBLE_DEVICES: which physical devices this process sees, in which order, and the
//! translation between its ordinals and physical ones.

use super::*;

/// Parses CUDA_VISIBLE_DEVICES as the real driver does: a comma list of indices or UUIDs (full or a
/// unique prefix, `GPU-` or `MIG-` included); the list ends at the first invalid, out-of-range or
/// duplicate entry. An index or a `GPU-` UUID names a GPU (NVML's index), which is its MIG instances
/// when it is in MIG mode; a `MIG-` UUID names one instance (drivers R470 and later; the older
/// `MIG-GPU-<uuid>/<gi>/<ci>` form is not modelled). Returns physical ordinals in visible order,
/// with the MIG rule applied ([`mig_rule`]).
pub(super) fn parse_visible(spec: &str, devices: &[DeviceInfo], gpus: &[GpuInfo]) -> Vec<u32> {
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
    mig_rule(out, devices)
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

/// Physical ordinals of the visible devices, indexed by visible ordinal (CUdevice).
pub fn visible() -> &'static [u32] {
    static VISIBLE: OnceLock<Vec<u32>> = OnceLock::new();
    VISIBLE.get_or_init(|| {
        let devices = simgpu_core::physical_devices();
        match std::env::var("CUDA_VISIBLE_DEVICES") {
            Ok(spec) => parse_visible(&spec, devices, simgpu_core::gpus()),
            Err(_) => mig_rule(devices.iter().map(|d| d.ordinal).collect(), devices),
        }
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
