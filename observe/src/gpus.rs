//! GPU indices as NVML numbers them (the `gpu` label of dcgm-exporter and of `nvidia-smi`), by UUID.
//! The ledgers know GPUs only by UUID; NVML (`libnvidia-ml.so.1`, loaded at run time) tells the
//! index. Without NVML the map is empty and series carry `gpu=""` (join on `UUID`). A MIG device
//! (`MIG-<uuid>`, nvml.h's MIG device handles) carries its GPU's index, as dcgm-exporter's `gpu`
//! label does for MIG devices.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::time::{Duration, Instant};

type NvmlReturn = c_int;
type NvmlDevice = *mut c_void;
/// NVML_DEVICE_UUID_V2_BUFFER_SIZE.
const UUID_BUFFER: usize = 96;

/// NVML's UUID of each device index (`UUID -> index`); empty when NVML cannot be used.
pub fn query_nvml() -> HashMap<String, u32> {
    query().unwrap_or_default()
}

fn query() -> Option<HashMap<String, u32>> {
    // SAFETY: loading NVML runs its initialisers; it is the library NVIDIA ships for exactly this
    // use (nvidia-smi, dcgm-exporter load it the same way).
    let lib = unsafe { libloading::Library::new("libnvidia-ml.so.1") }.ok()?;
    // SAFETY: the signatures are NVML's (nvml.h): nvmlReturn_t nvmlInit_v2(void),
    // nvmlDeviceGetCount_v2(unsigned*), nvmlDeviceGetHandleByIndex_v2(unsigned, nvmlDevice_t*),
    // nvmlDeviceGetUUID(nvmlDevice_t, char*, unsigned), nvmlShutdown(void).
    unsafe {
        let init = lib
            .get::<unsafe extern "C" fn() -> NvmlReturn>(b"nvmlInit_v2\0")
            .ok()?;
        let count = lib
            .get::<unsafe extern "C" fn(*mut c_uint) -> NvmlReturn>(b"nvmlDeviceGetCount_v2\0")
            .ok()?;
        let by_index = lib
            .get::<unsafe extern "C" fn(c_uint, *mut NvmlDevice) -> NvmlReturn>(
                b"nvmlDeviceGetHandleByIndex_v2\0",
            )
            .ok()?;
        let uuid = lib
            .get::<unsafe extern "C" fn(NvmlDevice, *mut c_char, c_uint) -> NvmlReturn>(
                b"nvmlDeviceGetUUID\0",
            )
            .ok()?;
        let shutdown = lib
            .get::<unsafe extern "C" fn() -> NvmlReturn>(b"nvmlShutdown\0")
            .ok()?;
        // nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t, unsigned*) and
        // nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t, unsigned, nvmlDevice_t*): optional.
        let mig_count = lib
            .get::<unsafe extern "C" fn(NvmlDevice, *mut c_uint) -> NvmlReturn>(
                b"nvmlDeviceGetMaxMigDeviceCount\0",
            )
            .ok();
        let mig_by_index = lib
            .get::<unsafe extern "C" fn(NvmlDevice, c_uint, *mut NvmlDevice) -> NvmlReturn>(
                b"nvmlDeviceGetMigDeviceHandleByIndex\0",
            )
            .ok();
        let text_of = |dev: NvmlDevice| -> Option<String> {
            let mut buf = [0 as c_char; UUID_BUFFER];
            if uuid(dev, buf.as_mut_ptr(), UUID_BUFFER as c_uint) != 0 {
                return None;
            }
            // The buffer is NUL-terminated by NVML; the last byte is kept 0 regardless.
            buf[UUID_BUFFER - 1] = 0;
            Some(CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned())
        };
        if init() != 0 {
            return None;
        }
        let mut n: c_uint = 0;
        let mut out = HashMap::new();
        if count(&mut n) == 0 {
            for i in 0..n.min(64) {
                let mut dev: NvmlDevice = std::ptr::null_mut();
                if by_index(i, &mut dev) != 0 {
                    continue;
                }
                if let Some(text) = text_of(dev) {
                    out.insert(text, i);
                }
                let mut max: c_uint = 0;
                if let (Some(count), Some(mig)) = (&mig_count, &mig_by_index) {
                    if count(dev, &mut max) == 0 {
                        for m in 0..max.min(64) {
                            let mut instance: NvmlDevice = std::ptr::null_mut();
                            if mig(dev, m, &mut instance) == 0 {
                                if let Some(text) = text_of(instance) {
                                    out.insert(text, i);
                                }
                            }
                        }
                    }
                }
            }
        }
        shutdown();
        Some(out)
    }
}

/// The UUID -> index map, asked of NVML again (at most every 30 s) when a UUID it did not know
/// shows up (a GPU added, or NVML not ready when the exporter started).
pub struct GpuIndex {
    map: HashMap<String, u32>,
    asked: Option<Instant>,
    ask: fn() -> HashMap<String, u32>,
}

const REQUERY: Duration = Duration::from_secs(30);

impl GpuIndex {
    pub fn from_nvml() -> GpuIndex {
        GpuIndex::with(query_nvml)
    }

    /// With another source of the map (tests).
    pub fn with(ask: fn() -> HashMap<String, u32>) -> GpuIndex {
        GpuIndex {
            map: HashMap::new(),
            asked: None,
            ask,
        }
    }

    /// The `gpu` label of `uuid`: NVML's index, or "" when NVML does not know it.
    pub fn label(&mut self, uuid: &str) -> String {
        let due = match self.asked {
            None => true,
            Some(t) => t.elapsed() >= REQUERY,
        };
        if !self.map.contains_key(uuid) && due {
            self.map = (self.ask)();
            self.asked = Some(Instant::now());
        }
        self.map
            .get(uuid)
            .map_or_else(String::new, |i| i.to_string())
    }
}
