//! Virtual memory management hooks: a physical allocation (`cuMemCreate`) is charged once however
//! often it is mapped, and returned when it is both released and unmapped everywhere
//! (`accounting::vmm`).

use super::{hooks, In, Out};
use crate::accounting::tenant;
use crate::driver::calls as driver;
use gpuslice_api::types::{
    CUdeviceptr, CUmemAllocationProp, CUmemGenericAllocationHandle, CU_MEM_LOCATION_TYPE_DEVICE,
};
use gpuslice_api::CUresult;

hooks! {
    ret = CUresult;
    fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64)
        => mem_create(Out::new(handle), size as u64, In::new(prop), || real::cuMemCreate(handle, size, prop, flags));
    fn cuMemRelease(handle: CUmemGenericAllocationHandle) => mem_release(handle, || real::cuMemRelease(handle));
    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64)
        => mem_map(ptr, size as u64, handle, || real::cuMemMap(ptr, size, offset, handle, flags));
    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) => mem_unmap(ptr, size as u64, || real::cuMemUnmap(ptr, size));
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
    let call = || {
        call()?;
        Ok(handle.get())
    };
    t.create_physical(device, bytes, granularity, call, |h| {
        // SAFETY: `h` is the handle the driver just created for this call.
        let _ = unsafe { driver::real::cuMemRelease(h) };
    })
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
