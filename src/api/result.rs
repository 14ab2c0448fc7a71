//! `CUresult` and `nvmlReturn_t` as Rust results, ABI-identical to the C `int`.
//!
//! `Result<(), E>` where `E` wraps a `NonZeroU32` has the layout of `u32` (the `Option`-like
//! representation guaranteed by `core::result`): success is 0, errors their code. Hooks use `?`.

use std::fmt;
use std::num::NonZeroU32;

/// A CUDA driver error code (never `CUDA_SUCCESS`).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CUerror(pub NonZeroU32);

/// The C `CUresult`: `Ok(())` is `CUDA_SUCCESS`.
pub type CUresult = Result<(), CUerror>;

/// An NVML error code (never `NVML_SUCCESS`).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NvmlError(pub NonZeroU32);

/// The C `nvmlReturn_t`: `Ok(())` is `NVML_SUCCESS`.
pub type NvmlReturn = Result<(), NvmlError>;

include!(concat!(env!("OUT_DIR"), "/errors.rs"));

fn lookup(
    table: &'static [(u32, &'static str, &'static str)],
    code: u32,
) -> Option<(&'static str, &'static str)> {
    table
        .binary_search_by_key(&code, |e| e.0)
        .ok()
        .map(|i| (table[i].1, table[i].2))
}

impl CUerror {
    /// The error for a raw `CUresult`, `None` for success.
    pub fn from_code(code: u32) -> Option<Self> {
        NonZeroU32::new(code).map(Self)
    }
    pub fn code(self) -> u32 {
        self.0.get()
    }
}

/// `CUresult` <-> raw code.
pub fn cu_code(r: CUresult) -> u32 {
    match r {
        Ok(()) => 0,
        Err(e) => e.code(),
    }
}

/// Raw code -> `CUresult`.
pub fn cu_result(code: u32) -> CUresult {
    match CUerror::from_code(code) {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

/// `cuGetErrorName` / `cuGetErrorString` text for a code the driver defines.
pub fn cuda_error_name(code: u32) -> Option<&'static str> {
    lookup(CUDA_CODES, code).map(|e| e.0)
}
pub fn cuda_error_string(code: u32) -> Option<&'static str> {
    lookup(CUDA_CODES, code).map(|e| e.1)
}

/// `nvmlErrorString` text; the real library answers "Unknown Error" for codes it does not define.
pub fn nvml_error_string(code: u32) -> &'static str {
    lookup(NVML_CODES, code).map_or("Unknown Error", |e| e.1)
}
pub fn nvml_error_name(code: u32) -> Option<&'static str> {
    lookup(NVML_CODES, code).map(|e| e.0)
}

impl NvmlError {
    pub fn from_code(code: u32) -> Option<Self> {
        NonZeroU32::new(code).map(Self)
    }
    pub fn code(self) -> u32 {
        self.0.get()
    }
}

impl fmt::Debug for CUerror {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match cuda_error_name(self.code()) {
            Some(name) => f.write_str(name),
            None => write!(f, "CUresult({})", self.code()),
        }
    }
}
impl fmt::Display for CUerror {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
impl fmt::Debug for NvmlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match nvml_error_name(self.code()) {
            Some(name) => f.write_str(name),
            None => write!(f, "nvmlReturn_t({})", self.code()),
        }
    }
}
impl fmt::Display for NvmlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_is_abi_identical_to_u32() {
        assert_eq!(std::mem::size_of::<CUresult>(), 4);
        let err: CUresult = Err(CUerror::OUT_OF_MEMORY);
        // SAFETY: CUresult is documented (core::result, "Representation") to have u32's layout.
        let raw: u32 = unsafe { std::mem::transmute(err) };
        assert_eq!(raw, 2);
        assert_eq!(cu_code(Ok(())), 0);
        assert_eq!(
            format!("{:?}", CUerror::INVALID_VALUE),
            "CUDA_ERROR_INVALID_VALUE"
        );
        assert_eq!(cuda_error_string(2), Some("out of memory"));
        assert_eq!(nvml_error_string(2), "Invalid Argument");
    }
}
