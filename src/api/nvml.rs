//! NVML types and constants shared by the shim and simgpu: `repr(C)` copies of the structs of
//! `nvml.h` that gpuslice and simgpu exchange, with NVML's names. Layouts are checked against the
//! header's definitions in the tests below.
#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::c_char;

/// `struct nvmlDevice_st`: opaque; NVML hands out pointers to it.
#[repr(C)]
pub struct nvmlDevice_st {
    _opaque: [u8; 0],
}
/// `nvmlDevice_t`.
pub type nvmlDevice_t = *mut nvmlDevice_st;

/// `nvmlMemory_t` (v1).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlMemory_t {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`; `version` must be [`nvmlMemory_v2`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlMemory_v2_t {
    pub version: u32,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `NVML_STRUCT_VERSION(data, ver)`: the struct's size with the version in the top byte.
pub const fn nvml_struct_version(size: usize, version: u32) -> u32 {
    size as u32 | (version << 24)
}
/// `nvmlMemory_v2`.
#[allow(non_upper_case_globals)]
pub const nvmlMemory_v2: u32 = nvml_struct_version(std::mem::size_of::<nvmlMemory_v2_t>(), 2);

/// `nvmlUtilization_t`: percentages over the past sample period.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlUtilization_t {
    pub gpu: u32,
    pub memory: u32,
}

/// `nvmlProcessInfo_v1_t` (`nvmlDeviceGetComputeRunningProcesses`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlProcessInfo_v1_t {
    pub pid: u32,
    pub usedGpuMemory: u64,
}

/// `nvmlProcessInfo_v2_t`, also `nvmlProcessInfo_t` (`_v2` and `_v3` entry points).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlProcessInfo_t {
    pub pid: u32,
    pub usedGpuMemory: u64,
    /// 0xFFFFFFFF without MIG.
    pub gpuInstanceId: u32,
    /// 0xFFFFFFFF without MIG.
    pub computeInstanceId: u32,
}
pub type nvmlProcessInfo_v2_t = nvmlProcessInfo_t;

/// `nvmlProcessDetail_v1_t` (`nvmlDeviceGetRunningProcessDetailList`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlProcessDetail_v1_t {
    pub pid: u32,
    pub usedGpuMemory: u64,
    /// 0xFFFFFFFF without MIG.
    pub gpuInstanceId: u32,
    /// 0xFFFFFFFF without MIG.
    pub computeInstanceId: u32,
    /// Confidential-computing protected memory.
    pub usedGpuCcProtectedMemory: u64,
}

/// `nvmlProcessDetailList_v1_t`, also `nvmlProcessDetailList_t`: the list of one `mode`'s processes,
/// in `procArray` of room `numProcArrayEntries`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct nvmlProcessDetailList_v1_t {
    pub version: u32,
    /// `NVML_PROCESS_MODE_*`.
    pub mode: u32,
    pub numProcArrayEntries: u32,
    pub procArray: *mut nvmlProcessDetail_v1_t,
}
pub type nvmlProcessDetailList_t = nvmlProcessDetailList_v1_t;

/// `nvmlProcessDetailList_v1`.
#[allow(non_upper_case_globals)]
pub const nvmlProcessDetailList_v1: u32 =
    nvml_struct_version(std::mem::size_of::<nvmlProcessDetailList_v1_t>(), 1);

/// `nvmlProcessMode_t`: which processes `nvmlDeviceGetRunningProcessDetailList` lists.
pub const NVML_PROCESS_MODE_COMPUTE: u32 = 0;
pub const NVML_PROCESS_MODE_GRAPHICS: u32 = 1;
pub const NVML_PROCESS_MODE_MPS: u32 = 2;

