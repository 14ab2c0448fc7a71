"""A program's start-up on a device, and its allocations there: whether NVML's library was loaded by
then (the preloaded gpuslice loads it only to tell a MIG instance from a GPU, or to measure), what
the driver API shows, and whether allocations under and past the quota succeed. Prints `key=value`
lines that tests/memory_mig.rs judges.

Usage: UNDER_MIB PAST_MIB. Device 0 is the device CUDA_VISIBLE_DEVICES names (or the first)."""

import sys

from cuda.bindings import driver as cu

MIB = 1 << 20


def check(result):
    err = result[0]
    assert err == cu.CUresult.CUDA_SUCCESS, err
    return result[1:] if len(result) > 2 else (result[1] if len(result) == 2 else None)


def nvml_loaded():
    """Whether an NVML library is mapped (NVIDIA's `libnvidia-ml.so.<version>`, simgpu's
    `libnvidia_ml.so`), naming the files on stderr."""
    with open("/proc/self/maps") as maps:
        files = {line.split()[-1] for line in maps if "libnvidia-ml" in line or "libnvidia_ml" in line}
    for f in sorted(files):
        print(f"mapped: {f}", file=sys.stderr)
    return int(bool(files))


def main(under_mib, past_mib):
    check(cu.cuInit(0))
    dev = check(cu.cuDeviceGet(0))
    raw = bytes(check(cu.cuDeviceGetUuid_v2(dev)).bytes).hex()
    print(f"cuda_uuid={raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}", flush=True)
    # A hooked view: the shim resolves the device (its key, its quota) to answer it.
    print(f"cuda_total_mem={check(cu.cuDeviceTotalMem(dev))}", flush=True)
    print(f"nvml_after_lookup={nvml_loaded()}", flush=True)
    err, ctx = cu.cuDevicePrimaryCtxRetain(dev)
    print(f"retain={err.name}", flush=True)
    if err != cu.CUresult.CUDA_SUCCESS:
        print("done=1", flush=True)
        return
    check(cu.cuCtxSetCurrent(ctx))
    err, ptr = cu.cuMemAlloc(under_mib * MIB)
    print(f"under={err.name}", flush=True)
    err2, _ = cu.cuMemAlloc(past_mib * MIB)
    print(f"past={err2.name}", flush=True)
    if err == cu.CUresult.CUDA_SUCCESS:
        check(cu.cuMemFree(ptr))
    print("done=1", flush=True)


main(int(sys.argv[1]), int(sys.argv[2]))
