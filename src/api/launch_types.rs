//! Stream, event, launch and graph types shared by the shim and simgpu (layouts follow cuda.h).
#![allow(non_camel_case_types, non_snake_case)]

use crate::types::{CUcontext, CUfunction, CUgraphNode, CUkernel, CUstream};
use std::ffi::{c_uint, c_void};

/// `CUstream_flags`
pub const CU_STREAM_DEFAULT: u32 = 0x0;
pub const CU_STREAM_NON_BLOCKING: u32 = 0x1;

/// `CUevent_flags`
pub const CU_EVENT_DEFAULT: u32 = 0x0;
pub const CU_EVENT_BLOCKING_SYNC: u32 = 0x1;
pub const CU_EVENT_DISABLE_TIMING: u32 = 0x2;
pub const CU_EVENT_INTERPROCESS: u32 = 0x4;

/// `CUevent_record_flags`
pub const CU_EVENT_RECORD_DEFAULT: u32 = 0x0;
pub const CU_EVENT_RECORD_EXTERNAL: u32 = 0x1;

/// `CUevent_wait_flags`
pub const CU_EVENT_WAIT_DEFAULT: u32 = 0x0;
pub const CU_EVENT_WAIT_EXTERNAL: u32 = 0x1;

/// `CUstreamCaptureStatus`
pub type CUstreamCaptureStatus = u32;
pub const CU_STREAM_CAPTURE_STATUS_NONE: CUstreamCaptureStatus = 0;
pub const CU_STREAM_CAPTURE_STATUS_ACTIVE: CUstreamCaptureStatus = 1;
pub const CU_STREAM_CAPTURE_STATUS_INVALIDATED: CUstreamCaptureStatus = 2;

/// `CUstreamCaptureMode`
pub type CUstreamCaptureMode = u32;
pub const CU_STREAM_CAPTURE_MODE_GLOBAL: CUstreamCaptureMode = 0;
pub const CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: CUstreamCaptureMode = 1;
pub const CU_STREAM_CAPTURE_MODE_RELAXED: CUstreamCaptureMode = 2;

/// `CUhostFn`: `void (*)(void *userData)`.
pub type CUhostFn = Option<unsafe extern "C" fn(user_data: *mut c_void)>;
/// `CUstreamCallback`: `void (*)(CUstream, CUresult, void *userData)`.
pub type CUstreamCallback =
    Option<unsafe extern "C" fn(stream: CUstream, status: u32, user_data: *mut c_void)>;

/// `CUfunction_attribute`
pub type CUfunction_attribute = u32;
pub const CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: CUfunction_attribute = 0;
pub const CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: CUfunction_attribute = 1;
pub const CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: CUfunction_attribute = 2;
pub const CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: CUfunction_attribute = 3;
pub const CU_FUNC_ATTRIBUTE_NUM_REGS: CUfunction_attribute = 4;
pub const CU_FUNC_ATTRIBUTE_PTX_VERSION: CUfunction_attribute = 5;
pub const CU_FUNC_ATTRIBUTE_BINARY_VERSION: CUfunction_attribute = 6;
pub const CU_FUNC_ATTRIBUTE_CACHE_MODE_CA: CUfunction_attribute = 7;
pub const CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: CUfunction_attribute = 8;
pub const CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: CUfunction_attribute = 9;
pub const CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET: CUfunction_attribute = 10;
pub const CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH: CUfunction_attribute = 11;
pub const CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT: CUfunction_attribute = 12;
pub const CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH: CUfunction_attribute = 13;
pub const CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: CUfunction_attribute = 14;
pub const CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE: CUfunction_attribute = 15;
/// One past the last defined `CUfunction_attribute` (`CU_FUNC_ATTRIBUTE_MAX`).
pub const CU_FUNC_ATTRIBUTE_MAX: CUfunction_attribute = 16;

/// `CU_LAUNCH_PARAM_*` markers of cuLaunchKernel's `extra` array.
pub const CU_LAUNCH_PARAM_END: usize = 0x00;
pub const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 0x01;
pub const CU_LAUNCH_PARAM_BUFFER_SIZE: usize = 0x02;

/// `CUlaunchAttributeID` values simgpu looks at.
pub type CUlaunchAttributeID = u32;
pub const CU_LAUNCH_ATTRIBUTE_COOPERATIVE: CUlaunchAttributeID = 2;
pub const CU_LAUNCH_ATTRIBUTE_PRIORITY: CUlaunchAttributeID = 8;

