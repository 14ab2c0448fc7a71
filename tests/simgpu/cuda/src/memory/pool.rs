//! Stream-ordered memory: pools and their attributes, cuMemAllocAsync and cuMemFreeAsync.

use super::pointer::put;
use super::*;

/// A stream-ordered memory pool (the device's default one or one from cuMemPoolCreate).
pub(super) struct Pool {
    pub(super) device: u32,
    pub(super) release_threshold: u64,
    pub(super) max_size: usize,
    pub(super) reserved: u64,
    pub(super) reserved_high: u64,
    pub(super) used: u64,
    pub(super) used_high: u64,
    /// Freed blocks still reserved by the pool: (address, span).
    pub(super) idle: Vec<(usize, usize)>,
    /// Blocks freed on a stream whose free has not run yet: (address, span, stream id). As with the
    /// real driver, a later allocation on the same stream may reuse them at once (stream order makes
    /// it safe); other streams wait until the free has run.
    pub(super) pending: Vec<(usize, usize, u64)>,
    pub(super) follow_event_deps: i32,
    pub(super) allow_opportunistic: i32,
    pub(super) allow_internal_deps: i32,
}

impl Pool {
    pub(super) fn new(device: u32, max_size: usize) -> Pool {
        Pool {
            device,
            release_threshold: 0,
            max_size,
            reserved: 0,
            reserved_high: 0,
            used: 0,
            used_high: 0,
            idle: Vec::new(),
            pending: Vec::new(),
            follow_event_deps: 1,
            allow_opportunistic: 1,
            allow_internal_deps: 1,
        }
    }
}

