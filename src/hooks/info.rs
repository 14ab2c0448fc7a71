//! What the program is told about the device's memory: the quota is the card.
//! `cuMemGetInfo`: total = quota, free = min(quota - used, physically free); `cuDeviceTotalMem`: the quota.

use super::{hooks, Out};
use crate::accounting::tenant;
use gpuslice_api::types::CUdevice;
use gpuslice_api::CUresult;
use std::ffi::c_uint;

hooks! {
    ret = CUresult;
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize)
        => mem_get_info(Out::new(free), Out::new(total), || real::cuMemGetInfo_v2(free, total));
    fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint)
        => mem_get_info(Out::new(free), Out::new(total), || real::cuMemGetInfo(free, total));
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice)
        => total_mem(Out::new(bytes), dev, || real::cuDeviceTotalMem_v2(bytes, dev));
    fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice)
        => total_mem(Out::new(bytes), dev, || real::cuDeviceTotalMem(bytes, dev));
}

use super::Word;

fn mem_get_info<S: Word>(free: Out<S>, total: Out<S>, call: impl FnOnce() -> CUresult) -> CUresult {
    call()?;
    let Some(t) = tenant() else { return Ok(()) };
    let (Some(f), Some(tot)) = (free.get(), total.get()) else {
        return Ok(());
    };
    let Ok(device) = t.current_device() else {
        return Ok(());
    };
    t.reconcile_before_query(device);
    if let Some((f, tot)) = t.shown_memory(device, f.to_u64(), tot.to_u64()) {
        free.set(S::from_u64(f));
        total.set(S::from_u64(tot));
    }
    Ok(())
}

/// Debug builds only (the library the tests load): a device ordinal no driver hands out (it answers
/// `CUDA_ERROR_INVALID_DEVICE`) for which `cuDeviceTotalMem` panics inside the hook, so a test sees
/// through the real library that a panic is caught at the C ABI by the library's own unwinder
/// (shim-c/static_unwinder.rs; tests/shim_unwinding.rs). Not in release builds.
#[cfg(debug_assertions)]
pub const PANIC_DEVICE: CUdevice = -0x0050_4e43;

fn total_mem<S: Word>(bytes: Out<S>, dev: CUdevice, call: impl FnOnce() -> CUresult) -> CUresult {
    #[cfg(debug_assertions)]
    if dev == PANIC_DEVICE {
        panic!("cuDeviceTotalMem: the test-only panic device");
    }
    call()?;
    let Some(t) = tenant() else { return Ok(()) };
    let Some(b) = bytes.get() else { return Ok(()) };
    let Ok(device) = t.device(dev) else {
        return Ok(());
    };
    if let Some((_, total)) = t.shown_memory(device, b.to_u64(), b.to_u64()) {
        bytes.set(S::from_u64(total));
    }
    Ok(())
}
