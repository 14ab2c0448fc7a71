//! NVML shows the tenant's quota, so `nvidia-smi` and monitoring agents in the container report the
//! quota as the card: total = quota, used = the tenant's usage (allocations and driver overhead as
//! charged), free = the rest (`_v2`: `reserved` 0, so total = reserved + used + free; on a card
//! fuller than the quotas promise, free is what the card has, and the difference is `_v2`'s
//! `reserved` and part of v1's `used`); the process lists (compute, graphics, MPS, in every version,
//! and the detail list of each mode) and per-process utilisation show the tenant's own processes
//! only, each with its charge: [`shown_processes`] decides which, for every one of these calls.
//! Per-process utilisation (`nvmlDeviceGetProcessUtilization`,
//! `nvmlDeviceGetProcessesUtilizationInfo`) keeps the driver's samples of the tenant's own processes
//! only. Accounting mode (`nvmlDeviceGetAccountingPids`, `nvmlDeviceGetAccountingStats`)
//! names and describes the tenant's own processes only, and the confidential-computing protected
//! memory (`nvmlDeviceGetConfComputeProtectedMemoryUsage`) is shown as the quota, as the memory
//! view is.

use super::{hooks, Out};
use crate::accounting::tenant;
use crate::accounting::views::{shown_processes, ProcessList, TenantProcess};
use crate::driver::calls::nvml::real as nvml_real;
use gpuslice_api::nvml::{
    nvmlAccountingStats_t, nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlProcessDetailList_t,
    nvmlProcessDetailList_v1, nvmlProcessDetail_v1_t, nvmlProcessInfo_t, nvmlProcessInfo_v1_t,
    nvmlProcessUtilizationInfo_v1_t, nvmlProcessUtilizationSample_t,
    nvmlProcessesUtilizationInfo_t, nvmlProcessesUtilizationInfo_v1, NVML_PROCESS_MODE_COMPUTE,
    NVML_PROCESS_MODE_GRAPHICS, NVML_PROCESS_MODE_MPS,
};
use gpuslice_api::{NvmlError, NvmlReturn};
use std::ffi::{c_char, c_uint, c_ulonglong};
use ProcessList::{Compute, Graphics, Mps};

