//! Devices: the count, handles (by index, UUID or PCI bus id) and what a device says of itself
//! (name, UUID, index, minor number, compute capability, clocks, PCI information).

use super::*;

fn count() -> u32 {
    gpus().len() as u32
}

/// # Safety
/// `n` is null or valid for writing an unsigned int.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(n: *mut c_uint) -> NvmlReturn {
    // SAFETY: the caller's contract.
    call("nvmlDeviceGetCount", true, || unsafe { put(n, count()) })
}

/// # Safety
/// `n` is null or valid for writing an unsigned int.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(n: *mut c_uint) -> NvmlReturn {
    // SAFETY: the caller's contract.
    call("nvmlDeviceGetCount_v2", true, || unsafe { put(n, count()) })
}

fn by_index(index: c_uint, out: *mut nvmlDevice_t) -> NvmlReturn {
    if index >= count() {
        return Err(NvmlError::INVALID_ARGUMENT);
    }
    // SAFETY: `out` is the caller's out-pointer (null or valid), per the entry point's contract.
    unsafe { put(out, handle(index)) }
}

/// # Safety
/// `device` is null or valid for writing a handle.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> NvmlReturn {
    call("nvmlDeviceGetHandleByIndex", true, || {
        by_index(index, device)
    })
}

/// # Safety
/// `device` is null or valid for writing a handle.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> NvmlReturn {
    call("nvmlDeviceGetHandleByIndex_v2", true, || {
        by_index(index, device)
    })
}

/// # Safety
/// `uuid` is null or a NUL-terminated string; `device` is null or valid for writing a handle.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> NvmlReturn {
    call("nvmlDeviceGetHandleByUUID", true, || {
        // SAFETY: the caller's contract.
        let want = unsafe { arg_str(uuid) }?.trim();
        // "The UUID of the target GPU or MIG instance" (nvml.h).
        if let Some(g) = gpus()
            .iter()
            .find(|g| g.info.uuid_text().eq_ignore_ascii_case(want))
        {
            return by_index(g.index, device);
        }
        let d = physical_devices()
            .iter()
            .find(|d| d.mig.is_some() && d.uuid_text().eq_ignore_ascii_case(want))
            .ok_or(NvmlError::NOT_FOUND)?;
        // SAFETY: the caller's contract.
        unsafe { put(device, mig_handle(d.ordinal)) }
    })
}

fn by_bus_id(bus: *const c_char, device: *mut nvmlDevice_t) -> NvmlReturn {
    // SAFETY: the entry point's contract: null or a NUL-terminated string.
    let want = parse_bus_id(unsafe { arg_str(bus) }?).ok_or(NvmlError::INVALID_ARGUMENT)?;
    let g = gpus()
        .iter()
        .find(|g| parse_bus_id(&g.info.pci_bus_id) == Some(want))
        .ok_or(NvmlError::NOT_FOUND)?;
    by_index(g.index, device)
}

/// # Safety
/// `bus` is null or a NUL-terminated string; `device` is null or valid for writing a handle.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    bus: *const c_char,
    device: *mut nvmlDevice_t,
) -> NvmlReturn {
    call("nvmlDeviceGetHandleByPciBusId", true, || {
        by_bus_id(bus, device)
    })
}

/// # Safety
/// `bus` is null or a NUL-terminated string; `device` is null or valid for writing a handle.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus: *const c_char,
    device: *mut nvmlDevice_t,
) -> NvmlReturn {
    call("nvmlDeviceGetHandleByPciBusId_v2", true, || {
        by_bus_id(bus, device)
    })
}

/// # Safety
/// `name` is null or valid for `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    // SAFETY: the caller's contract.
    call("nvmlDeviceGetName", true, || unsafe {
        put_str(name, length, &self::device(device)?.name)
    })
}

/// # Safety
/// `uuid` is null or valid for `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    // SAFETY: the caller's contract.
    call("nvmlDeviceGetUUID", true, || unsafe {
        put_str(uuid, length, &self::device(device)?.uuid_text())
    })
}

/// # Safety
/// `index` is null or valid for writing an unsigned int.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: the caller's contract.
    call("nvmlDeviceGetIndex", true, || unsafe {
        // A MIG device's index under its GPU (nvml.h: "indices that can be passed to
        // nvmlDeviceGetMigDeviceHandleByIndex").
        let i = match target(device)? {
            Target::Gpu(g) => g.index,
            Target::Mig(d) => d.mig.map_or(0, |m| m.index),
        };
        put(index, i)
    })
}

