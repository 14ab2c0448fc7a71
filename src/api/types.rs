//! CUDA driver types and constants shared by the shim and simgpu. Layouts follow NVIDIA's `cuda.h`
//! (x86_64); tests/layout.rs checks them against the real header.
#![allow(non_camel_case_types, non_snake_case)]

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
    CUcontext,
    CUmodule,
    CUfunction,
    CUlibrary,
    CUkernel,
    CUstream,
    CUevent,
    CUarray,
    CUmipmappedArray,
    CUmemoryPool,
    CUgraph,
    CUgraphExec,
    CUgraphNode,
    CUtexref,
    CUsurfref,
    CUlinkState,
    CUgreenCtx,
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

/// `CUipcMemHandle` (cuda.h: `CU_IPC_HANDLE_SIZE` 64 opaque bytes, passed by value).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CUipcMemHandle {
    pub reserved: [u8; 64],
}

/// cuda.h `CUipcMem_flags`: "Automatically enable peer access between remote devices as needed".
pub const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: u32 = 0x1;

// ---- Driver structs and constants simgpu's memory/context/device entry points exchange. Layouts and
// values from NVIDIA's cu13 `cuda.h` (x86_64). ----

/// `CUmemorytype`
pub const CU_MEMORYTYPE_HOST: u32 = 1;
pub const CU_MEMORYTYPE_DEVICE: u32 = 2;
pub const CU_MEMORYTYPE_ARRAY: u32 = 3;
pub const CU_MEMORYTYPE_UNIFIED: u32 = 4;

/// `CUDA_MEMCPY2D` (`_v2`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_MEMCPY2D {
    pub srcXInBytes: usize,
    pub srcY: usize,
    pub srcMemoryType: u32,
    pub srcHost: *const c_void,
    pub srcDevice: CUdeviceptr,
    pub srcArray: CUarray,
    pub srcPitch: usize,
    pub dstXInBytes: usize,
    pub dstY: usize,
    pub dstMemoryType: u32,
    pub dstHost: *mut c_void,
    pub dstDevice: CUdeviceptr,
    pub dstArray: CUarray,
    pub dstPitch: usize,
    pub WidthInBytes: usize,
    pub Height: usize,
}

/// `CUDA_ARRAY_DESCRIPTOR` (`_v2`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    /// `CUarray_format`
    pub Format: u32,
    pub NumChannels: u32,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (`_v2`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Depth: usize,
    pub Format: u32,
    pub NumChannels: u32,
    pub Flags: u32,
}