hooks! {
    ret = NvmlReturn;
    fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t)
        => memory_info(device, Out::new(memory), || real::nvmlDeviceGetMemoryInfo(device, memory));
    fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t)
        => memory_info(device, Out::new(memory), || real::nvmlDeviceGetMemoryInfo_v2(device, memory));
    fn nvmlDeviceGetComputeRunningProcesses(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t)
        => processes(device, Compute, Out::new(count), infos, || real::nvmlDeviceGetComputeRunningProcesses(device, count, infos),
                     |all, n| real::nvmlDeviceGetComputeRunningProcesses(device, n, all));
    fn nvmlDeviceGetComputeRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t)
        => processes(device, Compute, Out::new(count), infos, || real::nvmlDeviceGetComputeRunningProcesses_v2(device, count, infos),
                     |all, n| real::nvmlDeviceGetComputeRunningProcesses_v2(device, n, all));
    fn nvmlDeviceGetComputeRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t)
        => processes(device, Compute, Out::new(count), infos, || real::nvmlDeviceGetComputeRunningProcesses_v3(device, count, infos),
                     |all, n| real::nvmlDeviceGetComputeRunningProcesses_v3(device, n, all));
    fn nvmlDeviceGetGraphicsRunningProcesses(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t)
        => processes(device, Graphics, Out::new(count), infos, || real::nvmlDeviceGetGraphicsRunningProcesses(device, count, infos),
                     |all, n| real::nvmlDeviceGetGraphicsRunningProcesses(device, n, all));
    fn nvmlDeviceGetGraphicsRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t)
        => processes(device, Graphics, Out::new(count), infos, || real::nvmlDeviceGetGraphicsRunningProcesses_v2(device, count, infos),
                     |all, n| real::nvmlDeviceGetGraphicsRunningProcesses_v2(device, n, all));
    fn nvmlDeviceGetGraphicsRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t)
        => processes(device, Graphics, Out::new(count), infos, || real::nvmlDeviceGetGraphicsRunningProcesses_v3(device, count, infos),
                     |all, n| real::nvmlDeviceGetGraphicsRunningProcesses_v3(device, n, all));
    fn nvmlDeviceGetMPSComputeRunningProcesses(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t)
        => processes(device, Mps, Out::new(count), infos, || real::nvmlDeviceGetMPSComputeRunningProcesses(device, count, infos),
                     |all, n| real::nvmlDeviceGetMPSComputeRunningProcesses(device, n, all));
    fn nvmlDeviceGetMPSComputeRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t)
        => processes(device, Mps, Out::new(count), infos, || real::nvmlDeviceGetMPSComputeRunningProcesses_v2(device, count, infos),
                     |all, n| real::nvmlDeviceGetMPSComputeRunningProcesses_v2(device, n, all));
    fn nvmlDeviceGetMPSComputeRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t)
        => processes(device, Mps, Out::new(count), infos, || real::nvmlDeviceGetMPSComputeRunningProcesses_v3(device, count, infos),
                     |all, n| real::nvmlDeviceGetMPSComputeRunningProcesses_v3(device, n, all));
    fn nvmlDeviceGetRunningProcessDetailList(device: nvmlDevice_t, plist: *mut nvmlProcessDetailList_t)
        => process_detail_list(device, Out::new(plist), || real::nvmlDeviceGetRunningProcessDetailList(device, plist),
                               |own| real::nvmlDeviceGetRunningProcessDetailList(device, own));
    fn nvmlDeviceGetProcessUtilization(device: nvmlDevice_t, samples: *mut nvmlProcessUtilizationSample_t, count: *mut c_uint, since: c_ulonglong)
        => process_utilization(device, samples, Out::new(count), || real::nvmlDeviceGetProcessUtilization(device, samples, count, since),
                               |all, n| real::nvmlDeviceGetProcessUtilization(device, all, n, since));
    fn nvmlDeviceGetProcessesUtilizationInfo(device: nvmlDevice_t, info: *mut nvmlProcessesUtilizationInfo_t)
        => processes_utilization_info(device, Out::new(info), || real::nvmlDeviceGetProcessesUtilizationInfo(device, info),
                                      |own| real::nvmlDeviceGetProcessesUtilizationInfo(device, own));
    fn nvmlDeviceGetAccountingPids(device: nvmlDevice_t, count: *mut c_uint, pids: *mut c_uint)
        => accounting_pids(device, Out::new(count), pids, || real::nvmlDeviceGetAccountingPids(device, count, pids),
                           |all, n| real::nvmlDeviceGetAccountingPids(device, n, all));
    fn nvmlDeviceGetAccountingStats(device: nvmlDevice_t, pid: c_uint, stats: *mut nvmlAccountingStats_t)
        => accounting_stats(device, pid, Out::new(stats), || real::nvmlDeviceGetAccountingStats(device, pid, stats),
                            |own| real::nvmlDeviceGetAccountingStats(device, pid, own));
    fn nvmlDeviceGetConfComputeProtectedMemoryUsage(device: nvmlDevice_t, memory: *mut nvmlMemory_t)
        => memory_info(device, Out::new(memory), || real::nvmlDeviceGetConfComputeProtectedMemoryUsage(device, memory));
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

/// The GPU and compute instance ids of a MIG device handle (nvml.h `nvmlDeviceGetGpuInstanceId`,
/// `nvmlDeviceGetComputeInstanceId`), which the process lists of a MIG device carry; `u32::MAX`
/// each (NVML's "no instance") for a GPU's handle, where the driver refuses them.
fn instance_ids(device: nvmlDevice_t) -> (u32, u32) {
    let (mut gi, mut ci): (c_uint, c_uint) = (0, 0);
    // SAFETY: valid out-parameters; the handle is the caller's, validated by the driver.
    let ok = unsafe {
        nvml_real::nvmlDeviceGetGpuInstanceId(device, &mut gi).is_ok()
            && nvml_real::nvmlDeviceGetComputeInstanceId(device, &mut ci).is_ok()
    };
    if ok {
        (gi, ci)
    } else {
        (u32::MAX, u32::MAX)
    }
}

