//! Memory and processes: what simgpu processes really hold on a device, and the process lists
//! (compute, graphics, MPS, detail).

use super::*;

/// (total, used) of a device, from the shared state: a MIG instance's own; a GPU in MIG mode's
/// total is all of its memory, its used memory its instances'.
pub(crate) fn memory(device: nvmlDevice_t) -> Result<(u64, u64), NvmlError> {
    let s = state()?;
    s.reclaim_dead();
    let devices = devices_of(device)?;
    let total = match target(device)? {
        Target::Gpu(g) if g.mig_mode => g.info.total_memory,
        _ => devices.iter().map(|&d| s.device_capacity(d)).sum(),
    };
    let used: u64 = devices.iter().map(|&d| s.device_used(d)).sum();
    Ok((total, used.min(total)))
}

/// # Safety
/// `memory` is null or valid for writing an `nvmlMemory_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> NvmlReturn {
    call("nvmlDeviceGetMemoryInfo", true, || {
        // SAFETY: the caller's contract.
        unsafe { put_memory_v1(device, memory) }
    })
}

/// # Safety
/// `memory` is null or valid for reading and writing an `nvmlMemory_v2_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> NvmlReturn {
    call("nvmlDeviceGetMemoryInfo_v2", true, || {
        let (total, used) = self::memory(device)?;
        if memory.is_null() {
            return Err(NvmlError::INVALID_ARGUMENT);
        }
        // SAFETY: non-null and valid per the caller's contract; the version field comes first.
        let version = unsafe { memory.cast::<u32>().read_unaligned() };
        if version != nvmlMemory_v2 {
            return Err(NvmlError::ARGUMENT_VERSION_MISMATCH);
        }
        // SAFETY: as above.
        unsafe {
            put(
                memory,
                nvmlMemory_v2_t {
                    version,
                    total,
                    reserved: 0,
                    free: total - used,
                    used,
                },
            )
        }
    })
}

/// Processes "with a compute context on a device" (NVIDIA's `nvmlDeviceGetComputeRunningProcesses`),
/// or holding its memory: (pid, bytes), by pid. A context is listed whatever it costs
/// (`SIMGPU_CONTEXT_MEMORY=0` too).
fn running(device: nvmlDevice_t) -> Result<Vec<(u32, u64)>, NvmlError> {
    Ok(running_in(device)?
        .into_iter()
        .map(|(pid, used, _)| (pid, used))
        .collect())
}

/// [`running`], each entry with the MIG instance it is on (a GPU in MIG mode lists its instances'
/// processes, one entry per process and instance).
fn running_in(device: nvmlDevice_t) -> Result<Vec<(u32, u64, Option<u32>)>, NvmlError> {
    let processes = state()?.processes();
    let mut v = Vec::new();
    for d in devices_of(device)? {
        let instance = physical_devices()
            .get(d as usize)
            .and_then(|i| i.mig.map(|_| d));
        let d = d as usize;
        v.extend(processes.iter().filter_map(|p| {
            let used = p.used.get(d).copied().unwrap_or(0);
            let contexts = p.contexts.get(d).copied().unwrap_or(0);
            (used > 0 || contexts > 0).then_some((p.pid, used, instance))
        }));
    }
    v.sort_unstable();
    Ok(v)
}

/// NVML's GPU and compute instance ids of the MIG instance at simgpu device `device` (`u32::MAX`
/// each: no MIG).
fn instance_ids(device: Option<u32>) -> (u32, u32) {
    device
        .and_then(|d| physical_devices().get(d as usize)?.mig)
        .map_or((u32::MAX, u32::MAX), |m| {
            (m.gpu_instance_id, m.compute_instance_id)
        })
}

