//! Child graph nodes: a node that executes an embedded graph.
//!
//! What NVIDIA documents (CUDA Driver API, Graph Management; cuda.h 13), and simgpu does:
//! - `cuGraphAddChildGraphNode` "Creates a new node which executes an embedded graph ... The child
//!   graph is cloned in this call." A graph with memory allocation or free nodes cannot be cloned
//!   into a node: `CUDA_ERROR_INVALID_VALUE` ("Graphs containing memory allocation or memory free
//!   nodes must set the ownership to be moved to the parent", `CUDA_CHILD_GRAPH_NODE_PARAMS::graph`).
//! - `cuGraphAddNode` with `CU_GRAPH_NODE_TYPE_GRAPH` and `CUDA_CHILD_GRAPH_NODE_PARAMS`: ownership
//!   `CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE` as above, or `CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE` (CUDA
//!   12.9): "The child graph is moved to the parent. The handle to the child graph is owned by the
//!   parent and will be destroyed when the parent is destroyed", and it "Cannot be independently
//!   instantiated or destroyed; Cannot be added as a child graph of a separate parent graph; ...
//!   Cannot have additional memory allocation or free nodes added" (all `CUDA_ERROR_INVALID_VALUE`).
//!   Its memory nodes are the parent's: they allocate when the parent is launched.
//! - `cuGraphChildGraphNodeGetGraph` "Gets a handle to the embedded graph in a child graph node. This
//!   call does not clone the graph ... the node retains ownership of the graph. Allocation and free
//!   nodes cannot be added to the returned graph."
//! - `cuGraphNodeGetType` answers `CU_GRAPH_NODE_TYPE_GRAPH`.
//! - `cuGraphAddNode` (and its `_v2`/`_v3` forms, whose edge data simgpu ignores: its graphs are
//!   ordered lists) also makes empty, allocation and free nodes; other node types answer
//!   `CUDA_ERROR_NOT_SUPPORTED` (not modelled).
//!
//! An instantiated graph runs its child graphs' nodes where the child node stands (simgpu keeps one
//! ordered list). Not modelled: `cuGraphExecChildGraphNodeSetParams`, `cuGraphNodeGetParams`,
//! conditional nodes, and a captured stream operation that runs once (`NodeKind::Once`) cloned into
//! a child: the clone shares it with the original.

use crate::graph::{self, check_deps, Graph, Node, NodeKind};
use crate::graph_memory::MemAllocNodeParams;
use crate::stream::lock;
use gpuslice_api::types::{CUdeviceptr, CUgraph, CUgraphNode};
use gpuslice_api::{CUerror, CUresult};
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Child graphs nest at most this deep (no real program comes close; a bound on every walk).
const MAX_DEPTH: usize = 64;

/// `CUgraphNodeType`
const NODE_TYPE_GRAPH: u32 = 4;
const NODE_TYPE_EMPTY: u32 = 5;
const NODE_TYPE_MEM_ALLOC: u32 = 10;
const NODE_TYPE_MEM_FREE: u32 = 11;
/// `CUgraphChildGraphNodeOwnership`
const OWNERSHIP_CLONE: i32 = 0;
const OWNERSHIP_MOVE: i32 = 1;

/// `CUgraphNodeParams` (cuda.h 12.2+): the type, reserved words, a 232-byte union, a reserved word.
#[repr(C)]
pub struct GraphNodeParams {
    kind: u32,
    reserved0: [i32; 3],
    union: [u64; 29],
    reserved2: i64,
}

/// `CUDA_CHILD_GRAPH_NODE_PARAMS`: the union's child graph member.
#[repr(C)]
struct ChildGraphNodeParams {
    graph: CUgraph,
    ownership: i32,
}