/// Both process-info structs.
trait ProcessEntry: Copy + Default {
    fn new(pid: u32, used: u64, instance: (u32, u32)) -> Self;
    fn pid(&self) -> u32;
}
impl ProcessEntry for nvmlProcessInfo_v1_t {
    fn new(pid: u32, used: u64, _instance: (u32, u32)) -> Self {
        nvmlProcessInfo_v1_t {
            pid,
            usedGpuMemory: used,
        }
    }
    fn pid(&self) -> u32 {
        self.pid
    }
}
impl ProcessEntry for nvmlProcessInfo_t {
    fn new(pid: u32, used: u64, (gi, ci): (u32, u32)) -> Self {
        nvmlProcessInfo_t {
            pid,
            usedGpuMemory: used,
            gpuInstanceId: gi,
            computeInstanceId: ci,
        }
    }
    fn pid(&self) -> u32 {
        self.pid
    }
}

/// The tenant's entries of `list` on a device; the driver's own entries of it are read (into a
/// buffer of our own) only where the view depends on them.
fn shown_list<E: Copy + Default>(
    list: ProcessList,
    mine: &[TenantProcess],
    pid: impl Fn(&E) -> u32,
    read_all: impl FnMut(*mut E, &mut c_uint) -> NvmlReturn,
) -> Result<Vec<TenantProcess>, NvmlError> {
    let driver_pids: Vec<u32> = if list.follows_driver() {
        all_entries(read_all)?.iter().map(pid).collect()
    } else {
        Vec::new()
    };
    Ok(shown_processes(list, mine, &driver_pids))
}

/// The tenant's own processes of `list`, each with what it is charged, in NVML's calling
/// convention: `count` holds the room in `infos`; too little room is `INSUFFICIENT_SIZE` with the
/// count needed (a NULL `infos` with room 0 asks for the count); none at all is success with 0.
fn processes<P: ProcessEntry>(
    device: nvmlDevice_t,
    list: ProcessList,
    count: Out<c_uint>,
    infos: *mut P,
    call: impl FnOnce() -> NvmlReturn,
    read_all: impl FnMut(*mut P, &mut c_uint) -> NvmlReturn,
) -> NvmlReturn {
    let Some(mine) = tenant_processes(device) else {
        return call();
    };
    let Some(room) = count.get() else {
        return call();
    };
    let shown = shown_list(list, &mine, P::pid, read_all)?;
    count.set(entry_count(&shown));
    let instance = instance_ids(device);
    write_entries(
        infos,
        room,
        shown.iter().map(|p| P::new(p.pid, p.used, instance)),
    )
}

/// `nvmlDeviceGetRunningProcessDetailList`: the tenant's own processes of the list's mode, as
/// [`processes`] shows the other lists, in this struct's convention (`numProcArrayEntries` holds
/// the room in `procArray` and returns the count). A version or mode gpuslice does not know is
/// refused as nvml.h documents (`INVALID_ARGUMENT`) rather than passed on unfiltered. The driver's
/// list of the mode is always read first, so that its own answer (a GPU older than Hopper does not
/// support the call) stands; its confidential-computing figure is kept for the tenant's processes.
fn process_detail_list(
    device: nvmlDevice_t,
    plist: Out<nvmlProcessDetailList_t>,
    call: impl FnOnce() -> NvmlReturn,
    read: impl Fn(*mut nvmlProcessDetailList_t) -> NvmlReturn,
) -> NvmlReturn {
    let Some(mine) = tenant_processes(device) else {
        return call();
    };
    let Some(mut request) = plist.get() else {
        return call();
    };
    if request.version != nvmlProcessDetailList_v1 {
        return Err(NvmlError::INVALID_ARGUMENT);
    }
    let list = match request.mode {
        NVML_PROCESS_MODE_COMPUTE => Compute,
        NVML_PROCESS_MODE_GRAPHICS => Graphics,
        NVML_PROCESS_MODE_MPS => Mps,
        _ => return Err(NvmlError::INVALID_ARGUMENT),
    };
    let driver: Vec<nvmlProcessDetail_v1_t> = all_entries(|buffer, n| {
        let mut own = nvmlProcessDetailList_t {
            procArray: buffer,
            numProcArrayEntries: *n,
            ..request
        };
        let answer = read(&mut own);
        *n = own.numProcArrayEntries;
        answer
    })?;
    let pids: Vec<u32> = driver.iter().map(|e| e.pid).collect();
    let shown = shown_processes(list, &mine, &pids);
    let room = request.numProcArrayEntries;
    request.numProcArrayEntries = entry_count(&shown);
    plist.set(request);
    let (gi, ci) = instance_ids(device);
    let entries = shown.iter().map(|p| nvmlProcessDetail_v1_t {
        pid: p.pid,
        usedGpuMemory: p.used,
        gpuInstanceId: gi,
        computeInstanceId: ci,
        usedGpuCcProtectedMemory: driver
            .iter()
            .find(|e| e.pid == p.pid)
            .map_or(0, |e| e.usedGpuCcProtectedMemory),
    });
    write_entries(request.procArray, room, entries)
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
    read_all: impl FnMut(*mut nvmlProcessUtilizationSample_t, &mut c_uint) -> NvmlReturn,
) -> NvmlReturn {
    let Some(list) = tenant_processes(device) else {
        return call();
    };
    let Some(room) = count.get() else {
        return call();
    };
    let all = all_entries(read_all)?;
    let mine: Vec<_> = all
        .into_iter()
        .filter(|s| list.iter().any(|p| p.pid == s.pid))
        .collect();
    count.set(entry_count(&mine));
    if mine.is_empty() {
        return Err(NvmlError::NOT_FOUND);
    }
    write_entries(samples, room, mine)
}