/// # Safety
/// `count` and `infos` follow NVML's in/out protocol (see `put_list`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> NvmlReturn {
    call("nvmlDeviceGetComputeRunningProcesses", true, || {
        let items = running(device)?
            .into_iter()
            .map(|(pid, usedGpuMemory)| nvmlProcessInfo_v1_t { pid, usedGpuMemory })
            .collect();
        // SAFETY: the caller's contract.
        unsafe { put_list(count, infos, items) }
    })
}

/// A process's entry in the `_v2`/`_v3` lists (no MIG).
fn process_info((pid, usedGpuMemory): (u32, u64)) -> nvmlProcessInfo_t {
    nvmlProcessInfo_t {
        pid,
        usedGpuMemory,
        gpuInstanceId: u32::MAX,
        computeInstanceId: u32::MAX,
    }
}

fn process_infos(device: nvmlDevice_t) -> Result<Vec<nvmlProcessInfo_t>, NvmlError> {
    Ok(running_in(device)?
        .into_iter()
        .map(|(pid, usedGpuMemory, instance)| {
            let (gpuInstanceId, computeInstanceId) = instance_ids(instance);
            nvmlProcessInfo_t {
                pid,
                usedGpuMemory,
                gpuInstanceId,
                computeInstanceId,
            }
        })
        .collect())
}

/// # Safety
/// `count` and `infos` follow NVML's in/out protocol (see `put_list`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> NvmlReturn {
    // SAFETY: the caller's contract.
    call("nvmlDeviceGetComputeRunningProcesses_v2", true, || unsafe {
        put_list(count, infos, process_infos(device)?)
    })
}

/// # Safety
/// `count` and `infos` follow NVML's in/out protocol (see `put_list`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> NvmlReturn {
    // SAFETY: the caller's contract.
    call("nvmlDeviceGetComputeRunningProcesses_v3", true, || unsafe {
        put_list(count, infos, process_infos(device)?)
    })
}

// Graphics and MPS clients. simgpu runs no graphics work and no MPS server: the MPS lists are empty,
// which NVML answers as success with a count of 0 (whatever room the caller gave), and so are the
// graphics lists, unless `SIMGPU_GRAPHICS_CLIENTS=1` says that every process with memory on the
// device also holds a graphics context (a CUDA-OpenGL/Vulkan interop program): then they name the
// same processes as the compute lists, each with all the memory it uses, as nvml.h documents.

/// The processes with a graphics context on `device`: (pid, bytes), by pid.
fn graphics(device: nvmlDevice_t) -> Result<Vec<(u32, u64)>, NvmlError> {
    if config().graphics_clients {
        running(device)
    } else {
        self::device(device)?;
        Ok(Vec::new())
    }
}

/// # Safety
/// `count` and `infos` follow NVML's in/out protocol (see `put_list`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> NvmlReturn {
    call("nvmlDeviceGetGraphicsRunningProcesses", true, || {
        let items = graphics(device)?
            .into_iter()
            .map(|(pid, usedGpuMemory)| nvmlProcessInfo_v1_t { pid, usedGpuMemory })
            .collect();
        // SAFETY: the caller's contract.
        unsafe { put_list(count, infos, items) }
    })
}

/// # Safety
/// `count` and `infos` follow NVML's in/out protocol (see `put_list`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> NvmlReturn {
    call("nvmlDeviceGetGraphicsRunningProcesses_v2", true, || {
        let items = graphics(device)?.into_iter().map(process_info).collect();
        // SAFETY: the caller's contract.
        unsafe { put_list(count, infos, items) }
    })
}

/// # Safety
/// `count` and `infos` follow NVML's in/out protocol (see `put_list`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> NvmlReturn {
    call("nvmlDeviceGetGraphicsRunningProcesses_v3", true, || {
        let items = graphics(device)?.into_iter().map(process_info).collect();
        // SAFETY: the caller's contract.
        unsafe { put_list(count, infos, items) }
    })
}

/// # Safety
/// `count` and `infos` follow NVML's in/out protocol (see `put_list`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> NvmlReturn {
    call("nvmlDeviceGetMPSComputeRunningProcesses", true, || {
        self::device(device)?;
        // SAFETY: the caller's contract.
        unsafe { put_list(count, infos, Vec::new()) }
    })
}

