//! Capture-begin hooks: every entry point that begins a stream capture says so first
//! ([`capture::capture_begins`]), so that until a process begins one, the shim's own calls skip
//! the capture checks (`cuStreamIsCapturing`, the capture-mode exchanges) that would cost every
//! contended launch driver calls. Once a capture has begun, straight to the driver.

use super::hooks;
use crate::driver::capture;
use gpuslice_api::types::{CUgraph, CUgraphNode, CUstream};
use gpuslice_api::CUresult;
use std::ffi::{c_uint, c_void};

hooks! {
    ret = CUresult, fast = capture::begun();
    fn cuStreamBeginCapture(stream: CUstream)
        => begins(|| real::cuStreamBeginCapture(stream));
    fn cuStreamBeginCapture_ptsz(stream: CUstream)
        => begins(|| real::cuStreamBeginCapture_ptsz(stream));
    fn cuStreamBeginCapture_v2(stream: CUstream, mode: c_uint)
        => begins(|| real::cuStreamBeginCapture_v2(stream, mode));
    fn cuStreamBeginCapture_v2_ptsz(stream: CUstream, mode: c_uint)
        => begins(|| real::cuStreamBeginCapture_v2_ptsz(stream, mode));
    fn cuStreamBeginCaptureToCig(stream: CUstream, params: *mut c_void)
        => begins(|| real::cuStreamBeginCaptureToCig(stream, params));
    fn cuStreamBeginCaptureToCig_ptsz(stream: CUstream, params: *mut c_void)
        => begins(|| real::cuStreamBeginCaptureToCig_ptsz(stream, params));
    fn cuStreamBeginCaptureToGraph(stream: CUstream, graph: CUgraph, dependencies: *const CUgraphNode,
                                   edges: *const c_void, count: usize, mode: c_uint)
        => begins(|| real::cuStreamBeginCaptureToGraph(stream, graph, dependencies, edges, count, mode));
    fn cuStreamBeginCaptureToGraph_ptsz(stream: CUstream, graph: CUgraph, dependencies: *const CUgraphNode,
                                        edges: *const c_void, count: usize, mode: c_uint)
        => begins(|| real::cuStreamBeginCaptureToGraph_ptsz(stream, graph, dependencies, edges, count, mode));
    fn cuStreamBeginRecaptureToGraph(stream: CUstream, mode: c_uint, graph: CUgraph,
                                     callback: *mut c_void, user: *mut c_void)
        => begins(|| real::cuStreamBeginRecaptureToGraph(stream, mode, graph, callback, user));
    fn cuStreamBeginRecaptureToGraph_ptsz(stream: CUstream, mode: c_uint, graph: CUgraph,
                                          callback: *mut c_void, user: *mut c_void)
        => begins(|| real::cuStreamBeginRecaptureToGraph_ptsz(stream, mode, graph, callback, user));
}

/// The process begins a capture: noted before the real begin, so that any launch that can be
/// captured finds the shim checking for capture.
fn begins(begin: impl FnOnce() -> CUresult) -> CUresult {
    capture::capture_begins();
    begin()
}
