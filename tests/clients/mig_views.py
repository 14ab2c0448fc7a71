"""A program on a MIG instance under a quota: what the driver API and NVML show of the instance, and
whether allocations under and past the quota succeed. Prints `key=value` lines that
tests/memory_mig.rs judges.

Usage: UNDER_MIB PAST_MIB. Device 0 is the MIG instance CUDA_VISIBLE_DEVICES names; NVML's handle is
found by the instance's `MIG-` UUID (as `nvidia-smi -L` and device plugins name it), and by index
under its GPU."""

import sys
import time

import pynvml as nv
from cuda.bindings import driver as cu

MIB = 1 << 20


def check(result):
    err = result[0]
    assert err == cu.CUresult.CUDA_SUCCESS, err
    return result[1:] if len(result) > 2 else (result[1] if len(result) == 2 else None)


def uuid_text(raw):
    h = bytes(raw).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def nvml_views(step, handle):
    m = nv.nvmlDeviceGetMemoryInfo(handle)
    m2 = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
    lines = [
        f"{step}_nvml_total={m.total}",
        f"{step}_nvml_used={m.used}",
        f"{step}_nvml_free={m.free}",
        f"{step}_v2_total={m2.total}",
        f"{step}_v2_used={m2.used}",
        f"{step}_v2_free={m2.free}",
    ]
    for name, fn in [
        ("procs_v1", nv.nvmlDeviceGetComputeRunningProcesses),
        ("procs_v3", nv.nvmlDeviceGetComputeRunningProcesses_v3),
    ]:
        procs = fn(handle)
        lines.append(f"{step}_{name}_count={len(procs)}")
        lines.append(f"{step}_{name}_used={sum(p.usedGpuMemory for p in procs)}")
        lines.append(f"{step}_{name}_pids={','.join(str(p.pid) for p in procs)}")
        if name == "procs_v3":
            gis = ",".join(str(p.gpuInstanceId) for p in procs)
            lines.append(f"{step}_{name}_gi={gis}")
    print("\n".join(lines), flush=True)


def main(under_mib, past_mib):
    check(cu.cuInit(0))
    dev = check(cu.cuDeviceGet(0))
    raw = check(cu.cuDeviceGetUuid_v2(dev))
    uuid = uuid_text(raw.bytes)
    print(f"cuda_uuid={uuid}", flush=True)
    print(f"cuda_total_mem={check(cu.cuDeviceTotalMem(dev))}", flush=True)
    ctx = check(cu.cuDevicePrimaryCtxRetain(dev))
    check(cu.cuCtxSetCurrent(ctx))
    free, total = check(cu.cuMemGetInfo())
    print(f"context_free={free}\ncontext_total={total}", flush=True)

    nv.nvmlInit()
    handle = nv.nvmlDeviceGetHandleByUUID(f"MIG-{uuid}")
    print(f"nvml_uuid={nv.nvmlDeviceGetUUID(handle)}", flush=True)
    parent = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
    index = nv.nvmlDeviceGetIndex(handle)
    by_index = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, index)
    print(f"by_index_uuid={nv.nvmlDeviceGetUUID(by_index)}", flush=True)
    nvml_views("context", handle)

    ptr = check(cu.cuMemAlloc(under_mib * MIB))
    print("under_ok=1", flush=True)
    free, total = check(cu.cuMemGetInfo())
    print(f"alloc_free={free}\nalloc_total={total}", flush=True)
    nvml_views("alloc", handle)

    err, _ = cu.cuMemAlloc(past_mib * MIB)
    print(f"past_error={err.name}", flush=True)
    check(cu.cuMemFree(ptr))
    print("done=1", flush=True)
    if len(sys.argv) > 3:
        # Hold the context until stdin closes (a test reads the ledger meanwhile).
        sys.stdin.read()
        time.sleep(0)


main(int(sys.argv[1]), int(sys.argv[2]))