/// `nvmlDeviceGetProcessesUtilizationInfo` (R550 and later): the driver's samples of the tenant's
/// own processes only, as [`process_utilization`] shows them, in this struct's convention
/// (`processSamplesCount` holds the room in `procUtilArray` and returns the count). The driver's
/// samples are read into a buffer of our own. A version gpuslice does not know is refused as
/// nvml.h documents (`ARGUMENT_VERSION_MISMATCH`) rather than passed on unfiltered.
fn processes_utilization_info(
    device: nvmlDevice_t,
    info: Out<nvmlProcessesUtilizationInfo_t>,
    call: impl FnOnce() -> NvmlReturn,
    read: impl Fn(*mut nvmlProcessesUtilizationInfo_t) -> NvmlReturn,
) -> NvmlReturn {
    let Some(list) = tenant_processes(device) else {
        return call();
    };
    let Some(mut request) = info.get() else {
        return call();
    };
    if request.version != nvmlProcessesUtilizationInfo_v1 {
        return Err(NvmlError::ARGUMENT_VERSION_MISMATCH);
    }
    let all: Vec<nvmlProcessUtilizationInfo_v1_t> = all_entries(|buffer, n| {
        let mut own = nvmlProcessesUtilizationInfo_t {
            processSamplesCount: *n,
            procUtilArray: buffer,
            ..request
        };
        let answer = read(&mut own);
        *n = own.processSamplesCount;
        answer
    })?;
    let mine: Vec<_> = all
        .into_iter()
        .filter(|s| list.iter().any(|p| p.pid == s.pid))
        .collect();
    let room = request.processSamplesCount;
    request.processSamplesCount = entry_count(&mine);
    info.set(request);
    if mine.is_empty() {
        return Err(NvmlError::NOT_FOUND);
    }
    write_entries(request.procUtilArray, room, mine)
}

/// The pids of accounting mode's list that the tenant is shown: those of the driver's list (running
/// or terminated processes with statistics, in the driver's order) that are the tenant's processes
/// now, decided as [`shown_processes`] decides the graphics and MPS lists. A terminated process is
/// no longer the tenant's (its charge is gone with it), so it is not shown: it may be anyone's.
fn shown_accounting_pids(mine: &[TenantProcess], driver_pids: &[u32]) -> Vec<u32> {
    let shown = shown_processes(Graphics, mine, driver_pids);
    driver_pids
        .iter()
        .copied()
        .filter(|pid| shown.iter().any(|p| p.pid == *pid))
        .collect()
}

/// `nvmlDeviceGetAccountingPids`: the tenant's own processes of the driver's list, in NVML's count
/// protocol (`count` holds the room in `pids`; too little room, or a NULL `pids` with room 0, is
/// `INSUFFICIENT_SIZE` with the count needed; none is success with 0). The driver's list is read
/// into a buffer of our own, and its errors stand (`NOT_SUPPORTED` while accounting mode is off).
fn accounting_pids(
    device: nvmlDevice_t,
    count: Out<c_uint>,
    pids: *mut c_uint,
    call: impl FnOnce() -> NvmlReturn,
    read_all: impl FnMut(*mut c_uint, &mut c_uint) -> NvmlReturn,
) -> NvmlReturn {
    let Some(mine) = tenant_processes(device) else {
        return call();
    };
    let Some(room) = count.get() else {
        return call();
    };
    let shown = shown_accounting_pids(&mine, &all_entries(read_all)?);
    count.set(entry_count(&shown));
    write_entries(pids, room, shown)
}

