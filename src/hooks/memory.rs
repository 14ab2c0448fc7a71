//! Device-memory hooks: every path that allocates device memory is charged to the tenant's quota before
//! the driver is called, and every free returns what was charged.
//!
//! Counted: cuMemAlloc (both ABIs), cuMemAllocPitch (the pitch x height really reserved), cuMemAllocManaged,
//! stream-ordered allocation (charged as what the pool holds: a freed block stays in the pool, and
//! counts, until the driver trims it), VMM physical allocations (cuMemCreate counts once however often
//! mapped; returned when released and unmapped), arrays and mipmapped arrays (estimated, see
//! `array_bytes`).

use super::{hooks, In, Out, Word};
use crate::accounting::{allocation_size, tenant, Device, FreedOn, PendingFree, Tenant};
use crate::driver::calls as driver;
use gpuslice_api::types::{
    CUDA_ARRAY3D_DESCRIPTOR_v1, CUDA_ARRAY_DESCRIPTOR_v1, CUarray, CUdeviceptr,
    CUmemAllocationProp, CUmemGenericAllocationHandle, CUmemPoolProps, CUmemoryPool,
    CUmipmappedArray, CUstream, CUDA_ARRAY3D_DESCRIPTOR, CUDA_ARRAY_DESCRIPTOR,
    CU_MEM_LOCATION_TYPE_DEVICE,
};
use gpuslice_api::{CUerror, CUresult};
use parking_lot::ReentrantMutexGuard;
use std::ffi::c_uint;
use std::sync::atomic::{AtomicBool, Ordering};

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
        => alloc_from_pool(Out::new(dptr), bytesize as u64, stream, None, || driver::capturing(stream, false), || real::cuMemAllocAsync(dptr, bytesize, stream),
                           |p| real::cuMemFreeAsync(p, stream), || real::cuStreamSynchronize(stream));
    fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream)
        => alloc_from_pool(Out::new(dptr), bytesize as u64, stream, None, || driver::capturing(stream, true), || real::cuMemAllocAsync_ptsz(dptr, bytesize, stream),
                           |p| real::cuMemFreeAsync_ptsz(p, stream), || real::cuStreamSynchronize_ptsz(stream));
    fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream)
        => alloc_from_pool(Out::new(dptr), bytesize as u64, stream, Some(pool as usize), || driver::capturing(stream, false),
                           || real::cuMemAllocFromPoolAsync(dptr, bytesize, pool, stream),
                           |p| real::cuMemFreeAsync(p, stream), || real::cuStreamSynchronize(stream));
    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream)
        => alloc_from_pool(Out::new(dptr), bytesize as u64, stream, Some(pool as usize), || driver::capturing(stream, true),
                           || real::cuMemAllocFromPoolAsync_ptsz(dptr, bytesize, pool, stream),
                           |p| real::cuMemFreeAsync_ptsz(p, stream), || real::cuStreamSynchronize_ptsz(stream));
    fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) => free_on(dptr, stream, false, || real::cuMemFreeAsync(dptr, stream));
    fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) => free_on(dptr, stream, true, || real::cuMemFreeAsync_ptsz(dptr, stream));
    fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps)
        => pool_create(Out::new(pool), In::new(props), || real::cuMemPoolCreate(pool, props));
    fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) => settle_after(|| real::cuMemPoolTrimTo(pool, keep));
    fn cuMemPoolDestroy(pool: CUmemoryPool) => pool_destroy(pool as usize, || real::cuMemPoolDestroy(pool));
    fn cuStreamSynchronize(stream: CUstream) => settle_after(|| real::cuStreamSynchronize(stream));
    fn cuStreamSynchronize_ptsz(stream: CUstream) => settle_after(|| real::cuStreamSynchronize_ptsz(stream));
    fn cuCtxSynchronize() => settle_after(|| real::cuCtxSynchronize());

    fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64)
        => mem_create(Out::new(handle), size as u64, In::new(prop), || real::cuMemCreate(handle, size, prop, flags));
    fn cuMemRelease(handle: CUmemGenericAllocationHandle) => mem_release(handle, || real::cuMemRelease(handle));
    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64)
        => mem_map(ptr, size as u64, handle, || real::cuMemMap(ptr, size, offset, handle, flags));
    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) => mem_unmap(ptr, size as u64, || real::cuMemUnmap(ptr, size));

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
    if !matches!(element, 4 | 8 | 16) || width == 0 || height == 0 {
        // Arguments the documentation says the driver refuses (an element size other than 4, 8
        // or 16 bytes, an empty extent): its own error, not a quota refusal. Should a driver
        // allocate anyway, the allocation is charged afterwards, or freed.
        call()?;
        let key = dptr.get().map_or(0, Word::to_u64);
        let bytes = pitch.get().map_or(0, Word::to_u64).saturating_mul(height);
        return t
            .charged(device, bytes, "cuMemAllocPitch", || Ok(key))
            .inspect_err(|_| {
                let _ = free(key);
            });
    }
    // Before the call the pitch is not known: charge the width rounded to the usual 512-byte pitch
    // alignment, then settle on pitch x height.
    let estimate = width
        .div_ceil(512)
        .saturating_mul(512)
        .saturating_mul(height);
    let mut key = 0;
    t.charged(device, estimate, "cuMemAllocPitch", || {
        call()?;
        key = dptr.get().map_or(0, Word::to_u64);
        Ok(key)
    })?;
    let real_bytes = pitch
        .get()
        .map_or(estimate, Word::to_u64)
        .saturating_mul(height);
    if let Err(e) = t.recharge(key, device, real_bytes, "cuMemAllocPitch") {
        // Over quota once the real pitch is known: undo the allocation.
        let _ = t.uncharge(key, || free(key));
        return Err(e);
    }
    Ok(())
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