/// # Safety
/// `minor` is null or valid for writing an unsigned int.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minor: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: the caller's contract.
    call("nvmlDeviceGetMinorNumber", true, || unsafe {
        let gpu = match target(device)? {
            Target::Gpu(g) => g.index,
            Target::Mig(d) => d.mig.map_or(0, |m| m.gpu),
        };
        put(minor, gpu)
    })
}

/// # Safety
/// `multi` is null or valid for writing an unsigned int.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMultiGpuBoard(
    device: nvmlDevice_t,
    multi: *mut c_uint,
) -> NvmlReturn {
    call("nvmlDeviceGetMultiGpuBoard", true, || {
        self::device(device)?;
        // SAFETY: the caller's contract.
        unsafe { put(multi, 0) }
    })
}

/// # Safety
/// `major` and `minor` are null or valid for writing an int.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> NvmlReturn {
    call("nvmlDeviceGetCudaComputeCapability", true, || {
        let (ma, mi) = self::device(device)?.compute_capability;
        if minor.is_null() {
            return Err(NvmlError::INVALID_ARGUMENT);
        }
        // SAFETY: the caller's contract.
        unsafe {
            put(major, ma)?;
            put(minor, mi)
        }
    })
}

/// # Safety
/// `width` is null or valid for writing an unsigned int.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryBusWidth(
    device: nvmlDevice_t,
    width: *mut c_uint,
) -> NvmlReturn {
    call("nvmlDeviceGetMemoryBusWidth", true, || {
        self::device(device)?;
        // SAFETY: the caller's contract.
        unsafe { put(width, 5120) }
    })
}

/// # Safety
/// `clock` is null or valid for writing an unsigned int.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: nvmlDevice_t,
    kind: c_uint,
    clock: *mut c_uint,
) -> NvmlReturn {
    call("nvmlDeviceGetMaxClockInfo", true, || {
        self::device(device)?;
        let mhz = match kind {
            NVML_CLOCK_GRAPHICS | NVML_CLOCK_SM => 1410,
            NVML_CLOCK_MEM => 1215,
            NVML_CLOCK_VIDEO => 1275,
            _ => return Err(NvmlError::INVALID_ARGUMENT),
        };
        // SAFETY: the caller's contract.
        unsafe { put(clock, mhz) }
    })
}

fn pci_info(device: nvmlDevice_t, full: bool, pci: *mut nvmlPciInfo_t) -> NvmlReturn {
    let d = self::device(device)?;
    if pci.is_null() {
        return Err(NvmlError::INVALID_ARGUMENT);
    }
    let (domain, bus, dev, _) = parse_bus_id(&d.pci_bus_id).unwrap_or_default();
    let legacy = format!("{domain:04X}:{bus:02X}:{dev:02X}.0");
    let mut info = nvmlPciInfo_t {
        busIdLegacy: [0; NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE],
        domain,
        bus,
        device: dev,
        // Device id (A100 SXM4) << 16 | NVIDIA's vendor id.
        pciDeviceId: 0x20B0_10DE,
        pciSubSystemId: 0x134F_10DE,
        busId: [0; NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE],
    };
    for (dst, src) in info.busIdLegacy.iter_mut().zip(
        legacy
            .bytes()
            .take(NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE - 1),
    ) {
        *dst = src as c_char;
    }
    for (dst, src) in info.busId.iter_mut().zip(
        nvml_bus_id(d)
            .bytes()
            .take(NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE - 1),
    ) {
        *dst = src as c_char;
    }
    // The v1 struct ends after `pciSubSystemId` (its `busId` is the 16-byte legacy one, same offset).
    let len = if full {
        std::mem::size_of::<nvmlPciInfo_t>()
    } else {
        std::mem::offset_of!(nvmlPciInfo_t, busId)
    };
    // SAFETY: `pci` is non-null and, per the entry point's contract, valid for the struct of its
    // version, which is at least `len` bytes; `info` is a local of at least `len` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (&info as *const nvmlPciInfo_t).cast::<u8>(),
            pci.cast::<u8>(),
            len,
        )
    };
    Ok(())
}

/// # Safety
/// `pci` is null or valid for writing the v1 `nvmlPciInfo_t` (the prefix through `pciSubSystemId`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> NvmlReturn {
    call("nvmlDeviceGetPciInfo", true, || {
        pci_info(device, false, pci)
    })
}

/// # Safety
/// `pci` is null or valid for writing an `nvmlPciInfo_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> NvmlReturn {
    call("nvmlDeviceGetPciInfo_v2", true, || {
        pci_info(device, true, pci)
    })
}

/// # Safety
/// `pci` is null or valid for writing an `nvmlPciInfo_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> NvmlReturn {
    call("nvmlDeviceGetPciInfo_v3", true, || {
        pci_info(device, true, pci)
    })
}
