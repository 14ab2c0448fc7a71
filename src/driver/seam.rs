//! The driver as accounting sees it: one narrow trait, [`Driver`], through which every accounting
//! decision asks the driver what it needs (the current context and its device, a stream's device,
//! memory pools' figures and trimming, stream and event synchronisation, the memory figures a
//! measurement reads). [`REAL`] calls the real driver (`crate::driver::real`); a fake
//! (`driver::fake`, unit tests only) answers from settable figures and records the calls made, so
//! that accounting's decisions are tested without a GPU or simgpu.
//!
//! Handles cross the seam as addresses (`usize`): accounting keys its records by them and never
//! dereferences one. Only [`RealDriver`] turns them back into driver handles.

use super::calls;
use super::measure::{self, ProcessFigure};
use gpuslice_api::types::{CUcontext, CUdevice, CUevent, CUmemoryPool, CUstream};
use gpuslice_api::CUerror;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// What the driver says about device memory in use around an operation (see `driver::measure`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemorySample {
    /// This process's line in NVML's process list.
    pub process: ProcessFigure,
    /// The device's used memory (NVML, else `cuMemGetInfo` in the current context).
    pub device: Option<u64>,
    /// NVML's whole process list (driver PID, used memory), read only while this process does not
    /// know the PID the driver lists it under (a child PID namespace).
    pub listed: Option<Vec<(u32, u64)>>,
}

/// The driver calls accounting decides through. Every method is a query or an action the driver
/// answers; none decides anything.
pub trait Driver: Sync {
    /// The calling thread's current context (`None`: there is none, or the driver failed).
    fn current_context(&self) -> Result<Option<usize>, CUerror>;
    /// The device ordinal of `ctx` (asked of the driver every time: see [`Driver::context_device`]
    /// for the cached answer).
    fn device_of_context(&self, ctx: usize) -> Result<CUdevice, CUerror>;
    /// A device attribute (`CUdevice_attribute`), `None` when the driver cannot say.
    fn device_attribute(&self, ordinal: CUdevice, attribute: i32) -> Option<i32>;
    /// A limit of the current context (`CUlimit`), `None` when the driver does not know it.
    fn context_limit(&self, limit: i32) -> Option<usize>;
    /// Whether the driver loads modules lazily (`CU_MODULE_LAZY_LOADING`).
    fn lazy_module_loading(&self) -> bool;
    /// How many devices the process sees (fixed once the driver is initialised).
    fn device_count(&self) -> Option<i32>;
    /// A device's UUID in NVML's spelling (`GPU-…`, `MIG-…`).
    fn device_uuid(&self, ordinal: CUdevice) -> Result<String, CUerror>;
    /// The context and device ordinal work on `stream` runs in.
    fn stream_device(&self, stream: usize) -> Option<(usize, u32)>;
    /// Whether `stream` is being captured into a graph.
    fn capturing(&self, stream: usize, per_thread: bool) -> bool;
    /// Waits for everything enqueued on `stream` (`per_thread`: through a `_ptsz` entry point).
    fn stream_synchronize(&self, stream: usize, per_thread: bool) -> Result<(), CUerror>;
    /// The device's current memory pool (the one `cuMemAllocAsync` uses).
    fn current_pool(&self, ordinal: CUdevice) -> Option<usize>;
    /// The device whose default or current pool `pool` is.
    fn pool_owner(&self, pool: usize) -> Option<CUdevice>;
    /// What a pool holds (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    fn pool_reserved(&self, pool: usize) -> Option<u64>;
    /// What a pool has handed out (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`).
    fn pool_used(&self, pool: usize) -> Option<u64>;
    /// Releases what a pool holds beyond `keep` bytes (never memory a block holds).
    fn pool_trim(&self, pool: usize, keep: u64);
    /// Whether the driver may still hold the allocation at `ptr`.
    fn pointer_known(&self, ptr: u64) -> bool;
    /// Whether a device's primary context exists now (`None`: the driver did not say).
    fn primary_context_active(&self, ordinal: CUdevice) -> Option<bool>;
    /// While the guard lives, the calling thread's stream-capture mode is relaxed (our own
    /// synchronisations never invalidate another thread's capture).
    fn relaxed_capture(&self) -> Option<calls::RelaxedCapture>;
    /// Creates an event without timing, recorded on `stream`; destroyed when dropped.
    fn event_on(&self, stream: usize, per_thread: bool) -> Option<Event<'_>>;
    /// Whether the work before an event has run (`Err`: the event is invalid).
    fn event_done(&self, event: usize) -> Result<bool, CUerror>;
    /// Destroys an event (called by [`Event`]'s drop).
    fn event_destroy(&self, event: usize);
    /// What the driver says about memory in use on device `uuid`.
    fn memory_sample(&self, uuid: &str) -> MemorySample;
    /// The device's used memory alone (NVML, else `cuMemGetInfo`): a sample without the process
    /// list, where this process's own figure is known.
    fn device_used(&self, uuid: &str) -> Option<u64>;
    /// The device's total memory (NVML; `None` without it).
    fn device_total(&self, uuid: &str) -> Option<u64>;
    /// Whether this process's driver PID is not known yet (another PID namespace).
    fn driver_pid_unknown(&self) -> bool;
    /// Records the PID the driver lists this process under.
    fn identify_driver_pid(&self, pid: u32);
    /// The UUID of NVML device handle `handle` (`nvmlDeviceGetUUID`).
    fn nvml_device_uuid(&self, handle: usize) -> Option<String>;
    /// The GPU and compute instance ids of NVML device handle `handle`, which the process lists of
    /// a MIG device carry; `u32::MAX` each (NVML's "no instance") for a GPU's handle.
    fn nvml_instance_ids(&self, handle: usize) -> (u32, u32);

