//! Graph memory: allocations a CUDA graph makes when it is launched.
//!
//! A graph memory allocation node (`cuGraphAddMemAllocNode`, or a `cuMemAllocAsync` captured from a
//! stream) allocates nothing when it is created or instantiated: "memory is allocated when the graph
//! is launched" (CUDA Programming Guide, "Graph Memory Nodes"; `cuGraphLaunch` fails with
//! `CUDA_ERROR_OUT_OF_MEMORY` when it cannot be). So the capture passes through untouched, and the
//! charge is made at `cuGraphLaunch`:
//!
//! - At instantiation, the graph's memory nodes are read from the driver (`cuGraphGetNodes`,
//!   `cuGraphNodeGetType`, `cuGraphMemAllocNodeGetParams`, `cuGraphMemFreeNodeGetParams`) into the
//!   executable graph's [`Plan`], with those of its child graphs (`cuGraphChildGraphNodeGetGraph`):
//!   a graph moved into a child graph node (CUDA 12.9, `CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`) keeps
//!   its memory nodes, which allocate when the parent is launched.
//! - At launch, every allocation is reserved before the driver is called; over the quota the launch
//!   is refused with `CUDA_ERROR_OUT_OF_MEMORY` and the usual refusal line, and nothing runs.
//! - An allocation the graph does not free itself outlives the launch: its charge is kept under its
//!   address (fixed across launches) and returned by the `cuMemFreeAsync`/`cuMemFree` of that address,
//!   or by the launch of another graph that frees it. Relaunching a graph instantiated with
//!   `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH` frees and allocates it again: the charge stays.
//! - An allocation the graph frees itself lives only during the launch's execution: it must fit at
//!   the launch, and stays charged until the launch's work has completed (an event recorded on the
//!   stream after the launch, looked at whenever a reservation is refused, a graph is launched or the
//!   program synchronises), as does an allocation of another graph that this one frees. Two such
//!   graphs running at once hold both.
//! - Freed graph memory stays in the device's graph memory pool, cached for later graph allocations,
//!   until `cuDeviceGraphMemTrim` ("Free unused memory that was cached on the specified device for
//!   use with graphs back to the OS"). The pool's cache, what the driver reports reserved for graphs
//!   beyond what they use (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT` less `USED_MEM_CURRENT`), stays
//!   charged: it is read whenever finished launches are looked at, and after a trim. A launch takes
//!   its allocations from the cache's charge before reserving more, as the driver takes them from
//!   the cache. While a launch's work may still be running the charge only falls (the driver may
//!   have freed into the cache what is still charged to the launch).

pub use super::graph_plan::any;
use super::graph_plan::{read_plan, Alloc, Plan, ANY};
use super::{tenant, Charge, Reservation, Tenant};
use crate::driver::calls::{self as driver, real};
use crate::ledger::Ledger;
use gpuslice_api::types::{CUcontext, CUevent, CUstream};
use gpuslice_api::types::{CUdevice, CUgraph};
use gpuslice_api::{CUerror, CUresult};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

/// Executable graph -> its plan, for graphs with memory nodes only.
static PLANS: Mutex<BTreeMap<usize, Arc<Plan>>> = Mutex::new(BTreeMap::new());

/// Graph memory a launched graph frees itself (or frees for another graph), held until the launch's
/// work has completed: `event` was recorded on the launch's stream, in context `ctx`, right after it.
struct Running {
    event: usize,
    ctx: usize,
    charges: Vec<Charge>,
}

static RUNNING: Mutex<Vec<Running>> = Mutex::new(Vec::new());
/// `RUNNING` is not empty (one load where nothing is running).
static ANY_RUNNING: AtomicBool = AtomicBool::new(false);

/// `CU_EVENT_DISABLE_TIMING` (cuda.h).
const EVENT_DISABLE_TIMING: u32 = 2;

/// `CUgraphMem_attribute` (cuda.h).
const GRAPH_MEM_USED_CURRENT: i32 = 0;
const GRAPH_MEM_RESERVED_CURRENT: i32 = 2;