/// Waits for the frees enqueued on other streams since `pool` was last trimmed: a pool whose
/// figures are not believed is then trimmed to its outstanding blocks. Returns the streams waited
/// for; `None` when one cannot be waited for now (another thread's default stream, a stream
/// capturing, a failed wait).
fn wait_for_pending_frees(t: &Tenant, pool: usize) -> Option<Vec<PendingFree>> {
    let pending = t.untrusted_pending_frees(pool);
    let _relaxed = driver::RelaxedCapture::enter();
    for p in &pending {
        let stream = p.stream as CUstream;
        if !p.reachable() || driver::capturing(stream, p.per_thread) {
            return None;
        }
        // SAFETY: a stream handle the program freed on; a destroyed one answers an error.
        let waited = unsafe {
            if p.per_thread {
                real::cuStreamSynchronize_ptsz(stream)
            } else {
                real::cuStreamSynchronize(stream)
            }
        };
        if waited.is_err() {
            // A stream destroyed since: its free runs on its own; refused this time, counted as run
            // the next.
            t.forget_pending_free(pool, *p);
            return None;
        }
    }
    Some(pending)
}

static POOLS_USED: AtomicBool = AtomicBool::new(false);

/// A stream-ordered allocation. Captured into a graph (`capturing`), it allocates nothing now: the
/// graph's memory is allocated at its launch and charged by reconciliation (docs/MEMORY.md).
#[allow(clippy::too_many_arguments)]
fn alloc_from_pool(
    dptr: Out<CUdeviceptr>,
    bytes: u64,
    stream: CUstream,
    pool: Option<usize>,
    capturing: impl FnOnce() -> bool,
    call: impl FnOnce() -> CUresult,
    free: impl FnOnce(CUdeviceptr) -> CUresult,
    sync: impl Fn() -> CUresult,
) -> CUresult {
    let Some(t) = tenant() else { return call() };
    // No context: the driver answers (and reports its own error).
    let Ok(device) = t.stream_device(stream) else {
        return call();
    };
    if capturing() {
        return call();
    }
    let bytes = allocation_size(bytes);
    let Some(pool) = pool.or_else(|| driver::current_pool(device.ordinal)) else {
        // No pool to watch: charge the allocation itself, returned by its free.
        return t.charged(device, bytes, "cuMemAllocAsync", || {
            call()?;
            Ok(dptr.get().unwrap_or(0))
        });
    };
    if dptr.is_null() {
        return call();
    }
    // The memory is the pool's device's, whatever the current context's device.
    let device = match t.pool_place(pool) {
        Some(None) => return call(),
        Some(Some(ordinal)) if ordinal != device.ordinal => t.device(ordinal).unwrap_or(device),
        _ => device,
    };
    let mut serial = t.pool_serial();
    // The pool may grow by the whole request: reserve it before the driver is asked (a block the
    // pool reuses is given back right after). Near the quota, memory the pool holds for blocks
    // already freed on this stream is released first -- the stream is synchronised so that those
    // frees have run, and the pool trimmed to what is in use -- rather than refusing. The
    // synchronisations run without the pool bookkeeping's lock (the process's other stream-ordered
    // allocations must not wait for this stream): what they decide is read again after them.
    let reservation = t.reserve_or_make_room(device, bytes, "cuMemAllocAsync", || {
        if t.pool_untrusted(pool) {
            // Its figures cannot say what trimming would release: trimmed to nothing once every
            // enqueued free has run, it holds only its outstanding blocks.
            let waited = ReentrantMutexGuard::unlocked(&mut serial, || {
                sync().ok()?;
                wait_for_pending_frees(t, pool)
            });
            let Some(waited) = waited else {
                return false;
            };
            // SAFETY: `pool` is the caller's pool handle, valid for this call.
            let _ = unsafe { driver::real::cuMemPoolTrimTo(pool as CUmemoryPool, 0) };
            return t.untrusted_pool_trimmed(pool, &waited);
        }
        let (Some(held), Some(used)) = (driver::pool_reserved(pool), driver::pool_used(pool))
        else {
            return false;
        };
        if held <= used || ReentrantMutexGuard::unlocked(&mut serial, &sync).is_err() {
            return false;
        }
        // Trimming to `used` as read before the synchronisation is safe if another allocation
        // grew the pool since: the driver never releases memory a block holds.
        // SAFETY: `pool` is the caller's pool handle, valid for this call.
        let _ = unsafe { driver::real::cuMemPoolTrimTo(pool as CUmemoryPool, used as usize) };
        let now = driver::pool_reserved(pool);
        let _ = t.pool_now_holds(pool, device.slot.as_ref().copied().unwrap_or(0), now, 0);
        now.is_some_and(|n| n < held)
    })?;
    call()?;
    let charge = reservation.commit();
    POOLS_USED.store(true, Ordering::Relaxed);
    let block = dptr.get().unwrap_or(0);
    t.record_pool_block(pool, charge.device, block, bytes);
    let held = driver::pool_reserved(pool);
    if let Err(refused) = t.pool_now_holds(pool, charge.device, held, charge.bytes) {
        // The pool grew by more than the request (allocation granularity) and the quota has no room
        // for the rest: give the block back, shrink the pool, refuse.
        if t.uncharge(block, || free(block)).is_ok() {
            let _ = ReentrantMutexGuard::unlocked(&mut serial, &sync);
        }
        // Trimming releases only memory no block holds: to 0 when the driver cannot say what is used.
        let used = driver::pool_used(pool).unwrap_or(0);
        // SAFETY: `pool` is the caller's pool handle, valid for this call.
        let _ = unsafe { driver::real::cuMemPoolTrimTo(pool as CUmemoryPool, used as usize) };
        let _ = t.pool_now_holds(pool, charge.device, driver::pool_reserved(pool), 0);
        t.refused(device, bytes, "cuMemAllocAsync", refused);
        return Err(CUerror::OUT_OF_MEMORY);
    }
    Ok(())
}

