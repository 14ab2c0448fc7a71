//! What NVML shows a tenant: the quota as the card (total = quota, used = the tenant's usage, free
//! = the rest, never more than the card has free), and, in every process list (compute, graphics,
//! MPS, the detail list of each mode), per-process utilisation and accounting mode, the tenant's
//! own processes only, each with its charge. The NVML hooks (`hooks::nvml`) convert the caller's
//! arguments, call one method here and write back what it answers.
//!
//! Every list answers in NVML's count protocol ([`Listing`]): the caller's count holds the room in
//! its array; too little room (or no array for a list that is not empty) is `INSUFFICIENT_SIZE`
//! with the count needed; an empty list is success with 0 (`NOT_FOUND` for samples). The driver's
//! own lists are read into buffers of our own ([`read_all`]), so that neither the count asked for
//! nor the count returned tells the tenant how many processes of other tenants the device runs.

use super::Tenant;
use gpuslice_api::nvml::{
    nvmlProcessDetailList_v1, nvmlProcessesUtilizationInfo_v1, NVML_PROCESS_MODE_COMPUTE,
    NVML_PROCESS_MODE_GRAPHICS, NVML_PROCESS_MODE_MPS,
};
use gpuslice_api::{NvmlError, NvmlReturn};
use std::ffi::c_uint;

/// One of the tenant's processes as NVML's process lists show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantProcess {
    /// As the process sees itself (its own PID namespace).
    pub pid: u32,
    /// What it is charged on the device.
    pub used: u64,
}

/// Which of NVML's process lists a view is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessList {
    /// Processes with a compute context.
    Compute,
    /// Processes with a graphics context (OpenGL, Vulkan, ...).
    Graphics,
    /// Clients of an MPS server.
    Mps,
}

impl ProcessList {
    /// Whether the tenant's view of this list depends on what the driver lists.
    pub fn follows_driver(self) -> bool {
        self != ProcessList::Compute
    }

    /// The list `nvmlDeviceGetRunningProcessDetailList` asks for: a version or mode gpuslice does
    /// not know is refused as nvml.h documents (`INVALID_ARGUMENT`) rather than passed on
    /// unfiltered.
    pub fn of_detail_request(version: u32, mode: u32) -> Result<ProcessList, NvmlError> {
        if version != nvmlProcessDetailList_v1 {
            return Err(NvmlError::INVALID_ARGUMENT);
        }
        match mode {
            NVML_PROCESS_MODE_COMPUTE => Ok(ProcessList::Compute),
            NVML_PROCESS_MODE_GRAPHICS => Ok(ProcessList::Graphics),
            NVML_PROCESS_MODE_MPS => Ok(ProcessList::Mps),
            _ => Err(NvmlError::INVALID_ARGUMENT),
        }
    }
}

/// The entries of one of NVML's process lists that a tenant is shown, from its own processes on the
/// device (`mine`, each with its charge) and the pids the driver lists there. The compute list is the
/// tenant's charged processes whatever the driver lists (they are the processes with a CUDA context,
/// and the driver's own answer would name other tenants'); graphics and MPS clients are those of the
/// driver's entries that are the tenant's processes, each with its charge (what a process holds is
/// one figure, whichever list names it). A process not charged to the tenant is never shown: it
/// may be anyone's.
pub fn shown_processes(
    list: ProcessList,
    mine: &[TenantProcess],
    driver_pids: &[u32],
) -> Vec<TenantProcess> {
    match list {
        ProcessList::Compute => mine.to_vec(),
        ProcessList::Graphics | ProcessList::Mps => mine
            .iter()
            .filter(|p| driver_pids.contains(&p.pid))
            .copied()
            .collect(),
    }
}

/// The device memory NVML shows the tenant (`nvmlDeviceGetMemoryInfo`, its `_v2`, and the
/// confidential-computing protected memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryShown {
    /// The quota, or the card when it is smaller.
    pub total: u64,
    /// The tenant's usage (allocations and driver overhead as charged).
    pub used: u64,
    /// The rest of the quota, never more than the card has free.
    pub free: u64,
}

impl MemoryShown {
    /// From the tenant's `used` and `limit` and the driver's `total` and `free`.
    pub fn of(used: u64, limit: u64, total: u64, free: u64) -> MemoryShown {
        let total = limit.min(total);
        let used = used.min(total);
        MemoryShown {
            total,
            used,
            free: (total - used).min(free),
        }
    }

    /// What the card holds back beyond the tenant's used and free memory (when the card is fuller
    /// than the quotas promise): `_v2`'s `reserved`, so that total = reserved + used + free. The
    /// driver's own reservation is part of the card, not of the quota: otherwise 0.
    pub fn reserved(&self) -> u64 {
        self.total
            .saturating_sub(self.used)
            .saturating_sub(self.free)
    }