/// Device ordinal -> what its graph memory pool caches, charged (ledger slot, bytes). Every device
/// some graph of this process allocates on has an entry.
static CACHED: Mutex<BTreeMap<CUdevice, (usize, u64)>> = Mutex::new(BTreeMap::new());

/// Graph allocations a launch left live (not freed by their graph) -> their device ordinal: freed
/// outside a graph (`cuMemFree`, `cuMemFreeAsync`), their memory goes to the pool's cache.
static LIVE: Mutex<BTreeMap<u64, CUdevice>> = Mutex::new(BTreeMap::new());

/// After a successful instantiation of `graph` as `exec`: records what its launches allocate. A
/// handle the driver reuses gets its new graph's plan (or none). The instantiation flags change
/// nothing here: an auto-free relaunch frees and allocates again what the graph holds (its charge
/// stays), and without the flag the driver refuses to relaunch a graph whose allocations are live.
pub fn instantiated(exec: usize, graph: CUgraph) {
    if tenant().is_none() {
        return;
    }
    let plan = read_plan(graph);
    let mut plans = PLANS.lock();
    match plan {
        Some(p) => {
            if let Some(t) = tenant() {
                let mut cached = CACHED.lock();
                for a in &p.allocs {
                    if let Ok(Ok(slot)) = t.device(a.ordinal).map(|d| d.slot.clone()) {
                        cached.entry(a.ordinal).or_insert((slot, 0));
                    }
                }
            }
            plans.insert(exec, Arc::new(p));
            ANY.store(true, Relaxed);
        }
        None => {
            plans.remove(&exec);
        }
    }
}

/// Launches an executable graph (`launch`, the driver's `cuGraphLaunch`): its allocations are
/// reserved first; over the quota the launch is refused and nothing runs.
pub fn launch(
    exec: usize,
    stream: CUstream,
    per_thread: bool,
    launch: impl FnOnce() -> CUresult,
) -> CUresult {
    let (Some(t), Some(plan)) = (tenant(), PLANS.lock().get(&exec).cloned()) else {
        return launch();
    };
    if driver::capturing(stream, per_thread) {
        // Launched into a capture: recorded as a node of the graph being captured, it allocates
        // and frees nothing now (the shim never refuses inside a capture).
        return launch();
    }
    t.launch_graph(&plan, stream, per_thread, launch)
}

/// An event recorded on `stream` now, in the current context: (event, context). `None` when the
/// stream is capturing (the launch went into the capture, not to the GPU) or the driver refused.
fn mark(stream: CUstream, per_thread: bool) -> Option<(usize, usize)> {
    if driver::capturing(stream, per_thread) {
        return None;
    }
    // Not an unsafe call for another thread's global-mode capture.
    let _relaxed = driver::RelaxedCapture::when_needed();
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: a valid out-parameter.
    unsafe { real::cuCtxGetCurrent(&mut ctx) }.ok()?;
    let mut event: CUevent = std::ptr::null_mut();
    // SAFETY: a valid out-parameter.
    unsafe { real::cuEventCreate(&mut event, EVENT_DISABLE_TIMING) }.ok()?;
    // SAFETY: our event, the program's stream (not capturing, checked above).
    let recorded = unsafe {
        if per_thread {
            real::cuEventRecord_ptsz(event, stream)
        } else {
            real::cuEventRecord(event, stream)
        }
    };
    if recorded.is_err() {
        // SAFETY: our event, never recorded.
        let _ = unsafe { real::cuEventDestroy_v2(event) };
        return None;
    }
    Some((event as usize, ctx as usize))
}

