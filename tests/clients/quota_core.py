"""NVIDIA's cuda.core under a quota: its Device, a cubin loaded as ObjectCode, buffers from the
device's memory pool (cuda.core's default memory resource), a kernel launched through it, and the
program's exit, where cuda.core releases its primary contexts from thread-local destructors.

After each step prints what the driver API (cuMemGetInfo) and NVML (v1, v2, the process list)
show, as `<step>_<key>=value` lines that tests/memory_frameworks.rs judges. Usage: CUBIN"""

import sys

import numpy as np
import pynvml as nv
from cuda.bindings import driver as cu

try:
    from cuda.core import Device, LaunchConfig, ObjectCode, launch
except ImportError:  # cuda.core before 1.0
    from cuda.core.experimental import Device, LaunchConfig, ObjectCode, launch

MIB = 1 << 20


def views(step, device):
    err, free, total = cu.cuMemGetInfo()
    assert err == cu.CUresult.CUDA_SUCCESS, err
    m = nv.nvmlDeviceGetMemoryInfo(device)
    m2 = nv.nvmlDeviceGetMemoryInfo(device, version=nv.nvmlMemory_v2)
    procs = nv.nvmlDeviceGetComputeRunningProcesses(device)
    print(
        f"{step}_free={free}\n{step}_total={total}\n"
        f"{step}_nvml_total={m.total}\n{step}_nvml_used={m.used}\n{step}_nvml_free={m.free}\n"
        f"{step}_v2_total={m2.total}\n{step}_v2_reserved={m2.reserved}\n"
        f"{step}_v2_used={m2.used}\n{step}_v2_free={m2.free}\n"
        f"{step}_procs_count={len(procs)}\n"
        f"{step}_procs_used={sum(p.usedGpuMemory for p in procs)}",
        flush=True,
    )


def main(cubin_path):
    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()
    nv.nvmlInit()
    device = nv.nvmlDeviceGetHandleByIndex(0)
    views("context", device)

    with open(cubin_path, "rb") as f:
        kernel = ObjectCode.from_cubin(f.read()).get_kernel("saxpy")
    views("module", device)

    x = dev.allocate(32 * MIB, stream=stream)
    y = dev.allocate(32 * MIB, stream=stream)
    views("alloc", device)

    n = 256
    launch(stream, LaunchConfig(grid=1, block=n), kernel, np.float32(2.0), x, y, np.int32(n))
    stream.sync()
    views("launch", device)

    try:
        dev.allocate(2048 * MIB, stream=stream)
        print("refused=0")
    except Exception as e:  # cuda.core raises CUDAError naming the driver's error
        print(f"refused={int('CUDA_ERROR_OUT_OF_MEMORY' in str(e))}")

    x.close(stream)
    y.close(stream)
    stream.sync()
    # cuda.core keeps freed blocks in the pool (it raises the pool's release threshold): trimmed,
    # they go back to the device, as a program returning memory to its neighbours does.
    err, pool = cu.cuDeviceGetDefaultMemPool(0)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    (err,) = cu.cuMemPoolTrimTo(pool, 0)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    views("closed", device)
    print("done=1", flush=True)
    # The exit releases cuda.core's contexts from its thread-local destructors.


main(sys.argv[1])