    /// The v1 struct's `used`: it has no `reserved`, and NVIDIA documents its `used` as reserved +
    /// allocated, so that total = used + free.
    pub fn used_with_reserved(&self) -> u64 {
        self.total.saturating_sub(self.free)
    }
}

/// The caller's array in NVML's count protocol: the room it has (what the caller's count holds), and
/// whether it is there at all (not NULL).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Room {
    pub len: c_uint,
    pub array: bool,
}

/// An answer in NVML's count protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing<T> {
    /// The count the caller is told: the entries the list has.
    pub count: c_uint,
    /// What is written into the caller's array (nothing when it does not fit).
    pub entries: Vec<T>,
    /// The call's answer.
    pub result: NvmlReturn,
}

impl<T> Listing<T> {
    /// `entries` answered to a caller with `room`: too little room, or no array for a list that is
    /// not empty, is `INSUFFICIENT_SIZE` (nothing written); an empty list answers `empty`.
    pub fn of(entries: Vec<T>, room: Room, empty: NvmlReturn) -> Listing<T> {
        let count = c_uint::try_from(entries.len()).unwrap_or(c_uint::MAX);
        if entries.is_empty() {
            return Listing {
                count,
                entries,
                result: empty,
            };
        }
        if !room.array || usize::try_from(room.len).unwrap_or(usize::MAX) < entries.len() {
            return Listing {
                count,
                entries: Vec::new(),
                result: Err(NvmlError::INSUFFICIENT_SIZE),
            };
        }
        Listing {
            count,
            entries,
            result: Ok(()),
        }
    }
}

impl<T> Listing<T> {
    /// The same answer with each entry converted (to the caller's struct).
    pub fn map<U>(self, f: impl FnMut(T) -> U) -> Listing<U> {
        Listing {
            count: self.count,
            entries: self.entries.into_iter().map(f).collect(),
            result: self.result,
        }
    }
}

/// More entries than any device holds processes (a bound on what a driver's count can make us
/// allocate).
pub const MAX_ENTRIES: c_uint = 4096;

