//! NVML's MIG queries (nvml.h, "Multi Instance GPU Management";
//! <https://docs.nvidia.com/deploy/nvml-api/group__nvmlMultiInstanceGPU.html>) over simgpu's MIG
//! instances (`simgpu_core::mig`): a GPU's mode, its MIG device handles and their parent, their
//! GPU and compute instance ids. Other queries take MIG handles where the rest of this library
//! does ("with some restrictions interchangeably with a GPU device handle", nvml.h).

use super::{call, mig_handle, put, target, Target};
use gpuslice_api::nvml::nvmlDevice_t;
use gpuslice_api::{NvmlError, NvmlReturn};
use simgpu_core::{physical_devices, MAX_INSTANCES};
use std::ffi::c_uint;

/// `NVML_DEVICE_MIG_DISABLE`, `NVML_DEVICE_MIG_ENABLE` (nvml.h).
const MIG_DISABLE: c_uint = 0;
const MIG_ENABLE: c_uint = 1;

/// The GPU a handle designates; a MIG device handle is not one (`INVALID_ARGUMENT`).
fn gpu(device: nvmlDevice_t) -> Result<&'static simgpu_core::GpuInfo, NvmlError> {
    match target(device)? {
        Target::Gpu(g) => Ok(g),
        Target::Mig(_) => Err(NvmlError::INVALID_ARGUMENT),
    }
}

/// # Safety
/// `current` and `pending` are null or valid for writing an unsigned int.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> NvmlReturn {
    call("nvmlDeviceGetMigMode", true, || {
        let mode = if gpu(device)?.mig_mode {
            MIG_ENABLE
        } else {
            MIG_DISABLE
        };
        if pending.is_null() {
            return Err(NvmlError::INVALID_ARGUMENT);
        }
        // SAFETY: the caller's contract. The mode does not change while simgpu runs: pending is
        // current.
        unsafe {
            put(current, mode)?;
            put(pending, mode)
        }
    })
}

/// "The maximum number of MIG devices that can exist under a given parent NVML device. Returns
/// zero if MIG is not supported or enabled."
///
/// # Safety
/// `count` is null or valid for writing an unsigned int.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> NvmlReturn {
    call("nvmlDeviceGetMaxMigDeviceCount", true, || {
        let n = if gpu(device)?.mig_mode {
            MAX_INSTANCES
        } else {
            0
        };
        // SAFETY: the caller's contract.
        unsafe { put(count, n) }
    })
}

/// The MIG device at `index` under a GPU: `INVALID_ARGUMENT` past the maximum count (on a GPU not in
/// MIG mode, every index), `NOT_FOUND` where no instance has that index.
///
/// # Safety
/// `mig` is null or valid for writing a handle.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig: *mut nvmlDevice_t,
) -> NvmlReturn {
    call("nvmlDeviceGetMigDeviceHandleByIndex", true, || {
        let g = gpu(device)?;
        if !g.mig_mode || index >= MAX_INSTANCES || mig.is_null() {
            return Err(NvmlError::INVALID_ARGUMENT);
        }
        let d = g
            .devices
            .iter()
            .copied()
            .find(|&d| {
                physical_devices()
                    .get(d as usize)
                    .and_then(|i| i.mig)
                    .is_some_and(|m| m.index == index)
            })
            .ok_or(NvmlError::NOT_FOUND)?;
        // SAFETY: the caller's contract.
        unsafe { put(mig, mig_handle(d)) }
    })
}

/// # Safety
/// `parent` is null or valid for writing a handle.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig: nvmlDevice_t,
    parent: *mut nvmlDevice_t,
) -> NvmlReturn {
    call("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", true, || {
        let Target::Mig(d) = target(mig)? else {
            return Err(NvmlError::INVALID_ARGUMENT);
        };
        let gpu = d.mig.map_or(0, |m| m.gpu);
        // SAFETY: the caller's contract.
        unsafe { put(parent, super::handle(gpu)) }
    })
}

/// # Safety
/// `is_mig` is null or valid for writing an unsigned int.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    is_mig: *mut c_uint,
) -> NvmlReturn {
    call("nvmlDeviceIsMigDeviceHandle", true, || {
        let answer = matches!(target(device)?, Target::Mig(_));
        // SAFETY: the caller's contract.
        unsafe { put(is_mig, c_uint::from(answer)) }
    })
}

/// A MIG device's ids (GPU instance, compute instance); `INVALID_ARGUMENT` for a GPU's handle.
fn instance_ids(device: nvmlDevice_t) -> Result<(c_uint, c_uint), NvmlError> {
    match target(device)? {
        Target::Mig(d) => d
            .mig
            .map(|m| (m.gpu_instance_id, m.compute_instance_id))
            .ok_or(NvmlError::INVALID_ARGUMENT),
        Target::Gpu(_) => Err(NvmlError::INVALID_ARGUMENT),
    }
}

/// # Safety
/// `id` is null or valid for writing an unsigned int.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> NvmlReturn {
    call("nvmlDeviceGetGpuInstanceId", true, || {
        let (gi, _) = instance_ids(device)?;
        // SAFETY: the caller's contract.
        unsafe { put(id, gi) }
    })
}

/// # Safety
/// `id` is null or valid for writing an unsigned int.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> NvmlReturn {
    call("nvmlDeviceGetComputeInstanceId", true, || {
        let (_, ci) = instance_ids(device)?;
        // SAFETY: the caller's contract.
        unsafe { put(id, ci) }
    })
}
