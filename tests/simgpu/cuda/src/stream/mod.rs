//! Streams: each stream is an in-order queue executed by its own worker thread.
//!
//! Ordering between streams is expressed as dependencies `(stream, seq)`: "before running this op,
//! wait until `stream` has completed its first `seq` ops". Legacy default-stream semantics are such
//! dependencies, computed when an op is submitted under the context's ordering lock: an op on the
//! legacy stream depends on all work already submitted to the context's blocking streams, an op on a
//! blocking stream depends on all work already submitted to the legacy stream. Every dependency points
//! to an op submitted earlier, so waits can never form a cycle.

use crate::context::{self, Context};
use crate::graph::{Capture, NodeKind};
use gpuslice_api::launch_types::{
    CUhostFn, CUstreamCallback, CU_STREAM_DEFAULT, CU_STREAM_NON_BLOCKING,
};
use gpuslice_api::types::{CUcontext, CUgreenCtx, CUstream};
use gpuslice_api::{CUerror, CUresult};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::{c_int, c_uint, c_ulonglong, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::ThreadId;

mod api;
pub use api::*;

thread_local! {
    /// On a stream worker, while it runs an op: whether a kernel of the stream is queued behind it.
    static MORE_QUEUED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// On a stream worker, while it runs an op: the op's time on the device timeline (see
    /// [`device_time`]).
    static DEVICE_TIME: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The device timeline: on a GPU, an op of a stream is processed by the device when the stream's
/// previous work has ended on the device (and the work it waits for on other streams), or when it
/// was submitted if later — not when some host thread gets round to it. simgpu's stream workers are
/// host threads, late on a loaded machine; each op therefore carries its time on the device
/// timeline: events are stamped with it (`cuEventRecord` measures device time, as on a GPU),
/// kernels enter the device's queue at it (simgpu-core starts them then if the device was idle or
/// held for them), and the op's end on the timeline is what the next op waits for. On a worker, while
/// it runs an op: realtime ns (the shared state's clock) at which the op is processed; 0 elsewhere.
pub(crate) fn device_time() -> u64 {
    DEVICE_TIME.with(|t| t.get())
}

/// The op running on this worker has done device work that ended at `end_ns` (a kernel): what
/// follows it on the stream is processed from then on.
pub(crate) fn advance_device_time(end_ns: u64) {
    DEVICE_TIME.with(|t| t.set(t.get().max(end_ns)));
}

/// The op running on this worker ran host code (a host function, a callback): the stream was
/// blocked until it returned, now.
pub(crate) fn host_work_done() {
    advance_device_time(simgpu_core::realtime_ns());
}

/// Whether the op running on this (stream worker) thread has a kernel queued behind it on its
/// stream: on a GPU that kernel would already be in the device's queue.
pub(crate) fn more_queued() -> bool {
    MORE_QUEUED.with(|m| m.get())
}

/// Overrides [`more_queued`] for the rest of the current op (a graph's nodes before its last).
pub(crate) fn set_more_queued(more: bool) {
    MORE_QUEUED.with(|m| m.set(more));
}

/// Ops a stream may hold before `enqueue` blocks, like the real driver's launch queue.
const MAX_PENDING: u64 = 1024;
/// Ops whose end on the device timeline a stream remembers (for dependencies on them); an older op
/// ended before anything that waits for it now was submitted.
const TIMELINE_OPS: usize = 1024;
/// The priority range reported for streams (`cuCtxGetStreamPriorityRange`): lower is higher priority.
pub const PRIORITY_LEAST: i32 = 0;
pub const PRIORITY_GREATEST: i32 = -5;

/// Locks a mutex, ignoring poisoning: ops run under `catch_unwind`, state stays consistent.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamKind {
    /// The context's legacy default stream (NULL / `CU_STREAM_LEGACY`).
    Legacy,
    /// A thread's per-thread default stream: an ordinary blocking stream.
    PerThread,
    /// A stream from `cuStreamCreate`.
    Created,
}

/// A unit of stream work.
pub type Op = Box<dyn FnOnce() + Send>;

/// "Wait until `stream` has completed `seq` ops."
#[derive(Clone)]
pub(crate) struct Dep {
    pub stream: Arc<Stream>,
    pub seq: u64,
}

struct Job {
    deps: Vec<Dep>,
    /// Realtime ns at which it was submitted.
    submitted_ns: u64,
    op: Op,
    /// The op runs kernels (a launch, a graph with kernel nodes).
    kernel: bool,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    /// Ops submitted so far; an op's sequence number is the value after its submission.
    enqueued: u64,
    /// Ops finished so far.
    completed: u64,
    /// Where ops ended on the device timeline: op `seq` at `[seq % TIMELINE_OPS]` (empty until the
    /// first op).
    ended_ns: Vec<u64>,
    worker: bool,
    /// The worker waits for an op (a submission wakes it).
    worker_waiting: bool,
    /// Destroyed: the worker drains the queue and exits.
    closed: bool,
}

pub struct Stream {
    id: u64,
    kind: StreamKind,
    flags: u32,
    priority: i32,
    ctx: Weak<Context>,
    device: u32,
    state: Mutex<State>,
    cond: Condvar,
    /// The capture sequence this stream takes part in, if any.
    capture: Mutex<Option<Arc<Capture>>>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Streams from cuStreamCreate, by handle (the address of the `Stream`).
static STREAMS: Mutex<BTreeMap<usize, Arc<Stream>>> = Mutex::new(BTreeMap::new());

impl Stream {
    fn new(kind: StreamKind, flags: u32, priority: i32, ctx: &Arc<Context>) -> Arc<Stream> {
        Arc::new(Stream {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            kind,
            flags,
            priority,
            ctx: Arc::downgrade(ctx),
            device: ctx.device,
            state: Mutex::new(State::default()),
            cond: Condvar::new(),
            capture: Mutex::new(None),
        })
    }

    // Accessors for the other modules of the driver (not all of them use every one yet).
    #[allow(dead_code)]
    pub fn id(&self) -> u64 {
        self.id
    }
    pub fn kind(&self) -> StreamKind {
        self.kind
    }
    #[allow(dead_code)]
    pub fn flags(&self) -> u32 {
        self.flags
    }
    #[allow(dead_code)]
    pub fn priority(&self) -> i32 {
        self.priority
    }
    /// The device the stream's context runs on.
    pub fn device(&self) -> u32 {
        self.device
    }
    /// The stream's context (`CUDA_ERROR_CONTEXT_IS_DESTROYED` once it is gone).
    pub fn context(&self) -> Result<Arc<Context>, CUerror> {
        self.ctx.upgrade().ok_or(CUerror::CONTEXT_IS_DESTROYED)
    }
    fn blocking(&self) -> bool {
        self.kind != StreamKind::Created || self.flags & CU_STREAM_NON_BLOCKING == 0
    }

    /// The capture sequence the stream is part of.
    pub(crate) fn capture(&self) -> Option<Arc<Capture>> {
        lock(&self.capture).clone()
    }
    pub(crate) fn set_capture(&self, c: Option<Arc<Capture>>) {
        *lock(&self.capture) = c;
    }

    /// A dependency on everything submitted to this stream so far, `None` if all of it is done.
    pub(crate) fn tail(self: &Arc<Self>) -> Option<Dep> {
        let s = lock(&self.state);
        (s.completed < s.enqueued).then(|| Dep {
            stream: self.clone(),
            seq: s.enqueued,
        })
    }
    /// Whether the stream's first `seq` ops are done.
    pub(crate) fn reached(&self, seq: u64) -> bool {
        lock(&self.state).completed >= seq
    }
    /// Blocks until the stream's first `seq` ops are done; returns when the last of them ended on
    /// the device timeline (0 if long ago, or `seq` is 0).
    pub(crate) fn wait_for(&self, seq: u64) -> u64 {
        let mut s = lock(&self.state);
        while s.completed < seq {
            s = self.cond.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        if seq == 0 || s.completed - seq >= TIMELINE_OPS as u64 {
            return 0;
        }
        s.ended_ns
            .get(seq as usize % TIMELINE_OPS)
            .copied()
            .unwrap_or(0)
    }
    fn wait_for_room(&self) {
        let mut s = lock(&self.state);
        while s.enqueued - s.completed >= MAX_PENDING && !s.closed {
            s = self.cond.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }
    /// Where the stream's last finished op ended on the device timeline.
    fn previous_end(&self) -> u64 {
        let s = lock(&self.state);
        s.ended_ns
            .get(s.completed as usize % TIMELINE_OPS)
            .copied()
            .unwrap_or(0)
    }
    fn close(&self) {
        lock(&self.state).closed = true;
        self.cond.notify_all();
    }

    /// Appends a job; returns its sequence number.
    fn push(self: &Arc<Self>, job: Job) -> Result<u64, CUerror> {
        let mut s = lock(&self.state);
        if s.closed {
            return Err(CUerror::INVALID_HANDLE);
        }
        if !s.worker {
            let me = self.clone();
            std::thread::Builder::new()
                .name(format!("simgpu-stream{}", self.id))
                .spawn(move || me.work())
                .map_err(|_| CUerror::OUT_OF_MEMORY)?;
            s.worker = true;
        }
        if s.worker_waiting {
            crate::launch_stats::worker_woken();
        }
        s.queue.push_back(job);
        s.enqueued += 1;
        let seq = s.enqueued;
        drop(s);
        self.cond.notify_all();
        Ok(seq)
    }

    /// The worker: runs jobs in order until the stream is destroyed and drained.
    fn work(self: Arc<Self>) {
        // Kernels time their duration with short sleeps: the default 50 us timer slack would
        // stretch every one of them.
        // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
        loop {
            let job = {
                let mut s = lock(&self.state);
                loop {
                    if let Some(j) = s.queue.pop_front() {
                        set_more_queued(s.queue.iter().any(|j| j.kernel));
                        break j;
                    }
                    if s.closed {
                        s.worker = false;
                        return;
                    }
                    s.worker_waiting = true;
                    s = self.cond.wait(s).unwrap_or_else(|e| e.into_inner());
                    s.worker_waiting = false;
                }
            };
            let mut ready = job.submitted_ns.max(self.previous_end());
            for d in &job.deps {
                ready = ready.max(d.stream.wait_for(d.seq));
            }
            DEVICE_TIME.with(|t| t.set(ready));
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job.op)).is_err() {
                simgpu_core::trace(format_args!("stream {}: an op panicked", self.id));
            }
            let ended = DEVICE_TIME.with(|t| t.replace(0));
            {
                let mut s = lock(&self.state);
                s.completed += 1;
                if s.ended_ns.is_empty() {
                    s.ended_ns = vec![0; TIMELINE_OPS];
                }
                let i = s.completed as usize % TIMELINE_OPS;
                s.ended_ns[i] = ended;
            }
            self.cond.notify_all();
        }
    }
}

/// Per-context stream state: the legacy default stream, per-thread default streams, and every stream
/// of the context (for legacy-stream ordering and cuCtxSynchronize).
#[derive(Default)]
pub struct ContextStreams {
    inner: Mutex<CtxInner>,
}

#[derive(Default)]
struct CtxInner {
    legacy: Option<Arc<Stream>>,
    per_thread: HashMap<ThreadId, Arc<Stream>>,
    all: Vec<Weak<Stream>>,
}

impl CtxInner {
    fn live(&mut self) -> Vec<Arc<Stream>> {
        self.all.retain(|w| w.strong_count() > 0);
        self.all.iter().filter_map(Weak::upgrade).collect()
    }
}

impl ContextStreams {
    /// The context's legacy default stream.
    pub fn legacy(&self, ctx: &Arc<Context>) -> Arc<Stream> {
        let mut g = lock(&self.inner);
        if let Some(s) = &g.legacy {
            return s.clone();
        }
        let s = Stream::new(StreamKind::Legacy, CU_STREAM_DEFAULT, 0, ctx);
        g.all.push(Arc::downgrade(&s));
        g.legacy = Some(s.clone());
        s
    }
    /// The calling thread's per-thread default stream in this context.
    pub fn per_thread(&self, ctx: &Arc<Context>) -> Arc<Stream> {
        let mut g = lock(&self.inner);
        let tid = std::thread::current().id();
        if let Some(s) = g.per_thread.get(&tid) {
            return s.clone();
        }
        let s = Stream::new(StreamKind::PerThread, CU_STREAM_DEFAULT, 0, ctx);
        g.all.push(Arc::downgrade(&s));
        g.per_thread.insert(tid, s.clone());
        s
    }
    /// Every live stream of the context.
    pub fn all(&self) -> Vec<Arc<Stream>> {
        lock(&self.inner).live()
    }
    fn register(&self, s: &Arc<Stream>) {
        lock(&self.inner).all.push(Arc::downgrade(s));
    }
}

impl Drop for ContextStreams {
    /// The context is gone: its streams finish their queued work and their workers exit.
    fn drop(&mut self) {
        let streams = self
            .inner
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .live();
        let mut reg = lock(&STREAMS);
        for s in streams {
            if s.kind == StreamKind::Created {
                reg.remove(&(Arc::as_ptr(&s) as usize));
            }
            s.close();
        }
    }
}

/// The context is destroyed (`cuCtxDestroy`, `cuDevicePrimaryCtxReset`, the last
/// `cuDevicePrimaryCtxRelease`): its streams go with it. NVIDIA documents the reset as destroying
/// "all allocations and reset[ting] all state on the primary context" (Driver API, Primary Context
/// Management), and cuCtxDestroy as destroying "all resources associated with the context": their
/// handles are invalid afterwards (`CUDA_ERROR_INVALID_HANDLE`, "a resource handle passed to the API
/// call was not valid"). The default streams of a primary context that is retained again are new.
/// Called after the context's work was waited for; a capture still going on is invalidated.
pub(crate) fn invalidate_context(ctx: &Context) {
    let streams = {
        let mut g = lock(&ctx.streams.inner);
        let streams = g.live();
        g.legacy = None;
        g.per_thread.clear();
        g.all.clear();
        streams
    };
    let mut reg = lock(&STREAMS);
    for s in streams {
        if s.kind == StreamKind::Created {
            reg.remove(&(Arc::as_ptr(&s) as usize));
        }
        if let Some(c) = s.capture() {
            c.invalidate();
            s.set_capture(None);
        }
        s.close();
    }
}

/// The stream a client handle names. NULL is the current context's legacy default stream, or its
/// per-thread default stream when `per_thread` (the call came through a `_ptsz`/`_ptds` export).
pub fn resolve(h: CUstream, per_thread: bool) -> Result<Arc<Stream>, CUerror> {
    let special = |per_thread: bool| -> Result<Arc<Stream>, CUerror> {
        let ctx = context::current()?;
        Ok(if per_thread {
            ctx.streams.per_thread(&ctx)
        } else {
            ctx.streams.legacy(&ctx)
        })
    };
    match h as usize {
        0 => special(per_thread),
        1 => special(false),
        2 => special(true),
        addr => lock(&STREAMS)
            .get(&addr)
            .cloned()
            .ok_or(CUerror::INVALID_HANDLE),
    }
}

/// The implicit dependencies of an op submitted now on `stream` (legacy default stream semantics).
/// Called under the context's ordering lock.
fn implicit_deps(stream: &Arc<Stream>, inner: &mut CtxInner) -> Vec<Dep> {
    match stream.kind {
        StreamKind::Legacy => inner
            .live()
            .iter()
            .filter(|s| s.kind != StreamKind::Legacy && s.blocking())
            .filter_map(Stream::tail)
            .collect(),
        _ if stream.blocking() => inner
            .legacy
            .as_ref()
            .and_then(Stream::tail)
            .into_iter()
            .collect(),
        _ => Vec::new(),
    }
}

/// Submits `op` to run on `stream` after `deps` and after the stream's prior (and implicit) work;
/// returns its sequence number. Ignores capture: callers that capture check [`Stream::capture`] first.
pub(crate) fn submit(stream: &Arc<Stream>, deps: Vec<Dep>, op: Op) -> Result<u64, CUerror> {
    submit_job(stream, deps, op, false)
}

/// [`submit`] for an op that runs kernels: the kernel before it on the stream is "followed" (see
/// [`more_queued`]).
pub(crate) fn submit_kernel(stream: &Arc<Stream>, op: Op) -> Result<u64, CUerror> {
    submit_job(stream, Vec::new(), op, true)
}

fn submit_job(
    stream: &Arc<Stream>,
    mut deps: Vec<Dep>,
    op: Op,
    kernel: bool,
) -> Result<u64, CUerror> {
    stream.wait_for_room();
    let ctx = stream.context()?;
    let mut inner = lock(&ctx.streams.inner);
    if stream.kind == StreamKind::Legacy {
        refuse_implicit_capture_dependency(&mut inner)?;
    }
    deps.extend(implicit_deps(stream, &mut inner));
    deps.retain(|d| !Arc::ptr_eq(&d.stream, stream));
    stream.push(Job {
        deps,
        submitted_ns: simgpu_core::realtime_ns(),
        op,
        kernel,
    })
}

/// Runs `op` on the stream in order after prior work (legacy default stream semantics included).
/// On a capturing stream the op is recorded into the capture's graph instead, as a node that runs
/// the first time the graph is launched (an `FnOnce` cannot be replayed: use [`enqueue_repeatable`]
/// for work that must run on every graph launch). Blocks while 1024 ops are pending on the stream.
#[allow(dead_code)] // the interface for copy.rs' stream-ordered operations
pub fn enqueue(stream: &Arc<Stream>, op: Op) -> CUresult {
    if let Some(c) = stream.capture() {
        return c.add(NodeKind::Once(Mutex::new(Some(op))));
    }
    submit(stream, Vec::new(), op).map(drop)
}

/// Like [`enqueue`], but a capturing stream records `op` as a node that runs on every graph launch.
pub fn enqueue_repeatable(stream: &Arc<Stream>, op: Arc<dyn Fn() + Send + Sync>) -> CUresult {
    if let Some(c) = stream.capture() {
        return c.add(NodeKind::Repeat(op));
    }
    submit(stream, Vec::new(), Box::new(move || op())).map(drop)
}

/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` (and the capture invalidated) if the stream is capturing:
/// what a synchronous call on a capturing stream gets from the real driver.
pub fn check_not_capturing(stream: &Arc<Stream>) -> CUresult {
    match stream.capture() {
        Some(c) => {
            c.invalidate();
            Err(CUerror::STREAM_CAPTURE_UNSUPPORTED)
        }
        None => Ok(()),
    }
}

/// What waiting for `stream` means: its own work, plus for the legacy stream every blocking stream's.
fn sync_targets(stream: &Arc<Stream>) -> Result<Vec<Dep>, CUerror> {
    let mut deps: Vec<Dep> = stream.tail().into_iter().collect();
    if stream.kind == StreamKind::Legacy {
        let ctx = stream.context()?;
        let mut inner = lock(&ctx.streams.inner);
        refuse_implicit_capture_dependency(&mut inner)?;
        deps.extend(implicit_deps(stream, &mut inner));
    }
    Ok(deps)
}

/// Legacy-stream work (or a wait for it) would depend on a capturing blocking stream: the real
/// driver refuses with `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` and invalidates the capture.
fn refuse_implicit_capture_dependency(inner: &mut CtxInner) -> CUresult {
    for s in inner.live() {
        if s.blocking() && s.kind != StreamKind::Legacy {
            if let Some(c) = s.capture() {
                c.invalidate();
                return Err(CUerror::STREAM_CAPTURE_IMPLICIT);
            }
        }
    }
    Ok(())
}

/// Blocks until all work submitted to `stream` so far is done.
pub fn synchronize(stream: &Arc<Stream>) -> CUresult {
    check_not_capturing(stream)?;
    for d in sync_targets(stream)? {
        d.stream.wait_for(d.seq);
    }
    crate::memory::on_synchronize(&*stream.context()?);
    Ok(())
}

/// `CUDA_ERROR_NOT_READY` while work submitted to `stream` is pending.
pub fn query(stream: &Arc<Stream>) -> CUresult {
    check_not_capturing(stream)?;
    if sync_targets(stream)?
        .iter()
        .all(|d| d.stream.reached(d.seq))
    {
        Ok(())
    } else {
        Err(CUerror::NOT_READY)
    }
}

/// Blocks until all work submitted to any stream of `ctx` so far is done (cuCtxSynchronize).
pub fn synchronize_context(ctx: &Context) -> CUresult {
    let streams = ctx.streams.all();
    if streams.iter().any(|s| s.capture().is_some()) {
        for s in &streams {
            if let Some(c) = s.capture() {
                c.invalidate();
            }
        }
        return Err(CUerror::STREAM_CAPTURE_UNSUPPORTED);
    }
    let tails: Vec<Dep> = streams.iter().filter_map(Stream::tail).collect();
    for d in tails {
        d.stream.wait_for(d.seq);
    }
    crate::memory::on_synchronize(ctx);
    Ok(())
}

fn create(flags: u32, priority: i32) -> Result<CUstream, CUerror> {
    if flags & !CU_STREAM_NON_BLOCKING != 0 {
        return Err(CUerror::INVALID_VALUE);
    }
    create_in(&context::current()?, flags, priority)
}

/// A stream created in `ctx` (the current context, or a green context's).
pub(crate) fn create_in(
    ctx: &Arc<Context>,
    flags: u32,
    priority: i32,
) -> Result<CUstream, CUerror> {
    let ctx = ctx.clone();
    // Like the real driver, out-of-range priorities are clamped to the range.
    let priority = priority.clamp(PRIORITY_GREATEST, PRIORITY_LEAST);
    let s = Stream::new(StreamKind::Created, flags, priority, &ctx);
    ctx.streams.register(&s);
    let h = Arc::as_ptr(&s) as usize;
    lock(&STREAMS).insert(h, s);
    Ok(h as CUstream)
}

fn destroy(h: CUstream) -> CUresult {
    if (h as usize) < 3 {
        return Err(CUerror::INVALID_HANDLE);
    }
    let s = lock(&STREAMS)
        .remove(&(h as usize))
        .ok_or(CUerror::INVALID_HANDLE)?;
    if let Some(c) = s.capture() {
        c.invalidate();
        s.set_capture(None);
    }
    // Pending work still completes: the worker drains the queue, then exits.
    s.close();
    Ok(())
}

/// A client pointer carried to the worker thread that calls the client's function with it.
struct UserData(*mut c_void);
// SAFETY: the pointer is only handed back to the client's own callback, as the real driver does
// from its callback thread; the client is responsible for its thread-safety.
unsafe impl Send for UserData {}
// SAFETY: as above; the pointer is never dereferenced here.
unsafe impl Sync for UserData {}

/// A host function call (`cuLaunchHostFunc`), replayable by graphs.
pub(crate) fn host_fn_op(
    f: unsafe extern "C" fn(*mut c_void),
    user_data: *mut c_void,
) -> Arc<dyn Fn() + Send + Sync> {
    let data = UserData(user_data);
    Arc::new(move || {
        let d = &data;
        // SAFETY: the client registered `f` to be called with `user_data` on the stream, as here.
        unsafe { f(d.0) };
        host_work_done();
    })
}

fn launch_host_func(
    h: CUstream,
    per_thread: bool,
    f: CUhostFn,
    user_data: *mut c_void,
) -> CUresult {
    let f = f.ok_or(CUerror::INVALID_VALUE)?;
    let s = resolve(h, per_thread)?;
    enqueue_repeatable(&s, host_fn_op(f, user_data))
}

fn add_callback(
    h: CUstream,
    per_thread: bool,
    cb: CUstreamCallback,
    user_data: *mut c_void,
    flags: u32,
) -> CUresult {
    let cb = cb.ok_or(CUerror::INVALID_VALUE)?;
    if flags != 0 {
        return Err(CUerror::INVALID_VALUE);
    }
    let s = resolve(h, per_thread)?;
    let data = UserData(user_data);
    let handle = UserData(h);
    enqueue_repeatable(
        &s,
        Arc::new(move || {
            let (d, h) = (&data, &handle);
            // SAFETY: the client registered `cb` to be called with its stream, a status and `user_data`.
            unsafe { cb(h.0, 0, d.0) };
            host_work_done();
        }),
    )
}

fn wait_event(
    h: CUstream,
    per_thread: bool,
    ev: gpuslice_api::types::CUevent,
    flags: u32,
) -> CUresult {
    if flags & !gpuslice_api::launch_types::CU_EVENT_WAIT_EXTERNAL != 0 {
        return Err(CUerror::INVALID_VALUE);
    }
    let s = resolve(h, per_thread)?;
    let e = crate::event::lookup(ev)?;
    crate::event::stream_wait(&s, &e)
}

/// cuStreamSynchronize: the stream's own capture first (a conflict whatever the mode), then the
/// capture-mode rule for potentially unsafe calls (see `graph::check_unsafe_call`).
fn sync_export(h: CUstream, per_thread: bool) -> CUresult {
    let s = resolve(h, per_thread)?;
    check_not_capturing(&s)?;
    crate::graph::check_unsafe_call()?;
    synchronize(&s)
}

/// cuStreamQuery: as [`sync_export`].
fn query_export(h: CUstream, per_thread: bool) -> CUresult {
    let s = resolve(h, per_thread)?;
    check_not_capturing(&s)?;
    crate::graph::check_unsafe_call()?;
    query(&s)
}