/// Every entry the driver has (samples, processes), asked with NVML's count protocol into buffers of
/// our own (`read` is given no buffer, then one whose length the count holds) (the count may grow between the two calls: asked again a few times, with room to
/// spare). No entry at all is the driver's success with a count of 0 (or its `NOT_FOUND`, for
/// samples, which stands).
pub fn read_all<T: Copy + Default>(
    mut read: impl FnMut(Option<&mut [T]>, &mut c_uint) -> NvmlReturn,
) -> Result<Vec<T>, NvmlError> {
    let mut n: c_uint = 0;
    match read(None, &mut n) {
        Err(e) if e == NvmlError::INSUFFICIENT_SIZE => {}
        Ok(()) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    }
    for _ in 0..4 {
        // Room for processes that start between the calls.
        let room = n.saturating_add(8).min(MAX_ENTRIES);
        let mut buffer = vec![T::default(); room as usize];
        n = room;
        match read(Some(&mut buffer), &mut n) {
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

/// A tenant's view of one NVML device it is limited on: its processes there, each with its charge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmlView {
    mine: Vec<TenantProcess>,
    /// The device's GPU and compute instance ids, which the process lists of a MIG device carry
    /// (`u32::MAX` each for a GPU).
    pub instance: (u32, u32),
}

impl Tenant {
    /// What NVML shows as device `handle`'s memory, from the driver's `total` and `free` (`None`:
    /// the device has no limit, or is not known; the driver's answer stands).
    pub fn nvml_memory(&self, handle: usize, total: u64, free: u64) -> Option<MemoryShown> {
        let uuid = self.driver.nvml_device_uuid(handle)?;
        let (used, limit) = self.usage_by_uuid(&uuid)?;
        Some(MemoryShown::of(used, limit, total, free))
    }

    /// The tenant's view of NVML device `handle` (`None`: not limited there, the driver's answer
    /// stands).
    pub fn nvml_view(&self, handle: usize) -> Option<NvmlView> {
        let uuid = self.driver.nvml_device_uuid(handle)?;
        let mine = self.processes_by_uuid(&uuid)?;
        Some(NvmlView::new(mine, self.driver.nvml_instance_ids(handle)))
    }
}

impl NvmlView {
    pub fn new(mine: Vec<TenantProcess>, instance: (u32, u32)) -> NvmlView {
        NvmlView { mine, instance }
    }

    fn is_mine(&self, pid: u32) -> bool {
        self.mine.iter().any(|p| p.pid == pid)
    }

    /// The tenant's own processes of `list`, each with what it is charged, for a caller with
    /// `room`. The driver's list (entries `E`, read by `read`) is read only where the view depends
    /// on it; its errors stand.
    pub fn processes<E: Copy + Default>(
        &self,
        list: ProcessList,
        room: Room,
        pid: impl Fn(&E) -> u32,
        read: impl FnMut(Option<&mut [E]>, &mut c_uint) -> NvmlReturn,
    ) -> Result<Listing<TenantProcess>, NvmlError> {
        let driver_pids: Vec<u32> = if list.follows_driver() {
            read_all(read)?.iter().map(pid).collect()
        } else {
            Vec::new()
        };
        let shown = shown_processes(list, &self.mine, &driver_pids);
        Ok(Listing::of(shown, room, Ok(())))
    }

    /// `nvmlDeviceGetRunningProcessDetailList`: the tenant's own processes of the list asked for
    /// ([`ProcessList::of_detail_request`]), each with the driver's entry of it (which carries its
    /// confidential-computing figure). The driver's list of the mode is always read first, so that
    /// its own answer (a GPU older than Hopper does not support the call) stands.
    pub fn detail_list<E: Copy + Default>(
        &self,
        version: u32,
        mode: u32,
        room: Room,
        pid: impl Fn(&E) -> u32,
        read: impl FnMut(Option<&mut [E]>, &mut c_uint) -> NvmlReturn,
    ) -> Result<Listing<(TenantProcess, Option<E>)>, NvmlError> {
        let list = ProcessList::of_detail_request(version, mode)?;
        let driver = read_all(read)?;
        let pids: Vec<u32> = driver.iter().map(&pid).collect();
        let shown = shown_processes(list, &self.mine, &pids)
            .into_iter()
            .map(|p| (p, driver.iter().find(|e| pid(e) == p.pid).copied()))
            .collect();
        Ok(Listing::of(shown, room, Ok(())))
    }

    /// Per-process utilisation (`nvmlDeviceGetProcessUtilization`): the driver's samples of the
    /// tenant's own processes only; none of them is `NOT_FOUND`.
    pub fn samples<S: Copy + Default>(
        &self,
        room: Room,
        pid: impl Fn(&S) -> u32,
        read: impl FnMut(Option<&mut [S]>, &mut c_uint) -> NvmlReturn,
    ) -> Result<Listing<S>, NvmlError> {
        let mine: Vec<S> = read_all(read)?
            .into_iter()
            .filter(|s| self.is_mine(pid(s)))
            .collect();
        Ok(Listing::of(mine, room, Err(NvmlError::NOT_FOUND)))
    }

    /// `nvmlDeviceGetProcessesUtilizationInfo` (R550 and later): [`NvmlView::samples`], for a
    /// struct of `version`. A version gpuslice does not know is refused as nvml.h documents
    /// (`ARGUMENT_VERSION_MISMATCH`) rather than passed on unfiltered.
    pub fn samples_info<S: Copy + Default>(
        &self,
        version: u32,
        room: Room,
        pid: impl Fn(&S) -> u32,
        read: impl FnMut(Option<&mut [S]>, &mut c_uint) -> NvmlReturn,
    ) -> Result<Listing<S>, NvmlError> {
        if version != nvmlProcessesUtilizationInfo_v1 {
            return Err(NvmlError::ARGUMENT_VERSION_MISMATCH);
        }
        self.samples(room, pid, read)
    }

    /// The pids of accounting mode's list that the tenant is shown: those of the driver's list
    /// (running or terminated processes with statistics, in the driver's order) that are the
    /// tenant's processes now, decided as [`shown_processes`] decides the graphics and MPS lists. A
    /// terminated process is no longer the tenant's (its charge is gone with it), so it is not
    /// shown: it may be anyone's.
    fn accounting_shown(&self, driver_pids: &[u32]) -> Vec<u32> {
        let shown = shown_processes(ProcessList::Graphics, &self.mine, driver_pids);
        driver_pids
            .iter()
            .copied()
            .filter(|pid| shown.iter().any(|p| p.pid == *pid))
            .collect()
    }

    /// `nvmlDeviceGetAccountingPids`: the tenant's own processes of the driver's list (read by
    /// `read`; its errors stand: `NOT_SUPPORTED` while accounting mode is off).
    pub fn accounting_pids(
        &self,
        room: Room,
        read: impl FnMut(Option<&mut [c_uint]>, &mut c_uint) -> NvmlReturn,
    ) -> Result<Listing<c_uint>, NvmlError> {
        let shown = self.accounting_shown(&read_all(read)?);
        Ok(Listing::of(shown, room, Ok(())))
    }

    /// `nvmlDeviceGetAccountingStats` of `pid`, the driver having answered `driver` (asked first,
    /// into a struct of our own): `Ok` when the driver's statistics are shown. Any pid not the
    /// tenant's is `NOT_FOUND`, as the driver answers for a pid it has no statistics of; the
    /// driver's errors that do not depend on the pid (`NOT_SUPPORTED` while accounting mode is
    /// off, `INVALID_ARGUMENT`) stand, and nothing the tenant is told depends on whether another
    /// tenant's pid has statistics.
    pub fn accounting_stats(&self, pid: u32, driver: NvmlReturn) -> NvmlReturn {
        match driver {
            Ok(()) if self.accounting_shown(&[pid]).is_empty() => Err(NvmlError::NOT_FOUND),
            Ok(()) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