/// `CUDA_ARRAY_DESCRIPTOR_v1` (the legacy `cuArrayCreate` ABI: 32-bit sizes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY_DESCRIPTOR_v1 {
    pub Width: u32,
    pub Height: u32,
    /// `CUarray_format`
    pub Format: u32,
    pub NumChannels: u32,
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v1` (the legacy `cuArray3DCreate` ABI: 32-bit sizes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY3D_DESCRIPTOR_v1 {
    pub Width: u32,
    pub Height: u32,
    pub Depth: u32,
    pub Format: u32,
    pub NumChannels: u32,
    pub Flags: u32,
}

/// `CUmemLocation` (the union is the `int id` member; `localized` overlays its two low bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUmemLocation {
    /// `CUmemLocationType`
    pub type_: u32,
    pub id: i32,
}
pub const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;
pub const CU_MEM_LOCATION_TYPE_HOST: u32 = 2;

/// `CUmemAllocationProp` (`_v1`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    /// `CUmemAllocationType`
    pub type_: u32,
    /// `CUmemAllocationHandleType`
    pub requestedHandleTypes: u32,
    pub location: CUmemLocation,
    pub win32HandleMetaData: *mut c_void,
    pub compressionType: u8,
    pub gpuDirectRDMACapable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}
/// `CUmemAllocationType`
pub const CU_MEM_ALLOCATION_TYPE_PINNED: u32 = 1;
pub const CU_MEM_ALLOCATION_TYPE_MANAGED: u32 = 2;
/// `CUmemAllocationHandleType`
pub const CU_MEM_HANDLE_TYPE_NONE: u32 = 0;
pub const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: u32 = 1;

/// `CUmemAccessDesc` (`_v1`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    /// `CUmemAccess_flags`
    pub flags: u32,
}
pub const CU_MEM_ACCESS_FLAGS_PROT_NONE: u32 = 0;
pub const CU_MEM_ACCESS_FLAGS_PROT_READ: u32 = 1;
pub const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: u32 = 3;

/// `CUmemPoolProps` (`_v1`): 88 bytes; the tail is `usage`, `gpuDirectRDMACapable` and reserved bytes
/// in CUDA 13 (reserved bytes in 12), none of which simgpu reads.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemPoolProps {
    pub allocType: u32,
    pub handleTypes: u32,
    pub location: CUmemLocation,
    pub win32SecurityAttributes: *mut c_void,
    pub maxSize: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (`_v1`): a graph memory allocation node's parameters.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_MEM_ALLOC_NODE_PARAMS {
    pub poolProps: CUmemPoolProps,
    pub accessDescs: *const CUmemAccessDesc,
    pub accessDescCount: usize,
    pub bytesize: usize,
    pub dptr: u64,
}

/// `CUgraphNodeType` (the child graph and memory node types).
pub const CU_GRAPH_NODE_TYPE_GRAPH: u32 = 4;
pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: u32 = 10;
pub const CU_GRAPH_NODE_TYPE_MEM_FREE: u32 = 11;

/// `CUmemPool_attribute`
pub const CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: u32 = 1;
pub const CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: u32 = 2;
pub const CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: u32 = 3;
pub const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: u32 = 4;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: u32 = 5;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: u32 = 6;
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: u32 = 7;
pub const CU_MEMPOOL_ATTR_USED_MEM_HIGH: u32 = 8;
pub const CU_MEMPOOL_ATTR_ALLOCATION_TYPE: u32 = 9;
pub const CU_MEMPOOL_ATTR_EXPORT_HANDLE_TYPES: u32 = 10;
pub const CU_MEMPOOL_ATTR_LOCATION_ID: u32 = 11;
pub const CU_MEMPOOL_ATTR_LOCATION_TYPE: u32 = 12;
pub const CU_MEMPOOL_ATTR_MAX_POOL_SIZE: u32 = 13;

/// `CUpointer_attribute` (the ones simgpu answers).
pub const CU_POINTER_ATTRIBUTE_CONTEXT: u32 = 1;
pub const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: u32 = 2;
pub const CU_POINTER_ATTRIBUTE_DEVICE_POINTER: u32 = 3;
pub const CU_POINTER_ATTRIBUTE_HOST_POINTER: u32 = 4;
pub const CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: u32 = 6;
pub const CU_POINTER_ATTRIBUTE_BUFFER_ID: u32 = 7;
pub const CU_POINTER_ATTRIBUTE_IS_MANAGED: u32 = 8;
pub const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: u32 = 9;
pub const CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: u32 = 11;
pub const CU_POINTER_ATTRIBUTE_RANGE_SIZE: u32 = 12;
pub const CU_POINTER_ATTRIBUTE_MAPPED: u32 = 13;
pub const CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: u32 = 17;

/// `CUexecAffinityParam` (`_v1`): type + `smCount` union (one `unsigned int`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUexecAffinityParam {
    pub type_: u32,
    pub smCount: u32,
}

/// `CUctxCreateParams` (CUDA 12.5+).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUctxCreateParams {
    pub execAffinityParams: *mut CUexecAffinityParam,
    pub numExecAffinityParams: i32,
    pub cigParams: *mut c_void,
}

/// `CUdevprop` (`_v1`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUdevprop {
    pub maxThreadsPerBlock: i32,
    pub maxThreadsDim: [i32; 3],
    pub maxGridSize: [i32; 3],
    pub sharedMemPerBlock: i32,
    pub totalConstantMemory: i32,
    pub SIMDWidth: i32,
    pub memPitch: i32,
    pub regsPerBlock: i32,
    pub clockRate: i32,
    pub textureAlign: i32,
}

/// `CUctx_flags`
pub const CU_CTX_SCHED_MASK: u32 = 0x07;
pub const CU_CTX_MAP_HOST: u32 = 0x08;
pub const CU_CTX_FLAGS_MASK: u32 = 0xFF;

/// `CU_MEMHOSTALLOC_*` / `CU_MEMHOSTREGISTER_*`
pub const CU_MEMHOSTALLOC_PORTABLE: u32 = 0x01;
pub const CU_MEMHOSTALLOC_DEVICEMAP: u32 = 0x02;
pub const CU_MEMHOSTALLOC_WRITECOMBINED: u32 = 0x04;
pub const CU_MEMHOSTREGISTER_PORTABLE: u32 = 0x01;
pub const CU_MEMHOSTREGISTER_DEVICEMAP: u32 = 0x02;
pub const CU_MEMHOSTREGISTER_IOMEMORY: u32 = 0x04;
pub const CU_MEMHOSTREGISTER_READ_ONLY: u32 = 0x08;

/// `CUmemAttach_flags`
pub const CU_MEM_ATTACH_GLOBAL: u32 = 0x1;
pub const CU_MEM_ATTACH_HOST: u32 = 0x2;

/// `CUlimit` values run 0..=0x0A (`CU_LIMIT_PER_BLOCK_MEMORY_SIZE`).
pub const CU_LIMIT_COUNT: usize = 11;

/// `CU_DEVICE_ATTRIBUTE_MAX` in cu13 `cuda.h` (attributes are 1..MAX).
pub const CU_DEVICE_ATTRIBUTE_MAX: i32 = 162;

#[cfg(test)]
mod layout_tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn driver_struct_sizes() {
        assert_eq!(size_of::<CUDA_MEMCPY2D>(), 128);
        assert_eq!(offset_of!(CUDA_MEMCPY2D, dstXInBytes), 56);
        assert_eq!(size_of::<CUDA_ARRAY_DESCRIPTOR>(), 24);
        assert_eq!(size_of::<CUDA_ARRAY3D_DESCRIPTOR>(), 40);
        assert_eq!(size_of::<CUmemAllocationProp>(), 32);
        assert_eq!(size_of::<CUmemAccessDesc>(), 12);
        assert_eq!(size_of::<CUmemPoolProps>(), 88);
        assert_eq!(size_of::<CUDA_MEM_ALLOC_NODE_PARAMS>(), 120);
        assert_eq!(offset_of!(CUDA_MEM_ALLOC_NODE_PARAMS, dptr), 112);
        assert_eq!(size_of::<CUctxCreateParams>(), 24);
        assert_eq!(size_of::<CUdevprop>(), 56);
    }
}
