//! Driver overhead: the device memory the driver spends on a program's behalf without a
//! `cuMemAlloc` (a context, module code, the stack, heap and printf limits), charged at what the
//! driver actually spent.
//!
//! Method (docs/MEMORY.md): around the operation, under a lock per device shared by every tenant of
//! the GPU (a file in the effective device directory, `Config::device_dir`: a node policy's wins
//! over `GPUSLICE_DEVICE_DIR`), read this process's used memory from NVML (when it can
//! find itself in the process list) and the device's used memory; what the driver spent is the
//! change, less what this process charged for its own allocations meanwhile. The process figure is
//! exact; the device figure also moves with other processes' allocations in the window (the error
//! bound). Nothing measurable: the fallback estimate (`GPUSLICE_CONTEXT_RESERVE` for a context).
//! After each operation the process's overhead is reconciled (`reconcile`): what the driver says
//! the process holds minus what it charged for allocations; more than the recorded charges is
//! charged too, never less. An impossible answer (the process holds less than it allocated) is
//! logged once and not believed. This file holds the samples and what an operation spent, the
//! records of modules', libraries' and limits' overhead, and the code a lazily loaded module or
//! library loads at its lookups.

use super::lazy_code::LazyCode;
pub use super::records::Overhead;
use super::records::OverheadRecord;
use super::{Charge, Device, Tenant};
use crate::driver::measure::ProcessFigure;
use crate::log;
use std::sync::atomic::{AtomicBool, Ordering};

/// `bytes` in the 2 MiB pages a driver maps device memory in.
pub fn driver_pages(bytes: u64) -> u64 {
    const PAGE: u64 = 2 << 20;
    bytes.div_ceil(PAGE).saturating_mul(PAGE)
}

/// One reading of the driver's figures (and of what this process charged) on a device.
#[derive(Clone, Debug)]
pub(super) struct Sample {
    pub(super) process: ProcessFigure,
    pub(super) device: Option<u64>,
    /// NVML's whole process list (driver PIDs and their used memory), read only while this process
    /// does not know the PID the driver lists it under (a child PID namespace).
    pub(super) listed: Option<Vec<(u32, u64)>>,
    /// What this process had charged on the device in the ledger, read just before and just after
    /// the driver's figures. Other threads' allocations and frees may run meanwhile; as a
    /// reservation precedes the driver's allocation and a release follows its free, the larger of
    /// the two is at least what the driver held for them when it answered.
    pub(super) charged_low: u64,
    pub(super) charged: u64,
}

impl Sample {
    /// Whether it read this process's own figure (NVML lists it): no other process moves it.
    pub(super) fn is_own(&self) -> bool {
        matches!(self.process, ProcessFigure::Listed(_))
    }
}

/// What [`Tenant::spent`] found an operation cost.
#[derive(Clone, Copy, Debug)]
pub(super) struct Spent {
    pub bytes: i128,
    /// From this process's own figure; else from the device's used memory, which also moves with
    /// every other process's allocations and frees meanwhile.
    pub exact: bool,
    /// The most the operation can have cost by NVML's process list (the largest process that
    /// appeared meanwhile, this one among them).
    pub bound: Option<u64>,
}

static WARNED_IMPOSSIBLE: AtomicBool = AtomicBool::new(false);
pub(super) static WARNED_DISTURBED: AtomicBool = AtomicBool::new(false);
pub(super) static WARNED_NEIGHBOUR: AtomicBool = AtomicBool::new(false);
pub(super) static WARNED_UNDOABLE: AtomicBool = AtomicBool::new(false);
pub(super) fn warn_once(flag: &AtomicBool, args: std::fmt::Arguments<'_>) {
    if !flag.swap(true, Ordering::Relaxed) {
        log::warn(args);
    }
}

impl Tenant {
    pub(super) fn sample(&self, device: &Device) -> Sample {
        let charged = || match (&device.slot, self.ledger.get()) {
            (Ok(slot), Some(Ok(ledger))) => ledger.used_by_me(*slot),
            _ => 0,
        };
        let first = charged();
        let read = self.driver.memory_sample(&device.uuid);
        let last = charged();
        Sample {
            process: read.process,
            device: read.device,
            listed: read.listed,
            charged_low: first.min(last),
            charged: first.max(last),
        }
    }

