//! `cuGetProcAddress` resolution: which exported symbol a (name, CUDA version, flags) request gets.
//!
//! The rule, checked entry by entry against NVIDIA's 535 driver (tests/procaddress_oracle.rs):
//! * flags above 3 (`LEGACY_STREAM | PER_THREAD_DEFAULT_STREAM`) are `CUDA_ERROR_INVALID_VALUE`;
//! * the name is a *base* name (`cuMemAlloc`); exact variant names (`cuMemAlloc_v2`) are not found;
//! * with the per-thread flag (bit 1) and a base that has `_ptds`/`_ptsz` variants, only those are
//!   candidates; otherwise only the legacy ones;
//! * the newest candidate introduced at or before the requested version wins; the version is read as
//!   unsigned, so -1 asks for the newest (and versions above the driver's own resolve too, unlike the
//!   documentation says);
//! * none at or before the version: `VERSION_NOT_SUFFICIENT`; unknown base: `SYMBOL_NOT_FOUND`.

use crate::entry_points::{variants_of, DriverEntryPoint};

/// `CU_GET_PROC_ADDRESS_LEGACY_STREAM`
pub const LEGACY_STREAM: u64 = 1;
/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`
pub const PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// `CUdriverProcAddressQueryResult` values.
pub const CU_GET_PROC_ADDRESS_SUCCESS: i32 = 0;
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: i32 = 1;
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: i32 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// Flags out of range: the call fails with `CUDA_ERROR_INVALID_VALUE`, outputs untouched.
    InvalidFlags,
    Found(&'static DriverEntryPoint),
    SymbolNotFound,
    VersionNotSufficient,
}

impl Resolution {
    /// The `CUdriverProcAddressQueryResult` this resolution reports (`None` for invalid flags).
    pub fn status(self) -> Option<i32> {
        match self {
            Resolution::InvalidFlags => None,
            Resolution::Found(_) => Some(CU_GET_PROC_ADDRESS_SUCCESS),
            Resolution::SymbolNotFound => Some(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
            Resolution::VersionNotSufficient => Some(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT),
        }
    }
}

/// Resolve `symbol` as the driver does, among entry points introduced up to `max_version`
/// (the driver's own version for simgpu; `u32::MAX` for "everything in the table").
pub fn resolve(symbol: &str, cuda_version: i32, flags: u64, max_version: u32) -> Resolution {
    if flags > (LEGACY_STREAM | PER_THREAD_DEFAULT_STREAM) {
        return Resolution::InvalidFlags;
    }
    let wanted = cuda_version as u32;
    let known = || variants_of(symbol).filter(|e| e.version <= max_version);
    if known().next().is_none() {
        return Resolution::SymbolNotFound;
    }
    let per_thread =
        flags & PER_THREAD_DEFAULT_STREAM != 0 && known().any(|e| e.stream.is_per_thread());
    known()
        .filter(|e| e.stream.is_per_thread() == per_thread && e.version <= wanted)
        .max_by_key(|e| e.version)
        .map_or(Resolution::VersionNotSufficient, Resolution::Found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(name: &str, v: i32, flags: u64) -> Option<&'static str> {
        match resolve(name, v, flags, u32::MAX) {
            Resolution::Found(e) => Some(e.symbol()),
            _ => None,
        }
    }

    #[test]
    fn table_driven() {
        assert_eq!(sym("cuMemAlloc", 3000, 0), Some("cuMemAlloc"));
        assert_eq!(sym("cuMemAlloc", 3020, 0), Some("cuMemAlloc_v2"));
        assert_eq!(sym("cuMemAlloc", -1, 0), Some("cuMemAlloc_v2"));
        assert_eq!(sym("cuMemcpy", 7000, 2), Some("cuMemcpy_ptds"));
        assert_eq!(sym("cuMemcpy", 7000, 3), Some("cuMemcpy_ptds"));
        assert_eq!(sym("cuMemcpy", 7000, 1), Some("cuMemcpy"));
        assert_eq!(
            resolve("cuMemcpy", 4000, 2, u32::MAX),
            Resolution::VersionNotSufficient
        );
        assert_eq!(
            resolve("cuMemAlloc", 1999, 0, u32::MAX),
            Resolution::VersionNotSufficient
        );
        assert_eq!(
            resolve("cuMemAlloc_v2", 12000, 0, u32::MAX),
            Resolution::SymbolNotFound
        );
        assert_eq!(
            resolve("cuMemAlloc", 12000, 4, u32::MAX),
            Resolution::InvalidFlags
        );
        assert_eq!(sym("cuCtxCreate", 12080, 0), Some("cuCtxCreate_v4"));
        assert_eq!(sym("cuCtxCreate", 13000, 0), Some("cuCtxCreate_v4"));
        assert_eq!(sym("cuLaunchKernel", 12000, 2), Some("cuLaunchKernel_ptsz"));
        // A driver that predates a variant resolves the newest it has.
        assert_eq!(
            match resolve("cuCtxCreate", 12080, 0, 12020) {
                Resolution::Found(e) => e.symbol(),
                _ => "",
            },
            "cuCtxCreate_v3"
        );
    }
}
