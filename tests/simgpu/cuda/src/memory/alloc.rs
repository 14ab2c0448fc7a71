//! The cuMemAlloc family: allocation, free, and what cuMemGetInfo and cuMemGetAddressRange answer.

use super::*;

fn mem_alloc(dptr: Option<&mut CUdeviceptr>, size: usize, kind: Kind) -> CUresult {
    let ctx = crate::context::current()?;
    let dptr = crate::out(dptr)?;
    if size == 0 {
        return Err(CUerror::INVALID_VALUE);
    }
    let span = round_up(size, ALIGN).ok_or(CUerror::OUT_OF_MEMORY)?;
    *dptr = mem().alloc(&ctx, size, span, ALIGN, kind)? as CUdeviceptr;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: Option<&mut CUdeviceptr>, size: usize) -> CUresult {
    crate::call("cuMemAlloc_v2", || {
        // Not stream-ordered: prohibited while a capture is going on (see graph.rs).
        crate::graph::check_unsafe_call()?;
        mem_alloc(dptr, size, Kind::Device)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc(dptr: Option<&mut u32>, size: c_uint) -> CUresult {
    crate::call("cuMemAlloc", || {
        let dptr = crate::out(dptr)?;
        let mut p: CUdeviceptr = 0;
        mem_alloc(Some(&mut p), size as usize, Kind::Device)?;
        // The 32-bit API cannot name a 64-bit address: undo and fail as an old driver would.
        match u32::try_from(p) {
            Ok(v) => {
                *dptr = v;
                Ok(())
            }
            Err(_) => {
                mem().free(p as usize);
                Err(CUerror::OUT_OF_MEMORY)
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: Option<&mut CUdeviceptr>,
    size: usize,
    flags: c_uint,
) -> CUresult {
    crate::call("cuMemAllocManaged", || {
        if flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST {
            return Err(CUerror::INVALID_VALUE);
        }
        // Counted as device memory: simgpu has no host/device migration.
        mem_alloc(dptr, size, Kind::Managed)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: Option<&mut CUdeviceptr>,
    pitch: Option<&mut usize>,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    crate::call("cuMemAllocPitch_v2", || {
        let ctx = crate::context::current()?;
        let (dptr, pitch) = (crate::out(dptr)?, crate::out(pitch)?);
        if !matches!(element_size, 4 | 8 | 16) || width == 0 || height == 0 {
            return Err(CUerror::INVALID_VALUE);
        }
        let row = round_up(width, PITCH_ALIGN).ok_or(CUerror::INVALID_VALUE)?;
        let size = row.checked_mul(height).ok_or(CUerror::OUT_OF_MEMORY)?;
        let span = round_up(size, ALIGN).ok_or(CUerror::OUT_OF_MEMORY)?;
        *dptr = mem().alloc(&ctx, size, span, ALIGN, Kind::Device)? as CUdeviceptr;
        *pitch = row;
        Ok(())
    })
}

fn mem_free(ptr: CUdeviceptr) -> CUresult {
    crate::context::current()?;
    if ptr == 0 {
        return Ok(());
    }
    // Freeing waits for the device, as the real cuMemFree does.
    if let Ok(s) = crate::stream::resolve(std::ptr::null_mut(), false) {
        let _ = crate::stream::synchronize(&s);
    }
    let mut m = mem();
    match m.allocs.get(&(ptr as usize)) {
        Some(a) if !a.freeing && matches!(a.kind, Kind::Device | Kind::Managed | Kind::Pool(_)) => {
            m.free(ptr as usize);
            Ok(())
        }
        _ => Err(CUerror::INVALID_VALUE),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(ptr: CUdeviceptr) -> CUresult {
    crate::call("cuMemFree_v2", || {
        crate::graph::check_unsafe_call()?;
        if let Some(a) = crate::graph_memory::lookup(ptr) {
            crate::graph_memory::release(&a);
            return Ok(());
        }
        mem_free(ptr)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree(ptr: u32) -> CUresult {
    crate::call("cuMemFree", || mem_free(ptr as CUdeviceptr))
}

/// The current context's device: (free, total).
fn mem_info() -> Result<(u64, u64), CUerror> {
    let ctx = crate::context::current()?;
    let s = shared()?;
    let cap = s.device_capacity(ctx.device);
    Ok((cap.saturating_sub(s.device_used(ctx.device)), cap))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(
    free: Option<&mut usize>,
    total: Option<&mut usize>,
) -> CUresult {
    crate::call("cuMemGetInfo_v2", || {
        let (free, total) = (crate::out(free)?, crate::out(total)?);
        let (f, t) = mem_info()?;
        (*free, *total) = (f as usize, t as usize);
        Ok(())
    })
}

/// The legacy 32-bit entry point (what a binary built against CUDA < 3.2 calls, and what
/// `cuGetProcAddress("cuMemGetInfo", ..., version < 3020)` returns): saturates rather than wrapping,
/// as `cuDeviceTotalMem` does.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo(free: Option<&mut u32>, total: Option<&mut u32>) -> CUresult {
    crate::call("cuMemGetInfo", || {
        let (free, total) = (crate::out(free)?, crate::out(total)?);
        let (f, t) = mem_info()?;
        let narrow = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        (*free, *total) = (narrow(f), narrow(t));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: Option<&mut CUdeviceptr>,
    size: Option<&mut usize>,
    ptr: CUdeviceptr,
) -> CUresult {
    crate::call("cuMemGetAddressRange_v2", || {
        crate::context::current()?;
        let m = mem();
        let (b, s) = match m.find(ptr as usize) {
            Some((b, a)) => (b, a.size),
            None => {
                let (&b, map) = m
                    .mappings
                    .range(..=ptr as usize)
                    .next_back()
                    .ok_or(CUerror::NOT_FOUND)?;
                if ptr as usize >= b + map.size {
                    return Err(CUerror::NOT_FOUND);
                }
                (b, map.size)
            }
        };
        if let Some(base) = base {
            *base = b as CUdeviceptr;
        }
        if let Some(size) = size {
            *size = s;
        }
        Ok(())
    })
}