    /// What the driver spent between two samples (negative: it gave memory back), less what this
    /// process charged for allocations meanwhile; `None` when nothing trustworthy was read.
    /// `reserved` is what the operation reserved before the driver was asked (in both samples'
    /// ledger readings, and no allocation).
    pub(super) fn spent(
        &self,
        device: &Device,
        before: &Sample,
        after: &Sample,
        reserved: u64,
    ) -> Option<Spent> {
        // The most this process's own allocations can have moved: an error here under-measures the
        // operation, never over-charges it; reconciliation then charges what is left.
        let ours = i128::from(after.charged) - i128::from(before.charged_low);
        let mut process = match (before.process, after.process) {
            (ProcessFigure::Listed(b), ProcessFigure::Listed(a)) => Some((b, a)),
            // Not listed before: it held nothing there yet.
            (ProcessFigure::NotListed, ProcessFigure::Listed(a)) => Some((0, a)),
            _ => None,
        };
        // In another PID namespace, before this process knows its driver PID: the processes that
        // appeared in NVML's list during the operation. Under the measurement lock a process that
        // gets its first context on the device appears there; when it is the only newcomer, it is
        // this process (found once for its life), and its figure is exact. Several newcomers (a
        // process outside gpuslice started meanwhile): this process is one of them, so it spent
        // no more than the largest one holds.
        let mut bound = None;
        if let (None, Some(b), Some(a)) = (process, &before.listed, &after.listed) {
            let new: Vec<(u32, u64)> = a
                .iter()
                .filter(|(pid, _)| !b.iter().any(|(p, _)| p == pid))
                .copied()
                .collect();
            match new.as_slice() {
                [(pid, used)] if *used != gpuslice_api::nvml::NVML_VALUE_NOT_AVAILABLE => {
                    self.driver.identify_driver_pid(*pid);
                    log::info(format_args!(
                        "the driver lists this process as PID {pid} on {} (another PID \
                         namespace): its per-process figures are used from now on",
                        device.uuid
                    ));
                    process = Some((0, *used));
                }
                [] => {}
                several => {
                    bound = several
                        .iter()
                        .map(|&(_, used)| used)
                        .filter(|&u| u != gpuslice_api::nvml::NVML_VALUE_NOT_AVAILABLE)
                        .max();
                }
            }
        }
        let allocated = after
            .charged
            .saturating_sub(reserved)
            .saturating_sub(self.overhead_on(device.slot.as_ref().ok().copied()));
        if let Some((b, a)) = process {
            if a >= allocated {
                return Some(Spent {
                    bytes: i128::from(a) - i128::from(b) - ours,
                    exact: true,
                    bound: None,
                });
            }
            warn_once(
                &WARNED_IMPOSSIBLE,
                format_args!(
                    "the driver says this process holds {a} bytes on {}, less than the {allocated} \
                     it allocated: its per-process figures are not believed (charging the estimate)",
                    device.uuid
                ),
            );
        }
        match (before.device, after.device) {
            (Some(b), Some(a)) if a >= allocated => Some(Spent {
                bytes: i128::from(a) - i128::from(b) - ours,
                exact: false,
                bound,
            }),
            _ => None,
        }
    }

    /// Driver overhead charged on a ledger device: contexts, primary contexts, modules, limits and
    /// what reconciliation found beyond them.
    pub(super) fn overhead_on(&self, slot: Option<usize>) -> u64 {
        let Some(slot) = slot else { return 0 };
        let r = self.records.lock();
        let on = |c: &Charge| if c.device == slot { c.bytes } else { 0 };
        let contexts: u64 = r.contexts.values().map(on).sum();
        let primary: u64 = r.primary.values().filter_map(|p| p.charge()).map(on).sum();
        let objects: u64 = r.overhead.values().map(|o| on(&o.charge)).sum();
        drop(r);
        let unattributed = self
            .overhead
            .lock()
            .unattributed
            .get(&slot)
            .copied()
            .unwrap_or(0);
        contexts + primary + objects + unattributed
    }

    /// Records the driver memory of a module, library or context limits (replacing the object's
    /// previous record, whose charge [`Tenant::charge_measured`] already moved to this one).
    pub fn record_overhead(&self, kind: Overhead, handle: usize, ctx: usize, charge: Charge) {
        self.records
            .lock()
            .overhead
            .insert((kind as u8, handle), OverheadRecord { charge, ctx });
    }

    /// Remembers what a module or library loaded lazily will load at its lookups.
    pub fn record_lazy_code(&self, kind: Overhead, handle: usize, code: gpuslice_api::image::Code) {
        self.records
            .lock()
            .lazy_code
            .insert((kind as u8, handle), LazyCode::new(code));
    }

