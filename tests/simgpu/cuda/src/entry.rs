//! Initialisation, versions, error names and `cuGetProcAddress`.

use gpuslice_api::procaddress::{resolve, Resolution};
use gpuslice_api::result::{cuda_error_name, cuda_error_string};
use gpuslice_api::{CUerror, CUresult};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

static INITIALIZED: AtomicBool = AtomicBool::new(false);

/// `Ok` once `cuInit` succeeded; `CUDA_ERROR_NOT_INITIALIZED` before, as every other entry point answers.
pub fn initialized() -> CUresult {
    if INITIALIZED.load(Ordering::Acquire) {
        Ok(())
    } else {
        Err(CUerror::NOT_INITIALIZED)
    }
}

fn init(flags: u32) -> CUresult {
    if flags != 0 {
        return Err(CUerror::INVALID_VALUE);
    }
    if let Err(e) = simgpu_core::shared() {
        eprintln!("simgpu: cannot open the shared device state: {e}");
        return Err(CUerror::NO_DEVICE);
    }
    // The real driver fails cuInit when CUDA_VISIBLE_DEVICES leaves no device.
    if crate::device::visible().is_empty() {
        return Err(CUerror::NO_DEVICE);
    }
    INITIALIZED.store(true, Ordering::Release);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: u32) -> CUresult {
    crate::call("cuInit", || init(flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: Option<&mut c_int>) -> CUresult {
    crate::call("cuDriverGetVersion", || {
        *crate::out(version)? = simgpu_core::config().driver_version;
        Ok(())
    })
}

/// NUL-terminated copies of the error tables, built once: C callers keep the pointers forever.
fn error_text(code: u32) -> Option<&'static (CString, CString)> {
    static TEXT: OnceLock<HashMap<u32, (CString, CString)>> = OnceLock::new();
    TEXT.get_or_init(|| {
        gpuslice_api::result::CUDA_CODES
            .iter()
            .filter_map(|&(code, name, text)| {
                Some((code, (CString::new(name).ok()?, CString::new(text).ok()?)))
            })
            .collect()
    })
    .get(&code)
}

fn error_lookup(code: u32, name: bool, out: Option<&mut *const c_char>) -> CUresult {
    let out = crate::out(out)?;
    // Keep the table lookups as the authority for which codes exist.
    let known = if name {
        cuda_error_name(code).is_some()
    } else {
        cuda_error_string(code).is_some()
    };
    match error_text(code).filter(|_| known) {
        Some((n, s)) => {
            *out = if name { n.as_ptr() } else { s.as_ptr() };
            Ok(())
        }
        None => {
            *out = std::ptr::null();
            Err(CUerror::INVALID_VALUE)
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: u32, pstr: Option<&mut *const c_char>) -> CUresult {
    crate::call("cuGetErrorName", || error_lookup(error, true, pstr))
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(
    error: u32,
    pstr: Option<&mut *const c_char>,
) -> CUresult {
    crate::call("cuGetErrorString", || error_lookup(error, false, pstr))
}

#[no_mangle]
pub unsafe extern "C" fn cuGetExportTable(
    _table: *mut *const c_void,
    _id: *const c_void,
) -> CUresult {
    crate::call("cuGetExportTable", || Err(CUerror::NOT_SUPPORTED))
}

/// Resolution shared by both `cuGetProcAddress` versions; `None` = invalid flags.
fn lookup(symbol: &CStr, version: c_int, flags: u64) -> Option<(Option<*const ()>, i32)> {
    let max = simgpu_core::config().driver_version as u32;
    let symbol = symbol.to_str().unwrap_or("");
    let resolution = resolve(symbol, version, flags, max);
    let status = resolution.status()?;
    let address = match resolution {
        Resolution::Found(entry) => crate::export_address(entry.symbol()),
        _ => None,
    };
    Some((address, status))
}

/// # Safety
/// `symbol` must be NULL or a NUL-terminated string.
unsafe fn symbol_arg<'a>(symbol: *const c_char) -> Result<&'a CStr, CUerror> {
    if symbol.is_null() {
        return Err(CUerror::INVALID_VALUE);
    }
    // SAFETY: non-NULL, and the caller passes a C string per the API contract.
    Ok(unsafe { CStr::from_ptr(symbol) })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: Option<&mut *const ()>,
    version: c_int,
    flags: u64,
) -> CUresult {
    crate::call("cuGetProcAddress", || {
        // SAFETY: C string from the client (checked for NULL).
        let symbol = unsafe { symbol_arg(symbol) }?;
        let pfn = crate::out(pfn)?;
        match lookup(symbol, version, flags) {
            None => Err(CUerror::INVALID_VALUE),
            Some((Some(address), _)) => {
                *pfn = address;
                Ok(())
            }
            // The 11.3 entry point reports "not found" and "version too old" alike, *pfn untouched.
            Some((None, _)) => Err(CUerror::NOT_FOUND),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: Option<&mut *const ()>,
    version: c_int,
    flags: u64,
    status: Option<&mut c_int>,
) -> CUresult {
    crate::call("cuGetProcAddress_v2", || {
        // SAFETY: C string from the client (checked for NULL).
        let symbol = unsafe { symbol_arg(symbol) }?;
        let pfn = crate::out(pfn)?;
        let (address, found) = lookup(symbol, version, flags).ok_or(CUerror::INVALID_VALUE)?;
        *pfn = address.unwrap_or(std::ptr::null());
        if let Some(status) = status {
            *status = found;
        }
        Ok(())
    })
}
