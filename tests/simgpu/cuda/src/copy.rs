//! memcpy / memset, synchronous and stream-ordered, with NVIDIA's documented host-memory rules:
//! synchronous calls wait for the (legacy or per-thread) default stream first; asynchronous copies
//! from pageable memory are staged at call time, to pageable memory complete before the call
//! returns, and pinned memory is truly asynchronous.

use crate::memory::{array_storage, device_range, format_bytes, is_pinned_host};
use crate::stream::{self, Stream};
use gpuslice_api::types::*;
use gpuslice_api::{CUerror, CUresult};
use std::ffi::c_void;
use std::sync::Arc;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Device,
    Pinned,
    Pageable,
}

/// A validated rectangular copy between addresses of this process (device memory is host-backed).
#[derive(Clone, Copy)]
struct Plan {
    src: usize,
    src_pitch: usize,
    dst: usize,
    dst_pitch: usize,
    width: usize,
    height: usize,
}

impl Plan {
    fn linear(dst: usize, src: usize, n: usize) -> Plan {
        Plan {
            src,
            src_pitch: n,
            dst,
            dst_pitch: n,
            width: n,
            height: 1,
        }
    }

    fn run(&self) {
        for row in 0..self.height {
            // SAFETY: both ranges were checked when the plan was built (device side: inside live
            // allocations; host side: the client's buffer, per the API contract); rows may overlap
            // for device-to-device copies, hence `copy` (memmove).
            unsafe {
                std::ptr::copy(
                    (self.src + row * self.src_pitch) as *const u8,
                    (self.dst + row * self.dst_pitch) as *mut u8,
                    self.width,
                )
            };
        }
    }

    /// The source rows copied out now (a staged pageable source), as a plan reading the copy.
    fn staged(self) -> (Plan, Vec<u8>) {
        let mut buf = vec![0u8; self.width * self.height];
        let into = Plan {
            dst: buf.as_mut_ptr() as usize,
            dst_pitch: self.width,
            ..self
        };
        into.run();
        (
            Plan {
                src: buf.as_ptr() as usize,
                src_pitch: self.width,
                ..self
            },
            buf,
        )
    }
}

enum Mode {
    /// Synchronous: after the default stream's prior work (per-thread one for `_ptds`).
    Sync {
        per_thread: bool,
    },
    Async(Arc<Stream>),
}

fn sync_mode(per_thread: bool) -> Result<Mode, CUerror> {
    crate::context::current()?;
    Ok(Mode::Sync { per_thread })
}

fn async_mode(h: CUstream, per_thread: bool) -> Result<Mode, CUerror> {
    crate::context::current()?;
    Ok(Mode::Async(stream::resolve(h, per_thread)?))
}

fn wait_default(per_thread: bool) -> CUresult {
    let s = stream::resolve(std::ptr::null_mut(), per_thread)?;
    stream::synchronize(&s)
}

fn execute(plan: Plan, src: Side, dst: Side, mode: Mode) -> CUresult {
    if plan.width == 0 || plan.height == 0 {
        return Ok(());
    }
    simgpu_core::trace(format_args!(
        "  copy {} x {} bytes {:#x} -> {:#x}",
        plan.height, plan.width, plan.src, plan.dst
    ));
    match mode {
        Mode::Sync { per_thread } => {
            wait_default(per_thread)?;
            plan.run();
            Ok(())
        }
        Mode::Async(s) => {
            if src == Side::Pageable {
                let (plan, buf) = plan.staged();
                stream::enqueue(
                    &s,
                    Box::new(move || {
                        plan.run();
                        drop(buf);
                    }),
                )?;
            } else {
                stream::enqueue(&s, Box::new(move || plan.run()))?;
            }
            // To pageable memory: done before returning (not while capturing: there is nothing to
            // wait for, the copy is recorded into the graph).
            if dst == Side::Pageable && s.capture().is_none() {
                stream::synchronize(&s)?;
            }
            Ok(())
        }
    }
}

fn host_side(p: usize, len: usize) -> Result<Side, CUerror> {
    if p == 0 {
        return Err(CUerror::INVALID_VALUE);
    }
    Ok(if is_pinned_host(p as *const u8, len) {
        Side::Pinned
    } else {
        Side::Pageable
    })
}

fn htod(dst: CUdeviceptr, src: *const c_void, n: usize, mode: Result<Mode, CUerror>) -> CUresult {
    let mode = mode?;
    if n == 0 {
        return Ok(());
    }
    let d = device_range(dst, n)? as usize;
    let side = host_side(src as usize, n)?;
    execute(Plan::linear(d, src as usize, n), side, Side::Device, mode)
}

