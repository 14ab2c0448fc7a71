//! `cuDeviceGraphMemTrim`: the graph memory pool's cache goes back to the device, and its charge
//! with it ([`crate::accounting::graphs`]).

use crate::accounting::tenant;
use crate::hooks::hooks;
use gpuslice_api::types::CUdevice;
use gpuslice_api::CUresult;

hooks! {
    ret = CUresult;
    fn cuDeviceGraphMemTrim(device: CUdevice) => trim(device, || real::cuDeviceGraphMemTrim(device));
}

fn trim(device: CUdevice, call: impl FnOnce() -> CUresult) -> CUresult {
    call()?;
    if let Some(t) = tenant() {
        t.graph_pool_trimmed(device);
    }
    Ok(())
}
