//! CUDA arrays and mipmapped arrays (storage only).

use super::*;

/// Bytes a CUDA array takes: width x max(height,1) x max(depth,1) x channels x format bytes,
/// rounded up to 2 MiB (arrays are laid out in whole large pages); for a mipmapped array the levels
/// (each dimension halved, at least 1) are summed before rounding.
fn array_bytes(d: &CUDA_ARRAY3D_DESCRIPTOR, levels: u32) -> Result<usize, CUerror> {
    let elem = format_bytes(d.Format).ok_or(CUerror::INVALID_VALUE)?;
    if !matches!(d.NumChannels, 1 | 2 | 4) || d.Width == 0 {
        return Err(CUerror::INVALID_VALUE);
    }
    let mut total: usize = 0;
    for l in 0..levels.max(1) {
        let dim = |n: usize| if n == 0 { 1 } else { (n >> l).max(1) };
        let bytes = dim(d.Width)
            .checked_mul(dim(d.Height))
            .and_then(|v| v.checked_mul(dim(d.Depth)))
            .and_then(|v| v.checked_mul(elem * d.NumChannels as usize))
            .ok_or(CUerror::OUT_OF_MEMORY)?;
        total = total.checked_add(bytes).ok_or(CUerror::OUT_OF_MEMORY)?;
    }
    round_up(total, GRANULARITY).ok_or(CUerror::OUT_OF_MEMORY)
}

fn array_create(d: CUDA_ARRAY3D_DESCRIPTOR, levels: Option<u32>) -> Result<usize, CUerror> {
    let ctx = crate::context::current()?;
    let bytes = array_bytes(&d, levels.unwrap_or(1))?;
    let kind = match levels {
        Some(l) => Kind::Mipmap(d, l),
        None => Kind::Array(d),
    };
    mem().alloc(&ctx, bytes, bytes, GRANULARITY, kind)
}

fn array_destroy(handle: usize, mipmap: bool) -> CUresult {
    crate::context::current()?;
    let mut m = mem();
    match m.allocs.get(&handle).map(|a| a.kind) {
        Some(Kind::Array(_)) if !mipmap => m.free(handle),
        Some(Kind::Mipmap(..)) if mipmap => m.free(handle),
        _ => return Err(CUerror::INVALID_HANDLE),
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate_v2(
    handle: Option<&mut CUarray>,
    desc: Option<&CUDA_ARRAY_DESCRIPTOR>,
) -> CUresult {
    crate::call("cuArrayCreate_v2", || {
        crate::context::current()?;
        let (handle, desc) = (crate::out(handle)?, desc.ok_or(CUerror::INVALID_VALUE)?);
        let d3 = CUDA_ARRAY3D_DESCRIPTOR {
            Width: desc.Width,
            Height: desc.Height,
            Depth: 0,
            Format: desc.Format,
            NumChannels: desc.NumChannels,
            Flags: 0,
        };
        *handle = array_create(d3, None)? as CUarray;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    handle: Option<&mut CUarray>,
    desc: Option<&CUDA_ARRAY3D_DESCRIPTOR>,
) -> CUresult {
    crate::call("cuArray3DCreate_v2", || {
        crate::context::current()?;
        let (handle, desc) = (crate::out(handle)?, desc.ok_or(CUerror::INVALID_VALUE)?);
        *handle = array_create(*desc, None)? as CUarray;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayDestroy(handle: CUarray) -> CUresult {
    crate::call("cuArrayDestroy", || array_destroy(handle as usize, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayGetDescriptor_v2(
    desc: Option<&mut CUDA_ARRAY_DESCRIPTOR>,
    handle: CUarray,
) -> CUresult {
    crate::call("cuArrayGetDescriptor_v2", || {
        crate::context::current()?;
        let desc = crate::out(desc)?;
        let (_, d) = array_storage(handle)?;
        *desc = CUDA_ARRAY_DESCRIPTOR {
            Width: d.Width,
            Height: d.Height,
            Format: d.Format,
            NumChannels: d.NumChannels,
        };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuArray3DGetDescriptor_v2(
    desc: Option<&mut CUDA_ARRAY3D_DESCRIPTOR>,
    handle: CUarray,
) -> CUresult {
    crate::call("cuArray3DGetDescriptor_v2", || {
        crate::context::current()?;
        let desc = crate::out(desc)?;
        *desc = array_storage(handle)?.1;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    handle: Option<&mut CUmipmappedArray>,
    desc: Option<&CUDA_ARRAY3D_DESCRIPTOR>,
    levels: c_uint,
) -> CUresult {
    crate::call("cuMipmappedArrayCreate", || {
        crate::context::current()?;
        let (handle, desc) = (crate::out(handle)?, desc.ok_or(CUerror::INVALID_VALUE)?);
        if levels == 0 {
            return Err(CUerror::INVALID_VALUE);
        }
        *handle = array_create(*desc, Some(levels))? as CUmipmappedArray;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(handle: CUmipmappedArray) -> CUresult {
    crate::call("cuMipmappedArrayDestroy", || {
        array_destroy(handle as usize, true)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_sizes() {
        let d = CUDA_ARRAY3D_DESCRIPTOR {
            Width: 1024,
            Height: 1024,
            Depth: 0,
            Format: 0x20,
            NumChannels: 4,
            Flags: 0,
        };
        assert_eq!(array_bytes(&d, 1).unwrap(), 16 << 20);
        let small = CUDA_ARRAY3D_DESCRIPTOR { Width: 16, ..d };
        assert_eq!(array_bytes(&small, 1).unwrap(), 2 << 20);
        assert!(array_bytes(&CUDA_ARRAY3D_DESCRIPTOR { Format: 0x77, ..d }, 1).is_err());
    }
}
