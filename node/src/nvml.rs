//! The node's GPUs, through NVML (`libnvidia-ml.so.1`, or `GPUSLICE_REAL_NVML`), loaded at run time.
//!
//! A GPU in MIG mode is its MIG devices: each is a GPU of its own to the node (tenants, slices),
//! named by its `MIG-` UUID, with its own memory (nvml.h, "Multi Instance GPU Management":
//! `nvmlDeviceGetMigMode`, `nvmlDeviceGetMaxMigDeviceCount`, `nvmlDeviceGetMigDeviceHandleByIndex`;
//! a MIG device handle answers `nvmlDeviceGetUUID` and `nvmlDeviceGetMemoryInfo` for the instance).

use libloading::{Library, Symbol};
use std::ffi::{c_char, c_uint, c_void, CStr};

/// One GPU of the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// NVML index (a MIG device's: its GPU's).
    pub index: u32,
    /// A MIG device's index under its GPU (`None`: a whole GPU).
    pub mig: Option<u32>,
    /// `GPU-...` (a MIG device: `MIG-...`), canonical.
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

impl Gpu {
    /// How NVML indexes name it: `0`, or `0:1` for MIG device 1 of GPU 0 (the form NVIDIA's CDI
    /// specs and its device plugin's index strategy use for MIG devices).
    pub fn index_name(&self) -> String {
        match self.mig {
            Some(m) => format!("{}:{m}", self.index),
            None => self.index.to_string(),
        }
    }
}

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
        // MIG queries are optional: an NVML without them has no MIG devices.
        let mig_mode: Option<
            Symbol<unsafe extern "C" fn(Device, *mut c_uint, *mut c_uint) -> c_uint>,
        > = sym(&lib, b"nvmlDeviceGetMigMode\0").ok();
        let mig_count: Option<Symbol<unsafe extern "C" fn(Device, *mut c_uint) -> c_uint>> =
            sym(&lib, b"nvmlDeviceGetMaxMigDeviceCount\0").ok();
        let mig_handle: Option<
            Symbol<unsafe extern "C" fn(Device, c_uint, *mut Device) -> c_uint>,
        > = sym(&lib, b"nvmlDeviceGetMigDeviceHandleByIndex\0").ok();
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
                    mig: None,
                    uuid: String::new(),
                    name: String::new(),
                    memory: 0,
                    healthy: false,
                });
                continue;
            }
            let describe = |dev: Device, mig: Option<u32>| {
                let text =
                    |f: &Symbol<unsafe extern "C" fn(Device, *mut c_char, c_uint) -> c_uint>| {
                        let mut buf = [0 as c_char; 96];
                        if f(dev, buf.as_mut_ptr(), buf.len() as c_uint) != 0 {
                            return String::new();
                        }
                        CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned()
                    };
                let u = text(&uuid);
                let mut m = NvmlMemory::default();
                let mem_ok = memory(dev, &mut m) == 0;
                Gpu {
                    index: i,
                    mig,
                    uuid: gpuslice_state::config::canonical_uuid(&u).unwrap_or(u),
                    name: text(&gname),
                    memory: m.total,
                    healthy: mem_ok && m.total > 0,
                }
            };
            let (mut current, mut pending): (c_uint, c_uint) = (0, 0);
            let in_mig_mode = mig_mode
                .as_ref()
                .is_some_and(|f| f(dev, &mut current, &mut pending) == 0 && current == 1);
            if let (true, Some(count), Some(by_index)) = (in_mig_mode, &mig_count, &mig_handle) {
                let mut max: c_uint = 0;
                if count(dev, &mut max) == 0 {
                    // At most a handful per GPU (seven on an H100); the bound guards a bad answer.
                    for m in 0..max.min(64) {
                        let mut mig: Device = std::ptr::null_mut();
                        if by_index(dev, m, &mut mig) == 0 {
                            out.push(describe(mig, Some(m)));
                        }
                    }
                }
                continue;
            }
            out.push(describe(dev, None));
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
