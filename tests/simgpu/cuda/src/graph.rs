//! Graphs: built node by node or captured from streams, instantiated, launched.
//!
//! simgpu's device runs one kernel at a time, so a graph is kept as its nodes in a topological order
//! (the order they were added: a node's dependencies must exist before it); launching an instantiated
//! graph enqueues one stream op that executes the nodes in that order.

use crate::graph_memory::{self, GraphAlloc, MemAllocNodeParams};
use crate::launch::{self, Kernel, Params, Shape};
use crate::stream::{self, lock, Op, Stream};
use gpuslice_api::launch_types::*;
use gpuslice_api::types::{
    CUcontext, CUdeviceptr, CUfunction, CUgraph, CUgraphExec, CUgraphNode, CUstream,
};
use gpuslice_api::{CUerror, CUresult};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_uint, c_ulonglong, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::ThreadId;

/// What a node does when the graph runs.
pub(crate) enum NodeKind {
    Kernel(Kernel),
    /// Stream work that can run only once (an `FnOnce` captured from `stream::enqueue`).
    #[allow(dead_code)] // built by stream::enqueue, which copy.rs uses
    Once(Mutex<Option<Op>>),
    /// Stream work that runs on every launch (host functions, replayable copies).
    Repeat(Arc<dyn Fn() + Send + Sync>),
    Empty,
    /// An allocation node: its memory is reserved when the graph is launched (graph_memory.rs).
    MemAlloc(Arc<GraphAlloc>),
    /// A free node: the allocation's memory goes back when execution reaches it.
    MemFree(Arc<GraphAlloc>),
    /// A child graph node: the embedded graph, owned by the node (child_graph.rs).
    Child(Arc<Graph>),
}

pub(crate) struct Node {
    pub(crate) kind: NodeKind,
}

impl Node {
    fn run(&self) {
        match &self.kind {
            NodeKind::Kernel(k) => k.execute(),
            NodeKind::Once(op) => {
                if let Some(op) = lock(op).take() {
                    op();
                }
            }
            NodeKind::Repeat(f) => f(),
            NodeKind::Empty | NodeKind::MemAlloc(_) => {}
            NodeKind::MemFree(a) => graph_memory::release(a),
            // Flattened into its parent's nodes at instantiation (child_graph::flatten).
            NodeKind::Child(g) => lock(&g.nodes).iter().for_each(|n| n.run()),
        }
    }
}

#[derive(Default)]
pub struct Graph {
    pub(crate) nodes: Mutex<Vec<Arc<Node>>>,
    /// Owned by a parent's child graph node (moved into it, or the node's clone): it cannot be
    /// instantiated or destroyed on its own, nor given memory nodes (child_graph.rs).
    pub(crate) owned: AtomicBool,
}

impl Graph {
    pub(crate) fn add(&self, kind: NodeKind) -> CUgraphNode {
        let n = Arc::new(Node { kind });
        let h = Arc::as_ptr(&n) as CUgraphNode;
        lock(&self.nodes).push(n);
        h
    }
    fn contains(&self, h: CUgraphNode) -> bool {
        lock(&self.nodes)
            .iter()
            .any(|n| Arc::as_ptr(n) as CUgraphNode == h)
    }
}

pub struct GraphExec {
    nodes: Vec<Arc<Node>>,
    /// The graph's allocation nodes' allocations, given memory at each launch.
    allocs: Vec<Arc<GraphAlloc>>,
    /// `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`.
    auto_free: bool,
    /// The graph it was made from, when that has memory nodes: "there can be at most one executable
    /// graph in existence for that graph at a time" (`cuGraphInstantiate`). A `Weak` keeps the
    /// graph's address from being reused while this exists.
    memory_source: Option<std::sync::Weak<Graph>>,
}

static GRAPHS: Mutex<BTreeMap<usize, Arc<Graph>>> = Mutex::new(BTreeMap::new());
static EXECS: Mutex<BTreeMap<usize, Arc<GraphExec>>> = Mutex::new(BTreeMap::new());

pub(crate) fn graph(h: CUgraph) -> Result<Arc<Graph>, CUerror> {
    lock(&GRAPHS)
        .get(&(h as usize))
        .cloned()
        .ok_or(CUerror::INVALID_HANDLE)
}
fn exec(h: CUgraphExec) -> Result<Arc<GraphExec>, CUerror> {
    lock(&EXECS)
        .get(&(h as usize))
        .cloned()
        .ok_or(CUerror::INVALID_HANDLE)
}
pub(crate) fn register_graph(g: Arc<Graph>) -> CUgraph {
    let h = Arc::as_ptr(&g) as usize;
    lock(&GRAPHS).insert(h, g);
    h as CUgraph
}

// ---- stream capture ----

static NEXT_CAPTURE: AtomicU64 = AtomicU64::new(1);