/// # Safety
/// `count` and `infos` follow NVML's in/out protocol (see `put_list`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v2(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> NvmlReturn {
    call("nvmlDeviceGetMPSComputeRunningProcesses_v2", true, || {
        self::device(device)?;
        // SAFETY: the caller's contract.
        unsafe { put_list(count, infos, Vec::new()) }
    })
}

/// # Safety
/// `count` and `infos` follow NVML's in/out protocol (see `put_list`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> NvmlReturn {
    call("nvmlDeviceGetMPSComputeRunningProcesses_v3", true, || {
        self::device(device)?;
        // SAFETY: the caller's contract.
        unsafe { put_list(count, infos, Vec::new()) }
    })
}

/// The processes of `plist->mode` (compute: those with memory on the device; graphics: see
/// [`graphics`]; MPS: none), in NVML's protocol for this struct: `numProcArrayEntries` holds the room
/// in `procArray` and returns the count; too little room (or a NULL array) is
/// `NVML_ERROR_INSUFFICIENT_SIZE`, no process at all success. An unknown version or mode is
/// `NVML_ERROR_INVALID_ARGUMENT`, as nvml.h documents; a device
/// older than Hopper (compute capability 9.0) does not support the call.
///
/// # Safety
/// `plist` is null or valid for reading and writing an `nvmlProcessDetailList_t` whose `procArray` is
/// null or holds `numProcArrayEntries` writable entries.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRunningProcessDetailList(
    device: nvmlDevice_t,
    plist: *mut nvmlProcessDetailList_t,
) -> NvmlReturn {
    call("nvmlDeviceGetRunningProcessDetailList", true, || {
        let d = self::device(device)?;
        if plist.is_null() {
            return Err(NvmlError::INVALID_ARGUMENT);
        }
        // SAFETY: non-null and valid per the caller's contract.
        let mut list = unsafe { plist.read_unaligned() };
        if list.version != nvmlProcessDetailList_v1 {
            return Err(NvmlError::INVALID_ARGUMENT);
        }
        if d.compute_capability.0 < 9 {
            return Err(NvmlError::NOT_SUPPORTED);
        }
        let processes = match list.mode {
            NVML_PROCESS_MODE_COMPUTE => running_in(device)?,
            NVML_PROCESS_MODE_GRAPHICS if config().graphics_clients => running_in(device)?,
            NVML_PROCESS_MODE_GRAPHICS | NVML_PROCESS_MODE_MPS => Vec::new(),
            _ => return Err(NvmlError::INVALID_ARGUMENT),
        };
        let items: Vec<nvmlProcessDetail_v1_t> = processes
            .into_iter()
            .map(|(pid, usedGpuMemory, instance)| nvmlProcessDetail_v1_t {
                pid,
                usedGpuMemory,
                gpuInstanceId: instance_ids(instance).0,
                computeInstanceId: instance_ids(instance).1,
                // In confidential-computing mode all of a process's memory is protected memory.
                usedGpuCcProtectedMemory: if config().conf_compute {
                    usedGpuMemory
                } else {
                    0
                },
            })
            .collect();
        let room = list.numProcArrayEntries as usize;
        list.numProcArrayEntries = items.len() as c_uint;
        // SAFETY: as above.
        unsafe { plist.write_unaligned(list) };
        if items.is_empty() {
            return Ok(());
        }
        if room < items.len() || list.procArray.is_null() {
            return Err(NvmlError::INSUFFICIENT_SIZE);
        }
        for (i, item) in items.into_iter().enumerate() {
            // SAFETY: `i < items.len() <= room`, and `procArray` holds `room` entries per the
            // caller's contract.
            unsafe { list.procArray.add(i).write_unaligned(item) };
        }
        Ok(())
    })
}
