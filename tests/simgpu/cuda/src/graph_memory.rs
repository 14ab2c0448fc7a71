//! Graph memory nodes: allocations that belong to a graph and get memory when it is launched.
//!
//! What NVIDIA documents (CUDA Driver API, `cuGraphAddMemAllocNode`, `cuGraphAddMemFreeNode`,
//! `cuGraphInstantiate`; CUDA Programming Guide, "Graph Memory Nodes"), and simgpu does:
//! - An allocation node is created by `cuGraphAddMemAllocNode` or by a `cuMemAllocAsync` captured from
//!   a stream. It returns the allocation's address at once ("The allocation's address remains fixed
//!   across instantiations and launches"), but no memory is allocated then: simgpu reserves address
//!   space only (`PROT_NONE`), and charges nothing to the device.
//! - Memory is allocated when the graph is launched: `cuGraphLaunch` reserves every allocation of the
//!   graph on its device (charged to the process and its group like any allocation), or fails with
//!   `CUDA_ERROR_OUT_OF_MEMORY` and launches nothing.
//! - A free node (`cuGraphAddMemFreeNode`, or a `cuMemFreeAsync` captured in the same graph) returns
//!   the memory when the graph's execution reaches it. An allocation not freed in its graph stays
//!   allocated after the launch until `cuMemFreeAsync`/`cuMemFree`, or until the graph is launched
//!   again if it was instantiated with `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH` ("automatically
//!   free any unfreed memory allocations before the graph is relaunched"). Relaunching a graph whose
//!   allocations are still allocated, without that flag, fails (`CUDA_ERROR_INVALID_VALUE`).
//! - The device's graph memory pool keeps what it got: freed graph memory stays reserved for later
//!   graph allocations ("memory that was cached on the specified device for use with graphs",
//!   `cuDeviceGraphMemTrim`), still counted for the process and the device, and a launch takes its
//!   allocations from that cache before asking the device for more. `cuDeviceGraphMemTrim` gives the
//!   unused part back: "Blocks which are not in use by a graph that is either currently executing or
//!   scheduled to execute are freed back to the operating system" (simgpu: all but the allocations
//!   live now, which a launch makes live before it is enqueued).
//! - `cuDeviceGetGraphMemAttribute` reports `CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT` ("Amount of memory,
//!   in bytes, currently associated with graphs": the live allocations) and
//!   `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT` ("currently allocated for use by the CUDA graphs
//!   asynchronous allocator": live plus cached), and their high-water marks.
//!
//! Not modelled: physical memory reuse between allocations of one graph, the pool's granularity
//! (the cache is counted in bytes), the cache kept per process (one pool per device of the process), copies to or from graph allocations (their addresses are not backed by
//! host memory), and peer access of graph allocations. Graphs with memory nodes moved into a child
//! graph node allocate with their parent (child_graph.rs).

use crate::graph::{Capture, NodeKind};
use gpuslice_api::types::{CUdevice, CUmemAccessDesc, CUmemPoolProps, CU_MEM_LOCATION_TYPE_DEVICE};
use gpuslice_api::{CUerror, CUresult};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (`_v1`).
#[repr(C)]
pub struct MemAllocNodeParams {
    pub pool_props: CUmemPoolProps,
    pub access_descs: *const CUmemAccessDesc,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: u64,
}

/// `CUgraphMem_attribute`
const USED_MEM_CURRENT: u32 = 0;
const USED_MEM_HIGH: u32 = 1;
const RESERVED_MEM_CURRENT: u32 = 2;
const RESERVED_MEM_HIGH: u32 = 3;

/// One allocation of a graph.
pub(crate) struct GraphAlloc {
    pub device: u32,
    pub size: usize,
    /// Its fixed address (a `PROT_NONE` reservation of `size` bytes).
    pub base: usize,
    /// Memory is held now (the graph was launched and the allocation not freed since).
    live: AtomicBool,
}

impl Drop for GraphAlloc {
    fn drop(&mut self) {
        release(self);
        // SAFETY: `base` is this allocation's own reservation of `size` bytes, unmapped once.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.size) };
    }
}

static ALLOCS: Mutex<BTreeMap<usize, Arc<GraphAlloc>>> = Mutex::new(BTreeMap::new());
const DEVICES: usize = simgpu_core::MAX_DEVICES as usize;
/// Each device's graph memory pool: (live allocations, reserved from the device = live + cached).
static POOL: Mutex<[Pool; DEVICES]> = Mutex::new([Pool::EMPTY; DEVICES]);

#[derive(Clone, Copy)]
struct Pool {
    used: u64,
    used_high: u64,
    reserved: u64,
    reserved_high: u64,
}

impl Pool {
    const EMPTY: Pool = Pool {
        used: 0,
        used_high: 0,
        reserved: 0,
        reserved_high: 0,
    };
}

/// A new allocation node's allocation on `device`: address space only.
pub(crate) fn new_alloc(device: u32, size: usize) -> Result<Arc<GraphAlloc>, CUerror> {
    if size == 0 {
        return Err(CUerror::INVALID_VALUE);
    }
    // SAFETY: an anonymous PROT_NONE reservation: no memory is touched or committed.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUerror::OUT_OF_MEMORY);
    }
    let a = Arc::new(GraphAlloc {
        device,
        size,
        base: p as usize,
        live: AtomicBool::new(false),
    });
    crate::stream::lock(&ALLOCS).insert(a.base, a.clone());
    Ok(a)
}

/// The graph allocation at `ptr` (its base address), if any.
pub(crate) fn lookup(ptr: u64) -> Option<Arc<GraphAlloc>> {
    crate::stream::lock(&ALLOCS).get(&(ptr as usize)).cloned()
}

