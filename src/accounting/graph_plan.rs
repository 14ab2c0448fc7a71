//! What launching an executable graph allocates and frees ([`Plan`]), read from the driver once, at
//! instantiation: the graph's memory allocation and free nodes, with those of its child graphs
//! ([`super::graphs`] charges them at each launch).

use crate::driver::calls::real;
use gpuslice_api::types::{
    CUdevice, CUgraph, CUgraphNode, CUDA_MEM_ALLOC_NODE_PARAMS, CU_GRAPH_NODE_TYPE_GRAPH,
    CU_GRAPH_NODE_TYPE_MEM_ALLOC, CU_GRAPH_NODE_TYPE_MEM_FREE, CU_MEM_LOCATION_TYPE_DEVICE,
};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// One allocation node of a graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Alloc {
    /// Its address, the same at every launch.
    pub(super) ptr: u64,
    pub(super) bytes: u64,
    pub(super) ordinal: CUdevice,
    /// A free node of the same graph returns it before the launch's work completes.
    pub(super) freed_in_graph: bool,
}

/// What launching an executable graph allocates and frees.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub(super) allocs: Vec<Alloc>,
    /// Free nodes of allocations made by other graphs.
    pub(super) frees_elsewhere: Vec<u64>,
}

/// Child graphs nest at most this deep when their memory nodes are read (a bound on the walk: a
/// graph cannot contain itself, and no real program nests nearly this deep).
const MAX_CHILD_DEPTH: usize = 16;

/// Reads `graph`'s memory nodes from the driver, with those of its child graphs at every depth:
/// a graph moved into a child graph node (`cuGraphAddNode`, `CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`,
/// CUDA 12.9) keeps its allocation and free nodes, which allocate and free when the parent is
/// launched. `None` when it has none (or cannot be read).
pub(super) fn read_plan(graph: CUgraph) -> Option<Plan> {
    let mut allocs = Vec::new();
    let mut frees = Vec::new();
    read_nodes(graph, 0, &mut allocs, &mut frees)?;
    let mut frees_elsewhere = Vec::new();
    for ptr in frees {
        match allocs.iter_mut().find(|a| a.ptr == ptr) {
            Some(a) => a.freed_in_graph = true,
            None => frees_elsewhere.push(ptr),
        }
    }
    (!allocs.is_empty() || !frees_elsewhere.is_empty()).then_some(Plan {
        allocs,
        frees_elsewhere,
    })
}

/// Adds the memory nodes of `graph` (and of its child graphs, `depth` levels down already) to
/// `allocs` and `frees`. `None` when the graph's nodes cannot be listed.
fn read_nodes(
    graph: CUgraph,
    depth: usize,
    allocs: &mut Vec<Alloc>,
    frees: &mut Vec<u64>,
) -> Option<()> {
    let mut count = 0usize;
    // SAFETY: NULL node array with a valid count out-parameter: the driver reports the count.
    unsafe { real::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut count) }.ok()?;
    let mut nodes: Vec<CUgraphNode> = vec![std::ptr::null_mut(); count];
    // SAFETY: `nodes` holds `count` entries, as the count says.
    unsafe { real::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count) }.ok()?;
    nodes.truncate(count);
    for &node in &nodes {
        let mut kind = 0u32;
        // SAFETY: a node of `graph`, valid out-parameter.
        if unsafe { real::cuGraphNodeGetType(node, &mut kind) }.is_err() {
            continue;
        }
        match kind {
            CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
                // SAFETY: zeroed plain data (pointers NULL), filled by the driver.
                let mut p: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
                // SAFETY: an allocation node of `graph`, valid out-parameter.
                if unsafe { real::cuGraphMemAllocNodeGetParams(node, &mut p) }.is_ok()
                    && p.poolProps.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE
                {
                    allocs.push(Alloc {
                        ptr: p.dptr,
                        bytes: p.bytesize as u64,
                        ordinal: p.poolProps.location.id,
                        freed_in_graph: false,
                    });
                }
            }
            CU_GRAPH_NODE_TYPE_MEM_FREE => {
                let mut ptr = 0u64;
                // SAFETY: a free node of `graph`, valid out-parameter.
                if unsafe { real::cuGraphMemFreeNodeGetParams(node, &mut ptr) }.is_ok() {
                    frees.push(ptr);
                }
            }
            CU_GRAPH_NODE_TYPE_GRAPH if depth < MAX_CHILD_DEPTH => {
                let mut child: CUgraph = std::ptr::null_mut();
                // SAFETY: a child graph node of `graph`, valid out-parameter; the handle is the
                // node's own graph (not a clone), read only.
                if unsafe { real::cuGraphChildGraphNodeGetGraph(node, &mut child) }.is_ok()
                    && !child.is_null()
                {
                    read_nodes(child, depth + 1, allocs, frees);
                }
            }
            _ => {}
        }
    }
    Some(())
}

/// Some executable graph has memory nodes: graph launches look their plan up.
pub(super) static ANY: AtomicBool = AtomicBool::new(false);

/// Whether any executable graph of this process allocates memory (one load; graph launches of a
/// process without graph memory skip everything here).
#[inline]
pub fn any() -> bool {
    ANY.load(Relaxed)
}
