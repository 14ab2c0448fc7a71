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

mod capture;
mod instance;
mod nodes;
pub use capture::*;
use instance::instantiate;
pub use instance::*;
pub use nodes::*;

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

/// `CUDA_HOST_NODE_PARAMS_v1`: `{ CUhostFn fn; void *userData; }`.
#[repr(C)]
pub struct HostNodeParams {
    f: CUhostFn,
    user_data: *mut c_void,
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
