//! The virtual memory management API: memfd-backed physical allocations, reserved address ranges,
//! mappings (`MAP_FIXED`) and access.

use super::*;

fn check_prop(prop: Option<&CUmemAllocationProp>) -> Result<u32, CUerror> {
    let prop = prop.ok_or(CUerror::INVALID_VALUE)?;
    if prop.type_ != CU_MEM_ALLOCATION_TYPE_PINNED
        || prop.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE
    {
        return Err(CUerror::INVALID_VALUE);
    }
    crate::device::physical(prop.location.id).map_err(|_| CUerror::INVALID_DEVICE)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: Option<&mut usize>,
    prop: Option<&CUmemAllocationProp>,
    _option: c_uint,
) -> CUresult {
    crate::call("cuMemGetAllocationGranularity", || {
        crate::entry::initialized()?;
        let granularity = crate::out(granularity)?;
        check_prop(prop)?;
        *granularity = GRANULARITY;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: Option<&mut CUmemGenericAllocationHandle>,
    size: usize,
    prop: Option<&CUmemAllocationProp>,
    flags: u64,
) -> CUresult {
    crate::call("cuMemCreate", || {
        crate::context::current()?;
        let handle = crate::out(handle)?;
        let device = check_prop(prop)?;
        if flags != 0 || size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(CUerror::INVALID_VALUE);
        }
        charge(device, size)?;
        // A memfd so that every mapping of the allocation aliases the same pages.
        // SAFETY: plain syscalls on a name we own; the fd is wrapped at once.
        let fd = unsafe { libc::memfd_create(c"simgpu-vmm".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            uncharge(device, size);
            return Err(CUerror::OUT_OF_MEMORY);
        }
        // SAFETY: fd is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: resizing our own memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
            uncharge(device, size);
            return Err(CUerror::OUT_OF_MEMORY);
        }
        let h = 0xc0de_0000_0000 + NEXT_ID.fetch_add(1, Ordering::Relaxed);
        mem().physical.insert(
            h,
            Physical {
                fd,
                size,
                device,
                refs: 1,
                maps: 0,
            },
        );
        *handle = h;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    crate::call("cuMemRelease", || {
        crate::entry::initialized()?;
        let mut m = mem();
        match m.physical.get_mut(&handle) {
            Some(p) if p.refs > 0 => p.refs -= 1,
            _ => return Err(CUerror::INVALID_VALUE),
        }
        m.maybe_drop_physical(handle);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: Option<&mut CUmemGenericAllocationHandle>,
    addr: *mut c_void,
) -> CUresult {
    crate::call("cuMemRetainAllocationHandle", || {
        crate::entry::initialized()?;
        let handle = crate::out(handle)?;
        let p = addr as usize;
        let mut m = mem();
        let h = m
            .mappings
            .range(..=p)
            .next_back()
            .filter(|(&b, map)| p < b + map.size)
            .map(|(_, map)| map.handle)
            .ok_or(CUerror::INVALID_VALUE)?;
        m.physical.get_mut(&h).ok_or(CUerror::INVALID_VALUE)?.refs += 1;
        *handle = h;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: Option<&mut CUdeviceptr>,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: u64,
) -> CUresult {
    crate::call("cuMemAddressReserve", || {
        crate::entry::initialized()?;
        let ptr = crate::out(ptr)?;
        if size == 0
            || !size.is_multiple_of(GRANULARITY)
            || flags != 0
            || (alignment != 0 && !alignment.is_power_of_two())
        {
            return Err(CUerror::INVALID_VALUE);
        }
        let align = alignment.max(GRANULARITY);
        let mut m = mem();
        let space = m.space()?;
        // The requested address is a hint, as in the driver.
        let at = if addr != 0
            && (addr as usize).is_multiple_of(align)
            && space.alloc_at(addr as usize, size)
        {
            addr as usize
        } else {
            space.alloc(size, align).ok_or(CUerror::OUT_OF_MEMORY)?
        };
        m.reservations.insert(at, size);
        *ptr = at as CUdeviceptr;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    crate::call("cuMemAddressFree", || {
        crate::entry::initialized()?;
        let at = ptr as usize;
        let mut m = mem();
        if m.reservations.get(&at) != Some(&size) {
            return Err(CUerror::INVALID_VALUE);
        }
        if m.mappings.range(at..at + size).next().is_some() {
            // Still mapped: the driver requires cuMemUnmap first.
            return Err(CUerror::INVALID_VALUE);
        }
        m.reservations.remove(&at);
        if let Some(s) = m.space.as_mut() {
            s.release(at, size);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    crate::call("cuMemMap", || {
        crate::entry::initialized()?;
        let at = ptr as usize;
        if flags != 0
            || size == 0
            || !size.is_multiple_of(GRANULARITY)
            || !at.is_multiple_of(GRANULARITY)
            || !offset.is_multiple_of(GRANULARITY)
        {
            return Err(CUerror::INVALID_VALUE);
        }
        let end = at.checked_add(size).ok_or(CUerror::INVALID_VALUE)?;
        let mut m = mem();
        let reserved = m
            .reservations
            .range(..=at)
            .next_back()
            .is_some_and(|(&b, &s)| end <= b + s);
        let overlaps = m
            .mappings
            .range(..end)
            .next_back()
            .is_some_and(|(&b, mp)| b + mp.size > at);
        let phys = m
            .physical
            .get_mut(&handle)
            .filter(|p| p.refs > 0)
            .ok_or(CUerror::INVALID_HANDLE)?;
        if !reserved || overlaps || offset.checked_add(size).is_none_or(|e| e > phys.size) {
            return Err(CUerror::INVALID_VALUE);
        }
        // SAFETY: [at, end) is inside a reservation of our own address range and not mapped; the
        // shared file mapping replaces the anonymous pages there.
        let r = unsafe {
            libc::mmap(
                at as *mut c_void,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                phys.fd.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if r == libc::MAP_FAILED {
            return Err(CUerror::OUT_OF_MEMORY);
        }
        phys.maps += 1;
        m.mappings.insert(
            at,
            Mapping {
                size,
                handle,
                access: CU_MEM_ACCESS_FLAGS_PROT_NONE,
            },
        );
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    crate::call("cuMemUnmap", || {
        crate::entry::initialized()?;
        let at = ptr as usize;
        let end = at.checked_add(size).ok_or(CUerror::INVALID_VALUE)?;
        let mut m = mem();
        let inside: Vec<usize> = m.mappings.range(at..end).map(|(&b, _)| b).collect();
        let partial = m
            .mappings
            .range(..at)
            .next_back()
            .is_some_and(|(&b, mp)| b + mp.size > at)
            || inside.iter().any(|b| b + m.mappings[b].size > end);
        if inside.is_empty() || partial {
            return Err(CUerror::INVALID_VALUE);
        }
        for b in inside {
            let map = m.mappings.remove(&b).expect("listed above");
            // SAFETY: [b, b+size) is our own mapping; put back private anonymous pages so the
            // reservation stays backed (and keeps the address range ours).
            unsafe {
                libc::mmap(
                    b as *mut c_void,
                    map.size,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if let Some(p) = m.physical.get_mut(&map.handle) {
                p.maps -= 1;
            }
            m.maybe_drop_physical(map.handle);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    crate::call("cuMemSetAccess", || {
        crate::entry::initialized()?;
        if desc.is_null() || count == 0 {
            return Err(CUerror::INVALID_VALUE);
        }
        // SAFETY: the client passes `count` descriptors.
        let descs = unsafe { std::slice::from_raw_parts(desc, count) };
        for d in descs {
            if d.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
                return Err(CUerror::INVALID_VALUE);
            }
            crate::device::physical(d.location.id).map_err(|_| CUerror::INVALID_DEVICE)?;
        }
        let flags = descs.last().map_or(0, |d| d.flags);
        let (at, end) = (
            ptr as usize,
            (ptr as usize)
                .checked_add(size)
                .ok_or(CUerror::INVALID_VALUE)?,
        );
        let mut m = mem();
        let mut covered = 0;
        for (_, map) in m.mappings.range_mut(at..end) {
            map.access = flags;
            covered += map.size;
        }
        if covered != size {
            return Err(CUerror::INVALID_VALUE);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAccess(
    flags: Option<&mut u64>,
    location: Option<&CUmemLocation>,
    ptr: CUdeviceptr,
) -> CUresult {
    crate::call("cuMemGetAccess", || {
        crate::entry::initialized()?;
        let (flags, location) = (crate::out(flags)?, location.ok_or(CUerror::INVALID_VALUE)?);
        if location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
            return Err(CUerror::INVALID_VALUE);
        }
        let p = ptr as usize;
        let m = mem();
        let (_, map) = m
            .mappings
            .range(..=p)
            .next_back()
            .filter(|(&b, mp)| p < b + mp.size)
            .ok_or(CUerror::INVALID_VALUE)?;
        *flags = map.access as u64;
        Ok(())
    })
}
