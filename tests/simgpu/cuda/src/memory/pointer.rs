//! Pointer attributes: what cuPointerGetAttribute(s) tell of device, managed, pinned and VMM memory.

use super::*;

/// # Safety
/// `data` must be valid for a write of `T`.
pub(super) unsafe fn put<T>(data: *mut c_void, v: T) {
    // SAFETY: per the caller.
    unsafe { data.cast::<T>().write_unaligned(v) }
}

/// What simgpu knows of the allocation holding an address.
struct PointerInfo {
    memory_type: u32,
    ctx: usize,
    device: u32,
    base: usize,
    size: usize,
    managed: bool,
    id: u64,
    pool: usize,
}

fn pointer_info(p: usize) -> Option<PointerInfo> {
    let m = mem();
    if let Some((b, a)) = m.find(p) {
        let pool = if let Kind::Pool(h) = a.kind { h } else { 0 };
        return Some(PointerInfo {
            memory_type: CU_MEMORYTYPE_DEVICE,
            ctx: a.ctx,
            device: a.device,
            base: b,
            size: a.size,
            managed: a.kind == Kind::Managed,
            id: a.id,
            pool,
        });
    }
    if let Some((&b, map)) = m
        .mappings
        .range(..=p)
        .next_back()
        .filter(|(&b, mp)| p < b + mp.size)
    {
        return Some(PointerInfo {
            memory_type: CU_MEMORYTYPE_DEVICE,
            ctx: 0,
            device: m.physical.get(&map.handle).map_or(0, |ph| ph.device),
            base: b,
            size: map.size,
            managed: false,
            id: map.handle,
            pool: 0,
        });
    }
    drop(m);
    let pinned = lock(pinned());
    let (base, size) = pinned
        .range(..=p)
        .next_back()
        .filter(|(&b, h)| p < b + h.size)
        .map(|(&b, h)| (b, h.size))?;
    let current = crate::context::current().ok();
    Some(PointerInfo {
        memory_type: CU_MEMORYTYPE_HOST,
        ctx: current.as_ref().map_or(0, |c| ctx_handle(c)),
        device: current.map_or(0, |c| c.device),
        base,
        size,
        managed: false,
        id: base as u64,
        pool: 0,
    })
}

const CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: u32 = 10;
const CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: u32 = 14;
const CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: u32 = 15;
const CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: u32 = 16;
/// `CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE`.
const ACCESS_READWRITE: u32 = 3;

/// Writes one attribute of `ptr` (`info`: its allocation, `None` when it is none of simgpu's) to
/// `data`. `Err(INVALID_VALUE)` for an unknown attribute or one that does not apply to the pointer;
/// with `defaults` (`cuPointerGetAttributes`), an attribute that does not apply is written as its
/// type's zero instead.
///
/// # Safety
/// `data` is valid for a write of the attribute's documented type.
unsafe fn put_pointer_attribute(
    data: *mut c_void,
    attr: u32,
    ptr: CUdeviceptr,
    info: Option<&PointerInfo>,
    defaults: bool,
) -> CUresult {
    // (the attribute's value, or None when it does not apply) per attribute, by type.
    macro_rules! answer {
        ($ty:ty, $v:expr) => {{
            let v: Option<$ty> = $v;
            match (v, defaults) {
                // SAFETY: per the caller.
                (Some(v), _) => unsafe { put(data, v) },
                // SAFETY: per the caller.
                (None, true) => unsafe { put(data, <$ty>::default()) },
                (None, false) => return Err(CUerror::INVALID_VALUE),
            }
        }};
    }
    match attr {
        CU_POINTER_ATTRIBUTE_CONTEXT => answer!(usize, info.map(|i| i.ctx)),
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE => answer!(u32, info.map(|i| i.memory_type)),
        CU_POINTER_ATTRIBUTE_DEVICE_POINTER => answer!(u64, info.map(|_| ptr)),
        CU_POINTER_ATTRIBUTE_HOST_POINTER => answer!(
            usize,
            info.filter(|i| i.memory_type == CU_MEMORYTYPE_HOST || i.managed)
                .map(|_| ptr as usize)
        ),
        CU_POINTER_ATTRIBUTE_SYNC_MEMOPS => answer!(u32, info.map(|_| 0)),
        CU_POINTER_ATTRIBUTE_BUFFER_ID => answer!(u64, info.map(|i| i.id)),
        CU_POINTER_ATTRIBUTE_IS_MANAGED => answer!(u32, info.map(|i| u32::from(i.managed))),
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => {
            answer!(i32, info.map(|i| crate::device::visible_ordinal(i.device)))
        }
        CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE => answer!(
            u32,
            info.map(|i| u32::from(
                i.memory_type == CU_MEMORYTYPE_DEVICE && i.pool == 0 && !i.managed
            ))
        ),
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR => answer!(u64, info.map(|i| i.base as u64)),
        CU_POINTER_ATTRIBUTE_RANGE_SIZE => answer!(usize, info.map(|i| i.size)),
        CU_POINTER_ATTRIBUTE_MAPPED => answer!(u32, info.map(|_| 1)),
        CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES => answer!(u64, info.map(|_| 0)),
        CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE => answer!(u32, info.map(|_| 0)),
        CU_POINTER_ATTRIBUTE_ACCESS_FLAGS => answer!(u32, info.map(|_| ACCESS_READWRITE)),
        CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE => answer!(usize, info.map(|i| i.pool)),
        _ => return Err(CUerror::INVALID_VALUE),
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attr: c_uint,
    ptr: CUdeviceptr,
) -> CUresult {
    crate::call("cuPointerGetAttribute", || {
        crate::entry::initialized()?;
        if data.is_null() {
            return Err(CUerror::INVALID_VALUE);
        }
        let info = pointer_info(ptr as usize).ok_or(CUerror::INVALID_VALUE)?;
        // SAFETY: the client passes storage of the attribute's documented type.
        unsafe { put_pointer_attribute(data, attr, ptr, Some(&info), false) }
    })
}

/// Several attributes at once. Unlike `cuPointerGetAttribute`, an address simgpu does not know (or
/// an attribute that does not apply to it) is no error: its attributes are written as NULL/0, as
/// NVIDIA documents.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttributes(
    count: c_uint,
    attrs: *const c_uint,
    data: *const *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    crate::call("cuPointerGetAttributes", || {
        crate::entry::initialized()?;
        if count == 0 || attrs.is_null() || data.is_null() {
            return Err(CUerror::INVALID_VALUE);
        }
        let info = pointer_info(ptr as usize);
        for i in 0..count as usize {
            // SAFETY: the client passes `count` attributes and as many data pointers.
            let (attr, out) = unsafe { (*attrs.add(i), *data.add(i)) };
            if out.is_null() {
                return Err(CUerror::INVALID_VALUE);
            }
            // SAFETY: each data pointer is storage of its attribute's documented type.
            unsafe { put_pointer_attribute(out, attr, ptr, info.as_ref(), true) }?;
        }
        Ok(())
    })
}
