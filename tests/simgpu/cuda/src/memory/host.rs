//! Pinned host memory: cuMemAllocHost/cuMemHostAlloc and registered host ranges.

use super::*;

/// A pinned host range: allocated by us or registered by the caller.
pub(super) struct Pinned {
    pub(super) size: usize,
    /// Allocated by us (cuMemAllocHost/cuMemHostAlloc) rather than registered.
    owned: bool,
    flags: u32,
}

pub(super) fn pinned() -> &'static Mutex<BTreeMap<usize, Pinned>> {
    static P: OnceLock<Mutex<BTreeMap<usize, Pinned>>> = OnceLock::new();
    P.get_or_init(Default::default)
}

fn host_alloc(pp: Option<&mut *mut c_void>, size: usize, flags: u32) -> CUresult {
    crate::context::current()?;
    let pp = crate::out(pp)?;
    if size == 0
        || flags
            & !(CU_MEMHOSTALLOC_PORTABLE
                | CU_MEMHOSTALLOC_DEVICEMAP
                | CU_MEMHOSTALLOC_WRITECOMBINED)
            != 0
    {
        return Err(CUerror::INVALID_VALUE);
    }
    // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUerror::OUT_OF_MEMORY);
    }
    lock(pinned()).insert(
        p as usize,
        Pinned {
            size,
            owned: true,
            flags,
        },
    );
    *pp = p;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: Option<&mut *mut c_void>, size: usize) -> CUresult {
    crate::call("cuMemAllocHost_v2", || host_alloc(pp, size, 0))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost(pp: Option<&mut *mut c_void>, size: c_uint) -> CUresult {
    crate::call("cuMemAllocHost", || host_alloc(pp, size as usize, 0))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: Option<&mut *mut c_void>,
    size: usize,
    flags: c_uint,
) -> CUresult {
    crate::call("cuMemHostAlloc", || host_alloc(pp, size, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    crate::call("cuMemFreeHost", || {
        crate::context::current()?;
        let mut pinned = lock(pinned());
        match pinned.get(&(p as usize)) {
            Some(h) if h.owned => {
                let size = h.size;
                pinned.remove(&(p as usize));
                // SAFETY: the mapping was created by host_alloc with this size and is no longer tracked.
                unsafe { libc::munmap(p, size) };
                Ok(())
            }
            _ => Err(CUerror::INVALID_VALUE),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostRegister_v2(
    p: *mut c_void,
    size: usize,
    flags: c_uint,
) -> CUresult {
    crate::call("cuMemHostRegister_v2", || {
        crate::context::current()?;
        let all = CU_MEMHOSTREGISTER_PORTABLE
            | CU_MEMHOSTREGISTER_DEVICEMAP
            | CU_MEMHOSTREGISTER_IOMEMORY
            | CU_MEMHOSTREGISTER_READ_ONLY;
        if p.is_null() || size == 0 || flags & !all != 0 {
            return Err(CUerror::INVALID_VALUE);
        }
        let start = p as usize;
        let end = start.checked_add(size).ok_or(CUerror::INVALID_VALUE)?;
        let mut pinned = lock(pinned());
        let overlaps = pinned
            .range(..end)
            .next_back()
            .is_some_and(|(&b, h)| b + h.size > start);
        if overlaps {
            return Err(CUerror::HOST_MEMORY_ALREADY_REGISTERED);
        }
        pinned.insert(
            start,
            Pinned {
                size,
                owned: false,
                flags,
            },
        );
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    crate::call("cuMemHostUnregister", || {
        crate::context::current()?;
        let mut pinned = lock(pinned());
        match pinned.get(&(p as usize)) {
            Some(h) if !h.owned => {
                pinned.remove(&(p as usize));
                Ok(())
            }
            _ => Err(CUerror::HOST_MEMORY_NOT_REGISTERED),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    dptr: Option<&mut CUdeviceptr>,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    crate::call("cuMemHostGetDevicePointer_v2", || {
        crate::context::current()?;
        let dptr = crate::out(dptr)?;
        if flags != 0 || !is_pinned_host(p as *const u8, 1) {
            return Err(CUerror::INVALID_VALUE);
        }
        // Unified addressing: the device sees pinned memory at its host address.
        *dptr = p as CUdeviceptr;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetFlags(flags: Option<&mut c_uint>, p: *mut c_void) -> CUresult {
    crate::call("cuMemHostGetFlags", || {
        crate::context::current()?;
        let flags = crate::out(flags)?;
        let pinned = lock(pinned());
        let (_, h) = pinned
            .range(..=p as usize)
            .next_back()
            .filter(|(&b, h)| (p as usize) < b + h.size)
            .ok_or(CUerror::INVALID_VALUE)?;
        *flags = h.flags;
        Ok(())
    })
}