impl Tenant {
    fn launch_graph(
        &self,
        plan: &Plan,
        stream: CUstream,
        per_thread: bool,
        launch: impl FnOnce() -> CUresult,
    ) -> CUresult {
        self.release_finished_graph_memory();
        // Graphs with memory nodes only: a reservation per allocation (their memory is allocated
        // by this very call).
        let mut held: Vec<(Reservation<'_>, &Alloc, u64)> = Vec::with_capacity(plan.allocs.len());
        for a in &plan.allocs {
            if !a.freed_in_graph && self.allocations.lock().get(a.ptr).is_some() {
                // Still held from an earlier launch (auto-free relaunch: freed and allocated again).
                continue;
            }
            let Ok(device) = self.device(a.ordinal) else {
                continue;
            };
            // The driver takes it from the pool's cache first: so does the charge.
            let cached = take_cached(a.ordinal, a.bytes);
            let reservation = match self.reserve(
                device,
                a.bytes - cached,
                "cuGraphLaunch (graph memory node)",
            ) {
                Ok(r) => r,
                Err(e) => {
                    put_cached(a.ordinal, cached);
                    held.iter().for_each(|(_, a, c)| put_cached(a.ordinal, *c));
                    return Err(e);
                }
            };
            held.push((reservation, a, cached));
        }
        if let Err(e) = launch() {
            held.iter().for_each(|(_, a, c)| put_cached(a.ordinal, *c));
            return Err(e);
        }
        // Freed by the graph's own free nodes, or by them for another graph: held until the
        // launch's work has run.
        let mut freed = Vec::new();
        for (reservation, a, cached) in held {
            let mut charge = reservation.commit();
            charge.bytes += cached;
            if a.freed_in_graph {
                freed.push(charge);
            } else {
                self.allocations.lock().insert(a.ptr, charge);
                LIVE.lock().insert(a.ptr, a.ordinal);
            }
        }
        for &ptr in &plan.frees_elsewhere {
            LIVE.lock().remove(&ptr);
            let charge = self.allocations.lock().remove(ptr);
            match charge {
                Some(charge) => freed.push(charge),
                // A stream-ordered block whose `cuMemFreeAsync` was captured into this graph: back
                // to its pool now (which stays charged what it holds).
                None => {
                    if let Some((pool, bytes)) = self.take_pool_block(ptr) {
                        self.pool_block_freed(pool, ptr, bytes, None);
                    }
                }
            }
        }
        if freed.is_empty() {
            return Ok(());
        }
        match mark(stream, per_thread) {
            Some((event, ctx)) => {
                RUNNING.lock().push(Running {
                    event,
                    ctx,
                    charges: freed,
                });
                ANY_RUNNING.store(true, Relaxed);
            }
            None => freed.into_iter().for_each(|c| self.release(c)),
        }
        Ok(())
    }

    /// Returns the graph memory of launches whose work has completed, and charges what the graph
    /// memory pools cache now. True if any charge went down.
    pub fn release_finished_graph_memory(&self) -> bool {
        let released = self.release_finished_launches();
        if !ANY.load(Relaxed) {
            return released;
        }
        let devices: Vec<CUdevice> = CACHED.lock().keys().copied().collect();
        let mut fell = false;
        for ordinal in devices {
            fell |= self.charge_graph_pool_cache(ordinal);
        }
        released || fell
    }

    /// The allocation at `ptr`, charged `charge`, was freed outside a graph: a graph allocation's
    /// memory stays in its device's graph memory pool, cached until a trim (`cuDeviceGraphMemTrim`:
    /// "Free unused memory that was cached on the specified device for use with graphs"), so its
    /// charge moves to the pool's cache rather than going back (true); any other allocation's does
    /// not (false).
    pub(super) fn graph_allocation_freed(&self, ptr: u64, charge: Charge) -> bool {
        let Some(ordinal) = LIVE.lock().remove(&ptr) else {
            return false;
        };
        match CACHED.lock().get_mut(&ordinal) {
            Some((slot, charged)) if *slot == charge.device => {
                *charged = charged.saturating_add(charge.bytes);
                true
            }
            _ => false,
        }
    }

    /// After `cuDeviceGraphMemTrim` of `ordinal`: the pool's cache went back to the device.
    pub fn graph_pool_trimmed(&self, ordinal: CUdevice) {
        self.release_finished_launches();
        if ANY.load(Relaxed) {
            self.charge_graph_pool_cache(ordinal);
        }
    }

    /// Sets the charge for `ordinal`'s graph memory pool cache to what the driver reports it holds
    /// beyond what graphs use; only down while some launch's work may still be running (see the
    /// module docs). True if the charge went down.
    fn charge_graph_pool_cache(&self, ordinal: CUdevice) -> bool {
        let Some(Ok(ledger)) = self.ledger.get() else {
            return false;
        };
        let (Some(reserved), Some(used)) = (
            graph_mem_attribute(ordinal, GRAPH_MEM_RESERVED_CURRENT),
            graph_mem_attribute(ordinal, GRAPH_MEM_USED_CURRENT),
        ) else {
            return false;
        };
        let mut wanted = reserved.saturating_sub(used);
        let mut cached = CACHED.lock();
        let Some((slot, charged)) = cached.get_mut(&ordinal) else {
            return false;
        };
        if ANY_RUNNING.load(Relaxed) {
            wanted = wanted.min(*charged);
        }
        adjust(ledger, *slot, charged, wanted)
    }

    /// Returns the graph memory of launches whose work has completed. True if any was returned.
    fn release_finished_launches(&self) -> bool {
        if !ANY_RUNNING.load(Relaxed) {
            return false;
        }
        let done: Vec<Running> = {
            let _relaxed = driver::RelaxedCapture::when_needed();
            let mut running = RUNNING.lock();
            let mut done = Vec::new();
            let mut i = 0;
            while i < running.len() {
                // SAFETY: our event, alive until destroyed below.
                match unsafe { real::cuEventQuery(running[i].event as CUevent) } {
                    Err(CUerror::NOT_READY) => i += 1,
                    // Complete, or an error (its work cannot be waited for): returned.
                    _ => done.push(running.swap_remove(i)),
                }
            }
            ANY_RUNNING.store(!running.is_empty(), Relaxed);
            done
        };
        let released = !done.is_empty();
        for r in done {
            // SAFETY: our event, completed.
            let _ = unsafe { real::cuEventDestroy_v2(r.event as CUevent) };
            r.charges.into_iter().for_each(|c| self.release(c));
        }
        released
    }

    /// Context `ctx` was destroyed, with its work and events: its launches' graph memory goes back.
    pub(super) fn graph_memory_context_gone(&self, ctx: usize) {
        if !ANY_RUNNING.load(Relaxed) {
            return;
        }
        let gone: Vec<Running> = {
            let mut running = RUNNING.lock();
            let (gone, kept) = std::mem::take(&mut *running)
                .into_iter()
                .partition(|r| r.ctx == ctx);
            *running = kept;
            ANY_RUNNING.store(!running.is_empty(), Relaxed);
            gone
        };
        for r in gone {
            r.charges.into_iter().for_each(|c| self.release(c));
        }
    }
}

/// Moves the charge of a pool's cache to `wanted` bytes (a rise the quota has no room for is left
/// out: the driver holds the memory anyway, and reconciliation sees it). True if it fell.
fn adjust(ledger: &Ledger, slot: usize, charged: &mut u64, wanted: u64) -> bool {
    if wanted > *charged {
        if ledger.try_reserve(slot, wanted - *charged).is_ok() {
            *charged = wanted;
        }
        false
    } else if wanted < *charged {
        ledger.release(slot, *charged - wanted);
        *charged = wanted;
        true
    } else {
        false
    }
}

/// Up to `bytes` of `ordinal`'s cached pool charge, taken for a launch's allocation.
fn take_cached(ordinal: CUdevice, bytes: u64) -> u64 {
    let mut cached = CACHED.lock();
    let Some((_, charged)) = cached.get_mut(&ordinal) else {
        return 0;
    };
    let taken = (*charged).min(bytes);
    *charged -= taken;
    taken
}

/// Gives back what [`take_cached`] took (the launch did not happen).
fn put_cached(ordinal: CUdevice, bytes: u64) {
    if let Some((_, charged)) = CACHED.lock().get_mut(&ordinal) {
        *charged += bytes;
    }
}

/// A graph memory attribute of a device (`cuDeviceGetGraphMemAttribute`), `None` if the driver
/// does not answer.
fn graph_mem_attribute(ordinal: CUdevice, attr: i32) -> Option<u64> {
    let mut value = 0u64;
    // SAFETY: a `cuuint64_t` out-parameter, as every graph memory attribute is.
    unsafe { real::cuDeviceGetGraphMemAttribute(ordinal, attr, (&raw mut value).cast()) }.ok()?;
    Some(value)
}