    /// The device of `ctx`, cached per thread until a context of the process is destroyed (a
    /// driver gives a destroyed context's handle to a later context, perhaps on another device).
    /// Allocations repeat on one context: the answer is a thread-local compare after the first.
    #[inline]
    fn context_device(&self, ctx: usize) -> Result<CUdevice, CUerror> {
        // Read after the context: a context made current after another's destruction was created
        // after it, so a handle given again is never taken for the context it once named.
        let destroyed = CONTEXTS_DESTROYED.load(Ordering::Acquire);
        let (last_ctx, last_ordinal, seen) = LAST_CONTEXT.with(Cell::get);
        if last_ctx == ctx && seen == destroyed {
            return Ok(last_ordinal);
        }
        let ordinal = self.device_of_context(ctx)?;
        LAST_CONTEXT.with(|c| c.set((ctx, ordinal, destroyed)));
        Ok(ordinal)
    }

    /// The device of the calling thread's current context.
    #[inline]
    fn current_device(&self) -> Result<CUdevice, CUerror> {
        match self.current_context()? {
            Some(ctx) => self.context_device(ctx),
            None => Err(CUerror::INVALID_CONTEXT),
        }
    }
}

thread_local! {
    /// The last (context, device ordinal) this thread resolved, and [`CONTEXTS_DESTROYED`] then.
    static LAST_CONTEXT: Cell<(usize, CUdevice, u64)> = const { Cell::new((0, -1, 0)) };
}

/// Contexts of this process destroyed so far (created ones destroyed, primary ones reset or
/// released for the last time): what a thread cached for a handle holds only while this has not
/// moved.
static CONTEXTS_DESTROYED: AtomicU64 = AtomicU64::new(0);

/// A context of this process was destroyed: every thread's cached context → device answer is
/// asked again.
pub fn context_destroyed() {
    CONTEXTS_DESTROYED.fetch_add(1, Ordering::AcqRel);
}

/// Streams the scheduler found named a context other than the one cached for them: every thread's
/// cached stream → context answers are asked again ([`stream_context_stale`]).
static STREAMS_STALE: AtomicU64 = AtomicU64::new(0);

/// How many stream → context answers each thread keeps.
const STREAM_CACHE: usize = 4;

thread_local! {
    /// The last streams this thread launched on, with their context and the stamp
    /// ([`stream_stamp`]) they were resolved under; `(0, 0, 0)`: empty.
    static LAST_STREAMS: Cell<[(usize, usize, u64); STREAM_CACHE]> =
        const { Cell::new([(0, 0, 0); STREAM_CACHE]) };
    /// Where the next answer goes (round robin).
    static NEXT_STREAM: Cell<usize> = const { Cell::new(0) };
}

/// What a cached stream → context answer holds under: no context destroyed, no stream found stale
/// since (both counters only grow, so their sum moves whenever either does).
fn stream_stamp() -> u64 {
    CONTEXTS_DESTROYED
        .load(Ordering::Acquire)
        .wrapping_add(STREAMS_STALE.load(Ordering::Acquire))
        .wrapping_add(1)
}

/// A stream's context turned out to be another than the one cached (an operation of ours on it
/// failed: the stream was destroyed and its handle given to a stream of another context): every
/// thread asks again.
pub fn stream_context_stale() {
    STREAMS_STALE.fetch_add(1, Ordering::AcqRel);
}

