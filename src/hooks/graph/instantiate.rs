//! Graph instantiation hooks: what the graph's launches will allocate is read once, here.

use crate::accounting::graphs;
use crate::hooks::{hooks, Out};
use gpuslice_api::types::{CUgraph, CUgraphExec, CUgraphNode};
use gpuslice_api::CUresult;
use std::ffi::{c_char, c_void};
hooks! {
    // What a graph's launches will allocate is read once, when it is instantiated.
    ret = CUresult;
    fn cuGraphInstantiate(exec: *mut CUgraphExec, graph: CUgraph, error_node: *mut CUgraphNode, log: *mut c_char, log_size: usize)
        => instantiate(exec, graph, || real::cuGraphInstantiate(exec, graph, error_node, log, log_size));
    fn cuGraphInstantiate_v2(exec: *mut CUgraphExec, graph: CUgraph, error_node: *mut CUgraphNode, log: *mut c_char, log_size: usize)
        => instantiate(exec, graph, || real::cuGraphInstantiate_v2(exec, graph, error_node, log, log_size));
    fn cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: u64)
        => instantiate(exec, graph, || real::cuGraphInstantiateWithFlags(exec, graph, flags));
    fn cuGraphInstantiateWithParams(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void)
        => instantiate(exec, graph, || real::cuGraphInstantiateWithParams(exec, graph, params));
    fn cuGraphInstantiateWithParams_ptsz(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void)
        => instantiate(exec, graph, || real::cuGraphInstantiateWithParams_ptsz(exec, graph, params));
}

/// Instantiates a graph through `call`, then records what its launches allocate.
///
/// # Safety
/// `exec` is NULL or valid for reads and writes of a `CUgraphExec`, as the driver API requires.
unsafe fn instantiate(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    call()?;
    // SAFETY: the caller's contract; read only after the driver succeeded (it wrote it).
    if let Some(exec) = unsafe { Out::new(exec) }.get() {
        graphs::instantiated(exec as usize, graph);
    }
    Ok(())
}