/// `NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE`, `NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE`.
pub const NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE: usize = 32;
pub const NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE: usize = 16;
pub const NVML_DEVICE_UUID_BUFFER_SIZE: usize = 80;
pub const NVML_DEVICE_NAME_BUFFER_SIZE: usize = 64;
pub const NVML_DEVICE_NAME_V2_BUFFER_SIZE: usize = 96;
pub const NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE: usize = 80;
pub const NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE: usize = 80;
/// `NVML_VALUE_NOT_AVAILABLE` as an unsigned field value.
pub const NVML_VALUE_NOT_AVAILABLE: u64 = u64::MAX;

/// `nvmlPciInfo_t` (v2/v3 layout). The v1 entry point fills only the prefix up to and including
/// `pciSubSystemId`, which is also the prefix of the old v1 struct.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct nvmlPciInfo_t {
    pub busIdLegacy: [c_char; NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE],
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub pciDeviceId: u32,
    pub pciSubSystemId: u32,
    pub busId: [c_char; NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE],
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlProcessUtilizationSample_t {
    pub pid: u32,
    /// CPU timestamp in microseconds.
    pub timeStamp: u64,
    pub smUtil: u32,
    pub memUtil: u32,
    pub encUtil: u32,
    pub decUtil: u32,
}

/// `nvmlProcessUtilizationInfo_v1_t`: one process's sample in
/// `nvmlDeviceGetProcessesUtilizationInfo`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlProcessUtilizationInfo_v1_t {
    /// CPU timestamp in microseconds.
    pub timeStamp: u64,
    pub pid: u32,
    pub smUtil: u32,
    pub memUtil: u32,
    pub encUtil: u32,
    pub decUtil: u32,
    pub jpgUtil: u32,
    pub ofaUtil: u32,
}

/// `nvmlProcessesUtilizationInfo_v1_t`, also `nvmlProcessesUtilizationInfo_t`: the samples newer
/// than `lastSeenTimeStamp`, in `procUtilArray` of room `processSamplesCount`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct nvmlProcessesUtilizationInfo_v1_t {
    pub version: u32,
    pub processSamplesCount: u32,
    pub lastSeenTimeStamp: u64,
    pub procUtilArray: *mut nvmlProcessUtilizationInfo_v1_t,
}
pub type nvmlProcessesUtilizationInfo_t = nvmlProcessesUtilizationInfo_v1_t;

/// `nvmlProcessesUtilizationInfo_v1`.
#[allow(non_upper_case_globals)]
pub const nvmlProcessesUtilizationInfo_v1: u32 =
    nvml_struct_version(std::mem::size_of::<nvmlProcessesUtilizationInfo_v1_t>(), 1);

/// `nvmlAccountingStats_t` (`nvmlDeviceGetAccountingStats`): a process's statistics over its life.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlAccountingStats_t {
    /// Percent of the process's life during which one or more of its kernels ran.
    pub gpuUtilization: u32,
    /// Percent of the process's life during which device memory was read or written.
    pub memoryUtilization: u32,
    /// Most memory the process ever held, in bytes.
    pub maxMemoryUsage: u64,
    /// How long its context was active, in ms; 0 while the process runs.
    pub time: u64,
    /// When the process started (CPU time, microseconds).
    pub startTime: u64,
    /// 1 while the process runs, 0 once it has terminated.
    pub isRunning: u32,
    pub reserved: [u32; 5],
}

/// `nvmlEnableState_t`.
pub const NVML_FEATURE_DISABLED: u32 = 0;
pub const NVML_FEATURE_ENABLED: u32 = 1;

