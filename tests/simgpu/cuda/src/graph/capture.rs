//! Stream capture: a stream's work recorded into a graph instead of run, and what the capture
//! rules forbid while one is going on.

use super::*;

static NEXT_CAPTURE: AtomicU64 = AtomicU64::new(1);

/// A capture sequence: started on one stream, joined by streams that wait on its events.
pub struct Capture {
    id: u64,
    pub(super) graph: Arc<Graph>,
    origin: Weak<Stream>,
    mode: u32,
    thread: ThreadId,
    pub(super) invalid: AtomicBool,
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
    /// Every answer of the latest version (`_v3`); an earlier version passes NULL for those it lacks.
    fn new(
        status: *mut CUstreamCaptureStatus,
        id: *mut c_ulonglong,
        graph: *mut CUgraph,
        deps: *mut *const CUgraphNode,
        edges: *mut *const c_void,
        num_deps: *mut usize,
    ) -> Self {
        CaptureInfoOut {
            status,
            id,
            graph,
            deps,
            edges,
            num_deps,
        }
    }

    /// The first version's two answers (status and id), nothing else.
    fn status_and_id(status: *mut CUstreamCaptureStatus, id: *mut c_ulonglong) -> Self {
        let null = std::ptr::null_mut();
        Self::new(status, id, null, null.cast(), null.cast(), null.cast())
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
                CaptureInfoOut::new(status, id, graph_out, deps, std::ptr::null_mut(), num_deps),
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
                CaptureInfoOut::new(status, id, graph_out, deps, std::ptr::null_mut(), num_deps),
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
                CaptureInfoOut::new(status, id, graph_out, deps, edges, num_deps),
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
                CaptureInfoOut::new(status, id, graph_out, deps, edges, num_deps),
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
