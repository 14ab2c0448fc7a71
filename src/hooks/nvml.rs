//! NVML's memory figures show the tenant's quota, so `nvidia-smi` and monitoring agents in the container
//! report the quota as the card: total = quota, used = the tenant's usage, free = the rest.

use super::{hooks, Out};
use crate::accounting::tenant;
use gpuslice_api::nvml::{nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t};
use gpuslice_api::{NvmlError, NvmlReturn};
use std::ffi::c_char;

hooks! {
    ret = NvmlReturn, missing = Err(NvmlError::UNINITIALIZED);
    fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t)
        => memory_info(device, Out::new(memory), || real::nvmlDeviceGetMemoryInfo(device, memory));
    fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t)
        => memory_info(device, Out::new(memory), || real::nvmlDeviceGetMemoryInfo_v2(device, memory));
}

/// Both NVML memory structs, seen as (total, used, free).
pub trait MemoryFigures: Copy {
    fn figures(&self) -> (u64, u64, u64);
    fn set_figures(&mut self, total: u64, used: u64, free: u64);
}
impl MemoryFigures for nvmlMemory_t {
    fn figures(&self) -> (u64, u64, u64) {
        (self.total, self.used, self.free)
    }
    fn set_figures(&mut self, total: u64, used: u64, free: u64) {
        (self.total, self.used, self.free) = (total, used, free);
    }
}
impl MemoryFigures for nvmlMemory_v2_t {
    fn figures(&self) -> (u64, u64, u64) {
        (self.total, self.used, self.free)
    }
    fn set_figures(&mut self, total: u64, used: u64, free: u64) {
        // `reserved` (driver/firmware memory) stays what the driver says; it is not the tenant's.
        (self.total, self.used, self.free) = (total, used, free);
    }
}

fn memory_info<M: MemoryFigures>(
    device: nvmlDevice_t,
    memory: Out<M>,
    call: impl FnOnce() -> NvmlReturn,
) -> NvmlReturn {
    call()?;
    let Some(t) = tenant() else { return Ok(()) };
    let Some(mut m) = memory.get() else {
        return Ok(());
    };
    let mut uuid = [0 as c_char; 96];
    // SAFETY: `uuid` is a writable buffer of the length given.
    if unsafe {
        super::calls::nvml::real::nvmlDeviceGetUUID(device, uuid.as_mut_ptr(), uuid.len() as u32)
    }
    .is_err()
    {
        return Ok(());
    }
    // SAFETY: NVML wrote a NUL-terminated string into the buffer (it is zero-initialised besides).
    let uuid = unsafe { std::ffi::CStr::from_ptr(uuid.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let (total, _, free) = m.figures();
    if let Some((used, limit)) = t.usage_by_uuid(&uuid) {
        let shown_total = limit.min(total);
        let shown_free = shown_total.saturating_sub(used).min(free);
        m.set_figures(shown_total, used.min(shown_total), shown_free);
        memory.set(m);
    }
    Ok(())
}