/// The context and device ordinal work on `stream` runs in, for the launch path: a stream the
/// program created is resolved once per thread (`cuStreamGetCtx`, then [`Driver::context_device`],
/// whose per-thread cache it shares) and kept until a context of the process is destroyed or
/// [`stream_context_stale`] says a handle was given to another stream; the default streams
/// (`NULL`, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`) are the current context's, one
/// `cuCtxGetCurrent`. On a launch of a stream seen before, no driver call at all.
///
/// Handles cross as addresses, as everywhere in the seam.
pub fn launch_stream_device(stream: usize) -> Option<(usize, u32)> {
    let default_stream = matches!(stream, 0..=2);
    let stamp = stream_stamp();
    let cached = if default_stream {
        None
    } else {
        LAST_STREAMS.with(|c| {
            c.get()
                .iter()
                .find(|&&(s, _, at)| s == stream && at == stamp)
                .map(|&(_, ctx, _)| ctx)
        })
    };
    let ctx = match cached {
        Some(ctx) => ctx,
        None => {
            let resolved = if default_stream {
                None
            } else {
                let mut ctx: CUcontext = std::ptr::null_mut();
                // SAFETY: valid out-parameter; the program's stream handle, as its launch got it.
                match unsafe { calls::real::cuStreamGetCtx(stream as CUstream, &mut ctx) } {
                    Ok(()) if !ctx.is_null() => Some(ctx as usize),
                    _ => None,
                }
            };
            match resolved {
                Some(ctx) => {
                    LAST_STREAMS.with(|c| {
                        let mut all = c.get();
                        let i = NEXT_STREAM.with(|n| {
                            let i = n.get() % STREAM_CACHE;
                            n.set(i + 1);
                            i
                        });
                        all[i] = (stream, ctx, stamp);
                        c.set(all);
                    });
                    ctx
                }
                None => REAL.current_context().ok().flatten()?,
            }
        }
    };
    let ordinal = REAL.context_device(ctx).ok()?;
    Some((ctx, u32::try_from(ordinal).ok()?))
}

/// An event the driver made for us, destroyed when dropped.
pub struct Event<'d> {
    driver: &'d dyn Driver,
    handle: usize,
}

impl<'d> Event<'d> {
    /// Owns `handle`, an event `driver` created.
    pub fn own(driver: &'d dyn Driver, handle: usize) -> Event<'d> {
        Event { driver, handle }
    }

    pub fn handle(&self) -> usize {
        self.handle
    }

    /// Whether the work before the event has run.
    pub fn done(&self) -> Result<bool, CUerror> {
        self.driver.event_done(self.handle)
    }

    /// Hands the event's handle to the caller, who destroys it (through [`Driver::event_destroy`]).
    pub fn into_handle(self) -> usize {
        let handle = self.handle;
        std::mem::forget(self);
        handle
    }
}

impl Drop for Event<'_> {
    fn drop(&mut self) {
        self.driver.event_destroy(self.handle);
    }
}

/// The real driver.
pub struct RealDriver;

/// The one real driver.
pub static REAL: RealDriver = RealDriver;

/// `CU_EVENT_DISABLE_TIMING` (cuda.h).
const EVENT_DISABLE_TIMING: u32 = 2;

impl Driver for RealDriver {
    #[inline]
    fn current_context(&self) -> Result<Option<usize>, CUerror> {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out-parameter.
        unsafe { calls::real::cuCtxGetCurrent(&mut ctx) }?;
        Ok((!ctx.is_null()).then_some(ctx as usize))
    }

    fn device_of_context(&self, ctx: usize) -> Result<CUdevice, CUerror> {
        let query = || {
            let mut ordinal: CUdevice = -1;
            // SAFETY: `ordinal` is a valid out-parameter.
            unsafe { calls::real::cuCtxGetDevice(&mut ordinal) }.map(|()| ordinal)
        };
        if self.current_context()? == Some(ctx) {
            return query();
        }
        calls::in_context(ctx as CUcontext, query)
    }

    fn device_attribute(&self, ordinal: CUdevice, attribute: i32) -> Option<i32> {
        let mut v = 0;
        // SAFETY: `v` is a valid out-parameter.
        unsafe { calls::real::cuDeviceGetAttribute(&mut v, attribute, ordinal) }.ok()?;
        Some(v)
    }

    fn context_limit(&self, limit: i32) -> Option<usize> {
        let mut value: usize = 0;
        // SAFETY: `value` is a valid out-parameter.
        unsafe { calls::real::cuCtxGetLimit(&mut value, limit) }.ok()?;
        Some(value)
    }

    fn lazy_module_loading(&self) -> bool {
        calls::lazy_module_loading()
    }

    fn device_count(&self) -> Option<i32> {
        let mut count = 0;
        // SAFETY: `count` is a valid out-parameter.
        unsafe { calls::real::cuDeviceGetCount(&mut count) }.ok()?;
        Some(count)
    }