fn dtoh(dst: *mut c_void, src: CUdeviceptr, n: usize, mode: Result<Mode, CUerror>) -> CUresult {
    let mode = mode?;
    if n == 0 {
        return Ok(());
    }
    let s = device_range(src, n)? as usize;
    let side = host_side(dst as usize, n)?;
    execute(Plan::linear(dst as usize, s, n), Side::Device, side, mode)
}

fn dtod(dst: CUdeviceptr, src: CUdeviceptr, n: usize, mode: Result<Mode, CUerror>) -> CUresult {
    let mode = mode?;
    if n == 0 {
        return Ok(());
    }
    let (d, s) = (
        device_range(dst, n)? as usize,
        device_range(src, n)? as usize,
    );
    execute(Plan::linear(d, s, n), Side::Device, Side::Device, mode)
}

/// Unified addressing: either side may be device memory or host memory.
fn unified_side(p: usize, n: usize) -> Result<Side, CUerror> {
    if device_range(p as CUdeviceptr, n).is_ok() && !is_pinned_host(p as *const u8, n) {
        Ok(Side::Device)
    } else {
        host_side(p, n)
    }
}

fn unified(dst: CUdeviceptr, src: CUdeviceptr, n: usize, mode: Result<Mode, CUerror>) -> CUresult {
    let mode = mode?;
    if n == 0 {
        return Ok(());
    }
    let (ds, ss) = (
        unified_side(dst as usize, n)?,
        unified_side(src as usize, n)?,
    );
    execute(Plan::linear(dst as usize, src as usize, n), ss, ds, mode)
}

// ---- 2D ----

/// One side of a CUDA_MEMCPY2D, as the caller described it (the `src*` or the `dst*` fields).
struct Side2d {
    ty: u32,
    host: usize,
    device: CUdeviceptr,
    array: CUarray,
    x: usize,
    y: usize,
    pitch: usize,
}

impl Side2d {
    fn src(p: &CUDA_MEMCPY2D) -> Self {
        Side2d {
            ty: p.srcMemoryType,
            host: p.srcHost as usize,
            device: p.srcDevice,
            array: p.srcArray,
            x: p.srcXInBytes,
            y: p.srcY,
            pitch: p.srcPitch,
        }
    }

    fn dst(p: &CUDA_MEMCPY2D) -> Self {
        Side2d {
            ty: p.dstMemoryType,
            host: p.dstHost as usize,
            device: p.dstDevice,
            array: p.dstArray,
            x: p.dstXInBytes,
            y: p.dstY,
            pitch: p.dstPitch,
        }
    }
}

/// One side of a CUDA_MEMCPY2D of `width` bytes by `height` rows: its first byte, pitch and kind.
fn side_2d(side: Side2d, width: usize, height: usize) -> Result<(usize, usize, Side), CUerror> {
    let Side2d {
        ty,
        host,
        device,
        array,
        x,
        y,
        pitch,
    } = side;
    let (base, pitch, kind) = match ty {
        CU_MEMORYTYPE_HOST => (host, pitch, None),
        CU_MEMORYTYPE_DEVICE => (device as usize, pitch, Some(Side::Device)),
        CU_MEMORYTYPE_UNIFIED => (device as usize, pitch, None),
        CU_MEMORYTYPE_ARRAY => {
            let (b, d) = array_storage(array)?;
            let row = d.Width * format_bytes(d.Format).unwrap_or(1) * d.NumChannels as usize;
            (b, row, Some(Side::Device))
        }
        _ => return Err(CUerror::INVALID_VALUE),
    };
    if height > 1 && pitch < x + width {
        return Err(CUerror::INVALID_VALUE);
    }
    let first = y
        .checked_mul(pitch)
        .and_then(|o| o.checked_add(x))
        .and_then(|o| o.checked_add(base))
        .ok_or(CUerror::INVALID_VALUE)?;
    let extent = (height - 1)
        .checked_mul(pitch)
        .and_then(|e| e.checked_add(width))
        .ok_or(CUerror::INVALID_VALUE)?;
    let side = match (ty, kind) {
        (_, Some(Side::Device)) => {
            device_range(first as CUdeviceptr, extent)?;
            Side::Device
        }
        (CU_MEMORYTYPE_UNIFIED, _) => unified_side(first, extent)?,
        _ => host_side(first, extent)?,
    };
    Ok((first, pitch, side))
}