/// `CUlaunchAttributeValue`: a 64-byte union; read the member the id names. Some members hold pointers
/// and 64-bit values, so the union is 8-byte aligned in C.
#[repr(C)]
#[derive(Clone, Copy)]
pub union CUlaunchAttributeValue {
    pub pad: [u64; 8],
    pub cooperative: i32,
    pub priority: i32,
}

/// `CUlaunchAttribute`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUlaunchAttribute {
    pub id: CUlaunchAttributeID,
    pub pad: [u8; 4],
    pub value: CUlaunchAttributeValue,
}

/// `CUlaunchConfig`
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUlaunchConfig {
    pub gridDimX: u32,
    pub gridDimY: u32,
    pub gridDimZ: u32,
    pub blockDimX: u32,
    pub blockDimY: u32,
    pub blockDimZ: u32,
    pub sharedMemBytes: u32,
    pub hStream: CUstream,
    pub attrs: *mut CUlaunchAttribute,
    pub numAttrs: u32,
}

/// `CUDA_KERNEL_NODE_PARAMS_v1`
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_KERNEL_NODE_PARAMS_v1 {
    pub func: CUfunction,
    pub gridDimX: u32,
    pub gridDimY: u32,
    pub gridDimZ: u32,
    pub blockDimX: u32,
    pub blockDimY: u32,
    pub blockDimZ: u32,
    pub sharedMemBytes: u32,
    pub kernelParams: *mut *mut c_void,
    pub extra: *mut *mut c_void,
}

/// `CUDA_KERNEL_NODE_PARAMS_v2` (= `CUDA_KERNEL_NODE_PARAMS` since 12.0)
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_KERNEL_NODE_PARAMS_v2 {
    pub func: CUfunction,
    pub gridDimX: u32,
    pub gridDimY: u32,
    pub gridDimZ: u32,
    pub blockDimX: u32,
    pub blockDimY: u32,
    pub blockDimZ: u32,
    pub sharedMemBytes: u32,
    pub kernelParams: *mut *mut c_void,
    pub extra: *mut *mut c_void,
    pub kern: CUkernel,
    pub ctx: CUcontext,
}

/// `CUgraphInstantiateResult`
pub type CUgraphInstantiateResult = u32;
pub const CUDA_GRAPH_INSTANTIATE_SUCCESS: CUgraphInstantiateResult = 0;
pub const CUDA_GRAPH_INSTANTIATE_ERROR: CUgraphInstantiateResult = 1;

/// `CUgraphInstantiate_flags`
pub const CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH: u64 = 1;
pub const CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD: u64 = 2;
pub const CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH: u64 = 4;
pub const CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY: u64 = 8;

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_GRAPH_INSTANTIATE_PARAMS {
    pub flags: u64,
    pub hUploadStream: CUstream,
    pub hErrNode_out: CUgraphNode,
    pub result_out: CUgraphInstantiateResult,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_cuda_h() {
        assert_eq!(size_of::<CUlaunchAttribute>(), 72);
        assert_eq!(offset_of!(CUlaunchAttribute, value), 8);
        assert_eq!(size_of::<CUlaunchConfig>(), 56);
        assert_eq!(offset_of!(CUlaunchConfig, hStream), 32);
        assert_eq!(offset_of!(CUlaunchConfig, numAttrs), 48);
        assert_eq!(size_of::<CUDA_KERNEL_NODE_PARAMS_v1>(), 56);
        assert_eq!(size_of::<CUDA_KERNEL_NODE_PARAMS_v2>(), 72);
        assert_eq!(size_of::<CUDA_GRAPH_INSTANTIATE_PARAMS>(), 32);
    }
}

/// `CUDA_LAUNCH_PARAMS_v1` (cuda.h): the element of `cuLaunchCooperativeKernelMultiDevice`'s list.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_LAUNCH_PARAMS {
    pub function: CUfunction,
    pub gridDimX: c_uint,
    pub gridDimY: c_uint,
    pub gridDimZ: c_uint,
    pub blockDimX: c_uint,
    pub blockDimY: c_uint,
    pub blockDimZ: c_uint,
    pub sharedMemBytes: c_uint,
    pub hStream: CUstream,
    pub kernelParams: *mut *mut c_void,
}
