//! NVML types and constants shared by the shim and simgpu.
