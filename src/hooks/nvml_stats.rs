//! Per-process statistics NVML keeps, shown for the tenant's own processes only: utilisation
//! samples (`nvmlDeviceGetProcessUtilization`, `nvmlDeviceGetProcessesUtilizationInfo`) and
//! accounting mode (`nvmlDeviceGetAccountingPids`, `nvmlDeviceGetAccountingStats`). What is shown
//! is decided by `accounting::nvml_view`, in NVML's count protocol as the process lists are
//! (`hooks::nvml`).

use super::nvml::{ptr, room, view, write};
use super::{hooks, Out};
use gpuslice_api::nvml::{
    nvmlAccountingStats_t, nvmlDevice_t, nvmlProcessUtilizationInfo_v1_t,
    nvmlProcessUtilizationSample_t, nvmlProcessesUtilizationInfo_t,
};
use gpuslice_api::NvmlReturn;
use std::ffi::{c_uint, c_ulonglong};

hooks! {
    ret = NvmlReturn;
    fn nvmlDeviceGetProcessUtilization(device: nvmlDevice_t, samples: *mut nvmlProcessUtilizationSample_t, count: *mut c_uint, since: c_ulonglong)
        => process_utilization(device, samples, Out::new(count), || real::nvmlDeviceGetProcessUtilization(device, samples, count, since),
                               |all, n| real::nvmlDeviceGetProcessUtilization(device, ptr(all), n, since));
    fn nvmlDeviceGetProcessesUtilizationInfo(device: nvmlDevice_t, info: *mut nvmlProcessesUtilizationInfo_t)
        => processes_utilization_info(device, Out::new(info), || real::nvmlDeviceGetProcessesUtilizationInfo(device, info),
                                      |own| real::nvmlDeviceGetProcessesUtilizationInfo(device, own));
    fn nvmlDeviceGetAccountingPids(device: nvmlDevice_t, count: *mut c_uint, pids: *mut c_uint)
        => accounting_pids(device, Out::new(count), pids, || real::nvmlDeviceGetAccountingPids(device, count, pids),
                           |all, n| real::nvmlDeviceGetAccountingPids(device, n, ptr(all)));
    fn nvmlDeviceGetAccountingStats(device: nvmlDevice_t, pid: c_uint, stats: *mut nvmlAccountingStats_t)
        => accounting_stats(device, pid, Out::new(stats), || real::nvmlDeviceGetAccountingStats(device, pid, stats),
                            |own| real::nvmlDeviceGetAccountingStats(device, pid, own));
}

/// `nvmlDeviceGetProcessUtilization`: the driver's samples of the tenant's own processes only
/// (`NvmlView::samples`).
fn process_utilization(
    device: nvmlDevice_t,
    samples: *mut nvmlProcessUtilizationSample_t,
    count: Out<c_uint>,
    call: impl FnOnce() -> NvmlReturn,
    read_all: impl FnMut(Option<&mut [nvmlProcessUtilizationSample_t]>, &mut c_uint) -> NvmlReturn,
) -> NvmlReturn {
    let (Some(view), Some(n)) = (view(device), count.get()) else {
        return call();
    };
    let mine = view.samples(room(n, samples), |s| s.pid, read_all)?;
    count.set(mine.count);
    write(samples, mine)
}

/// `nvmlDeviceGetProcessesUtilizationInfo` (R550 and later): as [`process_utilization`], in this
/// struct's convention (`processSamplesCount` holds the room in `procUtilArray` and returns the
/// count; `NvmlView::samples_info`).
fn processes_utilization_info(
    device: nvmlDevice_t,
    info: Out<nvmlProcessesUtilizationInfo_t>,
    call: impl FnOnce() -> NvmlReturn,
    read: impl Fn(*mut nvmlProcessesUtilizationInfo_t) -> NvmlReturn,
) -> NvmlReturn {
    let (Some(view), Some(mut request)) = (view(device), info.get()) else {
        return call();
    };
    let read_all = |buffer: Option<&mut [_]>, n: &mut c_uint| {
        let mut own = nvmlProcessesUtilizationInfo_t {
            processSamplesCount: *n,
            procUtilArray: ptr(buffer),
            ..request
        };
        let answer = read(&mut own);
        *n = own.processSamplesCount;
        answer
    };
    let out = request.procUtilArray;
    let room = room(request.processSamplesCount, out);
    let pid = |s: &nvmlProcessUtilizationInfo_v1_t| s.pid;
    let mine = view.samples_info(request.version, room, pid, read_all)?;
    request.processSamplesCount = mine.count;
    info.set(request);
    write(out, mine)
}

/// `nvmlDeviceGetAccountingPids`: the tenant's own processes of the driver's list
/// (`NvmlView::accounting_pids`).
fn accounting_pids(
    device: nvmlDevice_t,
    count: Out<c_uint>,
    pids: *mut c_uint,
    call: impl FnOnce() -> NvmlReturn,
    read_all: impl FnMut(Option<&mut [c_uint]>, &mut c_uint) -> NvmlReturn,
) -> NvmlReturn {
    let (Some(view), Some(n)) = (view(device), count.get()) else {
        return call();
    };
    let shown = view.accounting_pids(room(n, pids), read_all)?;
    count.set(shown.count);
    write(pids, shown)
}

/// `nvmlDeviceGetAccountingStats`: the driver is asked first, into a struct of our own; its
/// statistics are shown for the tenant's own processes only (`NvmlView::accounting_stats`).
fn accounting_stats(
    device: nvmlDevice_t,
    pid: c_uint,
    stats: Out<nvmlAccountingStats_t>,
    call: impl FnOnce() -> NvmlReturn,
    read: impl FnOnce(*mut nvmlAccountingStats_t) -> NvmlReturn,
) -> NvmlReturn {
    let Some(view) = view(device).filter(|_| !stats.is_null()) else {
        return call();
    };
    let mut driver = nvmlAccountingStats_t::default();
    let answer = read(&mut driver);
    view.accounting_stats(pid, answer)?;
    stats.set(driver);
    Ok(())
}