fn copy_2d(p: Option<&CUDA_MEMCPY2D>, mode: Result<Mode, CUerror>) -> CUresult {
    let mode = mode?;
    let p = p.ok_or(CUerror::INVALID_VALUE)?;
    if p.WidthInBytes == 0 || p.Height == 0 {
        return Ok(());
    }
    let (w, h) = (p.WidthInBytes, p.Height);
    let (src, src_pitch, ss) = side_2d(Side2d::src(p), w, h)?;
    let (dst, dst_pitch, ds) = side_2d(Side2d::dst(p), w, h)?;
    execute(
        Plan {
            src,
            src_pitch,
            dst,
            dst_pitch,
            width: w,
            height: h,
        },
        ss,
        ds,
        mode,
    )
}

// ---- memset ----

/// A validated 2D fill of `elem`-byte values (1D: one row).
#[derive(Clone, Copy)]
struct Fill {
    dst: usize,
    pitch: usize,
    width: usize,
    height: usize,
    value: u32,
    elem: usize,
}

impl Fill {
    fn run(&self) {
        for row in 0..self.height {
            let start = self.dst + row * self.pitch;
            for i in 0..self.width {
                let at = start + i * self.elem;
                // SAFETY: the whole rectangle was checked to lie in device memory; addresses are
                // aligned to `elem` (checked), so each store is an aligned write.
                unsafe {
                    match self.elem {
                        1 => *(at as *mut u8) = self.value as u8,
                        2 => *(at as *mut u16) = self.value as u16,
                        _ => *(at as *mut u32) = self.value,
                    }
                }
            }
        }
    }
}

fn memset(
    dst: CUdeviceptr,
    pitch: usize,
    value: u32,
    elem: usize,
    width: usize,
    height: usize,
    mode: Result<Mode, CUerror>,
) -> CUresult {
    let mode = mode?;
    if width == 0 || height == 0 {
        return Ok(());
    }
    let row = width.checked_mul(elem).ok_or(CUerror::INVALID_VALUE)?;
    let pitch = if height == 1 { row } else { pitch };
    if !(dst as usize).is_multiple_of(elem) || !pitch.is_multiple_of(elem) || pitch < row {
        return Err(CUerror::INVALID_VALUE);
    }
    let extent = (height - 1)
        .checked_mul(pitch)
        .and_then(|e| e.checked_add(row))
        .ok_or(CUerror::INVALID_VALUE)?;
    let d = device_range(dst, extent)? as usize;
    let fill = Fill {
        dst: d,
        pitch,
        width,
        height,
        value,
        elem,
    };
    match mode {
        Mode::Sync { per_thread } => {
            wait_default(per_thread)?;
            fill.run();
            Ok(())
        }
        Mode::Async(s) => stream::enqueue(&s, Box::new(move || fill.run())),
    }
}

