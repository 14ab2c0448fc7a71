//! Building a graph node by node: kernel, empty, host and memory nodes, and what a node tells of
//! itself.

use super::*;

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
