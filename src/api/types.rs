//! CUDA driver types and constants shared by the shim and simgpu. Layouts follow NVIDIA's `cuda.h`
//! (x86_64); tests/layout.rs checks them against the real header.
#![allow(non_camel_case_types)]

use std::ffi::c_void;

pub type CUdevice = i32;
pub type CUdeviceptr = u64;

macro_rules! opaque_handle {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "`: an opaque driver handle (a pointer in C).")]
        pub type $name = *mut c_void;
    )*};
}
opaque_handle!(
    CUcontext, CUmodule, CUfunction, CUlibrary, CUkernel, CUstream, CUevent, CUarray, CUmipmappedArray,
    CUmemoryPool, CUgraph, CUgraphExec, CUgraphNode, CUtexref, CUsurfref, CUlinkState, CUgreenCtx,
);

/// `CUmemGenericAllocationHandle` (an integer, not a pointer).
pub type CUmemGenericAllocationHandle = u64;

/// `CU_STREAM_LEGACY` / `CU_STREAM_PER_THREAD` special stream handles.
pub const CU_STREAM_LEGACY: CUstream = 0x1 as CUstream;
pub const CU_STREAM_PER_THREAD: CUstream = 0x2 as CUstream;

/// `CUuuid`
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}
