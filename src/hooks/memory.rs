//! Device-memory hooks: every path that allocates device memory is charged to the tenant's quota before
//! the driver is called, and every free returns what was charged.
//!
//! Counted: cuMemAlloc (both ABIs), cuMemAllocPitch (the pitch x height really reserved), cuMemAllocManaged,
//! stream-ordered allocation (charged as what the pool holds: a freed block stays in the pool, and
//! counts, until the driver trims it), arrays and mipmapped arrays (estimated, see
//! `accounting::sizes::array_bytes`). VMM physical allocations: `vmm.rs`.

use super::{hooks, In, Out, Word};
use crate::accounting::sizes::{array_bytes, Pitch};
use crate::accounting::{allocation_size, tenant, Device, FreedOn, PoolRequest, Tenant};
use crate::driver::calls as driver;
use crate::scheduling::host_wait;
use gpuslice_api::types::{
    CUDA_ARRAY3D_DESCRIPTOR_v1, CUDA_ARRAY_DESCRIPTOR_v1, CUarray, CUdeviceptr, CUevent,
    CUmemPoolProps, CUmemoryPool, CUmipmappedArray, CUstream, CUDA_ARRAY3D_DESCRIPTOR,
    CUDA_ARRAY_DESCRIPTOR,
};
use gpuslice_api::{CUerror, CUresult};
use std::ffi::c_uint;

hooks! {
    ret = CUresult;
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize)
        => alloc(Out::new(dptr), bytesize as u64, "cuMemAlloc", || real::cuMemAlloc_v2(dptr, bytesize));
    fn cuMemAlloc(dptr: *mut c_uint, bytesize: c_uint)
        => alloc(Out::new(dptr), bytesize as u64, "cuMemAlloc", || real::cuMemAlloc(dptr, bytesize));
    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint)
        => alloc(Out::new(dptr), bytesize as u64, "cuMemAllocManaged", || real::cuMemAllocManaged(dptr, bytesize, flags));
    fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, element: c_uint)
        => alloc_pitch(Out::new(dptr), Out::new(pitch), width as u64, height as u64, element,
                       || real::cuMemAllocPitch_v2(dptr, pitch, width, height, element),
                       |p| real::cuMemFree_v2(p));
    fn cuMemAllocPitch(dptr: *mut c_uint, pitch: *mut c_uint, width: c_uint, height: c_uint, element: c_uint)
        => alloc_pitch(Out::new(dptr), Out::new(pitch), width as u64, height as u64, element,
                       || real::cuMemAllocPitch(dptr, pitch, width, height, element),
                       |p| real::cuMemFree(p as c_uint));
    fn cuMemFree_v2(dptr: CUdeviceptr) => free(dptr, || real::cuMemFree_v2(dptr));
    fn cuMemFree(dptr: c_uint) => free(dptr as u64, || real::cuMemFree(dptr));

    fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream)
        => from_pool(Out::new(dptr), pool_request(bytesize, stream, false, None),
                     || real::cuMemAllocAsync(dptr, bytesize, stream), |p| real::cuMemFreeAsync(p, stream));
    fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream)
        => from_pool(Out::new(dptr), pool_request(bytesize, stream, true, None),
                     || real::cuMemAllocAsync_ptsz(dptr, bytesize, stream), |p| real::cuMemFreeAsync_ptsz(p, stream));
    fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream)
        => from_pool(Out::new(dptr), pool_request(bytesize, stream, false, Some(pool)),
                     || real::cuMemAllocFromPoolAsync(dptr, bytesize, pool, stream), |p| real::cuMemFreeAsync(p, stream));
    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream)
        => from_pool(Out::new(dptr), pool_request(bytesize, stream, true, Some(pool)),
                     || real::cuMemAllocFromPoolAsync_ptsz(dptr, bytesize, pool, stream), |p| real::cuMemFreeAsync_ptsz(p, stream));
    fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) => free_on(dptr, stream, false, || real::cuMemFreeAsync(dptr, stream));
    fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) => free_on(dptr, stream, true, || real::cuMemFreeAsync_ptsz(dptr, stream));
    fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps)
        => pool_create(Out::new(pool), In::new(props), || real::cuMemPoolCreate(pool, props));
    fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) => settle_after(|| real::cuMemPoolTrimTo(pool, keep));
    fn cuMemPoolDestroy(pool: CUmemoryPool) => pool_destroy(pool as usize, || real::cuMemPoolDestroy(pool));
    fn cuStreamSynchronize(stream: CUstream) => settle_after(|| real::cuStreamSynchronize(stream));
    fn cuStreamSynchronize_ptsz(stream: CUstream) => settle_after(|| real::cuStreamSynchronize_ptsz(stream));
    fn cuCtxSynchronize() => settle_after(|| real::cuCtxSynchronize());
    // Waiting for an event behind queued work is waiting for that work: the process still wants
    // the device (`host_wait`). Nothing is settled: only the work before the event is known done.
    fn cuEventSynchronize(event: CUevent) => host_wait(|| real::cuEventSynchronize(event));

    fn cuArrayCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR)
        => array_create(Out::new(handle), In::new(desc).get().map(|d| array_bytes(d.Width as u64, d.Height as u64, 0, d.Format, d.NumChannels, 1)),
                        || real::cuArrayCreate_v2(handle, desc));
    fn cuArrayCreate(handle: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR_v1)
        => array_create(Out::new(handle), In::new(desc).get().map(|d| array_bytes(d.Width as u64, d.Height as u64, 0, d.Format, d.NumChannels, 1)),
                        || real::cuArrayCreate(handle, desc));
    fn cuArray3DCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR)
        => array_create(Out::new(handle), In::new(desc).get().map(|d| array_bytes(d.Width as u64, d.Height as u64, d.Depth as u64, d.Format, d.NumChannels, 1)),
                        || real::cuArray3DCreate_v2(handle, desc));
    fn cuArray3DCreate(handle: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR_v1)
        => array_create(Out::new(handle), In::new(desc).get().map(|d| array_bytes(d.Width as u64, d.Height as u64, d.Depth as u64, d.Format, d.NumChannels, 1)),
                        || real::cuArray3DCreate(handle, desc));
    fn cuArrayDestroy(handle: CUarray) => array_destroy(handle as usize, || real::cuArrayDestroy(handle));
    fn cuMipmappedArrayCreate(handle: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint)
        => array_create(Out::new(handle), In::new(desc).get().map(|d| array_bytes(d.Width as u64, d.Height as u64, d.Depth as u64, d.Format, d.NumChannels, levels.max(1))),
                        || real::cuMipmappedArrayCreate(handle, desc, levels));
    fn cuMipmappedArrayDestroy(handle: CUmipmappedArray) => array_destroy(handle as usize, || real::cuMipmappedArrayDestroy(handle));
}