fn pool_handle(pool: CUmemoryPool) -> Result<usize, CUerror> {
    let h = pool as usize;
    if mem().pools.contains_key(&h) {
        Ok(h)
    } else {
        Err(CUerror::INVALID_VALUE)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: Option<&mut CUmemoryPool>,
    props: Option<&CUmemPoolProps>,
) -> CUresult {
    crate::call("cuMemPoolCreate", || {
        crate::entry::initialized()?;
        let (pool, props) = (crate::out(pool)?, props.ok_or(CUerror::INVALID_VALUE)?);
        if props.allocType != CU_MEM_ALLOCATION_TYPE_PINNED
            || props.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE
        {
            return Err(CUerror::INVALID_VALUE);
        }
        let device =
            crate::device::physical(props.location.id).map_err(|_| CUerror::INVALID_VALUE)?;
        let h = new_pool_handle();
        mem().pools.insert(h, Pool::new(device, props.maxSize));
        *pool = h as CUmemoryPool;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    crate::call("cuMemPoolDestroy", || {
        crate::entry::initialized()?;
        let h = pool_handle(pool)?;
        let mut m = mem();
        if m.default_pools.values().any(|&d| d == h) {
            return Err(CUerror::INVALID_VALUE);
        }
        m.current_pools.retain(|_, c| *c != h);
        // Frees still in flight: their blocks go back with the pool (the driver releases them
        // once nothing is outstanding).
        if let Some(p) = m.pools.get_mut(&h) {
            let pending = std::mem::take(&mut p.pending);
            p.idle
                .extend(pending.into_iter().map(|(at, span, _)| (at, span)));
        }
        m.trim(h, 0);
        // Blocks still allocated from it are returned when freed (the pool is gone).
        m.pools.remove(&h);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CUresult {
    crate::call("cuMemPoolTrimTo", || {
        crate::entry::initialized()?;
        let h = pool_handle(pool)?;
        mem().trim(h, keep as u64);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    attr: c_uint,
    value: *mut c_void,
) -> CUresult {
    crate::call("cuMemPoolSetAttribute", || {
        crate::entry::initialized()?;
        let h = pool_handle(pool)?;
        if value.is_null() {
            return Err(CUerror::INVALID_VALUE);
        }
        let mut m = mem();
        let p = m.pools.get_mut(&h).ok_or(CUerror::INVALID_VALUE)?;
        // SAFETY: (all reads) the client passes a value of the attribute's documented type.
        unsafe {
            match attr {
                CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES => {
                    p.follow_event_deps = *value.cast::<i32>()
                }
                CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC => {
                    p.allow_opportunistic = *value.cast::<i32>()
                }
                CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                    p.allow_internal_deps = *value.cast::<i32>()
                }
                CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => p.release_threshold = *value.cast::<u64>(),
                // The high-water marks can only be reset (to 0 -> the current value).
                CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH if *value.cast::<u64>() == 0 => {
                    p.reserved_high = p.reserved
                }
                CU_MEMPOOL_ATTR_USED_MEM_HIGH if *value.cast::<u64>() == 0 => p.used_high = p.used,
                _ => return Err(CUerror::INVALID_VALUE),
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: CUmemoryPool,
    attr: c_uint,
    value: *mut c_void,
) -> CUresult {
    crate::call("cuMemPoolGetAttribute", || {
        crate::entry::initialized()?;
        let h = pool_handle(pool)?;
        if value.is_null() {
            return Err(CUerror::INVALID_VALUE);
        }
        let m = mem();
        let p = m.pools.get(&h).ok_or(CUerror::INVALID_VALUE)?;
        // SAFETY: (all writes) the client passes storage of the attribute's documented type.
        unsafe {
            match attr {
                CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES => put(value, p.follow_event_deps),
                CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC => put(value, p.allow_opportunistic),
                CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                    put(value, p.allow_internal_deps)
                }
                CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => put(value, p.release_threshold),
                // SIMGPU_POOL_ATTRIBUTES_ZERO: a driver whose pool figures cannot be trusted.
                CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT
                | CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH
                | CU_MEMPOOL_ATTR_USED_MEM_CURRENT
                | CU_MEMPOOL_ATTR_USED_MEM_HIGH
                    if simgpu_core::config().pool_attributes_zero =>
                {
                    put(value, 0u64)
                }
                CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => put(value, p.reserved),
                CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => put(value, p.reserved_high),
                CU_MEMPOOL_ATTR_USED_MEM_CURRENT => put(value, p.used),
                CU_MEMPOOL_ATTR_USED_MEM_HIGH => put(value, p.used_high),
                CU_MEMPOOL_ATTR_ALLOCATION_TYPE => put(value, CU_MEM_ALLOCATION_TYPE_PINNED),
                CU_MEMPOOL_ATTR_EXPORT_HANDLE_TYPES => put(value, CU_MEM_HANDLE_TYPE_NONE),
                CU_MEMPOOL_ATTR_LOCATION_ID => put(value, crate::device::visible_ordinal(p.device)),
                CU_MEMPOOL_ATTR_LOCATION_TYPE => put(value, CU_MEM_LOCATION_TYPE_DEVICE),
                CU_MEMPOOL_ATTR_MAX_POOL_SIZE => put(value, p.max_size as u64),
                _ => return Err(CUerror::INVALID_VALUE),
            }
        }
        Ok(())
    })
}

/// Allocates from `pool` (NULL: the device's current pool) at call time; the stream is validated
/// and the pointer is usable in stream order (it already is, so nothing is enqueued).
fn alloc_async(
    dptr: Option<&mut CUdeviceptr>,
    size: usize,
    pool: Option<CUmemoryPool>,
    stream: CUstream,
    per_thread: bool,
) -> CUresult {
    crate::context::current()?;
    let dptr = crate::out(dptr)?;
    let s = crate::stream::resolve(stream, per_thread)?;
    if size == 0 {
        return Err(CUerror::INVALID_VALUE);
    }
    // NVIDIA's cuMemAllocAsync: the memory comes from "the current mempool of the provided stream's
    // device", which need not be the current context's.
    let ctx = s.context()?;
    if let Some(c) = s.capture() {
        // Captured: an allocation node, with no memory until the graph is launched.
        *dptr = crate::graph_memory::captured_alloc(&c, s.device(), size)? as CUdeviceptr;
        return Ok(());
    }
    let mut m = mem();
    let h = match pool {
        Some(p) => {
            let h = p as usize;
            if !m.pools.contains_key(&h) {
                return Err(CUerror::INVALID_VALUE);
            }
            h
        }
        None => m.current_pool(s.device()),
    };
    *dptr = m.pool_alloc(&ctx, h, size, s.id())? as CUdeviceptr;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: Option<&mut CUdeviceptr>,
    size: usize,
    stream: CUstream,
) -> CUresult {
    crate::call("cuMemAllocAsync", || {
        alloc_async(dptr, size, None, stream, false)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: Option<&mut CUdeviceptr>,
    size: usize,
    stream: CUstream,
) -> CUresult {
    crate::call("cuMemAllocAsync_ptsz", || {
        alloc_async(dptr, size, None, stream, true)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: Option<&mut CUdeviceptr>,
    size: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    crate::call("cuMemAllocFromPoolAsync", || {
        alloc_async(dptr, size, Some(pool), stream, false)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: Option<&mut CUdeviceptr>,
    size: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    crate::call("cuMemAllocFromPoolAsync_ptsz", || {
        alloc_async(dptr, size, Some(pool), stream, true)
    })
}

fn free_async(ptr: CUdeviceptr, stream: CUstream, per_thread: bool) -> CUresult {
    crate::context::current()?;
    let s = crate::stream::resolve(stream, per_thread)?;
    if let Some(a) = crate::graph_memory::lookup(ptr) {
        return crate::graph_memory::free_async(a, &s);
    }
    let base = ptr as usize;
    {
        let mut m = mem();
        let pool = match m.allocs.get_mut(&base) {
            Some(a)
                if !a.freeing && matches!(a.kind, Kind::Device | Kind::Managed | Kind::Pool(_)) =>
            {
                a.freeing = true;
                match a.kind {
                    Kind::Pool(h) => Some((h, a.span)),
                    _ => None,
                }
            }
            _ => return Err(CUerror::INVALID_VALUE),
        };
        if let Some((h, span)) = pool {
            // The block is the pool's again for this stream at once, for every stream once the
            // free has run (see `Pool::pending`).
            if m.pools.contains_key(&h) {
                m.allocs.remove(&base);
                let p = m.pools.get_mut(&h).expect("present");
                p.used -= span as u64;
                p.pending.push((base, span, s.id()));
                drop(m);
                return crate::stream::enqueue(
                    &s,
                    Box::new(move || {
                        let mut m = mem();
                        if let Some(p) = m.pools.get_mut(&h) {
                            // What is left of the block (the stream may have reused part of it
                            // meanwhile: see `pool_alloc`) is every stream's now.
                            let freed = base..base + span;
                            let mut done = Vec::new();
                            p.pending.retain(|b| {
                                let ran = freed.contains(&b.0);
                                if ran {
                                    done.push((b.0, b.1));
                                }
                                !ran
                            });
                            p.idle.extend(done);
                        }
                    }),
                );
            }
        }
    }
    crate::stream::enqueue(&s, Box::new(move || mem().free(base)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(ptr: CUdeviceptr, stream: CUstream) -> CUresult {
    crate::call("cuMemFreeAsync", || free_async(ptr, stream, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(ptr: CUdeviceptr, stream: CUstream) -> CUresult {
    crate::call("cuMemFreeAsync_ptsz", || free_async(ptr, stream, true))
}
