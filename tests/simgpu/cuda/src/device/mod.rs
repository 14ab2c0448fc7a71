//! Devices: queries and attributes (CUDA_VISIBLE_DEVICES is `visible.rs`).

use gpuslice_api::types::{CUdevice, CUdevprop, CUmemoryPool, CUuuid, CU_DEVICE_ATTRIBUTE_MAX};
use gpuslice_api::{CUerror, CUresult};
use simgpu_core::{DeviceInfo, GpuInfo};
use std::ffi::{c_char, c_int, CStr};
use std::sync::OnceLock;

mod visible;
#[cfg(test)]
use visible::{mig_rule, parse_visible};
pub use visible::{physical, visible, visible_ordinal};

pub fn info(physical: u32) -> &'static DeviceInfo {
    &simgpu_core::physical_devices()[physical as usize]
}

/// (domain, bus, device, function) of a PCI bus id "dddddddd:bb:dd.f" (also "dddd:bb:dd.f", "bb:dd.f").
fn parse_pci(id: &str) -> Option<(u32, u32, u32, u32)> {
    let id = id.trim();
    let (rest, function) = match id.rsplit_once('.') {
        Some((r, f)) => (r, u32::from_str_radix(f, 16).ok()?),
        None => (id, 0),
    };
    let parts: Vec<&str> = rest.split(':').collect();
    let num = |s: &str| u32::from_str_radix(s, 16).ok();
    match parts.as_slice() {
        [d, b, v] => Some((num(d)?, num(b)?, num(v)?, function)),
        [b, v] => Some((0, num(b)?, num(v)?, function)),
        _ => None,
    }
}

fn pci(physical: u32) -> (u32, u32, u32, u32) {
    parse_pci(&info(physical).pci_bus_id).unwrap_or((0, physical + 1, 0, 0))
}

/// An H100-SXM-like attribute table (values as the real driver reports for that board), with the
/// per-device values (SM count, compute capability, PCI location) from simgpu's device description.
pub(crate) fn attribute(attr: c_int, physical: u32) -> Option<i32> {
    let d = info(physical);
    let (domain, bus, device, _) = pci(physical);
    let v = match attr {
        1 => 1024,
        2 | 3 => 1024,
        4 => 64,
        5 => i32::MAX,
        6 | 7 => 65535,
        8 => 49152,
        9 => 65536,
        10 => 32,
        11 => i32::MAX,
        12 => 65536,
        13 => 1_980_000,
        14 => 512,
        15 => 1,
        16 => d.multiprocessor_count,
        17 | 18 => 0,
        19 => 1,
        20 => 0,
        21 => 131072,
        22 => 131072,
        23 => 65536,
        24..=26 => 16384,
        27 | 28 => 32768,
        29 => 2048,
        30 => 512,
        31 | 32 => 1,
        33 => bus as i32,
        34 => device as i32,
        35 => 0,
        36 => 2_619_000,
        37 => 5120,
        38 => 52_428_800,
        39 => 2048,
        40 => 5,
        41 => 1,
        42 => 32768,
        43 => 2048,
        44 => 1,
        45 | 46 => 32768,
        47 | 48 => 8192,
        49 => 32768,
        50 => domain as i32,
        51 => 32,
        52 | 53 => 32768,
        54 => 2046,
        55 => 32768,
        56 => 131072,
        57 => 65536,
        58..=60 => 16384,
        61 => 32768,
        62 => 2048,
        63 | 64 => 32768,
        65 => 2048,
        66 | 67 => 32768,
        68 => 2046,
        69 => 268_435_456,
        70 => 131072,
        71 => 65000,
        72 => 2_097_120,
        73 | 74 => 32768,
        75 => d.compute_capability.0,
        76 => d.compute_capability.1,
        77 => 32768,
        78..=80 => 1,
        81 => 233_472,
        82 => 65536,
        83 => 1,
        84..=86 => 0,
        87 => 2,
        88 => 0,
        89..=91 => 1,
        92..=94 => 0,
        95 => 1,
        96 => 0,
        97 => 232_448,
        98 => 0,
        99 => 1,
        100 | 101 => 0,
        102 | 103 => 1,
        104 | 105 => 0,
        106 => 32,
        107 => 1,
        108 => 51_380_224,
        109 => 134_213_632,
        110 => 1,
        111 => 1024,
        112..=116 => 1,
        117 => 1,
        118 => 100,
        119 => 1,
        120..=125 => 1,
        126 => 4,
        127 => 1,
        128..=130 => 0,
        131 => -1,
        132 | 133 => 0,
        134 => -1,
        135..=138 => 0,
        // (PCI device id << 16) | NVIDIA's vendor id; H100 SXM5 80GB.
        139 => 0x2330_10DE,
        140 => 0x16C1_10DE,
        141..=143 => 0,
        144..=146 => 0,
        147 => 0,
        148 => 0,
        149 => 1,
        150 => 0,
        151..=159 => 0,
        160 => i32::MAX,
        161 => 0,
        _ => return None,
    };
    debug_assert!(attr < CU_DEVICE_ATTRIBUTE_MAX);
    Some(v)
}

