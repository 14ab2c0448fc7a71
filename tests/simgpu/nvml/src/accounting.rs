//! Accounting mode and confidential computing.

use super::*;

// Both are off on a GPU unless an administrator turns them on (`nvidia-smi -am 1`; a CC-mode boot):
// `SIMGPU_ACCOUNTING_MODE=1` and `SIMGPU_CONF_COMPUTE=1` say they are on.

/// # Safety
/// `mode` is null or valid for writing an `nvmlEnableState_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAccountingMode(
    device: nvmlDevice_t,
    mode: *mut c_uint,
) -> NvmlReturn {
    call("nvmlDeviceGetAccountingMode", true, || {
        self::device(device)?;
        let on = config().accounting_mode;
        let state = if on {
            NVML_FEATURE_ENABLED
        } else {
            NVML_FEATURE_DISABLED
        };
        // SAFETY: the caller's contract.
        unsafe { put(mode, state) }
    })
}

/// Accounting mode's records of `device`; `NVML_ERROR_NOT_SUPPORTED` while the mode is off
/// (nvml.h: "if device doesn't support this feature or accounting mode is disabled").
fn accounting(device: nvmlDevice_t) -> Result<Vec<AccountingRecord>, NvmlError> {
    let d = single_device(device)?;
    if !config().accounting_mode {
        return Err(NvmlError::NOT_SUPPORTED);
    }
    Ok(state()?.accounting(d))
}

/// The records the driver keeps (a circular buffer: simgpu's process slots).
///
/// # Safety
/// `size` is null or valid for writing an unsigned int.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAccountingBufferSize(
    device: nvmlDevice_t,
    size: *mut c_uint,
) -> NvmlReturn {
    call("nvmlDeviceGetAccountingBufferSize", true, || {
        accounting(device)?;
        // SAFETY: the caller's contract.
        unsafe { put(size, MAX_PROCESSES as c_uint) }
    })
}

/// Every process with a record, running or terminated, in NVML's count protocol (`*count` 0 and a
/// NULL `pids` ask for the count: `NVML_ERROR_INSUFFICIENT_SIZE` with it; none: success with 0).
///
/// # Safety
/// `count` and `pids` follow NVML's in/out protocol (see `put_list`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAccountingPids(
    device: nvmlDevice_t,
    count: *mut c_uint,
    pids: *mut c_uint,
) -> NvmlReturn {
    call("nvmlDeviceGetAccountingPids", true, || {
        let items = accounting(device)?.into_iter().map(|r| r.pid).collect();
        // SAFETY: the caller's contract.
        unsafe { put_list(count, pids, items) }
    })
}

/// A process's statistics over its life: its peak memory, the share of its life its kernels ran
/// (simulated kernels touch memory for as long as they run, as `nvmlDeviceGetUtilizationRates`
/// has it), when it started, and, once it has ended, how long it lived. `NVML_ERROR_NOT_FOUND` for
/// a pid without a record.
///
/// # Safety
/// `stats` is null or valid for writing an `nvmlAccountingStats_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAccountingStats(
    device: nvmlDevice_t,
    pid: c_uint,
    stats: *mut nvmlAccountingStats_t,
) -> NvmlReturn {
    call("nvmlDeviceGetAccountingStats", true, || {
        let records = accounting(device)?;
        if stats.is_null() {
            return Err(NvmlError::INVALID_ARGUMENT);
        }
        let r = records
            .into_iter()
            .find(|r| r.pid == pid)
            .ok_or(NvmlError::NOT_FOUND)?;
        let utilization = if r.lifetime_ns == 0 {
            0
        } else {
            (u128::from(r.busy_ns.min(r.lifetime_ns)) * 100 / u128::from(r.lifetime_ns)) as u32
        };
        let value = nvmlAccountingStats_t {
            gpuUtilization: utilization,
            memoryUtilization: utilization,
            maxMemoryUsage: r.max_memory,
            // nvml.h: "reported as 0 if the process is not terminated".
            time: if r.running {
                0
            } else {
                r.lifetime_ns / 1_000_000
            },
            startTime: r.start_ns / 1_000,
            isRunning: u32::from(r.running),
            reserved: [0; 5],
        };
        // SAFETY: the caller's contract.
        unsafe { put(stats, value) }
    })
}

/// The device's protected memory in confidential-computing mode: all of it (simgpu has no
/// unprotected region), with the device's used and free figures. `NVML_ERROR_NOT_SUPPORTED`
/// outside CC mode.
///
/// # Safety
/// `memory` is null or valid for writing an `nvmlMemory_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetConfComputeProtectedMemoryUsage(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> NvmlReturn {
    call("nvmlDeviceGetConfComputeProtectedMemoryUsage", true, || {
        self::device(device)?;
        if !config().conf_compute {
            return Err(NvmlError::NOT_SUPPORTED);
        }
        // SAFETY: the caller's contract.
        unsafe { put_memory_v1(device, memory) }
    })
}
