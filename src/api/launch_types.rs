//! Stream, event, launch and graph types shared by the shim and simgpu (layouts follow cuda.h).
