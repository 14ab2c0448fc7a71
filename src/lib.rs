//! gpuslice: device-memory quotas and compute shares for unmodified CUDA programs, enforced by a
//! library preloaded into them. See docs/ARCHITECTURE.md.
