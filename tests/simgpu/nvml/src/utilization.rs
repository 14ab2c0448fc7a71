//! Utilization: the device's rates and each process's samples, from what simgpu kernels really ran.

use super::*;

/// # Safety
/// `u` is null or valid for writing an `nvmlUtilization_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    u: *mut nvmlUtilization_t,
) -> NvmlReturn {
    call("nvmlDeviceGetUtilizationRates", true, || {
        let d = single_device(device)?;
        let gpu = state()?.utilization(d);
        // Simulated kernels touch memory for as long as they run.
        // SAFETY: the caller's contract.
        unsafe { put(u, nvmlUtilization_t { gpu, memory: gpu }) }
    })
}

/// Samples of processes that used the device since `lastSeenTimeStamp` (µs; at most the last
/// second): SM utilization from their busy time. `NVML_ERROR_NOT_FOUND` when there are none.
///
/// # Safety
/// `count` and `samples` follow NVML's in/out protocol (see `put_list`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: nvmlDevice_t,
    samples: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    lastSeenTimeStamp: c_ulonglong,
) -> NvmlReturn {
    call("nvmlDeviceGetProcessUtilization", true, || {
        let items: Vec<_> = utilization_samples(device, lastSeenTimeStamp)?
            .into_iter()
            .map(|(pid, timeStamp, sm)| nvmlProcessUtilizationSample_t {
                pid,
                timeStamp,
                smUtil: sm,
                memUtil: sm,
                encUtil: 0,
                decUtil: 0,
            })
            .collect();
        if items.is_empty() {
            return Err(NvmlError::NOT_FOUND);
        }
        // SAFETY: the caller's contract.
        unsafe { put_list(count, samples, items) }
    })
}

/// The per-process samples newer than `last_seen_us` on `device`: (pid, timestamp in µs, SM %).
fn utilization_samples(
    device: nvmlDevice_t,
    last_seen_us: u64,
) -> Result<Vec<(u32, u64, u32)>, NvmlError> {
    let d = single_device(device)?;
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.as_micros() as u64);
    Ok(state()?
        .process_utilization(d, last_seen_us.saturating_mul(1000))
        .into_iter()
        .map(|(pid, sm)| (pid, now_us, sm))
        .collect())
}

/// `nvmlDeviceGetProcessesUtilizationInfo` (R550 and later; nvml.h): the same samples as
/// `nvmlDeviceGetProcessUtilization`, in the struct's protocol: `processSamplesCount` holds the
/// room in `procUtilArray` and returns the count; a NULL array or too little room is
/// `INSUFFICIENT_SIZE`, no sample `NOT_FOUND`, another struct version `ARGUMENT_VERSION_MISMATCH`.
///
/// # Safety
/// `info` is NULL or points to a caller-owned `nvmlProcessesUtilizationInfo_t` whose
/// `procUtilArray` holds `processSamplesCount` entries (or is NULL).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessesUtilizationInfo(
    device: nvmlDevice_t,
    info: *mut nvmlProcessesUtilizationInfo_t,
) -> NvmlReturn {
    call("nvmlDeviceGetProcessesUtilizationInfo", true, || {
        self::device(device)?;
        if info.is_null() {
            return Err(NvmlError::INVALID_ARGUMENT);
        }
        // SAFETY: non-null and valid per the caller's contract.
        let mut request = unsafe { info.read_unaligned() };
        if request.version != nvmlProcessesUtilizationInfo_v1 {
            return Err(NvmlError::ARGUMENT_VERSION_MISMATCH);
        }
        let items: Vec<_> = utilization_samples(device, request.lastSeenTimeStamp)?
            .into_iter()
            .map(|(pid, timeStamp, sm)| nvmlProcessUtilizationInfo_v1_t {
                timeStamp,
                pid,
                smUtil: sm,
                memUtil: sm,
                ..Default::default()
            })
            .collect();
        let room = request.processSamplesCount as usize;
        request.processSamplesCount = items.len() as c_uint;
        // SAFETY: as above.
        unsafe { info.write_unaligned(request) };
        if items.is_empty() {
            return Err(NvmlError::NOT_FOUND);
        }
        if room < items.len() || request.procUtilArray.is_null() {
            return Err(NvmlError::INSUFFICIENT_SIZE);
        }
        for (i, item) in items.into_iter().enumerate() {
            // SAFETY: `i < items.len() <= room`, and `procUtilArray` holds `room` entries per the
            // caller's contract.
            unsafe { request.procUtilArray.add(i).write_unaligned(item) };
        }
        Ok(())
    })
}
