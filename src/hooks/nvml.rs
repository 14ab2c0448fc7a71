//! NVML shows the tenant's quota, so `nvidia-smi` and monitoring agents in the container report the
//! quota as the card: total = quota, used = the tenant's usage (allocations and driver overhead as
//! charged), free = the rest (`_v2`: `reserved` 0, so total = reserved + used + free; on a card
//! fuller than the quotas promise, free is what the card has, and the difference is `_v2`'s
//! `reserved` and part of v1's `used`); the process lists and per-process utilisation show the
//! tenant's own processes only, each with its charge.

use super::{hooks, Out};
use crate::accounting::tenant;
use crate::accounting::views::TenantProcess;
use crate::driver::calls::nvml::real as nvml_real;
use gpuslice_api::nvml::{
    nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlProcessInfo_t, nvmlProcessInfo_v1_t,
    nvmlProcessUtilizationSample_t,
};
use gpuslice_api::{NvmlError, NvmlReturn};
use std::ffi::{c_char, c_uint, c_ulonglong};

hooks! {
    ret = NvmlReturn, missing = Err(NvmlError::UNINITIALIZED);
    fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t)
        => memory_info(device, Out::new(memory), || real::nvmlDeviceGetMemoryInfo(device, memory));
    fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t)
        => memory_info(device, Out::new(memory), || real::nvmlDeviceGetMemoryInfo_v2(device, memory));
    fn nvmlDeviceGetComputeRunningProcesses(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t)
        => processes(device, Out::new(count), infos, || real::nvmlDeviceGetComputeRunningProcesses(device, count, infos));
    fn nvmlDeviceGetComputeRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t)
        => processes(device, Out::new(count), infos, || real::nvmlDeviceGetComputeRunningProcesses_v2(device, count, infos));
    fn nvmlDeviceGetComputeRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t)
        => processes(device, Out::new(count), infos, || real::nvmlDeviceGetComputeRunningProcesses_v3(device, count, infos));
    fn nvmlDeviceGetProcessUtilization(device: nvmlDevice_t, samples: *mut nvmlProcessUtilizationSample_t, count: *mut c_uint, since: c_ulonglong)
        => process_utilization(device, samples, Out::new(count), || real::nvmlDeviceGetProcessUtilization(device, samples, count, since),
                               |all, n| real::nvmlDeviceGetProcessUtilization(device, all, n, since));
}

/// Both NVML memory structs, seen as (total, used, free).
pub trait MemoryFigures: Copy {
    fn figures(&self) -> (u64, u64, u64);
    fn set_figures(&mut self, total: u64, used: u64, free: u64);
}
impl MemoryFigures for nvmlMemory_t {
    fn figures(&self) -> (u64, u64, u64) {
        (self.total, self.used, self.free)
    }
    fn set_figures(&mut self, total: u64, _used: u64, free: u64) {
        // The v1 struct has no `reserved`: NVIDIA documents its `used` as reserved + allocated, so
        // that total = used + free (what the card holds back when it is fuller than the quotas
        // promise is in it; otherwise it is the tenant's usage).
        (self.total, self.used, self.free) = (total, total.saturating_sub(free), free);
    }
}
impl MemoryFigures for nvmlMemory_v2_t {
    fn figures(&self) -> (u64, u64, u64) {
        (self.total, self.used, self.free)
    }
    fn set_figures(&mut self, total: u64, used: u64, free: u64) {
        // The driver's own reservation is part of the card, not of the quota: within the quota
        // every byte is the tenant's used or free memory (what the card holds back beyond that,
        // when the card is fuller than the quotas promise, is shown as reserved).
        (self.total, self.used, self.free) = (total, used, free);
        self.reserved = total.saturating_sub(used).saturating_sub(free);
    }
}

/// The device's UUID through the real NVML.
fn device_uuid(device: nvmlDevice_t) -> Option<String> {
    let mut uuid = [0 as c_char; 96];
    // SAFETY: `uuid` is a writable buffer of the length given.
    unsafe { nvml_real::nvmlDeviceGetUUID(device, uuid.as_mut_ptr(), uuid.len() as u32) }.ok()?;
    // SAFETY: NVML wrote a NUL-terminated string into the buffer (it is zero-initialised besides).
    let uuid = unsafe { std::ffi::CStr::from_ptr(uuid.as_ptr()) };
    Some(uuid.to_string_lossy().into_owned())
}

fn memory_info<M: MemoryFigures>(
    device: nvmlDevice_t,
    memory: Out<M>,
    call: impl FnOnce() -> NvmlReturn,
) -> NvmlReturn {
    call()?;
    let Some(t) = tenant() else { return Ok(()) };
    let Some(mut m) = memory.get() else {
        return Ok(());
    };
    let Some(uuid) = device_uuid(device) else {
        return Ok(());
    };
    let (total, _, free) = m.figures();
    if let Some((used, limit)) = t.usage_by_uuid(&uuid) {
        let shown_total = limit.min(total);
        let shown_used = used.min(shown_total);
        let shown_free = (shown_total - shown_used).min(free);
        m.set_figures(shown_total, shown_used, shown_free);
        memory.set(m);
    }
    Ok(())
}

