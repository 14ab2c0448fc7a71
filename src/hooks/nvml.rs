//! NVML shows the tenant's quota, so `nvidia-smi` and monitoring agents in the container report the
//! quota as the card: total = quota, used = the tenant's usage (allocations and driver overhead as
//! charged), free = the rest (`_v2`: `reserved` 0, so total = reserved + used + free; on a card
//! fuller than the quotas promise, free is what the card has, and the difference is `_v2`'s
//! `reserved` and part of v1's `used`); the process lists (compute, graphics, MPS, in every version,
//! and the detail list of each mode) show the tenant's own processes only, each with its charge;
//! the confidential-computing protected memory (`nvmlDeviceGetConfComputeProtectedMemoryUsage`) is
//! shown as the quota, as the memory view is. `accounting::nvml_view` decides what is shown, for
//! every one of these calls; per-process utilisation and accounting mode are `hooks::nvml_stats`.

use super::{hooks, Out};
use crate::accounting::nvml_view::{Listing, MemoryShown, NvmlView, ProcessList, Room};
use crate::accounting::tenant;
use gpuslice_api::nvml::{
    nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlProcessDetailList_t, nvmlProcessDetail_v1_t,
    nvmlProcessInfo_t, nvmlProcessInfo_v1_t,
};
use gpuslice_api::NvmlReturn;
use std::ffi::c_uint;
use ProcessList::{Compute, Graphics, Mps};

hooks! {
    ret = NvmlReturn;
    fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t)
        => memory_info(device, Out::new(memory), || real::nvmlDeviceGetMemoryInfo(device, memory));
    fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t)
        => memory_info(device, Out::new(memory), || real::nvmlDeviceGetMemoryInfo_v2(device, memory));
    fn nvmlDeviceGetComputeRunningProcesses(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t)
        => processes(device, Compute, Out::new(count), infos, || real::nvmlDeviceGetComputeRunningProcesses(device, count, infos),
                     |all, n| real::nvmlDeviceGetComputeRunningProcesses(device, n, ptr(all)));
    fn nvmlDeviceGetComputeRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t)
        => processes(device, Compute, Out::new(count), infos, || real::nvmlDeviceGetComputeRunningProcesses_v2(device, count, infos),
                     |all, n| real::nvmlDeviceGetComputeRunningProcesses_v2(device, n, ptr(all)));
    fn nvmlDeviceGetComputeRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t)
        => processes(device, Compute, Out::new(count), infos, || real::nvmlDeviceGetComputeRunningProcesses_v3(device, count, infos),
                     |all, n| real::nvmlDeviceGetComputeRunningProcesses_v3(device, n, ptr(all)));
    fn nvmlDeviceGetGraphicsRunningProcesses(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t)
        => processes(device, Graphics, Out::new(count), infos, || real::nvmlDeviceGetGraphicsRunningProcesses(device, count, infos),
                     |all, n| real::nvmlDeviceGetGraphicsRunningProcesses(device, n, ptr(all)));
    fn nvmlDeviceGetGraphicsRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t)
        => processes(device, Graphics, Out::new(count), infos, || real::nvmlDeviceGetGraphicsRunningProcesses_v2(device, count, infos),
                     |all, n| real::nvmlDeviceGetGraphicsRunningProcesses_v2(device, n, ptr(all)));
    fn nvmlDeviceGetGraphicsRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t)
        => processes(device, Graphics, Out::new(count), infos, || real::nvmlDeviceGetGraphicsRunningProcesses_v3(device, count, infos),
                     |all, n| real::nvmlDeviceGetGraphicsRunningProcesses_v3(device, n, ptr(all)));
    fn nvmlDeviceGetMPSComputeRunningProcesses(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t)
        => processes(device, Mps, Out::new(count), infos, || real::nvmlDeviceGetMPSComputeRunningProcesses(device, count, infos),
                     |all, n| real::nvmlDeviceGetMPSComputeRunningProcesses(device, n, ptr(all)));
    fn nvmlDeviceGetMPSComputeRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t)
        => processes(device, Mps, Out::new(count), infos, || real::nvmlDeviceGetMPSComputeRunningProcesses_v2(device, count, infos),
                     |all, n| real::nvmlDeviceGetMPSComputeRunningProcesses_v2(device, n, ptr(all)));
    fn nvmlDeviceGetMPSComputeRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t)
        => processes(device, Mps, Out::new(count), infos, || real::nvmlDeviceGetMPSComputeRunningProcesses_v3(device, count, infos),
                     |all, n| real::nvmlDeviceGetMPSComputeRunningProcesses_v3(device, n, ptr(all)));
    fn nvmlDeviceGetRunningProcessDetailList(device: nvmlDevice_t, plist: *mut nvmlProcessDetailList_t)
        => process_detail_list(device, Out::new(plist), || real::nvmlDeviceGetRunningProcessDetailList(device, plist),
                               |own| real::nvmlDeviceGetRunningProcessDetailList(device, own));
    fn nvmlDeviceGetConfComputeProtectedMemoryUsage(device: nvmlDevice_t, memory: *mut nvmlMemory_t)
        => memory_info(device, Out::new(memory), || real::nvmlDeviceGetConfComputeProtectedMemoryUsage(device, memory));
}