/// A capture sequence: started on one stream, joined by streams that wait on its events.
pub struct Capture {
    id: u64,
    graph: Arc<Graph>,
    origin: Weak<Stream>,
    mode: u32,
    thread: ThreadId,
    invalid: AtomicBool,
    ended: AtomicBool,
    members: Mutex<Vec<Weak<Stream>>>,
}

impl Capture {
    /// Records stream work as a node of the captured graph.
    pub(crate) fn add(&self, kind: NodeKind) -> CUresult {
        if self.invalid.load(Ordering::Acquire) {
            return Err(CUerror::STREAM_CAPTURE_INVALIDATED);
        }
        self.graph.add(kind);
        Ok(())
    }
    /// An operation not allowed during capture happened: the capture will fail at its end.
    pub(crate) fn invalidate(&self) {
        self.invalid.store(true, Ordering::Release);
    }
    pub(crate) fn active(&self) -> bool {
        !self.ended.load(Ordering::Acquire)
    }
    /// `s` joins the capture (it waited on an event recorded in it).
    pub(crate) fn join(self: &Arc<Self>, s: &Arc<Stream>) {
        s.set_capture(Some(self.clone()));
        lock(&self.members).push(Arc::downgrade(s));
    }
    fn status(&self) -> CUstreamCaptureStatus {
        if self.invalid.load(Ordering::Acquire) {
            CU_STREAM_CAPTURE_STATUS_INVALIDATED
        } else {
            CU_STREAM_CAPTURE_STATUS_ACTIVE
        }
    }
}

thread_local! {
    /// This thread's capture interaction mode (cuThreadExchangeStreamCaptureMode).
    static THREAD_MODE: Cell<u32> = const { Cell::new(CU_STREAM_CAPTURE_MODE_GLOBAL) };
}

/// Capture sequences of the process begun and not ended (a hint for the fast path: 0 means none).
static CAPTURES_GOING_ON: AtomicUsize = AtomicUsize::new(0);
/// Every capture sequence of the process, to find those that make a call unsafe.
static CAPTURES: Mutex<Vec<Weak<Capture>>> = Mutex::new(Vec::new());

