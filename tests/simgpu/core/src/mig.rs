//! Multi-Instance GPU (MIG): a GPU in MIG mode is split into instances, each with memory and
//! compute of its own, which CUDA sees as devices of their own and NVML as MIG device handles under
//! the GPU's handle.
//!
//! What NVIDIA documents, and simgpu follows:
//! - The MIG user guide ("CUDA Device Enumeration",
//!   <https://docs.nvidia.com/datacenter/tesla/mig-user-guide/mig-device-names.html>): a MIG device
//!   (a GPU instance with its compute instance) is one CUDA device; with drivers R470 and later each
//!   has a UUID `MIG-<uuid>`, which `CUDA_VISIBLE_DEVICES` accepts; a CUDA process enumerates a
//!   single MIG device (the first one visible) and no non-MIG GPU beside it.
//! - cuda.h, `cuDeviceGetUuid_v2`: "If the device is in MIG mode, returns its MIG UUID which uniquely
//!   identifies the subscribed MIG compute instance"; `cuDeviceTotalMem` and `cuMemGetInfo` are the
//!   instance's (its memory is its own: the guide's "memory isolation").
//! - nvml.h, "Multi Instance GPU Management" (`nvmlDeviceGetMigMode`,
//!   `nvmlDeviceGetMaxMigDeviceCount`: "zero if MIG is not supported or enabled",
//!   `nvmlDeviceGetMigDeviceHandleByIndex`, `nvmlDeviceGetDeviceHandleFromMigDeviceHandle`,
//!   `nvmlDeviceIsMigDeviceHandle`): MIG device handles "can be used (with some restrictions)
//!   interchangeably with a GPU device handle to execute queries at a per-compute instance
//!   granularity"; `nvmlDeviceGetUUID` of one gives its `MIG-` UUID, and
//!   `nvmlDeviceGetHandleByUUID` takes "the UUID of the target GPU or MIG instance".
//!
//! In simgpu's state file each instance is a device (memory, execution) of its own; a GPU in MIG
//! mode has no device of its own: its memory in use is its instances'.

/// Most MIG devices one GPU holds (an H100's seven 1g slices; `nvmlDeviceGetMaxMigDeviceCount`).
pub const MAX_INSTANCES: u32 = 7;

/// Parses `SIMGPU_MIG`: `GPU:SIZE[,SIZE...]` items separated by `;` (`0:10GiB,20GiB;1:40GiB`).
/// Each GPU must exist (`gpus`), be listed once, and have at least one and at most
/// [`MAX_INSTANCES`] instances whose sizes (each above zero) add up to no more than its memory;
/// the devices in all (instances, and GPUs not in MIG mode) fit in the state file. `None` if not.
pub fn parse(text: &str, gpus: u32, memory: u64) -> Option<Vec<(u32, Vec<u64>)>> {
    let mut out: Vec<(u32, Vec<u64>)> = Vec::new();
    for item in text.split(';').map(str::trim).filter(|i| !i.is_empty()) {
        let (gpu, sizes) = item.split_once(':')?;
        let gpu: u32 = gpu.trim().parse().ok().filter(|g| *g < gpus)?;
        let sizes: Vec<u64> = sizes
            .split(',')
            .map(|s| crate::config::parse_size(s).filter(|n| *n > 0))
            .collect::<Option<_>>()?;
        let total = sizes.iter().try_fold(0u64, |a, b| a.checked_add(*b))?;
        if sizes.is_empty()
            || sizes.len() > MAX_INSTANCES as usize
            || total > memory
            || out.iter().any(|(g, _)| *g == gpu)
        {
            return None;
        }
        out.push((gpu, sizes));
    }
    out.sort_by_key(|(g, _)| *g);
    let devices = gpus as usize + out.iter().map(|(_, s)| s.len() - 1).sum::<usize>();
    (devices <= crate::layout::MAX_DEVICES).then_some(out)
}

/// One device of the state file: the GPU it is on, and its MIG instance index (`None`: the whole
/// GPU), with its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub gpu: u32,
    pub instance: Option<u32>,
    pub memory: u64,
}

/// The devices of a state file made with `gpus` GPUs of `memory` bytes each and `mig`: GPUs in
/// order, a GPU in MIG mode as its instances in order.
pub fn placements(gpus: u32, memory: u64, mig: &[(u32, Vec<u64>)]) -> Vec<Placement> {
    let mut out = Vec::new();
    for gpu in 0..gpus {
        match mig.iter().find(|(g, _)| *g == gpu) {
            Some((_, sizes)) => {
                out.extend(sizes.iter().enumerate().map(|(i, &memory)| Placement {
                    gpu,
                    instance: Some(i as u32),
                    memory,
                }))
            }
            None => out.push(Placement {
                gpu,
                instance: None,
                memory,
            }),
        }
    }
    out.truncate(crate::layout::MAX_DEVICES);
    out
}

/// A MIG instance's UUID bytes: "SIMGMI" + its GPU and index, version-4 shaped, so that no GPU's
/// UUID (`crate::device_info`) is ever an instance's.
pub fn instance_uuid(gpu: u32, instance: u32) -> [u8; 16] {
    let mut uuid = [
        0x53, 0x49, 0x4d, 0x47, 0x4d, 0x49, 0x40, 0x00, 0x80, 0, 0, 0, 0, 0, 0, 0,
    ];
    uuid[10..12].copy_from_slice(&(gpu as u16).to_be_bytes());
    uuid[14..].copy_from_slice(&(instance as u16).to_be_bytes());
    uuid
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings() {
        let g = 1u64 << 30;
        assert_eq!(
            parse("0:10GiB,20GiB", 1, 80 * g),
            Some(vec![(0, vec![10 * g, 20 * g])])
        );
        assert_eq!(
            parse("1:4GiB; 0:2GiB", 2, 80 * g),
            Some(vec![(0, vec![2 * g]), (1, vec![4 * g])])
        );
        assert_eq!(parse("", 1, g), Some(vec![]));
        for bad in [
            "0:",
            "0:0",
            "1:1GiB",
            "0:1GiB;0:1GiB",
            "0:60GiB,30GiB",
            "x:1GiB",
            "0:1GiB,1GiB,1GiB,1GiB,1GiB,1GiB,1GiB,1GiB",
        ] {
            assert_eq!(parse(bad, 1, 80 * g), None, "{bad}");
        }
        // Seven instances and two whole GPUs do not fit in 8 devices.
        assert_eq!(parse("0:1G,1G,1G,1G,1G,1G,1G", 3, 80 * g), None);
        assert!(parse("0:1G,1G,1G,1G,1G,1G,1G", 2, 80 * g).is_some());
    }

    #[test]
    fn devices_follow_gpus_and_instances() {
        let p = placements(2, 80, &[(0, vec![10, 20])]);
        let got: Vec<_> = p.iter().map(|p| (p.gpu, p.instance, p.memory)).collect();
        assert_eq!(
            got,
            [(0, Some(0), 10), (0, Some(1), 20), (1, None, 80)],
            "{p:?}"
        );
        assert_ne!(instance_uuid(0, 1), instance_uuid(1, 0));
    }
}