// ---- Exports: the plain (legacy default stream) and per-thread (`_ptds`/`_ptsz`) variants ----

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> CUresult {
    crate::call("cuMemcpyHtoD_v2", || htod(dst, src, n, sync_mode(false)))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2_ptds(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> CUresult {
    crate::call("cuMemcpyHtoD_v2_ptds", || {
        htod(dst, src, n, sync_mode(true))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    crate::call("cuMemcpyDtoH_v2", || dtoh(dst, src, n, sync_mode(false)))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2_ptds(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
) -> CUresult {
    crate::call("cuMemcpyDtoH_v2_ptds", || {
        dtoh(dst, src, n, sync_mode(true))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    crate::call("cuMemcpyDtoD_v2", || dtod(dst, src, n, sync_mode(false)))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2_ptds(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
) -> CUresult {
    crate::call("cuMemcpyDtoD_v2_ptds", || {
        dtod(dst, src, n, sync_mode(true))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    crate::call("cuMemcpy", || unified(dst, src, n, sync_mode(false)))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    crate::call("cuMemcpy_ptds", || unified(dst, src, n, sync_mode(true)))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAsync(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    s: CUstream,
) -> CUresult {
    crate::call("cuMemcpyAsync", || {
        unified(dst, src, n, async_mode(s, false))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAsync_ptsz(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    s: CUstream,
) -> CUresult {
    crate::call("cuMemcpyAsync_ptsz", || {
        unified(dst, src, n, async_mode(s, true))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    s: CUstream,
) -> CUresult {
    crate::call("cuMemcpyHtoDAsync_v2", || {
        htod(dst, src, n, async_mode(s, false))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2_ptsz(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    s: CUstream,
) -> CUresult {
    crate::call("cuMemcpyHtoDAsync_v2_ptsz", || {
        htod(dst, src, n, async_mode(s, true))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    s: CUstream,
) -> CUresult {
    crate::call("cuMemcpyDtoHAsync_v2", || {
        dtoh(dst, src, n, async_mode(s, false))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2_ptsz(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    s: CUstream,
) -> CUresult {
    crate::call("cuMemcpyDtoHAsync_v2_ptsz", || {
        dtoh(dst, src, n, async_mode(s, true))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    s: CUstream,
) -> CUresult {
    crate::call("cuMemcpyDtoDAsync_v2", || {
        dtod(dst, src, n, async_mode(s, false))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2_ptsz(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    s: CUstream,
) -> CUresult {
    crate::call("cuMemcpyDtoDAsync_v2_ptsz", || {
        dtod(dst, src, n, async_mode(s, true))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2D_v2(p: Option<&CUDA_MEMCPY2D>) -> CUresult {
    crate::call("cuMemcpy2D_v2", || copy_2d(p, sync_mode(false)))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2D_v2_ptds(p: Option<&CUDA_MEMCPY2D>) -> CUresult {
    crate::call("cuMemcpy2D_v2_ptds", || copy_2d(p, sync_mode(true)))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DUnaligned_v2(p: Option<&CUDA_MEMCPY2D>) -> CUresult {
    crate::call("cuMemcpy2DUnaligned_v2", || copy_2d(p, sync_mode(false)))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DUnaligned_v2_ptds(p: Option<&CUDA_MEMCPY2D>) -> CUresult {
    crate::call("cuMemcpy2DUnaligned_v2_ptds", || {
        copy_2d(p, sync_mode(true))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DAsync_v2(p: Option<&CUDA_MEMCPY2D>, s: CUstream) -> CUresult {
    crate::call("cuMemcpy2DAsync_v2", || copy_2d(p, async_mode(s, false)))
}
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DAsync_v2_ptsz(
    p: Option<&CUDA_MEMCPY2D>,
    s: CUstream,
) -> CUresult {
    crate::call("cuMemcpy2DAsync_v2_ptsz", || {
        copy_2d(p, async_mode(s, true))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2(d: CUdeviceptr, v: u8, n: usize) -> CUresult {
    crate::call("cuMemsetD8_v2", || {
        memset(d, 0, v.into(), 1, n, 1, sync_mode(false))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2_ptds(d: CUdeviceptr, v: u8, n: usize) -> CUresult {
    crate::call("cuMemsetD8_v2_ptds", || {
        memset(d, 0, v.into(), 1, n, 1, sync_mode(true))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16_v2(d: CUdeviceptr, v: u16, n: usize) -> CUresult {
    crate::call("cuMemsetD16_v2", || {
        memset(d, 0, v.into(), 2, n, 1, sync_mode(false))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16_v2_ptds(d: CUdeviceptr, v: u16, n: usize) -> CUresult {
    crate::call("cuMemsetD16_v2_ptds", || {
        memset(d, 0, v.into(), 2, n, 1, sync_mode(true))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32_v2(d: CUdeviceptr, v: u32, n: usize) -> CUresult {
    crate::call("cuMemsetD32_v2", || {
        memset(d, 0, v, 4, n, 1, sync_mode(false))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32_v2_ptds(d: CUdeviceptr, v: u32, n: usize) -> CUresult {
    crate::call("cuMemsetD32_v2_ptds", || {
        memset(d, 0, v, 4, n, 1, sync_mode(true))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D8_v2(
    d: CUdeviceptr,
    pitch: usize,
    v: u8,
    w: usize,
    h: usize,
) -> CUresult {
    crate::call("cuMemsetD2D8_v2", || {
        memset(d, pitch, v.into(), 1, w, h, sync_mode(false))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D8_v2_ptds(
    d: CUdeviceptr,
    pitch: usize,
    v: u8,
    w: usize,
    h: usize,
) -> CUresult {
    crate::call("cuMemsetD2D8_v2_ptds", || {
        memset(d, pitch, v.into(), 1, w, h, sync_mode(true))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D16_v2(
    d: CUdeviceptr,
    pitch: usize,
    v: u16,
    w: usize,
    h: usize,
) -> CUresult {
    crate::call("cuMemsetD2D16_v2", || {
        memset(d, pitch, v.into(), 2, w, h, sync_mode(false))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D16_v2_ptds(
    d: CUdeviceptr,
    pitch: usize,
    v: u16,
    w: usize,
    h: usize,
) -> CUresult {
    crate::call("cuMemsetD2D16_v2_ptds", || {
        memset(d, pitch, v.into(), 2, w, h, sync_mode(true))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D32_v2(
    d: CUdeviceptr,
    pitch: usize,
    v: u32,
    w: usize,
    h: usize,
) -> CUresult {
    crate::call("cuMemsetD2D32_v2", || {
        memset(d, pitch, v, 4, w, h, sync_mode(false))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D32_v2_ptds(
    d: CUdeviceptr,
    pitch: usize,
    v: u32,
    w: usize,
    h: usize,
) -> CUresult {
    crate::call("cuMemsetD2D32_v2_ptds", || {
        memset(d, pitch, v, 4, w, h, sync_mode(true))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async(d: CUdeviceptr, v: u8, n: usize, s: CUstream) -> CUresult {
    crate::call("cuMemsetD8Async", || {
        memset(d, 0, v.into(), 1, n, 1, async_mode(s, false))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async_ptsz(
    d: CUdeviceptr,
    v: u8,
    n: usize,
    s: CUstream,
) -> CUresult {
    crate::call("cuMemsetD8Async_ptsz", || {
        memset(d, 0, v.into(), 1, n, 1, async_mode(s, true))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16Async(
    d: CUdeviceptr,
    v: u16,
    n: usize,
    s: CUstream,
) -> CUresult {
    crate::call("cuMemsetD16Async", || {
        memset(d, 0, v.into(), 2, n, 1, async_mode(s, false))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16Async_ptsz(
    d: CUdeviceptr,
    v: u16,
    n: usize,
    s: CUstream,
) -> CUresult {
    crate::call("cuMemsetD16Async_ptsz", || {
        memset(d, 0, v.into(), 2, n, 1, async_mode(s, true))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32Async(
    d: CUdeviceptr,
    v: u32,
    n: usize,
    s: CUstream,
) -> CUresult {
    crate::call("cuMemsetD32Async", || {
        memset(d, 0, v, 4, n, 1, async_mode(s, false))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32Async_ptsz(
    d: CUdeviceptr,
    v: u32,
    n: usize,
    s: CUstream,
) -> CUresult {
    crate::call("cuMemsetD32Async_ptsz", || {
        memset(d, 0, v, 4, n, 1, async_mode(s, true))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D8Async(
    d: CUdeviceptr,
    pitch: usize,
    v: u8,
    w: usize,
    h: usize,
    s: CUstream,
) -> CUresult {
    crate::call("cuMemsetD2D8Async", || {
        memset(d, pitch, v.into(), 1, w, h, async_mode(s, false))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D8Async_ptsz(
    d: CUdeviceptr,
    pitch: usize,
    v: u8,
    w: usize,
    h: usize,
    s: CUstream,
) -> CUresult {
    crate::call("cuMemsetD2D8Async_ptsz", || {
        memset(d, pitch, v.into(), 1, w, h, async_mode(s, true))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D16Async(
    d: CUdeviceptr,
    pitch: usize,
    v: u16,
    w: usize,
    h: usize,
    s: CUstream,
) -> CUresult {
    crate::call("cuMemsetD2D16Async", || {
        memset(d, pitch, v.into(), 2, w, h, async_mode(s, false))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D16Async_ptsz(
    d: CUdeviceptr,
    pitch: usize,
    v: u16,
    w: usize,
    h: usize,
    s: CUstream,
) -> CUresult {
    crate::call("cuMemsetD2D16Async_ptsz", || {
        memset(d, pitch, v.into(), 2, w, h, async_mode(s, true))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D32Async(
    d: CUdeviceptr,
    pitch: usize,
    v: u32,
    w: usize,
    h: usize,
    s: CUstream,
) -> CUresult {
    crate::call("cuMemsetD2D32Async", || {
        memset(d, pitch, v, 4, w, h, async_mode(s, false))
    })
}
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D32Async_ptsz(
    d: CUdeviceptr,
    pitch: usize,
    v: u32,
    w: usize,
    h: usize,
    s: CUstream,
) -> CUresult {
    crate::call("cuMemsetD2D32Async_ptsz", || {
        memset(d, pitch, v, 4, w, h, async_mode(s, true))
    })
}