/// The tenant and the current context's device, or `None` when quotas do not apply.
#[inline]
fn on_current_device() -> Result<Option<(&'static Tenant, &'static Device)>, CUerror> {
    let Some(t) = tenant() else { return Ok(None) };
    Ok(Some((t, t.current_device()?)))
}

/// Inlined into the hook, as everything on the way to a driver call (`hooks::slow`).
#[inline(always)]
fn alloc<P: Word>(
    dptr: Out<P>,
    bytes: u64,
    what: &str,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    // No context, no tenant: the driver answers (and reports its own error).
    let Ok(Some((t, device))) = on_current_device() else {
        return call();
    };
    if dptr.is_null() {
        return call();
    }
    t.charged(device, allocation_size(bytes), what, || {
        call()?;
        Ok(dptr.get().map_or(0, Word::to_u64))
    })
}

fn alloc_pitch<P: Word, Q: Word>(
    dptr: Out<P>,
    pitch: Out<Q>,
    width: u64,
    height: u64,
    element: c_uint,
    call: impl FnOnce() -> CUresult,
    free: impl FnOnce(u64) -> CUresult,
) -> CUresult {
    let Ok(Some((t, device))) = on_current_device() else {
        return call();
    };
    if dptr.is_null() || pitch.is_null() {
        return call();
    }
    let request = Pitch {
        width,
        height,
        element,
    };
    t.alloc_pitch(
        device,
        request,
        || {
            call()?;
            Ok((
                dptr.get().map_or(0, Word::to_u64),
                pitch.get().map(Word::to_u64),
            ))
        },
        free,
    )
}

#[inline(always)]
fn free(dptr: CUdeviceptr, call: impl FnOnce() -> CUresult) -> CUresult {
    match tenant() {
        Some(t) => t.uncharge(dptr, call),
        None => call(),
    }
}

/// A free enqueued on `stream` (`per_thread`: through a `_ptsz` entry point).
fn free_on(
    dptr: CUdeviceptr,
    stream: CUstream,
    per_thread: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    match tenant() {
        // Captured, the free is a node of the graph being made: it frees when that graph runs
        // (accounting::graphs), not now.
        Some(_) if driver::capturing(stream, per_thread) => call(),
        Some(t) => t.uncharge_on(
            dptr,
            Some(FreedOn {
                stream: stream as usize,
                per_thread,
            }),
            call,
        ),
        None => call(),
    }
}

fn pool_request(
    bytes: usize,
    stream: CUstream,
    per_thread: bool,
    pool: Option<CUmemoryPool>,
) -> PoolRequest {
    PoolRequest {
        bytes: bytes as u64,
        stream: stream as usize,
        per_thread,
        pool: pool.map(|p| p as usize),
    }
}

/// A stream-ordered allocation (`accounting::pool_alloc`).
fn from_pool(
    dptr: Out<CUdeviceptr>,
    request: PoolRequest,
    call: impl FnOnce() -> CUresult,
    free: impl FnOnce(CUdeviceptr) -> CUresult,
) -> CUresult {
    match tenant() {
        Some(t) if !dptr.is_null() => t.alloc_from_pool(
            request,
            || {
                call()?;
                Ok(dptr.get().unwrap_or(0))
            },
            free,
        ),
        _ => call(),
    }
}

fn settle_after(call: impl FnOnce() -> CUresult) -> CUresult {
    host_wait(call)?;
    if let Some(t) = tenant() {
        t.synchronized();
    }
    Ok(())
}

fn pool_create(
    pool: Out<CUmemoryPool>,
    props: In<CUmemPoolProps>,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    call()?;
    if let (Some(t), Some(pool), Some(props)) = (tenant(), pool.get(), props.get()) {
        t.pool_created(pool as usize, props.location);
    }
    Ok(())
}

fn pool_destroy(pool: usize, call: impl FnOnce() -> CUresult) -> CUresult {
    call()?;
    if let Some(t) = tenant() {
        t.forget_pool(pool);
    }
    Ok(())
}

fn array_create<H>(
    handle: Out<*mut H>,
    bytes: Option<u64>,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Ok(Some((t, device))) = on_current_device() else {
        return call();
    };
    let (Some(bytes), false) = (bytes, handle.is_null()) else {
        return call();
    };
    let reservation = t.reserve(device, bytes, "array creation")?;
    call()?;
    if let Some(h) = handle.get() {
        t.record_array(h as usize, reservation.commit(), t.current_context());
    }
    Ok(())
}

fn array_destroy(handle: usize, call: impl FnOnce() -> CUresult) -> CUresult {
    call()?;
    if let Some(t) = tenant() {
        t.forget_array(handle);
    }
    Ok(())
}