/// Copies `text` into a caller buffer of `len` bytes, truncating and always NUL-terminating.
///
/// # Safety
/// `buf` must be NULL or valid for `len` bytes of writes.
unsafe fn write_c_string(buf: *mut c_char, len: c_int, text: &str) -> CUresult {
    if buf.is_null() || len <= 0 {
        return Err(CUerror::INVALID_VALUE);
    }
    let n = text.len().min(len as usize - 1);
    // SAFETY: the caller guarantees `len` writable bytes; we write n + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: Option<&mut CUdevice>, ordinal: c_int) -> CUresult {
    crate::call("cuDeviceGet", || {
        crate::entry::initialized()?;
        let device = crate::out(device)?;
        physical(ordinal)?;
        *device = ordinal;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: Option<&mut c_int>) -> CUresult {
    crate::call("cuDeviceGetCount", || {
        crate::entry::initialized()?;
        *crate::out(count)? = visible().len() as c_int;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    crate::call("cuDeviceGetName", || {
        let p = physical(dev)?;
        // SAFETY: the client passes a buffer of `len` bytes.
        unsafe { write_c_string(name, len, &info(p).name) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: Option<&mut CUuuid>, dev: CUdevice) -> CUresult {
    crate::call("cuDeviceGetUuid", || {
        let p = physical(dev)?;
        crate::out(uuid)?.bytes = info(p).uuid;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: Option<&mut CUuuid>, dev: CUdevice) -> CUresult {
    crate::call("cuDeviceGetUuid_v2", || {
        let p = physical(dev)?;
        crate::out(uuid)?.bytes = info(p).uuid;
        Ok(())
    })
}

fn total_memory(physical: u32) -> u64 {
    match simgpu_core::shared() {
        Ok(s) => s.device_capacity(physical),
        Err(_) => info(physical).total_memory,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: Option<&mut usize>, dev: CUdevice) -> CUresult {
    crate::call("cuDeviceTotalMem_v2", || {
        let p = physical(dev)?;
        *crate::out(bytes)? = total_memory(p) as usize;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: Option<&mut u32>, dev: CUdevice) -> CUresult {
    crate::call("cuDeviceTotalMem", || {
        let p = physical(dev)?;
        // The legacy 32-bit entry point saturates rather than wrapping.
        *crate::out(bytes)? = total_memory(p).min(u32::MAX as u64) as u32;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: Option<&mut c_int>,
    attrib: c_int,
    dev: CUdevice,
) -> CUresult {
    crate::call("cuDeviceGetAttribute", || {
        let p = physical(dev)?;
        let pi = crate::out(pi)?;
        *pi = attribute(attrib, p).ok_or(CUerror::INVALID_VALUE)?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceComputeCapability(
    major: Option<&mut c_int>,
    minor: Option<&mut c_int>,
    dev: CUdevice,
) -> CUresult {
    crate::call("cuDeviceComputeCapability", || {
        let p = physical(dev)?;
        let (major, minor) = (crate::out(major)?, crate::out(minor)?);
        (*major, *minor) = info(p).compute_capability;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetProperties(
    prop: Option<&mut CUdevprop>,
    dev: CUdevice,
) -> CUresult {
    crate::call("cuDeviceGetProperties", || {
        let p = physical(dev)?;
        let prop = crate::out(prop)?;
        let a = |n| attribute(n, p).unwrap_or(0);
        *prop = CUdevprop {
            maxThreadsPerBlock: a(1),
            maxThreadsDim: [a(2), a(3), a(4)],
            maxGridSize: [a(5), a(6), a(7)],
            sharedMemPerBlock: a(8),
            totalConstantMemory: a(9),
            SIMDWidth: a(10),
            memPitch: a(11),
            regsPerBlock: a(12),
            clockRate: a(13),
            textureAlign: a(14),
        };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    id: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    crate::call("cuDeviceGetPCIBusId", || {
        let p = physical(dev)?;
        let (domain, bus, device, function) = pci(p);
        let text = format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}");
        // SAFETY: the client passes a buffer of `len` bytes.
        unsafe { write_c_string(id, len, &text) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetByPCIBusId(
    dev: Option<&mut CUdevice>,
    id: *const c_char,
) -> CUresult {
    crate::call("cuDeviceGetByPCIBusId", || {
        crate::entry::initialized()?;
        let dev = crate::out(dev)?;
        if id.is_null() {
            return Err(CUerror::INVALID_VALUE);
        }
        // SAFETY: non-NULL C string from the client.
        let id = unsafe { CStr::from_ptr(id) }
            .to_str()
            .map_err(|_| CUerror::INVALID_VALUE)?;
        let wanted = parse_pci(id).ok_or(CUerror::INVALID_VALUE)?;
        let found = visible()
            .iter()
            .position(|&p| pci(p) == wanted)
            .ok_or(CUerror::INVALID_DEVICE)?;
        *dev = found as CUdevice;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    pool: Option<&mut CUmemoryPool>,
    dev: CUdevice,
) -> CUresult {
    crate::call("cuDeviceGetDefaultMemPool", || {
        let p = physical(dev)?;
        *crate::out(pool)? = crate::memory::default_pool(p);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(
    pool: Option<&mut CUmemoryPool>,
    dev: CUdevice,
) -> CUresult {
    crate::call("cuDeviceGetMemPool", || {
        let p = physical(dev)?;
        *crate::out(pool)? = crate::memory::current_pool(p);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) -> CUresult {
    crate::call("cuDeviceSetMemPool", || {
        let p = physical(dev)?;
        crate::memory::set_current_pool(p, pool)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devices(n: u32) -> Vec<DeviceInfo> {
        (0..n)
            .map(|i| DeviceInfo {
                ordinal: i,
                name: "x".into(),
                uuid: [i as u8 * 17; 16],
                pci_bus_id: format!("00000000:{:02X}:00.0", i + 1),
                total_memory: 1 << 30,
                multiprocessor_count: 132,
                compute_capability: (9, 0),
                mig: None,
            })
            .collect()
    }

    fn gpus(devices: &[DeviceInfo]) -> Vec<GpuInfo> {
        devices
            .iter()
            .map(|d| GpuInfo {
                index: d.ordinal,
                info: d.clone(),
                devices: vec![d.ordinal],
                mig_mode: false,
            })
            .collect()
    }

    #[test]
    fn visible_devices() {
        let d = devices(4);
        let g = gpus(&d);
        assert_eq!(parse_visible("2,0", &d, &g), [2, 0]);
        assert_eq!(parse_visible("1,7,0", &d, &g), [1]);
        assert_eq!(parse_visible("1,1,0", &d, &g), [1]);
        assert_eq!(parse_visible("", &d, &g), Vec::<u32>::new());
        assert_eq!(parse_visible("GPU-22222222,0", &d, &g), [2, 0]);
        assert_eq!(parse_visible("GPU-,0", &d, &g), Vec::<u32>::new());
        assert_eq!(parse_pci("00000000:0A:00.0"), Some((0, 10, 0, 0)));
        assert_eq!(parse_pci("0000:0a:00.0"), Some((0, 10, 0, 0)));
    }

    #[test]
    fn mig_instances_are_enumerated_one_at_a_time() {
        // GPU 0 in MIG mode with instances (devices 0 and 1), GPU 1 whole (device 2).
        let mut d = devices(3);
        for (i, dev) in d.iter_mut().take(2).enumerate() {
            dev.mig = Some(simgpu_core::MigInstance {
                gpu: 0,
                index: i as u32,
                gpu_instance_id: i as u32 + 1,
                compute_instance_id: 0,
            });
        }
        let whole = |o: u32, devices: Vec<u32>| GpuInfo {
            index: o,
            info: d[devices[0] as usize].clone(),
            devices,
            mig_mode: false,
        };
        let g = vec![whole(0, vec![0, 1]), whole(1, vec![2])];
        let mig1 = d[1].uuid_text();
        assert!(mig1.starts_with("MIG-"), "{mig1}");
        assert_eq!(parse_visible(&mig1, &d, &g), [1]);
        assert_eq!(parse_visible(&format!("{mig1},1"), &d, &g), [1]);
        // GPU 1 first: the instance alone all the same.
        assert_eq!(parse_visible(&format!("1,{mig1}"), &d, &g), [1]);
        assert_eq!(parse_visible("0", &d, &g), [0]);
        assert_eq!(parse_visible("1", &d, &g), [2]);
        assert_eq!(mig_rule(vec![2, 0, 1], &d), [0]);
    }
}
