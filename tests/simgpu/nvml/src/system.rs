//! Initialisation and system queries: nvmlInit/Shutdown, the driver and NVML versions, error
//! strings, the device count.

use super::*;

fn init() -> NvmlReturn {
    if let Err(e) = state() {
        eprintln!("simgpu: nvmlInit: {}", attach().err().unwrap_or_default());
        return Err(e);
    }
    INIT.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> NvmlReturn {
    call("nvmlInit", false, init)
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> NvmlReturn {
    call("nvmlInit_v2", false, init)
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> NvmlReturn {
    call("nvmlInitWithFlags", false, init)
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> NvmlReturn {
    call("nvmlShutdown", false, || {
        INIT.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .map(drop)
            .map_err(|_| NvmlError::UNINITIALIZED)
    })
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: c_uint) -> *const c_char {
    static STRINGS: OnceLock<Vec<(u32, std::ffi::CString)>> = OnceLock::new();
    let strings = STRINGS.get_or_init(|| {
        gpuslice_api::result::NVML_CODES
            .iter()
            .map(|e| (e.0, std::ffi::CString::new(e.2).unwrap_or_default()))
            .collect()
    });
    match strings.iter().find(|e| e.0 == result) {
        Some(e) => e.1.as_ptr(),
        None => {
            debug_assert_eq!(nvml_error_string(result), "Unknown Error");
            c"Unknown Error".as_ptr()
        }
    }
}

/// # Safety
/// `version` is null or valid for `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    // SAFETY: the caller's contract.
    call("nvmlSystemGetDriverVersion", true, || unsafe {
        put_str(version, length, driver_version_string())
    })
}

/// # Safety
/// `version` is null or valid for `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    let v = format!(
        "{}.{}",
        config().driver_version / 1000,
        driver_version_string()
    );
    // SAFETY: the caller's contract.
    call("nvmlSystemGetNVMLVersion", true, || unsafe {
        put_str(version, length, &v)
    })
}

/// # Safety
/// `v` is null or valid for writing an int.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> NvmlReturn {
    // SAFETY: the caller's contract.
    call("nvmlSystemGetCudaDriverVersion", true, || unsafe {
        put(v, config().driver_version)
    })
}

/// # Safety
/// `v` is null or valid for writing an int.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> NvmlReturn {
    // SAFETY: the caller's contract.
    call("nvmlSystemGetCudaDriverVersion_v2", true, || unsafe {
        put(v, config().driver_version)
    })
}

/// # Safety
/// `name` is null or valid for `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetProcessName(
    pid: c_uint,
    name: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    call("nvmlSystemGetProcessName", true, || {
        let cmdline =
            std::fs::read(format!("/proc/{pid}/cmdline")).map_err(|_| NvmlError::NOT_FOUND)?;
        let first = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        let text = String::from_utf8_lossy(first);
        let text = if text.is_empty() {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map_err(|_| NvmlError::NOT_FOUND)?
                .trim()
                .to_owned()
        } else {
            text.into_owned()
        };
        // Truncated to the buffer, as NVML does for process names.
        let max = (length as usize).saturating_sub(1);
        let mut end = text.len().min(max);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        // SAFETY: the caller's contract.
        unsafe { put_str(name, length, &text[..end]) }
    })
}