fn settle_after(call: impl FnOnce() -> CUresult) -> CUresult {
    call()?;
    if let Some(t) = tenant() {
        if POOLS_USED.load(Ordering::Relaxed) {
            t.settle_pools();
        }
        t.release_finished_graph_memory();
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

fn mem_create(
    handle: Out<u64>,
    bytes: u64,
    prop: In<CUmemAllocationProp>,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some(t) = tenant() else { return call() };
    let (device, granularity) = match prop.get() {
        Some(p) if p.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE => {
            (p.location.id, driver::allocation_granularity(&p))
        }
        // Host-located or invalid: not device memory (or the driver rejects it).
        _ => return call(),
    };
    let Ok(device) = t.device(device) else {
        return call();
    };
    if bytes == 0 || granularity.is_some_and(|g| bytes % g != 0) {
        // A size the documentation says the driver refuses (0, or not a multiple of the minimum
        // granularity): the driver answers with its own error (INVALID_VALUE), not a quota
        // refusal. Should a driver accept it anyway, it is charged afterwards, or released.
        return mem_create_unaligned(t, device, handle, bytes, call);
    }
    let reservation = t.reserve(device, bytes, "cuMemCreate")?;
    call()?;
    if let Some(h) = handle.get() {
        t.record_physical(h, reservation.commit());
    }
    Ok(())
}

#[cold]
fn mem_create_unaligned(
    t: &Tenant,
    device: &Device,
    handle: Out<u64>,
    bytes: u64,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    call()?;
    let Some(h) = handle.get() else { return Ok(()) };
    match t.reserve(device, bytes, "cuMemCreate") {
        Ok(reservation) => {
            t.record_physical(h, reservation.commit());
            Ok(())
        }
        Err(e) => {
            // SAFETY: `h` is the handle the driver just created for this call.
            let _ = unsafe { driver::real::cuMemRelease(h) };
            Err(e)
        }
    }
}

fn mem_release(handle: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    call()?;
    if let Some(t) = tenant() {
        t.physical_released(handle);
    }
    Ok(())
}

fn mem_map(ptr: u64, size: u64, handle: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    call()?;
    if let Some(t) = tenant() {
        t.mapped(ptr, size, handle);
    }
    Ok(())
}

fn mem_unmap(ptr: u64, size: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    call()?;
    if let Some(t) = tenant() {
        t.unmapped(ptr, size);
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

/// Bytes per channel element of a `CUarray_format`.
fn format_bytes(format: u32) -> u64 {
    match format {
        0x01 | 0x08 => 1,        // (UN)SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // (UN)SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // (UN)SIGNED_INT32, FLOAT
        _ => 16,                 // packed / block-compressed formats: at most 16 bytes a texel
    }
}

/// The device memory an array takes, estimated from above: texels x bytes, each mipmap level in
/// turn, rounded up to the 2 MiB pages arrays are laid out in. The driver does not report an array's
/// footprint, so the estimate is deliberately not smaller than what a driver lays out.
pub fn array_bytes(
    width: u64,
    height: u64,
    depth: u64,
    format: u32,
    channels: u32,
    levels: u32,
) -> u64 {
    const PAGE: u64 = 2 << 20;
    let texel = format_bytes(format).saturating_mul(u64::from(channels.max(1)));
    let mut total: u64 = 0;
    let (mut w, mut h, mut d) = (width.max(1), height.max(1), depth.max(1));
    for _ in 0..levels.clamp(1, 32) {
        total = total.saturating_add(w.saturating_mul(h).saturating_mul(d).saturating_mul(texel));
        w = (w / 2).max(1);
        h = (h / 2).max(1);
        d = (d / 2).max(1);
    }
    total.div_ceil(PAGE).saturating_mul(PAGE)
}

#[cfg(test)]
mod tests {
    use super::array_bytes;

    #[test]
    fn arrays_round_up_to_pages() {
        assert_eq!(array_bytes(1024, 1024, 0, 0x20, 4, 1), 16 << 20);
        assert_eq!(array_bytes(1, 0, 0, 0x01, 1, 1), 2 << 20);
        // Mipmaps add their levels: 16 MiB + 4 MiB + 1 MiB + ...
        assert_eq!(array_bytes(1024, 1024, 0, 0x20, 4, 11), 22 << 20);
    }
}
