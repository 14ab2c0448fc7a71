//! IPC memory handle hooks: an export is remembered, a mapping registered and its last close
//! returns what the exporter's free handed it (`accounting::ipc`). Nothing is charged at an open:
//! the memory is the exporter's allocation.

use super::{hooks, Out};
use crate::accounting::tenant;
use gpuslice_api::types::{CUdeviceptr, CUipcMemHandle};
use gpuslice_api::CUresult;
use std::ffi::c_uint;

hooks! {
    ret = CUresult;
    fn cuIpcGetMemHandle(handle: *mut CUipcMemHandle, dptr: CUdeviceptr)
        => get_handle(Out::new(handle), dptr, || real::cuIpcGetMemHandle(handle, dptr));
    fn cuIpcOpenMemHandle(pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint)
        => open(Out::new(pdptr), &handle, || real::cuIpcOpenMemHandle(pdptr, handle, flags));
    fn cuIpcOpenMemHandle_v2(pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint)
        => open(Out::new(pdptr), &handle, || real::cuIpcOpenMemHandle_v2(pdptr, handle, flags));
    fn cuIpcCloseMemHandle(dptr: CUdeviceptr) => close(dptr, || real::cuIpcCloseMemHandle(dptr));
}

fn get_handle(
    handle: Out<CUipcMemHandle>,
    dptr: CUdeviceptr,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some(t) = tenant() else { return call() };
    call()?;
    if let Some(h) = handle.get() {
        t.ipc_exported(dptr, &h.reserved);
    }
    Ok(())
}

fn open(
    pdptr: Out<CUdeviceptr>,
    handle: &CUipcMemHandle,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some(t) = tenant() else { return call() };
    t.ipc_opened(&handle.reserved, || {
        call()?;
        Ok(pdptr.get().unwrap_or(0))
    })
}

fn close(dptr: CUdeviceptr, call: impl FnOnce() -> CUresult) -> CUresult {
    match tenant() {
        Some(t) => t.ipc_closed(dptr, call),
        None => call(),
    }
}
