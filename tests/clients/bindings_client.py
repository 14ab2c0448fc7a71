"""The `full` steps of client.h through NVIDIA's cuda-bindings, which loads libcuda.so.1 and resolves
every entry point with cuGetProcAddress_v2 (as CUDA 12 runtimes and frameworks do). Prints the same
`key=value` lines as linked.c/dlopen.c so the Rust test can compare them."""

import ctypes
import sys

try:
    from cuda.bindings import driver as cuda  # cuda-bindings >= 12.8
except ImportError:  # older cuda-python layout
    from cuda import cuda


def check(result, what):
    """cuda-bindings returns (CUresult, outputs...): stop at the first failure, naming the call."""
    if isinstance(result, tuple):
        err, rest = result[0], result[1:]
    else:
        err, rest = result, ()
    if err != cuda.CUresult.CUDA_SUCCESS:
        print(f"error={what} rc={int(err)} name={err.name}", flush=True)
        sys.exit(1)
    if len(rest) == 1:
        return rest[0]
    return rest


def uuid_text(raw):
    h = raw.hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def main():
    version = check(cuda.cuDriverGetVersion(), "cuDriverGetVersion")
    print(f"driver_version={version}")
    check(cuda.cuInit(0), "cuInit")
    print(f"device_count={check(cuda.cuDeviceGetCount(), 'cuDeviceGetCount')}")
    dev = check(cuda.cuDeviceGet(0), "cuDeviceGet")
    name = check(cuda.cuDeviceGetName(256, dev), "cuDeviceGetName")
    name = name.split(b"\0", 1)[0].decode()
    uuid = check(cuda.cuDeviceGetUuid(dev), "cuDeviceGetUuid")
    total = check(cuda.cuDeviceTotalMem(dev), "cuDeviceTotalMem")
    attr = cuda.CUdevice_attribute
    major = check(cuda.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "attr")
    minor = check(cuda.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "attr")
    print(f"device_name={name}")
    print(f"device_uuid={uuid_text(bytes(uuid.bytes))}")
    print(f"total_mem={total}")
    print(f"compute_capability={major}.{minor}")

    ctx = check(cuda.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    current = check(cuda.cuCtxGetCurrent(), "cuCtxGetCurrent")
    print(f"ctx_current={int(int(current) == int(ctx) and int(ctx) != 0)}")
    free, total_info = check(cuda.cuMemGetInfo(), "cuMemGetInfo")
    print(f"mem_info_free={free}")
    print(f"mem_info_total={total_info}")

    n = 1 << 20
    host = bytes(((i * 7 + (i >> 11)) & 0xFF) for i in range(n))
    back = bytearray(n)
    buf = check(cuda.cuMemAlloc(n), "cuMemAlloc")
    print(f"alloc_nonnull={int(int(buf) != 0)}")
    check(cuda.cuMemcpyHtoD(buf, host, n), "cuMemcpyHtoD")
    check(cuda.cuMemcpyDtoH(back, buf, n), "cuMemcpyDtoH")
    print(f"roundtrip_equal={int(bytes(back) == host)}")
    check(cuda.cuMemsetD8(buf, 0xA5, n), "cuMemsetD8")
    check(cuda.cuMemcpyDtoH(back, buf, n), "cuMemcpyDtoH")
    print(f"memset_equal={int(bytes(back) == bytes([0xA5]) * n)}")

    mod = check(cuda.cuModuleLoadData(b"simgpu test module: any bytes\0"), "cuModuleLoadData")
    spin = check(cuda.cuModuleGetFunction(mod, b"spin_kernel"), "cuModuleGetFunction")
    stream = check(cuda.cuStreamCreate(cuda.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
    start = check(cuda.cuEventCreate(cuda.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")
    stop = check(cuda.cuEventCreate(cuda.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")
    check(cuda.cuEventRecord(start, stream), "cuEventRecord")
    params = ((2000,), (ctypes.c_uint64,))
    check(cuda.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, params, 0), "cuLaunchKernel")
    check(cuda.cuEventRecord(stop, stream), "cuEventRecord")
    check(cuda.cuStreamSynchronize(stream), "cuStreamSynchronize")
    check(cuda.cuEventSynchronize(stop), "cuEventSynchronize")
    ms = check(cuda.cuEventElapsedTime(start, stop), "cuEventElapsedTime")
    print(f"kernel_elapsed_ms={ms:.3f}")
    check(cuda.cuEventDestroy(start), "cuEventDestroy")
    check(cuda.cuEventDestroy(stop), "cuEventDestroy")
    check(cuda.cuStreamDestroy(stream), "cuStreamDestroy")
    check(cuda.cuModuleUnload(mod), "cuModuleUnload")
    check(cuda.cuMemFree(buf), "cuMemFree")

    chunks = []
    while True:
        err, ptr = cuda.cuMemAlloc(64 << 20)
        if err != cuda.CUresult.CUDA_SUCCESS:
            break
        chunks.append(ptr)
    print(f"oom_allocs={len(chunks)}")
    print(f"oom_rc={int(err)}")
    for ptr in chunks:
        check(cuda.cuMemFree(ptr), "cuMemFree")
    free, _ = check(cuda.cuMemGetInfo(), "cuMemGetInfo")
    print(f"mem_info_free_after={free}")
    check(cuda.cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease")
    print("done=1", flush=True)


if __name__ == "__main__":
    main()
