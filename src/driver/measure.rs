//! What the real driver says about device memory in use: the device's used memory (NVML, else
//! `cuMemGetInfo` in the current context) and this process's own used memory (NVML's list of
//! running compute processes, when this process can find itself in it). These are the only ways a
//! driver reports the memory it spends on a program's behalf (contexts, module code, limits).

use super::calls::{nvml::real as nvml, real as cuda};
use gpuslice_api::nvml::{nvmlDevice_t, nvmlMemory_t, nvmlProcessInfo_t};
use gpuslice_api::NvmlError;
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// This process's line in NVML's process list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessFigure {
    /// Listed, with this much used device memory.
    Listed(u64),
    /// The list was read and this process is not in it: it holds nothing on the device.
    NotListed,
    /// NVML is not there, or failed, or cannot name this process (another PID namespace).
    Unavailable,
}

fn nvml_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    // NVML counts its initialisations: this one never shuts it down under the program.
    // SAFETY: no arguments.
    *READY.get_or_init(|| unsafe { nvml::nvmlInit_v2() }.is_ok())
}

/// NVML's handle of device `uuid`, looked up once per process: a handle stays valid until NVML is
/// shut down, which this library never does (see [`nvml_ready`]), and a measurement takes two
/// samples of two queries each. Only found handles are kept (a failed lookup is asked again).
fn nvml_device(uuid: &str) -> Option<nvmlDevice_t> {
    // (UUID, handle as an address); a few GPUs per process at most.
    static HANDLES: Mutex<Vec<(String, usize)>> = Mutex::new(Vec::new());
    if !nvml_ready() {
        return None;
    }
    let known = |handles: &[(String, usize)]| {
        handles
            .iter()
            .find(|(u, _)| u == uuid)
            .map(|&(_, h)| h as nvmlDevice_t)
    };
    if let Some(device) = known(&HANDLES.lock().unwrap_or_else(|e| e.into_inner())) {
        return Some(device);
    }
    let device = lookup_handle(uuid)?;
    let mut handles = HANDLES.lock().unwrap_or_else(|e| e.into_inner());
    if known(&handles).is_none() {
        handles.push((uuid.to_owned(), device as usize));
    }
    Some(device)
}

fn lookup_handle(uuid: &str) -> Option<nvmlDevice_t> {
    let uuid = CString::new(uuid).ok()?;
    let mut device: nvmlDevice_t = std::ptr::null_mut();
    // SAFETY: `uuid` is NUL-terminated; `device` is a valid out-parameter.
    unsafe { nvml::nvmlDeviceGetHandleByUUID(uuid.as_ptr(), &mut device) }.ok()?;
    Some(device)
}

/// The device's used memory as the driver reports it.
pub fn device_used(uuid: &str) -> Option<u64> {
    if let Some(device) = nvml_device(uuid) {
        let mut m = nvmlMemory_t::default();
        // SAFETY: `m` is a valid out-parameter of the v1 struct.
        if unsafe { nvml::nvmlDeviceGetMemoryInfo(device, &mut m) }.is_ok() && m.total > 0 {
            return Some(m.used);
        }
    }
    // Without NVML: the current context's device (callers measure on that device).
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: both are valid out-parameters.
    unsafe { cuda::cuMemGetInfo_v2(&mut free, &mut total) }.ok()?;
    (total > 0).then(|| (total as u64).saturating_sub(free as u64))
}

/// Whether NVML can list this process under `getpid()`. NVML reports every process by its PID in
/// the initial PID namespace (the driver's); a process in a child PID namespace is listed under
/// another PID, and a PID of its own namespace found in the list is another process's.
/// `/proc/self` names the process as `/proc`'s PID namespace sees it: another number than
/// `getpid()`, a child namespace. (A container that mounts its own `/proc` reads its own PID there:
/// see docs/MEMORY.md.) One `readlink` per process (a forked child may be in a new namespace).
fn pid_is_the_drivers() -> bool {
    // getpid << 1 | answer; 0: not read yet.
    static KNOWN: AtomicU64 = AtomicU64::new(0);
    let me = std::process::id();
    let known = KNOWN.load(Ordering::Relaxed);
    if known != 0 && known >> 1 == u64::from(me) {
        return known & 1 == 1;
    }
    // Without `/proc`: as the PID reads.
    let answer = std::fs::read_link("/proc/self").map_or(true, |seen| {
        seen.to_str()
            .and_then(|s| s.parse::<u32>().ok())
            .is_some_and(|pid| pid == me)
    });
    KNOWN.store(u64::from(me) << 1 | u64::from(answer), Ordering::Relaxed);
    answer
}

/// This process's used memory on the device, from NVML's list of compute processes.
pub fn process_used(uuid: &str) -> ProcessFigure {
    if !pid_is_the_drivers() {
        return ProcessFigure::Unavailable;
    }
    let Some(device) = nvml_device(uuid) else {
        return ProcessFigure::Unavailable;
    };
    let me = std::process::id();
    let mut capacity = 64u32;
    for _ in 0..4 {
        let mut infos = vec![nvmlProcessInfo_t::default(); capacity as usize];
        let mut count = capacity;
        // SAFETY: `infos` has room for `count` entries.
        match unsafe {
            nvml::nvmlDeviceGetComputeRunningProcesses_v3(device, &mut count, infos.as_mut_ptr())
        } {
            Ok(()) => {
                return infos
                    .iter()
                    .take(count.min(capacity) as usize)
                    .find(|p| p.pid == me)
                    .map_or(ProcessFigure::NotListed, |p| {
                        // Drivers that cannot say (e.g. without the privilege) answer "not available".
                        if p.usedGpuMemory == gpuslice_api::nvml::NVML_VALUE_NOT_AVAILABLE {
                            ProcessFigure::Unavailable
                        } else {
                            ProcessFigure::Listed(p.usedGpuMemory)
                        }
                    });
            }
            Err(e) if e == NvmlError::INSUFFICIENT_SIZE => capacity = count.max(capacity * 2),
            Err(_) => return ProcessFigure::Unavailable,
        }
    }
    ProcessFigure::Unavailable
}