/// `g`'s nodes with every child graph's nodes in its node's place (instantiation).
pub(crate) fn flatten(g: &Graph) -> Result<Vec<Arc<Node>>, CUerror> {
    fn walk(g: &Graph, depth: usize, out: &mut Vec<Arc<Node>>) -> CUresult {
        if depth > MAX_DEPTH {
            return Err(CUerror::INVALID_VALUE);
        }
        for n in lock(&g.nodes).iter() {
            match &n.kind {
                NodeKind::Child(c) => walk(c, depth + 1, out)?,
                _ => out.push(n.clone()),
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(g, 0, &mut out)?;
    Ok(out)
}

/// Adds the handles of `g`'s child graphs, at every depth, to `out`.
pub(crate) fn descendants(g: &Graph, out: &mut Vec<usize>) {
    fn walk(g: &Graph, depth: usize, out: &mut Vec<usize>) {
        if depth > MAX_DEPTH {
            return;
        }
        for n in lock(&g.nodes).iter() {
            if let NodeKind::Child(c) = &n.kind {
                out.push(Arc::as_ptr(c) as usize);
                walk(c, depth + 1, out);
            }
        }
    }
    walk(g, 0, out)
}

fn has_memory_nodes(g: &Graph) -> bool {
    flatten(g).map_or(true, |nodes| {
        nodes
            .iter()
            .any(|n| matches!(n.kind, NodeKind::MemAlloc(_) | NodeKind::MemFree(_)))
    })
}

/// A copy of `g` for a child graph node: new nodes running the same work, owned by the node.
fn clone_graph(g: &Graph, depth: usize) -> Result<Arc<Graph>, CUerror> {
    if depth > MAX_DEPTH {
        return Err(CUerror::INVALID_VALUE);
    }
    let copy = Arc::new(Graph::default());
    for n in lock(&g.nodes).iter() {
        let kind = match &n.kind {
            NodeKind::Kernel(k) => NodeKind::Kernel(k.clone()),
            NodeKind::Repeat(f) => NodeKind::Repeat(f.clone()),
            NodeKind::Empty => NodeKind::Empty,
            NodeKind::Child(c) => NodeKind::Child(clone_graph(c, depth + 1)?),
            // Work that runs once: shared with the original (see the module docs).
            NodeKind::Once(_) => {
                lock(&copy.nodes).push(n.clone());
                continue;
            }
            NodeKind::MemAlloc(_) | NodeKind::MemFree(_) => return Err(CUerror::INVALID_VALUE),
        };
        copy.add(kind);
    }
    copy.owned.store(true, Ordering::Release);
    graph::register_graph(copy.clone());
    Ok(copy)
}

/// A child graph node of `parent` embedding `child`, cloned or moved.
fn add_child(parent: &Arc<Graph>, child: CUgraph, ownership: i32) -> Result<CUgraphNode, CUerror> {
    let c = graph::graph(child)?;
    if c.owned.load(Ordering::Acquire) || Arc::ptr_eq(&c, parent) {
        // Already some node's graph ("Cannot be added as a child graph of a separate parent").
        return Err(CUerror::INVALID_VALUE);
    }
    let embedded = match ownership {
        OWNERSHIP_CLONE => {
            if has_memory_nodes(&c) {
                return Err(CUerror::INVALID_VALUE);
            }
            clone_graph(&c, 0)?
        }
        OWNERSHIP_MOVE => {
            // A graph cannot end up inside itself.
            let mut inside = Vec::new();
            descendants(&c, &mut inside);
            if inside.contains(&(Arc::as_ptr(parent) as usize)) {
                return Err(CUerror::INVALID_VALUE);
            }
            c.owned.store(true, Ordering::Release);
            c
        }
        _ => return Err(CUerror::INVALID_VALUE),
    };
    Ok(parent.add(NodeKind::Child(embedded)))
}

/// `cuGraphAddNode` (all forms): the node `p` describes.
///
/// # Safety
/// `deps` holds `num_deps` handles; `p` is NULL or a valid `CUgraphNodeParams`.
unsafe fn add_node(
    pn: Option<&mut CUgraphNode>,
    hg: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
    p: *mut GraphNodeParams,
) -> CUresult {
    let pn = crate::out(pn)?;
    let g = graph::graph(hg)?;
    // SAFETY: NULL or valid per the contract.
    let p = unsafe { p.as_mut() }.ok_or(CUerror::INVALID_VALUE)?;
    // SAFETY: the client's pointers follow the API's contract.
    unsafe { check_deps(&g, deps, num_deps) }?;
    let union = p.union.as_mut_ptr().cast::<c_void>();
    *pn = match p.kind {
        NODE_TYPE_GRAPH => {
            // SAFETY: the union holds `CUDA_CHILD_GRAPH_NODE_PARAMS` for this type (16 bytes of 232).
            let c = unsafe { &*union.cast::<ChildGraphNodeParams>() };
            add_child(&g, c.graph, c.ownership)?
        }
        NODE_TYPE_EMPTY => g.add(NodeKind::Empty),
        NODE_TYPE_MEM_ALLOC => {
            // SAFETY: `CUDA_MEM_ALLOC_NODE_PARAMS_v2` (the v1 layout) for this type; dptr is written.
            graph::add_mem_alloc(&g, unsafe { &mut *union.cast::<MemAllocNodeParams>() })?
        }
        NODE_TYPE_MEM_FREE => {
            // SAFETY: `CUDA_MEM_FREE_NODE_PARAMS` (one `CUdeviceptr`) for this type.
            graph::add_mem_free(&g, unsafe { *union.cast::<CUdeviceptr>() })?
        }
        other => {
            simgpu_core::trace(format_args!(
                "  cuGraphAddNode: node type {other} not modelled"
            ));
            return Err(CUerror::NOT_SUPPORTED);
        }
    };
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddChildGraphNode(
    pn: Option<&mut CUgraphNode>,
    hg: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
    child: CUgraph,
) -> CUresult {
    crate::call("cuGraphAddChildGraphNode", || {
        let pn = crate::out(pn)?;
        let g = graph::graph(hg)?;
        // SAFETY: the client's pointers follow the API's contract.
        unsafe { check_deps(&g, deps, num_deps) }?;
        *pn = add_child(&g, child, OWNERSHIP_CLONE)?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphChildGraphNodeGetGraph(
    hn: CUgraphNode,
    pg: Option<&mut CUgraph>,
) -> CUresult {
    crate::call("cuGraphChildGraphNodeGetGraph", || {
        let pg = crate::out(pg)?;
        match graph::node(hn).as_deref().map(|n| &n.kind) {
            Some(NodeKind::Child(c)) => {
                *pg = Arc::as_ptr(c) as CUgraph;
                Ok(())
            }
            Some(_) => Err(CUerror::INVALID_VALUE),
            None => Err(CUerror::INVALID_HANDLE),
        }
    })
}

/// The 12.2 signature (no edge data).
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddNode(
    pn: Option<&mut CUgraphNode>,
    hg: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
    p: *mut GraphNodeParams,
) -> CUresult {
    crate::call("cuGraphAddNode", || {
        // SAFETY: the client's pointers follow the API's contract.
        unsafe { add_node(pn, hg, deps, num_deps, p) }
    })
}

/// The 12.3 signature: edge data per dependency (ignored: simgpu's graphs are ordered lists).
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddNode_v2(
    pn: Option<&mut CUgraphNode>,
    hg: CUgraph,
    deps: *const CUgraphNode,
    _edges: *const c_void,
    num_deps: usize,
    p: *mut GraphNodeParams,
) -> CUresult {
    crate::call("cuGraphAddNode_v2", || {
        // SAFETY: the client's pointers follow the API's contract.
        unsafe { add_node(pn, hg, deps, num_deps, p) }
    })
}

/// The 13.4 form, with the 12.3 signature.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddNode_v3(
    pn: Option<&mut CUgraphNode>,
    hg: CUgraph,
    deps: *const CUgraphNode,
    _edges: *const c_void,
    num_deps: usize,
    p: *mut GraphNodeParams,
) -> CUresult {
    crate::call("cuGraphAddNode_v3", || {
        // SAFETY: the client's pointers follow the API's contract.
        unsafe { add_node(pn, hg, deps, num_deps, p) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph_node_params_has_cuda_h_layout() {
        // cuda.h: 4 + 3 * 4 bytes, a 232-byte union (8-aligned), 8 reserved bytes.
        assert_eq!(std::mem::size_of::<GraphNodeParams>(), 256);
        assert_eq!(std::mem::offset_of!(GraphNodeParams, union), 16);
    }
}