/// Both NVML memory structs.
pub trait MemoryFigures: Copy {
    /// The driver's (total, free).
    fn figures(&self) -> (u64, u64);
    fn show(&mut self, shown: MemoryShown);
}
impl MemoryFigures for nvmlMemory_t {
    fn figures(&self) -> (u64, u64) {
        (self.total, self.free)
    }
    fn show(&mut self, m: MemoryShown) {
        (self.total, self.used, self.free) = (m.total, m.used_with_reserved(), m.free);
    }
}
impl MemoryFigures for nvmlMemory_v2_t {
    fn figures(&self) -> (u64, u64) {
        (self.total, self.free)
    }
    fn show(&mut self, m: MemoryShown) {
        (self.total, self.used, self.free) = (m.total, m.used, m.free);
        self.reserved = m.reserved();
    }
}

/// The driver's memory figures, shown as the quota (`accounting::nvml_view`).
fn memory_info<M: MemoryFigures>(
    device: nvmlDevice_t,
    memory: Out<M>,
    call: impl FnOnce() -> NvmlReturn,
) -> NvmlReturn {
    call()?;
    let (Some(t), Some(mut m)) = (tenant(), memory.get()) else {
        return Ok(());
    };
    let (total, free) = m.figures();
    if let Some(shown) = t.nvml_memory(device as usize, total, free) {
        m.show(shown);
        memory.set(m);
    }
    Ok(())
}

/// The tenant's view of a device (`None`: not limited here, the driver's answer stands).
pub(super) fn view(device: nvmlDevice_t) -> Option<NvmlView> {
    tenant()?.nvml_view(device as usize)
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

/// A buffer of our own as the driver takes it (NULL: none, to ask for the count). The driver writes
/// at most the count it is given, which `nvml_view::read_all` sets to the buffer's length.
pub(super) fn ptr<T>(buffer: Option<&mut [T]>) -> *mut T {
    buffer.map_or(std::ptr::null_mut(), <[T]>::as_mut_ptr)
}

/// The caller's count (the room in its array) and array, as `accounting::nvml_view` takes them.
pub(super) fn room<T>(count: c_uint, array: *mut T) -> Room {
    Room {
        len: count,
        array: !array.is_null(),
    }
}

/// The tenant's own processes of `list`, each with what it is charged (`NvmlView::processes`).
fn processes<P: ProcessEntry>(
    device: nvmlDevice_t,
    list: ProcessList,
    count: Out<c_uint>,
    infos: *mut P,
    call: impl FnOnce() -> NvmlReturn,
    read_all: impl FnMut(Option<&mut [P]>, &mut c_uint) -> NvmlReturn,
) -> NvmlReturn {
    let (Some(view), Some(n)) = (view(device), count.get()) else {
        return call();
    };
    let shown = view.processes(list, room(n, infos), P::pid, read_all)?;
    let instance = view.instance;
    let shown = shown.map(|p| P::new(p.pid, p.used, instance));
    count.set(shown.count);
    write(infos, shown)
}

/// `nvmlDeviceGetRunningProcessDetailList` (`NvmlView::detail_list`), in this struct's convention
/// (`numProcArrayEntries` holds the room in `procArray` and returns the count).
fn process_detail_list(
    device: nvmlDevice_t,
    plist: Out<nvmlProcessDetailList_t>,
    call: impl FnOnce() -> NvmlReturn,
    read: impl Fn(*mut nvmlProcessDetailList_t) -> NvmlReturn,
) -> NvmlReturn {
    let (Some(view), Some(mut request)) = (view(device), plist.get()) else {
        return call();
    };
    let read_all = |buffer: Option<&mut [_]>, n: &mut c_uint| {
        let mut own = nvmlProcessDetailList_t {
            procArray: ptr(buffer),
            numProcArrayEntries: *n,
            ..request
        };
        let answer = read(&mut own);
        *n = own.numProcArrayEntries;
        answer
    };
    let out = request.procArray;
    let room = room(request.numProcArrayEntries, out);
    let pid = |e: &nvmlProcessDetail_v1_t| e.pid;
    let shown = view.detail_list(request.version, request.mode, room, pid, read_all)?;
    let (gi, ci) = view.instance;
    let shown = shown.map(|(p, driver)| nvmlProcessDetail_v1_t {
        pid: p.pid,
        usedGpuMemory: p.used,
        gpuInstanceId: gi,
        computeInstanceId: ci,
        usedGpuCcProtectedMemory: driver.map_or(0, |e| e.usedGpuCcProtectedMemory),
    });
    request.numProcArrayEntries = shown.count;
    plist.set(request);
    write(out, shown)
}

/// Writes an answer's entries into the caller's array `out` (`Listing::of` has checked that they
/// fit) and returns its result.
pub(super) fn write<T>(out: *mut T, listing: Listing<T>) -> NvmlReturn {
    if listing.result.is_ok() {
        for (i, entry) in listing.entries.into_iter().enumerate() {
            // SAFETY: NVML's contract: a non-NULL `out` has room for as many entries as the
            // caller's count said, and `Listing::of` keeps entries only when they fit (and `out`
            // is not NULL).
            unsafe { out.add(i).write_unaligned(entry) };
        }
    }
    listing.result
}