/// `nvmlDeviceGetAccountingStats`: the driver's statistics of one of the tenant's own processes;
/// any other pid is `NOT_FOUND`, as the driver answers for a pid it has no statistics of. The
/// driver is asked first (into a struct of our own), so that its errors that do not depend on the
/// pid (`NOT_SUPPORTED` while accounting mode is off, `INVALID_ARGUMENT`) stand, and nothing the
/// tenant is told depends on whether another tenant's pid has statistics.
fn accounting_stats(
    device: nvmlDevice_t,
    pid: c_uint,
    stats: Out<nvmlAccountingStats_t>,
    call: impl FnOnce() -> NvmlReturn,
    read: impl FnOnce(*mut nvmlAccountingStats_t) -> NvmlReturn,
) -> NvmlReturn {
    let Some(mine) = tenant_processes(device) else {
        return call();
    };
    if stats.is_null() {
        return call();
    }
    let mut driver = nvmlAccountingStats_t::default();
    let answer = read(&mut driver);
    let not_found = Err(NvmlError::NOT_FOUND);
    match answer {
        Ok(()) if shown_accounting_pids(&mine, &[pid]).is_empty() => not_found,
        Ok(()) => {
            stats.set(driver);
            Ok(())
        }
        Err(e) if e == NvmlError::NOT_FOUND => not_found,
        Err(e) => Err(e),
    }
}

/// A list's length as NVML counts it.
fn entry_count<T>(entries: &[T]) -> c_uint {
    c_uint::try_from(entries.len()).unwrap_or(c_uint::MAX)
}

/// Writes `entries` into the caller's array `out` of `room` entries, in NVML's count protocol (the
/// caller has set the count needed): too little room, or a NULL array for a list that is not
/// empty, is `INSUFFICIENT_SIZE`; an empty list is success.
fn write_entries<T>(
    out: *mut T,
    room: c_uint,
    entries: impl IntoIterator<Item = T, IntoIter: ExactSizeIterator>,
) -> NvmlReturn {
    let entries = entries.into_iter();
    if entries.len() == 0 {
        return Ok(());
    }
    if out.is_null() || usize::try_from(room).unwrap_or(usize::MAX) < entries.len() {
        return Err(NvmlError::INSUFFICIENT_SIZE);
    }
    for (i, entry) in entries.enumerate() {
        // SAFETY: NVML's contract: a non-NULL `out` has room for `room` entries, and
        // `i < entries.len() <= room`.
        unsafe { out.add(i).write_unaligned(entry) };
    }
    Ok(())
}

/// Every entry the driver has (samples, processes), asked with NVML's count protocol (the count may
/// grow between the two calls: asked again a few times). No entry at all is the driver's success with
/// a count of 0 (or its `NOT_FOUND`, for samples).
fn all_entries<T: Copy + Default>(
    mut read: impl FnMut(*mut T, &mut c_uint) -> NvmlReturn,
) -> Result<Vec<T>, NvmlError> {
    let mut n: c_uint = 0;
    match read(std::ptr::null_mut(), &mut n) {
        Err(e) if e == NvmlError::INSUFFICIENT_SIZE => {}
        Ok(()) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    }
    for _ in 0..4 {
        // Room for processes that start between the calls.
        let room = n.saturating_add(8).min(MAX_ENTRIES);
        let mut buffer = vec![T::default(); room as usize];
        n = room;
        match read(buffer.as_mut_ptr(), &mut n) {
            Ok(()) => {
                buffer.truncate((n as usize).min(buffer.len()));
                return Ok(buffer);
            }
            Err(e) if e == NvmlError::INSUFFICIENT_SIZE && n > room && room < MAX_ENTRIES => {}
            Err(e) => return Err(e),
        }
    }
    Err(NvmlError::INSUFFICIENT_SIZE)
}

/// More entries than any device holds processes (a bound on what a driver's count can make us
/// allocate).
const MAX_ENTRIES: c_uint = 4096;
