"""gpuslice's memory quota seen through NVIDIA's cuda-bindings, which loads libcuda.so.1 and resolves
every entry point with cuGetProcAddress_v2. For cuMemAlloc and cuMemAllocAsync it runs the steps of
quota_paths.c's `matrix` mode and prints the same `KIND.STEP.rc/.free/.total` lines (cuMemGetInfo after
each step), with `quota_paths: begin/end KIND` on stderr around the allocation that must be refused."""

import sys

try:
    from cuda.bindings import driver as cuda  # cuda-bindings >= 12.8
except ImportError:  # older cuda-python layout
    from cuda import cuda

MIB = 1 << 20
SIZE_A = 768 * MIB
SIZE_B = 512 * MIB


def check(result, what):
    """cuda-bindings returns (CUresult, outputs...): a failed setup step ends the client."""
    if not isinstance(result, tuple):
        result = (result,)
    err, rest = result[0], result[1:]
    if err != cuda.CUresult.CUDA_SUCCESS:
        print(f"error={what} returned {int(err)} ({err.name}), expected CUDA_SUCCESS", flush=True)
        sys.exit(1)
    return rest[0] if len(rest) == 1 else rest


def step(kind, name, rc):
    free, total = check(cuda.cuMemGetInfo(), "cuMemGetInfo")
    print(f"{kind}.{name}.rc={rc}\n{kind}.{name}.free={free}\n{kind}.{name}.total={total}", flush=True)


def main():
    check(cuda.cuInit(0), "cuInit")
    dev = check(cuda.cuDeviceGet(0), "cuDeviceGet")
    uuid = bytes(check(cuda.cuDeviceGetUuid(dev), "cuDeviceGetUuid").bytes).hex()
    print(f"device_uuid=GPU-{uuid[0:8]}-{uuid[8:12]}-{uuid[12:16]}-{uuid[16:20]}-{uuid[20:32]}")
    print(f"total_mem={check(cuda.cuDeviceTotalMem(dev), 'cuDeviceTotalMem')}")
    ctx = check(cuda.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    stream = check(cuda.cuStreamCreate(cuda.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")

    def alloc(kind, size):
        if kind == "alloc":
            return cuda.cuMemAlloc(size)
        return cuda.cuMemAllocAsync(size, stream)

    def free(kind, ptr, verbose):
        if kind == "alloc":
            check(cuda.cuMemFree(ptr), "cuMemFree")
            return
        check(cuda.cuMemFreeAsync(ptr, stream), "cuMemFreeAsync")
        if verbose:
            step(kind, "free_async", 0)
        check(cuda.cuStreamSynchronize(stream), "cuStreamSynchronize")

    for kind in ("alloc", "async"):
        step(kind, "start", 0)
        rc_a, a = alloc(kind, SIZE_A)
        step(kind, "a", int(rc_a))
        print(f"quota_paths: begin {kind}", file=sys.stderr, flush=True)
        rc_b, b = alloc(kind, SIZE_B)
        print(f"quota_paths: end {kind}", file=sys.stderr, flush=True)
        step(kind, "b", int(rc_b))
        if rc_b == cuda.CUresult.CUDA_SUCCESS:
            free(kind, b, False)
        if rc_a == cuda.CUresult.CUDA_SUCCESS:
            free(kind, a, True)
        step(kind, "a_freed", 0)
        rc_b, b = alloc(kind, SIZE_B)
        step(kind, "b2", int(rc_b))
        if rc_b == cuda.CUresult.CUDA_SUCCESS:
            free(kind, b, False)
        step(kind, "end", 0)

    check(cuda.cuStreamDestroy(stream), "cuStreamDestroy")
    check(cuda.cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease")
    print("done=1", flush=True)


if __name__ == "__main__":
    sys.exit(main())