/// `nvmlClockType_t`.
pub const NVML_CLOCK_GRAPHICS: u32 = 0;
pub const NVML_CLOCK_SM: u32 = 1;
pub const NVML_CLOCK_MEM: u32 = 2;
pub const NVML_CLOCK_VIDEO: u32 = 3;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// Sizes and offsets as nvml.h defines the structs (x86_64: `unsigned long long` aligned to 8).
    #[test]
    fn layouts_match_nvml_h() {
        assert_eq!(size_of::<nvmlMemory_t>(), 24);
        assert_eq!(offset_of!(nvmlMemory_t, free), 8);
        assert_eq!(offset_of!(nvmlMemory_t, used), 16);

        assert_eq!(size_of::<nvmlMemory_v2_t>(), 40);
        assert_eq!(offset_of!(nvmlMemory_v2_t, total), 8);
        assert_eq!(offset_of!(nvmlMemory_v2_t, reserved), 16);
        assert_eq!(offset_of!(nvmlMemory_v2_t, free), 24);
        assert_eq!(offset_of!(nvmlMemory_v2_t, used), 32);
        assert_eq!(nvmlMemory_v2, 0x0200_0028);

        assert_eq!(size_of::<nvmlUtilization_t>(), 8);

        assert_eq!(size_of::<nvmlProcessInfo_v1_t>(), 16);
        assert_eq!(offset_of!(nvmlProcessInfo_v1_t, usedGpuMemory), 8);
        assert_eq!(size_of::<nvmlProcessInfo_t>(), 24);
        assert_eq!(offset_of!(nvmlProcessInfo_t, gpuInstanceId), 16);
        assert_eq!(offset_of!(nvmlProcessInfo_t, computeInstanceId), 20);

        assert_eq!(size_of::<nvmlPciInfo_t>(), 68);
        assert_eq!(offset_of!(nvmlPciInfo_t, domain), 16);
        assert_eq!(offset_of!(nvmlPciInfo_t, pciSubSystemId), 32);
        assert_eq!(offset_of!(nvmlPciInfo_t, busId), 36);

        assert_eq!(size_of::<nvmlProcessDetail_v1_t>(), 32);
        assert_eq!(
            offset_of!(nvmlProcessDetail_v1_t, usedGpuCcProtectedMemory),
            24
        );
        assert_eq!(size_of::<nvmlProcessDetailList_v1_t>(), 24);
        assert_eq!(offset_of!(nvmlProcessDetailList_v1_t, procArray), 16);
        // nvml.h's NVML_STRUCT_VERSION(ProcessDetailList, 1), as nvidia-ml-py spells it.
        assert_eq!(nvmlProcessDetailList_v1, 0x0100_0018);
        assert_eq!(size_of::<nvmlProcessUtilizationSample_t>(), 32);
        assert_eq!(offset_of!(nvmlProcessUtilizationSample_t, timeStamp), 8);
        assert_eq!(offset_of!(nvmlProcessUtilizationSample_t, smUtil), 16);
        assert_eq!(offset_of!(nvmlProcessUtilizationSample_t, decUtil), 28);
        assert_eq!(size_of::<nvmlProcessUtilizationInfo_v1_t>(), 40);
        assert_eq!(offset_of!(nvmlProcessUtilizationInfo_v1_t, pid), 8);
        assert_eq!(offset_of!(nvmlProcessUtilizationInfo_v1_t, ofaUtil), 32);
        assert_eq!(size_of::<nvmlProcessesUtilizationInfo_v1_t>(), 24);
        assert_eq!(
            offset_of!(nvmlProcessesUtilizationInfo_v1_t, procUtilArray),
            16
        );
        // nvml.h's NVML_STRUCT_VERSION(ProcessesUtilizationInfo, 1), as nvidia-ml-py spells it.
        assert_eq!(nvmlProcessesUtilizationInfo_v1, 0x0100_0018);
        assert_eq!(size_of::<nvmlAccountingStats_t>(), 56);
        assert_eq!(offset_of!(nvmlAccountingStats_t, maxMemoryUsage), 8);
        assert_eq!(offset_of!(nvmlAccountingStats_t, time), 16);
        assert_eq!(offset_of!(nvmlAccountingStats_t, startTime), 24);
        assert_eq!(offset_of!(nvmlAccountingStats_t, isRunning), 32);
        assert_eq!(offset_of!(nvmlAccountingStats_t, reserved), 36);
    }
}
