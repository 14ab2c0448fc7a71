//! What the real driver says about device memory in use: the device's used memory (NVML, else
//! `cuMemGetInfo` in the current context) and this process's own used memory (NVML's list of
//! running compute processes, when this process can find itself in it). These are the only ways a
//! driver reports the memory it spends on a program's behalf (contexts, module code, limits).

use super::{real as cuda, real as nvml};
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

/// Whether NVML knows the device whose UUID's `GPU-` form is `gpu_form` as a MIG instance only
/// (`nvmlDeviceGetHandleByUUID` takes "the UUID of the target GPU or MIG instance": a GPU's UUID
/// never names an instance, nor the reverse). `None` when NVML is not there to ask.
pub fn known_as_mig_instance(gpu_form: &str) -> Option<bool> {
    if !nvml_ready() {
        return None;
    }
    if nvml_device(gpu_form).is_some() {
        return Some(false);
    }
    let mig = format!("MIG-{}", gpu_form.get(4..)?);
    Some(nvml_device(&mig).is_some())
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

/// The device's total memory as NVML reports it (`None` without NVML).
pub fn device_total(uuid: &str) -> Option<u64> {
    let device = nvml_device(uuid)?;
    let mut m = nvmlMemory_t::default();
    // SAFETY: `m` is a valid out-parameter of the v1 struct.
    unsafe { nvml::nvmlDeviceGetMemoryInfo(device, &mut m) }.ok()?;
    (m.total > 0).then_some(m.total)
}

/// The initial PID namespace's inode number (`PROC_PID_INIT_INO`, include/linux/proc_ns.h), which
/// `/proc/self/ns/pid` names as `pid:[4026531836]` in the namespace the driver sees PIDs in.
const INITIAL_PID_NAMESPACE: &str = "pid:[4026531836]";

/// Whether NVML can list this process under `getpid()`. NVML reports every process by its PID in
/// the initial PID namespace (the driver's); a process in a child PID namespace is listed under
/// another PID, and a PID of its own namespace found in the list is another process's.
/// `/proc/self` names the process as `/proc`'s PID namespace sees it: another number than
/// `getpid()`, a child namespace. A container that mounts its own `/proc` (every Kubernetes pod)
/// reads its own PID there: its PID namespace (`/proc/self/ns/pid`) is then not the initial one.
/// One `readlink` or two per process (a forked child may be in a new namespace).
fn pid_is_the_drivers() -> bool {
    // getpid << 1 | answer; 0: not read yet.
    static KNOWN: AtomicU64 = AtomicU64::new(0);
    let me = crate::slotfile::sys::own_pid();
    let known = KNOWN.load(Ordering::Relaxed);
    if known != 0 && known >> 1 == u64::from(me) {
        return known & 1 == 1;
    }
    // Without `/proc`: as the PID reads.
    let same = std::fs::read_link("/proc/self").map_or(true, |seen| {
        seen.to_str()
            .and_then(|s| s.parse::<u32>().ok())
            .is_some_and(|pid| pid == me)
    });
    let initial = std::fs::read_link("/proc/self/ns/pid")
        .map_or(true, |ns| ns.to_str() == Some(INITIAL_PID_NAMESPACE));
    let answer = same && initial;
    KNOWN.store(u64::from(me) << 1 | u64::from(answer), Ordering::Relaxed);
    answer
}

/// getpid << 32 | the PID the driver lists this process under, once found
/// ([`identify_driver_pid`]); 0: not found.
static DRIVER_PID: AtomicU64 = AtomicU64::new(0);

/// The PID NVML lists this process under: `getpid()` in the initial PID namespace, else the one
/// found by [`identify_driver_pid`] (for this process, not a parent it was forked from).
pub fn driver_pid() -> Option<u32> {
    let me = crate::slotfile::sys::own_pid();
    if pid_is_the_drivers() {
        return Some(me);
    }
    let known = DRIVER_PID.load(Ordering::Relaxed);
    (known != 0 && known >> 32 == u64::from(me)).then_some(known as u32)
}

/// Whether this process must find the PID the driver lists it under before its per-process
/// figures can be read (a child PID namespace, not found yet).
pub fn driver_pid_unknown() -> bool {
    driver_pid().is_none()
}

/// Records the PID the driver lists this process under (another PID namespace's): the one process
/// that appeared in NVML's list while this process created its first context there under the
/// device's measurement lock (see `accounting::overhead`).
pub fn identify_driver_pid(pid: u32) {
    let me = crate::slotfile::sys::own_pid();
    if pid == 0 || pid_is_the_drivers() {
        return;
    }
    DRIVER_PID.store(u64::from(me) << 32 | u64::from(pid), Ordering::Relaxed);
}

/// Every compute process NVML lists on the device, by the driver's PID, with its used memory
/// (`None` when it cannot be read; a process whose figure is not available is left out).
pub fn processes(uuid: &str) -> Option<Vec<(u32, u64)>> {
    let device = nvml_device(uuid)?;
    let mut capacity = 64u32;
    for _ in 0..4 {
        let mut infos = vec![nvmlProcessInfo_t::default(); capacity as usize];
        let mut count = capacity;
        // SAFETY: `infos` has room for `count` entries.
        match unsafe {
            nvml::nvmlDeviceGetComputeRunningProcesses_v3(device, &mut count, infos.as_mut_ptr())
        } {
            Ok(()) => {
                return Some(
                    infos
                        .iter()
                        .take(count.min(capacity) as usize)
                        .map(|p| (p.pid, p.usedGpuMemory))
                        .collect(),
                );
            }
            Err(e) if e == NvmlError::INSUFFICIENT_SIZE => capacity = count.max(capacity * 2),
            Err(_) => return None,
        }
    }
    None
}

/// This process's used memory on the device, from NVML's list of compute processes.
pub fn process_used(uuid: &str) -> ProcessFigure {
    let Some(me) = driver_pid() else {
        return ProcessFigure::Unavailable;
    };
    let Some(list) = processes(uuid) else {
        return ProcessFigure::Unavailable;
    };
    list.iter()
        .find(|p| p.0 == me)
        .map_or(ProcessFigure::NotListed, |&(_, used)| {
            // Drivers that cannot say (e.g. without the privilege) answer "not available".
            if used == gpuslice_api::nvml::NVML_VALUE_NOT_AVAILABLE {
                ProcessFigure::Unavailable
            } else {
                ProcessFigure::Listed(used)
            }
        })
}