    /// The context a lazily loaded object's code loads in: a library's, the current context's
    /// (0 when none); a module's, its own (0).
    pub(super) fn lazy_context(&self, kind: Overhead) -> usize {
        if kind != Overhead::Library {
            return 0;
        }
        self.driver().current_context().ok().flatten().unwrap_or(0)
    }

    /// Whether a module or library is loaded lazily and `kernel`'s code is not loaded yet in the
    /// current context.
    pub fn lazy_code_pending(&self, kind: Overhead, handle: usize, kernel: &[u8]) -> bool {
        let ctx = self.lazy_context(kind);
        let records = self.records.lock();
        records
            .lazy_code
            .get(&(kind as u8, handle))
            .is_some_and(|lazy| lazy.after_lookup(ctx, kernel).0 != lazy.bytes(ctx))
    }

    /// What looking up `kernel` in a lazily loaded module or library will make the driver load in
    /// the current context (the module's data on its first lookup there, the kernel's code), in the
    /// pages it adds: `None` when it loads nothing new, or nothing that needs another page (then it
    /// is marked loaded).
    pub fn lazy_code_expected(&self, kind: Overhead, handle: usize, kernel: &[u8]) -> Option<u64> {
        let ctx = self.lazy_context(kind);
        let mut records = self.records.lock();
        let lazy = records.lazy_code.get_mut(&(kind as u8, handle))?;
        let (bytes, _) = lazy.after_lookup(ctx, kernel);
        let before = lazy.bytes(ctx);
        let more = driver_pages(bytes).saturating_sub(driver_pages(before));
        if bytes == before {
            return None;
        }
        if more == 0 {
            lazy.mark_loaded(ctx, kernel, 0);
            return None;
        }
        Some(more)
    }

    /// A lookup of `kernel` in the current context loaded what [`Tenant::lazy_code_expected`]
    /// expected, charged `charge`: the object's charge grows by it.
    pub fn lazy_code_loaded(&self, kind: Overhead, handle: usize, kernel: &[u8], charge: Charge) {
        let ctx = self.lazy_context(kind);
        let mut records = self.records.lock();
        let same_device = records
            .overhead
            .get(&(kind as u8, handle))
            .map_or(true, |o| o.charge.device == charge.device);
        if let Some(lazy) = records.lazy_code.get_mut(&(kind as u8, handle)) {
            lazy.mark_loaded(ctx, kernel, if same_device { charge.bytes } else { 0 });
        }
        match records.overhead.get_mut(&(kind as u8, handle)) {
            Some(o) if o.charge.device == charge.device => {
                o.charge.bytes = o.charge.bytes.saturating_add(charge.bytes);
            }
            Some(_) => {
                drop(records);
                // A lookup on another device than the load's (a library's kernel in another
                // context): given back at once rather than recorded against the wrong device;
                // reconciliation charges what the driver holds there.
                self.release(charge);
            }
            None => {
                records
                    .overhead
                    .insert((kind as u8, handle), OverheadRecord { charge, ctx: 0 });
            }
        }
    }

    /// What an object is charged now (0: nothing).
    pub fn overhead_of(&self, kind: Overhead, handle: usize) -> u64 {
        self.records
            .lock()
            .overhead
            .get(&(kind as u8, handle))
            .map_or(0, |o| o.charge.bytes)
    }

    /// Returns everything a destroyed context owned (its modules and limits).
    pub(super) fn forget_owned_by(&self, ctx: usize) {
        let mut r = self.records.lock();
        let owned: Vec<(u8, usize)> = r
            .overhead
            .iter()
            .filter(|(k, o)| o.ctx == ctx || (k.0 == Overhead::Limits as u8 && k.1 == ctx))
            .map(|(k, _)| *k)
            .collect();
        for k in &owned {
            r.lazy_code.remove(k);
        }
        let mut charges: Vec<Charge> = owned
            .iter()
            .filter_map(|k| r.overhead.remove(k))
            .map(|o| o.charge)
            .collect();
        // The code libraries loaded in it goes with it.
        let records = &mut *r;
        for (key, lazy) in records.lazy_code.iter_mut() {
            let freed = lazy.forget_context(ctx);
            if let Some(o) = records.overhead.get_mut(key).filter(|_| freed > 0) {
                let bytes = freed.min(o.charge.bytes);
                o.charge.bytes -= bytes;
                charges.push(Charge {
                    device: o.charge.device,
                    bytes,
                });
            }
        }
        drop(r);
        for c in charges {
            self.release(c);
        }
    }
}
