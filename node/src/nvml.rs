//! The node's GPUs, through NVML (`libnvidia-ml.so.1`, or `GPUSLICE_REAL_NVML`), loaded at run time.

use libloading::{Library, Symbol};
use std::ffi::{c_char, c_uint, c_void, CStr};

/// One GPU of the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// NVML index.
    pub index: u32,
    /// `GPU-...`, canonical.
    pub uuid: String,
    pub name: String,
    /// Total device memory, bytes.
    pub memory: u64,
    /// NVML answers the memory query for it.
    pub healthy: bool,
}

#[repr(C)]
#[derive(Default)]
struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}

type Device = *mut c_void;

fn library_name() -> String {
    std::env::var("GPUSLICE_REAL_NVML")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "libnvidia-ml.so.1".into())
}

/// Every GPU NVML reports, in NVML's order.
pub fn gpus() -> Result<Vec<Gpu>, String> {
    let name = library_name();
    // SAFETY: loading NVML runs its initialisers, which have no preconditions.
    let lib = unsafe { Library::new(&name) }.map_err(|e| format!("NVML ({name}): {e}"))?;
    // SAFETY: each symbol's type is its declaration in nvml.h.
    unsafe {
        let init: Symbol<unsafe extern "C" fn() -> c_uint> = sym(&lib, b"nvmlInit_v2\0")?;
        let count: Symbol<unsafe extern "C" fn(*mut c_uint) -> c_uint> =
            sym(&lib, b"nvmlDeviceGetCount_v2\0")?;
        let handle: Symbol<unsafe extern "C" fn(c_uint, *mut Device) -> c_uint> =
            sym(&lib, b"nvmlDeviceGetHandleByIndex_v2\0")?;
        let uuid: Symbol<unsafe extern "C" fn(Device, *mut c_char, c_uint) -> c_uint> =
            sym(&lib, b"nvmlDeviceGetUUID\0")?;
        let gname: Symbol<unsafe extern "C" fn(Device, *mut c_char, c_uint) -> c_uint> =
            sym(&lib, b"nvmlDeviceGetName\0")?;
        let memory: Symbol<unsafe extern "C" fn(Device, *mut NvmlMemory) -> c_uint> =
            sym(&lib, b"nvmlDeviceGetMemoryInfo\0")?;
        let shutdown: Symbol<unsafe extern "C" fn() -> c_uint> = sym(&lib, b"nvmlShutdown\0")?;
        let rc = init();
        if rc != 0 {
            return Err(format!("NVML ({name}): nvmlInit_v2 returned {rc}"));
        }
        let mut n: c_uint = 0;
        let rc = count(&mut n);
        if rc != 0 {
            shutdown();
            return Err(format!(
                "NVML ({name}): nvmlDeviceGetCount_v2 returned {rc}"
            ));
        }
        let mut out = Vec::new();
        for i in 0..n {
            let mut dev: Device = std::ptr::null_mut();
            if handle(i, &mut dev) != 0 {
                out.push(Gpu {
                    index: i,
                    uuid: String::new(),
                    name: String::new(),
                    memory: 0,
                    healthy: false,
                });
                continue;
            }
            let text = |f: &Symbol<unsafe extern "C" fn(Device, *mut c_char, c_uint) -> c_uint>| {
                let mut buf = [0 as c_char; 96];
                if f(dev, buf.as_mut_ptr(), buf.len() as c_uint) != 0 {
                    return String::new();
                }
                CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned()
            };
            let u = text(&uuid);
            let mut m = NvmlMemory::default();
            let mem_ok = memory(dev, &mut m) == 0;
            out.push(Gpu {
                index: i,
                uuid: gpuslice::config::canonical_uuid(&u).unwrap_or(u),
                name: text(&gname),
                memory: m.total,
                healthy: mem_ok && m.total > 0,
            });
        }
        shutdown();
        Ok(out)
    }
}

/// # Safety
/// `T` must be the symbol's real type.
unsafe fn sym<'a, T>(lib: &'a Library, name: &[u8]) -> Result<Symbol<'a, T>, String> {
    // SAFETY: the caller guarantees the type.
    unsafe { lib.get(name) }.map_err(|e| {
        format!(
            "NVML: {}: {e}",
            String::from_utf8_lossy(&name[..name.len() - 1])
        )
    })
}
