//! CUDA IPC memory handles across the processes of one state file (cuda.h, `cuIpcGetMemHandle`,
//! `cuIpcOpenMemHandle`, `cuIpcCloseMemHandle`).
//!
//! NVIDIA documents that an importer's mapping is reference counted and that closing the last
//! mapping "unmaps the memory. The original allocation in the exporting process as well as imported
//! mappings in other processes will be unaffected" (`cuIpcCloseMemHandle`), and calls a `cuMemFree`
//! of an exported region before the importers close it "undefined behavior"
//! (`cuIpcOpenMemHandle`). What a driver does then is what CUDA IPC users report and rely on
//! (vLLM's custom all-reduce buffers, UCX's IPC cache): the physical memory stays alive until its
//! last mapping anywhere is gone. The documentation is silent on whose memory NVML counts it as; simgpu
//! counts it against the exporter while the exporter holds the allocation, then against one process
//! still mapping it (the lowest slot), so that the processes' figures always add up to the device's
//! (tests/simgpu/README.md lists this assumption).
//!
//! Every transition runs under the registry lock (an OFD lock of the state file, as registration
//! and the sweep take it), so entries, mapper bits and the per-process counters move together.

use crate::layout::*;
use crate::shared::{sub_saturating, Shared};
use crate::sys;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};

/// Why an IPC call failed (the cuda crate maps these to CUresults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpcError {
    /// No free entry, or the state cannot be locked.
    Full,
    /// The handle names no live export.
    Unknown,
    /// Opened in the process that exported it.
    OwnProcess,
}

fn index_of(key: u64) -> Option<usize> {
    let i = (key & 0xffff) as usize;
    (1..=MAX_IPC).contains(&i).then(|| i - 1)
}

impl Shared {
    fn with_registry<T>(&self, f: impl FnOnce(&State, usize) -> T) -> Result<T, IpcError> {
        let me = self.my_slot().ok_or(IpcError::Full)?;
        let registry = self.reopen_file().map_err(|_| IpcError::Full)?;
        sys::lock_wait(registry.as_raw_fd(), REGISTRY_LOCK).map_err(|_| IpcError::Full)?;
        Ok(f(self.state(), me))
        // The lock goes with `registry`.
    }

    /// Moves `bytes` on `device` from one process's (and group's) count to another's; the device's
    /// total is unchanged. Figures drop before they rise, so no peak passes what was really held.
    fn move_usage(&self, st: &State, from: usize, to: usize, device: usize, bytes: u64) {
        if from == to || device >= MAX_DEVICES {
            return;
        }
        sub_saturating(&st.slots[from].usage[device].used, bytes);
        if let Some(g) = self.group_of_slot(from) {
            sub_saturating(&g.usage[device].used, bytes);
        }
        let add = |u: &Usage| {
            let now = u.used.fetch_add(bytes, AcqRel) + bytes;
            u.peak.fetch_max(now, AcqRel);
        };
        add(&st.slots[to].usage[device]);
        if let Some(g) = self.group_of_slot(to) {
            add(&g.usage[device]);
        }
    }

    /// Exports the allocation at `base` (`bytes` charged to this process on `device`): the key its
    /// handles carry, the same for every call while it lives (cuda.h: "may be called multiple times
    /// on an allocation without adverse effects").
    pub fn ipc_export(&self, device: u32, base: u64, bytes: u64) -> Result<u64, IpcError> {
        self.with_registry(|st, me| {
            for e in &st.ipc {
                if e.state.load(Acquire) == IPC_EXPORTED
                    && e.exporter.load(Relaxed) as usize == me
                    && e.base.load(Relaxed) == base
                {
                    return Ok(e.key.load(Relaxed));
                }
            }
            let (i, e) = st
                .ipc
                .iter()
                .enumerate()
                .find(|(_, e)| e.state.load(Acquire) == IPC_FREE)
                .ok_or(IpcError::Full)?;
            let generation = (e.key.load(Relaxed) >> 16).wrapping_add(1) & 0xffff_ffff_ffff;
            let key = generation.max(1) << 16 | (i as u64 + 1);
            e.key.store(key, Relaxed);
            e.device.store(device, Relaxed);
            e.bytes.store(bytes, Relaxed);
            e.base.store(base, Relaxed);
            e.exporter.store(me as u32, Relaxed);
            e.holder.store(me as u32, Relaxed);
            for m in &e.mappers {
                m.store(0, Relaxed);
            }
            e.state.store(IPC_EXPORTED, Release);
            Ok(key)
        })?
    }