/// The tenant's processes on a device (`None`: not limited here, the driver's answer stands).
fn tenant_processes(device: nvmlDevice_t) -> Option<Vec<TenantProcess>> {
    let t = tenant()?;
    t.processes_by_uuid(&device_uuid(device)?)
}

/// Both process-info structs.
trait ProcessEntry: Copy {
    fn new(pid: u32, used: u64) -> Self;
}
impl ProcessEntry for nvmlProcessInfo_v1_t {
    fn new(pid: u32, used: u64) -> Self {
        nvmlProcessInfo_v1_t {
            pid,
            usedGpuMemory: used,
        }
    }
}
impl ProcessEntry for nvmlProcessInfo_t {
    fn new(pid: u32, used: u64) -> Self {
        nvmlProcessInfo_t {
            pid,
            usedGpuMemory: used,
            gpuInstanceId: u32::MAX,
            computeInstanceId: u32::MAX,
        }
    }
}

/// The tenant's own processes, each with what it is charged, in NVML's calling convention: `count`
/// holds the room in `infos`; too little room is `INSUFFICIENT_SIZE` with the count needed.
fn processes<P: ProcessEntry>(
    device: nvmlDevice_t,
    count: Out<c_uint>,
    infos: *mut P,
    call: impl FnOnce() -> NvmlReturn,
) -> NvmlReturn {
    let Some(list) = tenant_processes(device) else {
        return call();
    };
    let Some(room) = count.get() else {
        return call();
    };
    let needed = u32::try_from(list.len()).unwrap_or(u32::MAX);
    count.set(needed);
    if room < needed || (needed > 0 && infos.is_null()) {
        return Err(NvmlError::INSUFFICIENT_SIZE);
    }
    for (i, p) in list.iter().enumerate() {
        // SAFETY: the caller gave room for `room` >= `needed` entries at `infos`.
        unsafe { infos.add(i).write_unaligned(P::new(p.pid, p.used)) };
    }
    Ok(())
}

/// The driver's samples, kept for the tenant's own processes only, in NVML's calling convention:
/// `count` holds the room in `samples` (a NULL `samples` asks for the count); too little room is
/// `INSUFFICIENT_SIZE` with the count needed, no sample of the tenant's processes `NOT_FOUND`. The
/// driver's samples are read into a buffer of our own, so that neither the count asked for nor the
/// count returned tells the tenant how many processes of other tenants the device runs.
fn process_utilization(
    device: nvmlDevice_t,
    samples: *mut nvmlProcessUtilizationSample_t,
    count: Out<c_uint>,
    call: impl FnOnce() -> NvmlReturn,
    read_all: impl Fn(*mut nvmlProcessUtilizationSample_t, *mut c_uint) -> NvmlReturn,
) -> NvmlReturn {
    let Some(list) = tenant_processes(device) else {
        return call();
    };
    let Some(room) = count.get() else {
        return call();
    };
    let all = all_samples(read_all)?;
    let mine: Vec<_> = all
        .into_iter()
        .filter(|s| list.iter().any(|p| p.pid == s.pid))
        .collect();
    let needed = u32::try_from(mine.len()).unwrap_or(u32::MAX);
    count.set(needed);
    if mine.is_empty() {
        return Err(NvmlError::NOT_FOUND);
    }
    if samples.is_null() || room < needed {
        return Err(NvmlError::INSUFFICIENT_SIZE);
    }
    for (i, sample) in mine.into_iter().enumerate() {
        // SAFETY: the caller gave room for `room` >= `needed` samples at `samples`.
        unsafe { samples.add(i).write_unaligned(sample) };
    }
    Ok(())
}

/// Every sample the driver has, asked with NVML's count protocol (the count may grow between the
/// two calls: asked again a few times). No sample at all is the driver's `NOT_FOUND`.
fn all_samples(
    read: impl Fn(*mut nvmlProcessUtilizationSample_t, *mut c_uint) -> NvmlReturn,
) -> Result<Vec<nvmlProcessUtilizationSample_t>, NvmlError> {
    let mut n: c_uint = 0;
    match read(std::ptr::null_mut(), &mut n) {
        Err(e) if e == NvmlError::INSUFFICIENT_SIZE => {}
        Ok(()) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    }
    for _ in 0..4 {
        // Room for processes that start between the calls.
        let room = n.saturating_add(8).min(MAX_SAMPLES);
        let mut buffer = vec![nvmlProcessUtilizationSample_t::default(); room as usize];
        n = room;
        match read(buffer.as_mut_ptr(), &mut n) {
            Ok(()) => {
                buffer.truncate((n as usize).min(buffer.len()));
                return Ok(buffer);
            }
            Err(e) if e == NvmlError::INSUFFICIENT_SIZE && n > room && room < MAX_SAMPLES => {}
            Err(e) => return Err(e),
        }
    }
    Err(NvmlError::INSUFFICIENT_SIZE)
}

/// More samples than any device holds processes (a bound on what a driver's count can make us
/// allocate).
const MAX_SAMPLES: c_uint = 4096;
