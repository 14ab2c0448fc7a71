//! IPC memory handles (cuda.h: `cuIpcGetMemHandle`, `cuIpcOpenMemHandle`, `cuIpcCloseMemHandle`),
//! over the shared state's exports (`simgpu_core::ipc`: who holds the memory, and whom it counts
//! against). Not modelled: the bytes themselves (an importer's mapping is a range of its own, not the
//! exporter's data), peer access between devices (the flag is accepted), and one importing context
//! per device (a process's mappings are per process).

use super::*;
use simgpu_core::ipc::IpcError;

const MAGIC: &[u8; 8] = b"SIMGPUip";

/// This process's exports (allocation base -> key) and mappings (key -> (address, references)).
fn exported() -> MutexGuard<'static, HashMap<usize, u64>> {
    static M: OnceLock<Mutex<HashMap<usize, u64>>> = OnceLock::new();
    lock(M.get_or_init(Default::default))
}

fn opened() -> MutexGuard<'static, HashMap<u64, (usize, u32)>> {
    static M: OnceLock<Mutex<HashMap<u64, (usize, u32)>>> = OnceLock::new();
    lock(M.get_or_init(Default::default))
}

fn error(e: IpcError) -> CUerror {
    match e {
        IpcError::Full => CUerror::OUT_OF_MEMORY,
        IpcError::Unknown => CUerror::INVALID_HANDLE,
        // "invalid device context", as a driver answers an open in the exporting process
        // (openucx/ucx#11226, #11603: "cuIpcOpenMemHandle() failed: invalid device context").
        IpcError::OwnProcess => CUerror::INVALID_CONTEXT,
    }
}

/// The allocation at `base` is being freed: true when an importer still maps it (it lives on,
/// counted against that importer; nothing is returned to the device here).
pub(super) fn exported_freed(base: usize) -> bool {
    let Some(key) = exported().remove(&base) else {
        return false;
    };
    shared().is_ok_and(|s| s.ipc_free(key))
}

/// A mapping of `key` went (closed for the last time, or its context destroyed).
pub(super) fn unmapped(key: u64) {
    opened().remove(&key);
    if let Ok(s) = shared() {
        s.ipc_close(key);
    }
}

/// cuda.h: "Takes a pointer to the base of an existing device memory allocation created with
/// ::cuMemAlloc and exports it for use in another process. This is a lightweight operation and may
/// be called multiple times on an allocation without adverse effects."
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(
    handle: Option<&mut CUipcMemHandle>,
    dptr: CUdeviceptr,
) -> CUresult {
    crate::call("cuIpcGetMemHandle", || {
        crate::context::current()?;
        let handle = crate::out(handle)?;
        let m = mem();
        let a = match m.allocs.get(&(dptr as usize)) {
            Some(a) if !a.freeing && a.kind == Kind::Device => *a,
            _ => return Err(CUerror::INVALID_VALUE),
        };
        drop(m);
        let key = shared()?
            .ipc_export(a.device, dptr, a.span as u64)
            .map_err(error)?;
        exported().insert(dptr as usize, key);
        let mut bytes = [0u8; 64];
        bytes[..8].copy_from_slice(MAGIC);
        bytes[8..16].copy_from_slice(&key.to_le_bytes());
        bytes[16..24].copy_from_slice(&(a.span as u64).to_le_bytes());
        handle.reserved = bytes;
        Ok(())
    })
}

/// cuda.h: maps the export into this process; "If the memory handle has already been opened by the
/// current context, the reference count on the handle is incremented by 1 and the existing device
/// pointer is returned"; Flags "Must be specified as ::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS" (0 is
/// accepted too, as callers on one device pass it; any other bit is `CUDA_ERROR_INVALID_VALUE`).
fn open(pdptr: Option<&mut CUdeviceptr>, handle: CUipcMemHandle, flags: c_uint) -> CUresult {
    let ctx = crate::context::current()?;
    let pdptr = crate::out(pdptr)?;
    if flags & !CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS != 0 {
        return Err(CUerror::INVALID_VALUE);
    }
    if &handle.reserved[..8] != MAGIC {
        return Err(CUerror::INVALID_HANDLE);
    }
    let key = u64::from_le_bytes(handle.reserved[8..16].try_into().unwrap_or_default());
    if let Some((at, refs)) = opened().get_mut(&key) {
        *refs += 1;
        *pdptr = *at as CUdeviceptr;
        return Ok(());
    }
    let (device, bytes) = shared()?.ipc_open(key).map_err(error)?;
    let span = bytes as usize;
    let mut m = mem();
    let at = match m.space().map(|s| s.alloc(span, ALIGN)) {
        Ok(Some(at)) => at,
        other => {
            drop(m);
            shared()?.ipc_close(key);
            return Err(other.err().unwrap_or(CUerror::OUT_OF_MEMORY));
        }
    };
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    m.allocs.insert(
        at,
        Alloc {
            size: span,
            span,
            device,
            ctx: ctx_handle(&ctx),
            kind: Kind::Ipc(key),
            freeing: false,
            id,
        },
    );
    drop(m);
    opened().insert(key, (at, 1));
    *pdptr = at as CUdeviceptr;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle(
    pdptr: Option<&mut CUdeviceptr>,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> CUresult {
    crate::call("cuIpcOpenMemHandle", || open(pdptr, handle, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    pdptr: Option<&mut CUdeviceptr>,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> CUresult {
    crate::call("cuIpcOpenMemHandle_v2", || open(pdptr, handle, flags))
}

/// cuda.h: "Decrements the reference count of the memory returned by ::cuIpcOpenMemHandle by 1.
/// When the reference count reaches 0, this API unmaps the memory."
#[no_mangle]
pub unsafe extern "C" fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult {
    crate::call("cuIpcCloseMemHandle", || {
        crate::context::current()?;
        let key = match mem().allocs.get(&(dptr as usize)) {
            Some(a) => match a.kind {
                Kind::Ipc(key) => key,
                _ => return Err(CUerror::INVALID_VALUE),
            },
            None => return Err(CUerror::INVALID_VALUE),
        };
        let last = match opened().get_mut(&key) {
            Some((_, refs)) => {
                *refs -= 1;
                *refs == 0
            }
            None => true,
        };
        if last {
            // Mem::free unmaps it (`unmapped`).
            mem().free(dptr as usize);
        }
        Ok(())
    })
}