    /// Maps the export `key` into this process: its (device, bytes). Refused in the exporting
    /// process itself (a driver answers `CUDA_ERROR_INVALID_CONTEXT`, "invalid device context", as
    /// UCX reports: openucx/ucx#11226, #11603) and for a handle whose allocation was freed.
    pub fn ipc_open(&self, key: u64) -> Result<(u32, u64), IpcError> {
        let i = index_of(key).ok_or(IpcError::Unknown)?;
        self.with_registry(|st, me| {
            let e = &st.ipc[i];
            if e.key.load(Relaxed) != key || e.state.load(Acquire) != IPC_EXPORTED {
                return Err(IpcError::Unknown);
            }
            if e.exporter.load(Relaxed) as usize == me {
                return Err(IpcError::OwnProcess);
            }
            e.mappers[me / 64].fetch_or(1 << (me % 64), AcqRel);
            Ok((e.device.load(Relaxed), e.bytes.load(Relaxed)))
        })?
    }

    /// The lowest slot mapping entry `e`, but `except`.
    fn first_mapper(e: &IpcEntry, except: usize) -> Option<usize> {
        (0..MAX_PROCESSES)
            .find(|&s| s != except && e.mappers[s / 64].load(Acquire) & (1 << (s % 64)) != 0)
    }

    /// Process `slot` no longer maps entry `e` (closed, or gone): an orphan it held goes to another
    /// mapper, or is freed: true when the caller's process must return the bytes to the device.
    fn unmap_locked(&self, st: &State, e: &IpcEntry, slot: usize) -> bool {
        e.mappers[slot / 64].fetch_and(!(1 << (slot % 64)), AcqRel);
        if e.state.load(Acquire) != IPC_ORPHANED || e.holder.load(Relaxed) as usize != slot {
            return false;
        }
        let device = e.device.load(Relaxed) as usize;
        let bytes = e.bytes.load(Relaxed);
        match Self::first_mapper(e, slot) {
            Some(next) => {
                self.move_usage(st, slot, next, device, bytes);
                e.holder.store(next as u32, Relaxed);
                false
            }
            None => {
                e.state.store(IPC_FREE, Release);
                true
            }
        }
    }

    /// This process closed its last mapping of `key`. When it held the orphaned allocation and was
    /// its last mapping, the memory goes back to the device.
    pub fn ipc_close(&self, key: u64) {
        let Some(i) = index_of(key) else { return };
        let release = self.with_registry(|st, me| {
            let e = &st.ipc[i];
            if e.key.load(Relaxed) != key || e.state.load(Acquire) == IPC_FREE {
                return None;
            }
            self.unmap_locked(st, e, me)
                .then(|| (e.device.load(Relaxed), e.bytes.load(Relaxed)))
        });
        if let Ok(Some((device, bytes))) = release {
            self.release(device, bytes);
        }
    }

    /// The exporter frees the allocation of `key`: true when an importer still maps it (the memory
    /// stays alive, now counted against that importer; the caller must not return it), false when
    /// nobody does (the caller returns it as any free).
    pub fn ipc_free(&self, key: u64) -> bool {
        let Some(i) = index_of(key) else { return false };
        self.with_registry(|st, me| {
            let e = &st.ipc[i];
            if e.key.load(Relaxed) != key || e.state.load(Acquire) != IPC_EXPORTED {
                return false;
            }
            self.exporter_gone_locked(st, e, me)
        })
        .unwrap_or(false)
    }

    /// The exporter (`slot`) of entry `e` freed it or ended: true when it lives on in a mapper.
    fn exporter_gone_locked(&self, st: &State, e: &IpcEntry, slot: usize) -> bool {
        match Self::first_mapper(e, slot) {
            Some(next) => {
                let device = e.device.load(Relaxed) as usize;
                self.move_usage(st, slot, next, device, e.bytes.load(Relaxed));
                e.holder.store(next as u32, Relaxed);
                e.state.store(IPC_ORPHANED, Release);
                true
            }
            None => {
                e.state.store(IPC_FREE, Release);
                false
            }
        }
    }

    /// Process `slot` ends (exit, or found dead by a sweep; the registry lock is held): what it
    /// exported and others map lives on in them; what it mapped it no longer maps. Whatever it
    /// still counts is then returned with the rest of its memory.
    pub(crate) fn ipc_slot_gone_locked(&self, slot: usize) {
        let st = self.state();
        for e in &st.ipc {
            match e.state.load(Acquire) {
                IPC_EXPORTED if e.exporter.load(Relaxed) as usize == slot => {
                    self.exporter_gone_locked(st, e, slot);
                }
                IPC_EXPORTED | IPC_ORPHANED => {
                    self.unmap_locked(st, e, slot);
                }
                _ => {}
            }
        }
    }

    /// [`Shared::ipc_slot_gone_locked`] for this process, taking the lock.
    pub(crate) fn ipc_process_gone(&self) {
        let _ = self.with_registry(|_, me| self.ipc_slot_gone_locked(me));
    }
}