    fn device_uuid(&self, ordinal: CUdevice) -> Result<String, CUerror> {
        calls::device_uuid(ordinal)
    }

    fn stream_device(&self, stream: usize) -> Option<(usize, u32)> {
        calls::stream_device(stream as CUstream).map(|(ctx, ordinal)| (ctx as usize, ordinal))
    }

    fn capturing(&self, stream: usize, per_thread: bool) -> bool {
        calls::capturing(stream as CUstream, per_thread)
    }

    fn stream_synchronize(&self, stream: usize, per_thread: bool) -> Result<(), CUerror> {
        let stream = stream as CUstream;
        // SAFETY: a stream handle the program gave; a destroyed one answers an error.
        unsafe {
            if per_thread {
                calls::real::cuStreamSynchronize_ptsz(stream)
            } else {
                calls::real::cuStreamSynchronize(stream)
            }
        }
    }

    fn current_pool(&self, ordinal: CUdevice) -> Option<usize> {
        calls::current_pool(ordinal)
    }

    fn pool_owner(&self, pool: usize) -> Option<CUdevice> {
        calls::pool_owner(pool)
    }

    fn pool_reserved(&self, pool: usize) -> Option<u64> {
        calls::pool_reserved(pool)
    }

    fn pool_used(&self, pool: usize) -> Option<u64> {
        calls::pool_used(pool)
    }

    fn pool_trim(&self, pool: usize, keep: u64) {
        let keep = usize::try_from(keep).unwrap_or(usize::MAX);
        // SAFETY: a pool handle the program gave; the driver validates it.
        let _ = unsafe { calls::real::cuMemPoolTrimTo(pool as CUmemoryPool, keep) };
    }

    fn pointer_known(&self, ptr: u64) -> bool {
        calls::pointer_known(ptr)
    }

    fn primary_context_active(&self, ordinal: CUdevice) -> Option<bool> {
        calls::primary_context_active(ordinal)
    }

    fn relaxed_capture(&self) -> Option<calls::RelaxedCapture> {
        Some(calls::RelaxedCapture::enter())
    }

    fn event_on(&self, stream: usize, per_thread: bool) -> Option<Event<'_>> {
        let mut event: CUevent = std::ptr::null_mut();
        // SAFETY: `event` is a valid out-parameter.
        unsafe { calls::real::cuEventCreate(&mut event, EVENT_DISABLE_TIMING) }.ok()?;
        let event = Event::own(self, event as usize);
        let stream = stream as CUstream;
        // SAFETY: an event just created; the caller's stream handle.
        let recorded = unsafe {
            if per_thread {
                calls::real::cuEventRecord_ptsz(event.handle() as CUevent, stream)
            } else {
                calls::real::cuEventRecord(event.handle() as CUevent, stream)
            }
        };
        recorded.ok().map(|()| event)
    }

    fn event_done(&self, event: usize) -> Result<bool, CUerror> {
        // SAFETY: an event this library created and has not destroyed.
        match unsafe { calls::real::cuEventQuery(event as CUevent) } {
            Ok(()) => Ok(true),
            Err(e) if e == CUerror::NOT_READY => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn event_destroy(&self, event: usize) {
        // SAFETY: an event this library created, destroyed once (by its owner).
        let _ = unsafe { calls::real::cuEventDestroy_v2(event as CUevent) };
    }

    fn memory_sample(&self, uuid: &str) -> MemorySample {
        let process = measure::process_used(uuid);
        let listed = if measure::driver_pid_unknown() {
            measure::processes(uuid)
        } else {
            None
        };
        // The device's figure is only read when this process's own is not there: an own figure is
        // what a measurement and reconciliation use (one NVML query per sample, not two).
        let device = match process {
            ProcessFigure::Listed(_) => None,
            _ => measure::device_used(uuid),
        };
        MemorySample {
            process,
            device,
            listed,
        }
    }

    fn device_used(&self, uuid: &str) -> Option<u64> {
        measure::device_used(uuid)
    }

    fn device_total(&self, uuid: &str) -> Option<u64> {
        measure::device_total(uuid)
    }

    fn driver_pid_unknown(&self) -> bool {
        measure::driver_pid_unknown()
    }

    fn identify_driver_pid(&self, pid: u32) {
        measure::identify_driver_pid(pid)
    }

    fn nvml_device_uuid(&self, handle: usize) -> Option<String> {
        calls::nvml_device_uuid(handle)
    }

    fn nvml_instance_ids(&self, handle: usize) -> (u32, u32) {
        calls::nvml_instance_ids(handle)
    }
}
