//! Instantiating a graph and launching (or uploading) the instance on a stream.

use super::*;

pub(super) fn instantiate(hg: CUgraph, flags: u64) -> Result<CUgraphExec, CUerror> {
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