/// Returns an allocation's memory to its device's graph memory pool (cached there until
/// `cuDeviceGraphMemTrim`) if it holds any.
pub(crate) fn release(a: &GraphAlloc) {
    if a.live.swap(false, Ordering::AcqRel) {
        let mut pools = crate::stream::lock(&POOL);
        let p = &mut pools[a.device as usize % DEVICES];
        p.used = p.used.saturating_sub(a.size as u64);
    }
}

/// At `cuGraphLaunch`, before anything is enqueued: memory for every allocation of the graph, from
/// the pool's cache first, then from the device.
pub(crate) fn map_for_launch(allocs: &[Arc<GraphAlloc>], auto_free: bool) -> CUresult {
    for a in allocs {
        if a.live.load(Ordering::Acquire) {
            if !auto_free {
                return Err(CUerror::INVALID_VALUE);
            }
            release(a);
        }
    }
    let shared = simgpu_core::shared().map_err(|_| CUerror::NOT_INITIALIZED)?;
    for (i, a) in allocs.iter().enumerate() {
        let mut pools = crate::stream::lock(&POOL);
        let p = &mut pools[a.device as usize % DEVICES];
        let size = a.size as u64;
        let cached = p.reserved.saturating_sub(p.used);
        let more = size.saturating_sub(cached);
        if more > 0 && !shared.try_reserve(a.device, more) {
            drop(pools);
            for b in &allocs[..i] {
                release(b);
            }
            simgpu_core::trace(format_args!(
                "  graph launch: out of memory for a {} byte graph allocation",
                a.size
            ));
            return Err(CUerror::OUT_OF_MEMORY);
        }
        a.live.store(true, Ordering::Release);
        p.reserved += more;
        p.used += size;
        p.used_high = p.used_high.max(p.used);
        p.reserved_high = p.reserved_high.max(p.reserved);
    }
    Ok(())
}

/// A `cuMemAllocAsync` on a capturing stream: an allocation node of the capture's graph.
pub(crate) fn captured_alloc(c: &Capture, device: u32, size: usize) -> Result<u64, CUerror> {
    let a = new_alloc(device, size)?;
    let base = a.base as u64;
    c.add(NodeKind::MemAlloc(a))?;
    Ok(base)
}

/// A `cuMemFreeAsync` of a graph allocation: a free node if the stream captures, otherwise the
/// memory is returned in stream order.
pub(crate) fn free_async(a: Arc<GraphAlloc>, s: &Arc<crate::stream::Stream>) -> CUresult {
    if let Some(c) = s.capture() {
        return c.add(NodeKind::MemFree(a));
    }
    crate::stream::enqueue(s, Box::new(move || release(&a)))
}

pub(crate) fn params_of(a: &GraphAlloc, p: &mut MemAllocNodeParams) {
    p.bytesize = a.size;
    p.dptr = a.base as u64;
}

// ---- exports ----

/// Node creation lives in graph.rs (it owns graphs); these are the device-level queries.
fn graph_mem_attribute(dev: CUdevice, attr: u32, value: *mut u64, set: bool) -> CUresult {
    crate::entry::initialized()?;
    let d = crate::device::physical(dev)? as usize % DEVICES;
    if value.is_null() {
        return Err(CUerror::INVALID_VALUE);
    }
    let mut pools = crate::stream::lock(&POOL);
    let p = &mut pools[d];
    if set {
        // Only the high-water marks can be set, and only to 0 (reset to the current value).
        // SAFETY: non-NULL; a `cuuint64_t` per the API.
        if unsafe { *value } != 0 {
            return Err(CUerror::INVALID_VALUE);
        }
        match attr {
            USED_MEM_HIGH => p.used_high = p.used,
            RESERVED_MEM_HIGH => p.reserved_high = p.reserved,
            _ => return Err(CUerror::INVALID_VALUE),
        }
        return Ok(());
    }
    let v = match attr {
        USED_MEM_CURRENT => p.used,
        USED_MEM_HIGH => p.used_high,
        RESERVED_MEM_CURRENT => p.reserved,
        RESERVED_MEM_HIGH => p.reserved_high,
        _ => return Err(CUerror::INVALID_VALUE),
    };
    // SAFETY: non-NULL; a `cuuint64_t` per the API.
    unsafe { *value = v };
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetGraphMemAttribute(
    dev: CUdevice,
    attr: std::ffi::c_uint,
    value: *mut u64,
) -> CUresult {
    crate::call("cuDeviceGetGraphMemAttribute", || {
        graph_mem_attribute(dev, attr, value, false)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceSetGraphMemAttribute(
    dev: CUdevice,
    attr: std::ffi::c_uint,
    value: *mut u64,
) -> CUresult {
    crate::call("cuDeviceSetGraphMemAttribute", || {
        graph_mem_attribute(dev, attr, value, true)
    })
}

/// Gives the pool's cache back to the device: what is reserved beyond the live allocations.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGraphMemTrim(dev: CUdevice) -> CUresult {
    crate::call("cuDeviceGraphMemTrim", || {
        crate::entry::initialized()?;
        let device = crate::device::physical(dev)?;
        let mut pools = crate::stream::lock(&POOL);
        let p = &mut pools[device as usize % DEVICES];
        let cached = p.reserved.saturating_sub(p.used);
        if cached > 0 {
            if let Ok(s) = simgpu_core::shared() {
                s.release(device, cached);
            }
            p.reserved = p.used;
        }
        Ok(())
    })
}

/// The device an allocation node's pool properties name (a device location is required).
pub(crate) fn node_device(p: &MemAllocNodeParams) -> Result<u32, CUerror> {
    if p.pool_props.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
        return Err(CUerror::INVALID_VALUE);
    }
    crate::device::physical(p.pool_props.location.id)
}
