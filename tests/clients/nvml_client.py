"""NVML as monitoring tools see it, through NVIDIA's nvidia-ml-py (pynvml, ctypes over
libnvidia-ml.so.1). Prints `key=value` lines for every device: name, UUID, memory (v1 and v2),
utilization and the compute processes with their memory."""

import sys

import pynvml as nv


def main():
    nv.nvmlInit()
    count = nv.nvmlDeviceGetCount()
    print(f"device_count={count}")
    for i in range(count):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        name = nv.nvmlDeviceGetName(h)
        uuid = nv.nvmlDeviceGetUUID(h)
        print(f"device{i}_name={name.decode() if isinstance(name, bytes) else name}")
        print(f"device{i}_uuid={uuid.decode() if isinstance(uuid, bytes) else uuid}")
        m1 = nv.nvmlDeviceGetMemoryInfo(h)
        print(f"device{i}_mem_total={m1.total}")
        print(f"device{i}_mem_used={m1.used}")
        print(f"device{i}_mem_free={m1.free}")
        m2 = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
        print(f"device{i}_mem2_total={m2.total}")
        print(f"device{i}_mem2_reserved={m2.reserved}")
        print(f"device{i}_mem2_used={m2.used}")
        print(f"device{i}_mem2_free={m2.free}")
        u = nv.nvmlDeviceGetUtilizationRates(h)
        print(f"device{i}_util_gpu={u.gpu}")
        print(f"device{i}_util_memory={u.memory}")
        procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
        print(f"device{i}_procs={len(procs)}")
        for p in procs:
            print(f"device{i}_proc_{p.pid}={p.usedGpuMemory}")
    nv.nvmlShutdown()
    print("done=1", flush=True)


if __name__ == "__main__":
    sys.exit(main())