impl Drop for Capture {
    fn drop(&mut self) {
        // Abandoned without cuStreamEndCapture (its stream was destroyed).
        if !self.ended.swap(true, Ordering::AcqRel) {
            CAPTURES_GOING_ON.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The capture-mode rule for a "potentially unsafe API call" (cuThreadExchangeStreamCaptureMode,
/// CUDA Driver API, Stream Management), made by the calling thread with its current mode:
/// - `CU_STREAM_CAPTURE_MODE_GLOBAL` (the default): "If the local thread has an ongoing capture
///   sequence that was not initiated with CU_STREAM_CAPTURE_MODE_RELAXED at cuStreamBeginCapture,
///   or if any other thread has a concurrent capture sequence initiated with
///   CU_STREAM_CAPTURE_MODE_GLOBAL, this thread is prohibited from potentially unsafe API calls."
/// - `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`: only the thread's own (non-relaxed) capture counts;
///   "concurrent capture sequences in other threads are ignored".
/// - `CU_STREAM_CAPTURE_MODE_RELAXED`: "the local thread is not prohibited from potentially unsafe
///   API calls".
///
/// A prohibited call fails with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates the captures
/// that prohibit it ("When an invalid operation is attempted during stream capture, any associated
/// capture graphs are invalidated", CUDA Programming Guide, CUDA Graphs, Invalidation); their
/// cuStreamEndCapture then answers `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`. This is what breaks a
/// PyTorch graph capture when the NCCL watchdog thread calls cudaEventQuery meanwhile (PyTorch pull
/// requests 104555 and 148594, which move the watchdog to thread-local mode).
///
/// simgpu treats as potentially unsafe: cuEventQuery, cuEventSynchronize, cuStreamQuery,
/// cuStreamSynchronize, cuCtxSynchronize (they wait for or observe work that may be captured), and
/// cuMemAlloc / cuMemFree (not stream-ordered: the example the documentation gives is cudaMalloc).
pub(crate) fn check_unsafe_call() -> CUresult {
    if CAPTURES_GOING_ON.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    let mode = THREAD_MODE.with(|m| m.get());
    if mode == CU_STREAM_CAPTURE_MODE_RELAXED {
        return Ok(());
    }
    let me = std::thread::current().id();
    let mut all = lock(&CAPTURES);
    all.retain(|w| w.upgrade().is_some_and(|c| c.active()));
    let offending: Vec<Arc<Capture>> = all
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|c| {
            (c.thread == me && c.mode != CU_STREAM_CAPTURE_MODE_RELAXED)
                || (mode == CU_STREAM_CAPTURE_MODE_GLOBAL
                    && c.thread != me
                    && c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL)
        })
        .collect();
    drop(all);
    if offending.is_empty() {
        return Ok(());
    }
    for c in &offending {
        simgpu_core::trace(format_args!(
            "capture {} invalidated by a potentially unsafe call from another thread or its own",
            c.id
        ));
        c.invalidate();
    }
    Err(CUerror::STREAM_CAPTURE_UNSUPPORTED)
}

fn begin_capture(hs: CUstream, per_thread: bool, mode: u32) -> CUresult {
    if mode > CU_STREAM_CAPTURE_MODE_RELAXED {
        return Err(CUerror::INVALID_VALUE);
    }
    let s = stream::resolve(hs, per_thread)?;
    if s.kind() == stream::StreamKind::Legacy {
        return Err(CUerror::STREAM_CAPTURE_UNSUPPORTED);
    }
    if s.capture().is_some() {
        return Err(CUerror::ILLEGAL_STATE);
    }
    let g = Arc::new(Graph::default());
    register_graph(g.clone());
    let c = Arc::new(Capture {
        id: NEXT_CAPTURE.fetch_add(1, Ordering::Relaxed),
        graph: g,
        origin: Arc::downgrade(&s),
        mode,
        thread: std::thread::current().id(),
        invalid: AtomicBool::new(false),
        ended: AtomicBool::new(false),
        members: Mutex::new(Vec::new()),
    });
    c.join(&s);
    CAPTURES_GOING_ON.fetch_add(1, Ordering::AcqRel);
    lock(&CAPTURES).push(Arc::downgrade(&c));
    Ok(())
}

fn end_capture(hs: CUstream, per_thread: bool, pg: Option<&mut CUgraph>) -> CUresult {
    let pg = crate::out(pg)?;
    let s = stream::resolve(hs, per_thread)?;
    let c = s.capture().ok_or(CUerror::ILLEGAL_STATE)?;
    let origin = c.origin.upgrade();
    if !origin.is_some_and(|o| Arc::ptr_eq(&o, &s)) {
        c.invalidate();
        return Err(CUerror::STREAM_CAPTURE_UNMATCHED);
    }
    if c.mode != CU_STREAM_CAPTURE_MODE_RELAXED && c.thread != std::thread::current().id() {
        return Err(CUerror::STREAM_CAPTURE_WRONG_THREAD);
    }
    if !c.ended.swap(true, Ordering::AcqRel) {
        CAPTURES_GOING_ON.fetch_sub(1, Ordering::AcqRel);
    }
    for m in lock(&c.members).iter().filter_map(Weak::upgrade) {
        m.set_capture(None);
    }
    let h = Arc::as_ptr(&c.graph) as usize;
    if c.invalid.load(Ordering::Acquire) {
        lock(&GRAPHS).remove(&h);
        *pg = std::ptr::null_mut();
        return Err(CUerror::STREAM_CAPTURE_INVALIDATED);
    }
    *pg = h as CUgraph;
    Ok(())
}

fn capture_status(
    hs: CUstream,
    per_thread: bool,
) -> Result<(CUstreamCaptureStatus, Option<Arc<Capture>>), CUerror> {
    let s = stream::resolve(hs, per_thread)?;
    Ok(match s.capture() {
        Some(c) => (c.status(), Some(c)),
        None => (CU_STREAM_CAPTURE_STATUS_NONE, None),
    })
}

/// Where cuStreamGetCaptureInfo (any version) writes its answers: the C caller's out-parameters,
/// each NULL when that version has no such parameter or the caller does not ask for it.
struct CaptureInfoOut {
    status: *mut CUstreamCaptureStatus,
    id: *mut c_ulonglong,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const c_void,
    num_deps: *mut usize,
}

impl CaptureInfoOut {
    /// The first version's two answers (status and id), nothing else.
    fn status_and_id(status: *mut CUstreamCaptureStatus, id: *mut c_ulonglong) -> Self {
        let null = std::ptr::null_mut();
        CaptureInfoOut {
            status,
            id,
            graph: null,
            deps: null.cast(),
            edges: null.cast(),
            num_deps: null.cast(),
        }
    }
}

/// cuStreamGetCaptureInfo (all versions): status, id and graph; simgpu reports no dependency set
/// (its graphs are ordered lists).
///
/// # Safety
/// Each pointer of `out` is NULL or valid for a write of its type.
unsafe fn capture_info(hs: CUstream, per_thread: bool, out: CaptureInfoOut) -> CUresult {
    if out.status.is_null() {
        return Err(CUerror::INVALID_VALUE);
    }
    let (st, c) = capture_status(hs, per_thread)?;
    // SAFETY: each pointer is NULL or writable per the contract; only non-NULL ones are written.
    unsafe {
        *out.status = st;
        if let Some(c) = c {
            if !out.id.is_null() {
                *out.id = c.id;
            }
            if !out.graph.is_null() {
                *out.graph = Arc::as_ptr(&c.graph) as CUgraph;
            }
            if !out.deps.is_null() {
                *out.deps = std::ptr::null();
            }
            if !out.edges.is_null() {
                *out.edges = std::ptr::null();
            }
            if !out.num_deps.is_null() {
                *out.num_deps = 0;
            }
        }
    }
    Ok(())
}

// ---- building and launching ----

/// Checks a node's dependency list: every entry a node of `g`.
///
/// # Safety
/// `deps` is NULL or points to `n` node handles.
pub(crate) unsafe fn check_deps(g: &Graph, deps: *const CUgraphNode, n: usize) -> CUresult {
    if n == 0 {
        return Ok(());
    }
    if deps.is_null() {
        return Err(CUerror::INVALID_VALUE);
    }
    // SAFETY: `n` handles per the contract.
    let deps = unsafe { std::slice::from_raw_parts(deps, n) };
    if deps.iter().all(|d| g.contains(*d)) {
        Ok(())
    } else {
        Err(CUerror::INVALID_VALUE)
    }
}

/// A kernel node: the launch is validated and its parameters read now, as cuGraphAddKernelNode does.
///
/// # Safety
/// `kernel_params`/`extra` follow cuLaunchKernel's contract.
unsafe fn kernel_node(
    f: CUfunction,
    shape: Shape,
    params: Params,
    ctx: CUcontext,
) -> Result<NodeKind, CUerror> {
    let ctx = if ctx.is_null() {
        crate::context::current()?
    } else {
        crate::context::from_handle(ctx)?
    };
    // SAFETY: forwarded contract.
    Ok(NodeKind::Kernel(unsafe {
        launch::prepare(f, shape, params, ctx.device, ctx.tag, ctx.id)
    }?))
}

fn instantiate(hg: CUgraph, flags: u64) -> Result<CUgraphExec, CUerror> {
    let g = graph(hg)?;
    if g.owned.load(Ordering::Acquire) {
        // A moved child graph "cannot be independently instantiated" (cuda.h,
        // CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE).
        return Err(CUerror::INVALID_VALUE);
    }
    // Child graphs' nodes run where their node stands: one ordered list.
    let nodes = crate::child_graph::flatten(&g)?;
    let memory_nodes = nodes
        .iter()
        .any(|n| matches!(n.kind, NodeKind::MemAlloc(_) | NodeKind::MemFree(_)));
    let memory_source = memory_nodes.then(|| Arc::downgrade(&g));
    let allocs = nodes
        .iter()
        .filter_map(|n| match &n.kind {
            NodeKind::MemAlloc(a) => Some(a.clone()),
            _ => None,
        })
        .collect();
    let e = Arc::new(GraphExec {
        nodes,
        allocs,
        auto_free: flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH != 0,
        memory_source,
    });
    let mut execs = lock(&EXECS);
    if let Some(source) = &e.memory_source {
        let taken = execs.values().any(|other| {
            other
                .memory_source
                .as_ref()
                .is_some_and(|w| w.ptr_eq(source))
        });
        if taken {
            return Err(CUerror::INVALID_VALUE);
        }
    }
    let h = Arc::as_ptr(&e) as usize;
    execs.insert(h, e);
    Ok(h as CUgraphExec)
}

fn graph_launch(he: CUgraphExec, hs: CUstream, per_thread: bool) -> CUresult {
    let e = exec(he)?;
    let s = stream::resolve(hs, per_thread)?;
    if let Some(c) = s.capture() {
        if !e.allocs.is_empty() {
            // "The graph cannot be used in a child node" (cuGraphAddMemAllocNode's restrictions).
            return Err(CUerror::NOT_SUPPORTED);
        }
        // Launching a graph into a capture embeds its nodes.
        for n in &e.nodes {
            if c.invalid.load(Ordering::Acquire) {
                return Err(CUerror::STREAM_CAPTURE_INVALIDATED);
            }
            lock(&c.graph.nodes).push(n.clone());
        }
        return Ok(());
    }
    // Graph allocations get their memory now, or the launch fails as a whole.
    graph_memory::map_for_launch(&e.allocs, e.auto_free)?;
    let allocs = e.allocs.clone();
    stream::submit_kernel(
        &s,
        Box::new(move || {
            let more = stream::more_queued();
            let last_kernel = e
                .nodes
                .iter()
                .rposition(|n| matches!(n.kind, NodeKind::Kernel(_)));
            for (i, n) in e.nodes.iter().enumerate() {
                stream::set_more_queued(more || last_kernel.is_some_and(|l| i < l));
                n.run();
            }
        }),
    )
    .map(drop)
    .inspect_err(|_| allocs.iter().for_each(|a| graph_memory::release(a)))
}

/// The node behind a handle, in any graph of the process.
pub(crate) fn node(h: CUgraphNode) -> Option<Arc<Node>> {
    lock(&GRAPHS).values().find_map(|g| {
        lock(&g.nodes)
            .iter()
            .find(|n| Arc::as_ptr(n) as CUgraphNode == h)
            .cloned()
    })
}

// ---- exports ----

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture(hs: CUstream) -> CUresult {
    crate::call("cuStreamBeginCapture", || {
        begin_capture(hs, false, CU_STREAM_CAPTURE_MODE_GLOBAL)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_ptsz(hs: CUstream) -> CUresult {
    crate::call("cuStreamBeginCapture_ptsz", || {
        begin_capture(hs, true, CU_STREAM_CAPTURE_MODE_GLOBAL)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(hs: CUstream, mode: c_uint) -> CUresult {
    crate::call("cuStreamBeginCapture_v2", || begin_capture(hs, false, mode))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2_ptsz(hs: CUstream, mode: c_uint) -> CUresult {
    crate::call("cuStreamBeginCapture_v2_ptsz", || {
        begin_capture(hs, true, mode)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(hs: CUstream, pg: Option<&mut CUgraph>) -> CUresult {
    crate::call("cuStreamEndCapture", || end_capture(hs, false, pg))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture_ptsz(
    hs: CUstream,
    pg: Option<&mut CUgraph>,
) -> CUresult {
    crate::call("cuStreamEndCapture_ptsz", || end_capture(hs, true, pg))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(
    hs: CUstream,
    status: Option<&mut CUstreamCaptureStatus>,
) -> CUresult {
    crate::call("cuStreamIsCapturing", || {
        let status = crate::out(status)?;
        *status = capture_status(hs, false)?.0;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing_ptsz(
    hs: CUstream,
    status: Option<&mut CUstreamCaptureStatus>,
) -> CUresult {
    crate::call("cuStreamIsCapturing_ptsz", || {
        let status = crate::out(status)?;
        *status = capture_status(hs, true)?.0;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo(
    hs: CUstream,
    status: *mut CUstreamCaptureStatus,
    id: *mut c_ulonglong,
) -> CUresult {
    crate::call("cuStreamGetCaptureInfo", || {
        // SAFETY: the client's pointers follow the API's contract.
        unsafe { capture_info(hs, false, CaptureInfoOut::status_and_id(status, id)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_ptsz(
    hs: CUstream,
    status: *mut CUstreamCaptureStatus,
    id: *mut c_ulonglong,
) -> CUresult {
    crate::call("cuStreamGetCaptureInfo_ptsz", || {
        // SAFETY: the client's pointers follow the API's contract.
        unsafe { capture_info(hs, true, CaptureInfoOut::status_and_id(status, id)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2(
    hs: CUstream,
    status: *mut CUstreamCaptureStatus,
    id: *mut c_ulonglong,
    graph_out: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    num_deps: *mut usize,
) -> CUresult {
    crate::call("cuStreamGetCaptureInfo_v2", || {
        // SAFETY: the client's pointers follow the API's contract.
        unsafe {
            capture_info(
                hs,
                false,
                CaptureInfoOut {
                    status,
                    id,
                    graph: graph_out,
                    deps,
                    edges: std::ptr::null_mut(),
                    num_deps,
                },
            )
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2_ptsz(
    hs: CUstream,
    status: *mut CUstreamCaptureStatus,
    id: *mut c_ulonglong,
    graph_out: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    num_deps: *mut usize,
) -> CUresult {
    crate::call("cuStreamGetCaptureInfo_v2_ptsz", || {
        // SAFETY: the client's pointers follow the API's contract.
        unsafe {
            capture_info(
                hs,
                true,
                CaptureInfoOut {
                    status,
                    id,
                    graph: graph_out,
                    deps,
                    edges: std::ptr::null_mut(),
                    num_deps,
                },
            )
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3(
    hs: CUstream,
    status: *mut CUstreamCaptureStatus,
    id: *mut c_ulonglong,
    graph_out: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const c_void,
    num_deps: *mut usize,
) -> CUresult {
    crate::call("cuStreamGetCaptureInfo_v3", || {
        // SAFETY: the client's pointers follow the API's contract.
        unsafe {
            capture_info(
                hs,
                false,
                CaptureInfoOut {
                    status,
                    id,
                    graph: graph_out,
                    deps,
                    edges,
                    num_deps,
                },
            )
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3_ptsz(
    hs: CUstream,
    status: *mut CUstreamCaptureStatus,
    id: *mut c_ulonglong,
    graph_out: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const c_void,
    num_deps: *mut usize,
) -> CUresult {
    crate::call("cuStreamGetCaptureInfo_v3_ptsz", || {
        // SAFETY: the client's pointers follow the API's contract.
        unsafe {
            capture_info(
                hs,
                true,
                CaptureInfoOut {
                    status,
                    id,
                    graph: graph_out,
                    deps,
                    edges,
                    num_deps,
                },
            )
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: Option<&mut c_uint>) -> CUresult {
    crate::call("cuThreadExchangeStreamCaptureMode", || {
        let mode = crate::out(mode)?;
        if *mode > CU_STREAM_CAPTURE_MODE_RELAXED {
            return Err(CUerror::INVALID_VALUE);
        }
        *mode = THREAD_MODE.with(|m| m.replace(*mode));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphCreate(pg: Option<&mut CUgraph>, flags: c_uint) -> CUresult {
    crate::call("cuGraphCreate", || {
        let pg = crate::out(pg)?;
        if flags != 0 {
            return Err(CUerror::INVALID_VALUE);
        }
        *pg = register_graph(Arc::new(Graph::default()));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(hg: CUgraph) -> CUresult {
    crate::call("cuGraphDestroy", || {
        let g = graph(hg)?;
        if g.owned.load(Ordering::Acquire) {
            // Owned by its child graph node: "Cannot be independently ... destroyed".
            return Err(CUerror::INVALID_VALUE);
        }
        // Its child graphs go with it ("will be destroyed when the parent is destroyed").
        let mut gone = vec![hg as usize];
        crate::child_graph::descendants(&g, &mut gone);
        let mut graphs = lock(&GRAPHS);
        gone.iter().for_each(|h| drop(graphs.remove(h)));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddKernelNode(
    pn: Option<&mut CUgraphNode>,
    hg: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
    p: *const CUDA_KERNEL_NODE_PARAMS_v1,
) -> CUresult {
    crate::call("cuGraphAddKernelNode", || {
        let pn = crate::out(pn)?;
        let g = graph(hg)?;
        if p.is_null() {
            return Err(CUerror::INVALID_VALUE);
        }
        // SAFETY: non-NULL, a valid params struct per the API.
        let p = unsafe { *p };
        // SAFETY: the client's pointers follow the API's contract.
        unsafe { check_deps(&g, deps, num_deps) }?;
        let shape = Shape {
            grid: [p.gridDimX, p.gridDimY, p.gridDimZ],
            block: [p.blockDimX, p.blockDimY, p.blockDimZ],
            shared_mem: p.sharedMemBytes,
        };
        let params = Params {
            kernel_params: p.kernelParams,
            extra: p.extra,
        };
        // SAFETY: the node's parameters follow cuLaunchKernel's contract.
        let kind = unsafe { kernel_node(p.func, shape, params, std::ptr::null_mut()) }?;
        *pn = g.add(kind);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddKernelNode_v2(
    pn: Option<&mut CUgraphNode>,
    hg: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
    p: *const CUDA_KERNEL_NODE_PARAMS_v2,
) -> CUresult {
    crate::call("cuGraphAddKernelNode_v2", || {
        let pn = crate::out(pn)?;
        let g = graph(hg)?;
        if p.is_null() {
            return Err(CUerror::INVALID_VALUE);
        }
        // SAFETY: non-NULL, a valid params struct per the API.
        let p = unsafe { *p };
        // SAFETY: the client's pointers follow the API's contract.
        unsafe { check_deps(&g, deps, num_deps) }?;
        let shape = Shape {
            grid: [p.gridDimX, p.gridDimY, p.gridDimZ],
            block: [p.blockDimX, p.blockDimY, p.blockDimZ],
            shared_mem: p.sharedMemBytes,
        };
        let params = Params {
            kernel_params: p.kernelParams,
            extra: p.extra,
        };
        // `kern` is used only when `func` is NULL; a CUkernel is a function handle in simgpu.
        let (f, ctx) = if p.func.is_null() {
            (p.kern, p.ctx)
        } else {
            (p.func, std::ptr::null_mut())
        };
        // SAFETY: the node's parameters follow cuLaunchKernel's contract.
        let kind = unsafe { kernel_node(f, shape, params, ctx) }?;
        *pn = g.add(kind);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddEmptyNode(
    pn: Option<&mut CUgraphNode>,
    hg: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
) -> CUresult {
    crate::call("cuGraphAddEmptyNode", || {
        let pn = crate::out(pn)?;
        let g = graph(hg)?;
        // SAFETY: the client's pointers follow the API's contract.
        unsafe { check_deps(&g, deps, num_deps) }?;
        *pn = g.add(NodeKind::Empty);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    pn: Option<&mut CUgraphNode>,
    hg: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
    params: Option<&mut MemAllocNodeParams>,
) -> CUresult {
    crate::call("cuGraphAddMemAllocNode", || {
        let pn = crate::out(pn)?;
        let p = crate::out(params)?;
        let g = graph(hg)?;
        // SAFETY: the client's pointers follow the API's contract.
        unsafe { check_deps(&g, deps, num_deps) }?;
        *pn = add_mem_alloc(&g, p)?;
        Ok(())
    })
}

/// An allocation node of `g` (cuGraphAddMemAllocNode, cuGraphAddNode).
pub(crate) fn add_mem_alloc(g: &Graph, p: &mut MemAllocNodeParams) -> Result<CUgraphNode, CUerror> {
    if g.owned.load(Ordering::Acquire) {
        // A child graph "Cannot have additional memory allocation or free nodes added".
        return Err(CUerror::INVALID_VALUE);
    }
    let device = graph_memory::node_device(p)?;
    let a = graph_memory::new_alloc(device, p.bytesize)?;
    // "When cuGraphAddMemAllocNode creates an allocation node, it returns the address of the
    // allocation in nodeParams.dptr."
    graph_memory::params_of(&a, p);
    Ok(g.add(NodeKind::MemAlloc(a)))
}

/// A free node of `g` (cuGraphAddMemFreeNode, cuGraphAddNode).
pub(crate) fn add_mem_free(g: &Graph, dptr: CUdeviceptr) -> Result<CUgraphNode, CUerror> {
    if g.owned.load(Ordering::Acquire) {
        return Err(CUerror::INVALID_VALUE);
    }
    // "an address that was not returned by an allocation node": CUDA_ERROR_INVALID_VALUE.
    let a = graph_memory::lookup(dptr).ok_or(CUerror::INVALID_VALUE)?;
    // "an allocation twice in the same graph": CUDA_ERROR_INVALID_VALUE.
    let twice = lock(&g.nodes)
        .iter()
        .any(|n| matches!(&n.kind, NodeKind::MemFree(b) if Arc::ptr_eq(b, &a)));
    if twice {
        return Err(CUerror::INVALID_VALUE);
    }
    Ok(g.add(NodeKind::MemFree(a)))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemFreeNode(
    pn: Option<&mut CUgraphNode>,
    hg: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
    dptr: CUdeviceptr,
) -> CUresult {
    crate::call("cuGraphAddMemFreeNode", || {
        let pn = crate::out(pn)?;
        let g = graph(hg)?;
        // SAFETY: the client's pointers follow the API's contract.
        unsafe { check_deps(&g, deps, num_deps) }?;
        *pn = add_mem_free(&g, dptr)?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphMemAllocNodeGetParams(
    hn: CUgraphNode,
    params: Option<&mut MemAllocNodeParams>,
) -> CUresult {
    crate::call("cuGraphMemAllocNodeGetParams", || {
        let p = crate::out(params)?;
        match node(hn).as_deref().map(|n| &n.kind) {
            Some(NodeKind::MemAlloc(a)) => {
                graph_memory::params_of(a, p);
                p.pool_props.location.type_ = gpuslice_api::types::CU_MEM_LOCATION_TYPE_DEVICE;
                p.pool_props.location.id = crate::device::visible_ordinal(a.device);
                p.access_descs = std::ptr::null();
                p.access_desc_count = 0;
                Ok(())
            }
            Some(_) => Err(CUerror::INVALID_VALUE),
            None => Err(CUerror::INVALID_HANDLE),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphMemFreeNodeGetParams(
    hn: CUgraphNode,
    dptr: Option<&mut CUdeviceptr>,
) -> CUresult {
    crate::call("cuGraphMemFreeNodeGetParams", || {
        let out = crate::out(dptr)?;
        match node(hn).as_deref().map(|n| &n.kind) {
            Some(NodeKind::MemFree(a)) => {
                *out = a.base as CUdeviceptr;
                Ok(())
            }
            Some(_) => Err(CUerror::INVALID_VALUE),
            None => Err(CUerror::INVALID_HANDLE),
        }
    })
}

/// `cuGraphNodeGetType`: `CUgraphNodeType` (cuda.h). Kernel, empty, child graph and memory nodes are reported as
/// what they are; other work (host functions, captured copies and memsets, which simgpu keeps as
/// opaque stream work) is reported as a host node: simgpu does not model their node types.
#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeGetType(
    hn: CUgraphNode,
    kind: Option<&mut c_uint>,
) -> CUresult {
    crate::call("cuGraphNodeGetType", || {
        let out = crate::out(kind)?;
        *out = match node(hn).as_deref().map(|n| &n.kind) {
            Some(NodeKind::Kernel(_)) => 0,
            Some(NodeKind::Empty) => 5,
            Some(NodeKind::MemAlloc(_)) => 10,
            Some(NodeKind::MemFree(_)) => 11,
            Some(NodeKind::Once(_) | NodeKind::Repeat(_)) => 3,
            Some(NodeKind::Child(_)) => 4,
            None => return Err(CUerror::INVALID_HANDLE),
        };
        Ok(())
    })
}

/// `CUDA_HOST_NODE_PARAMS_v1`: `{ CUhostFn fn; void *userData; }`.
#[repr(C)]
pub struct HostNodeParams {
    f: CUhostFn,
    user_data: *mut c_void,
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddHostNode(
    pn: Option<&mut CUgraphNode>,
    hg: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
    p: *const HostNodeParams,
) -> CUresult {
    crate::call("cuGraphAddHostNode", || {
        let pn = crate::out(pn)?;
        let g = graph(hg)?;
        // SAFETY: the client's pointers follow the API's contract.
        unsafe { check_deps(&g, deps, num_deps) }?;
        // SAFETY: NULL or a valid params struct per the API.
        let p = unsafe { p.as_ref() }.ok_or(CUerror::INVALID_VALUE)?;
        let f = p.f.ok_or(CUerror::INVALID_VALUE)?;
        *pn = g.add(NodeKind::Repeat(stream::host_fn_op(f, p.user_data)));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphGetNodes(
    hg: CUgraph,
    nodes: *mut CUgraphNode,
    num: Option<&mut usize>,
) -> CUresult {
    crate::call("cuGraphGetNodes", || {
        let num = crate::out(num)?;
        let g = graph(hg)?;
        let all = lock(&g.nodes);
        if !nodes.is_null() {
            for (i, n) in all.iter().take(*num).enumerate() {
                // SAFETY: the client's array holds `*num` entries.
                unsafe { *nodes.add(i) = Arc::as_ptr(n) as CUgraphNode };
            }
        }
        *num = all.len();
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    pe: Option<&mut CUgraphExec>,
    hg: CUgraph,
    flags: c_ulonglong,
) -> CUresult {
    crate::call("cuGraphInstantiateWithFlags", || {
        let pe = crate::out(pe)?;
        let valid = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH
            | CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH
            | CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
        if flags & !valid != 0 {
            return Err(CUerror::INVALID_VALUE);
        }
        *pe = instantiate(hg, flags)?;
        Ok(())
    })
}

/// The 11.0 signature (exported `cuGraphInstantiate_v2`): error node and log buffer.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    pe: Option<&mut CUgraphExec>,
    hg: CUgraph,
    err_node: *mut CUgraphNode,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    crate::call("cuGraphInstantiate_v2", || {
        let pe = crate::out(pe)?;
        *pe = instantiate(hg, 0)?;
        // SAFETY: NULL or writable per the API.
        if let Some(n) = unsafe { err_node.as_mut() } {
            *n = std::ptr::null_mut();
        }
        if !log.is_null() && log_size > 0 {
            // SAFETY: a buffer of `log_size` bytes per the API: an empty log.
            unsafe { *log = 0 };
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate(
    pe: Option<&mut CUgraphExec>,
    hg: CUgraph,
    err_node: *mut CUgraphNode,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuGraphInstantiate_v2(pe, hg, err_node, log, log_size) }
}

fn instantiate_with_params(
    pe: Option<&mut CUgraphExec>,
    hg: CUgraph,
    p: Option<&mut CUDA_GRAPH_INSTANTIATE_PARAMS>,
    per_thread: bool,
) -> CUresult {
    let pe = crate::out(pe)?;
    let p = crate::out(p)?;
    let valid = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH
        | CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD
        | CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH
        | CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
    p.hErrNode_out = std::ptr::null_mut();
    p.result_out = CUDA_GRAPH_INSTANTIATE_ERROR;
    if p.flags & !valid != 0 {
        return Err(CUerror::INVALID_VALUE);
    }
    if p.flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD != 0 {
        stream::resolve(p.hUploadStream, per_thread)?;
    }
    *pe = instantiate(hg, p.flags)?;
    p.result_out = CUDA_GRAPH_INSTANTIATE_SUCCESS;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    pe: Option<&mut CUgraphExec>,
    hg: CUgraph,
    p: Option<&mut CUDA_GRAPH_INSTANTIATE_PARAMS>,
) -> CUresult {
    crate::call("cuGraphInstantiateWithParams", || {
        instantiate_with_params(pe, hg, p, false)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithParams_ptsz(
    pe: Option<&mut CUgraphExec>,
    hg: CUgraph,
    p: Option<&mut CUDA_GRAPH_INSTANTIATE_PARAMS>,
) -> CUresult {
    crate::call("cuGraphInstantiateWithParams_ptsz", || {
        instantiate_with_params(pe, hg, p, true)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(he: CUgraphExec) -> CUresult {
    crate::call("cuGraphExecDestroy", || {
        lock(&EXECS)
            .remove(&(he as usize))
            .map(drop)
            .ok_or(CUerror::INVALID_HANDLE)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch(he: CUgraphExec, hs: CUstream) -> CUresult {
    crate::call("cuGraphLaunch", || graph_launch(he, hs, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(he: CUgraphExec, hs: CUstream) -> CUresult {
    crate::call("cuGraphLaunch_ptsz", || graph_launch(he, hs, true))
}

/// Uploading is a no-op for simgpu (nothing to copy to a device): the handles are validated.
#[no_mangle]
pub unsafe extern "C" fn cuGraphUpload(he: CUgraphExec, hs: CUstream) -> CUresult {
    crate::call("cuGraphUpload", || {
        exec(he)?;
        stream::resolve(hs, false).map(drop)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphUpload_ptsz(he: CUgraphExec, hs: CUstream) -> CUresult {
    crate::call("cuGraphUpload_ptsz", || {
        exec(he)?;
        stream::resolve(hs, true).map(drop)
    })
}
