#!/usr/bin/env python3
"""Start-up side by side by mode and driver-file root (docs/BENCHMARKS.md, "Start-up without NVML
where MIG is ruled out"): callgrind instructions of one whole process per side, then RUNS
interleaved triples (without gpuslice, OLD_SO, NEW_SO) of paired wall times, pinned to CPU 1.

Modes of the bench client: `startup` (to a current context) and `query` (cuInit, cuDeviceGet,
cuDeviceTotalMem, exit). Roots: `/` (this machine: no NVIDIA driver files, NVML asked) and
`simgpu` (simgpu's model of a container given a whole GPU: SIMGPU_NVIDIA_ROOT and
GPUSLICE_NVIDIA_ROOT name one directory, on a state created with it).

Usage: scripts/bench/startup_modes.py BENCH SIMGPU_LIB_DIR OLD_SO NEW_SO RUNS
  BENCH: the bench client (scripts/bench.sh builds it: target/bench/bench); SIMGPU_LIB_DIR:
  simgpu's libraries (scripts/install-simgpu.sh). Copy both .so files to paths of the same
  length: the loader's instructions move by about 1.5 k with the length of the library's path.
Needs valgrind. Works in a private directory under /dev/shm, removed at the end.
"""
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SIDES = ("without", "old", "new")


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    bench, lib, old, new, runs = sys.argv[1:5] + [int(sys.argv[5])]
    shm = tempfile.mkdtemp(prefix="gpuslice-startup-modes-", dir="/dev/shm")
    root = os.path.join(shm, "nvidia")
    shims = {"old": os.path.abspath(old), "new": os.path.abspath(new)}

    def env_for(side, redirect):
        e = {"LD_LIBRARY_PATH": lib, "SIMGPU_MEMORY": "2GiB", "SIMGPU_KERNEL_NS": "1000",
             "SIMGPU_STATE": os.path.join(shm, "state" + ("-r" if redirect else ""))}
        if redirect:
            e["SIMGPU_NVIDIA_ROOT"] = root
        if side != "without":
            e.update(LD_PRELOAD=shims[side], GPUSLICE_MEMORY_LIMIT="1GiB", GPUSLICE_TENANT="bench",
                     GPUSLICE_LEDGER=os.path.join(shm, f"{side}{int(redirect)}.ledger"),
                     GPUSLICE_DEVICE_DIR=os.path.join(shm, f"dev-{side}{int(redirect)}"),
                     GPUSLICE_LEDGER_DIR=os.path.join(shm, "ledgers"))
            if redirect:
                e["GPUSLICE_NVIDIA_ROOT"] = root
        return e

    try:
        for redirect in (False, True):  # each simgpu state is created (with its root) first
            subprocess.run([bench, "startup"], env=env_for("without", redirect), check=True)
        os.sched_setaffinity(0, {1})
        for mode in ("startup", "query"):
            for redirect in (False, True):
                ir = {}
                for side in SIDES:
                    out = os.path.join(shm, f"cg.{mode}.{side}.{int(redirect)}")
                    p = subprocess.run(["valgrind", "--tool=callgrind",
                                        f"--callgrind-out-file={out}", bench, mode],
                                       env=env_for(side, redirect), capture_output=True, text=True)
                    m = re.search(r"Collected : (\d+)", p.stderr)
                    if not m:
                        sys.exit(f"startup_modes: callgrind of {side} {mode} failed:\n{p.stderr}")
                    ir[side] = int(m.group(1))
                t = {s: [] for s in SIDES}
                for i in range(runs):
                    for side in SIDES[i % 3:] + SIDES[:i % 3]:
                        s0 = time.perf_counter_ns()
                        subprocess.run([bench, mode], env=env_for(side, redirect), check=True)
                        t[side].append(time.perf_counter_ns() - s0)

                def diff(a, b):
                    return [x - y for x, y in zip(t[a], t[b])]

                med = {k: statistics.median(diff(k, "without")) / 1e6 for k in ("old", "new")}
                q = statistics.quantiles(diff("new", "old"), n=4)
                print(f"{mode:8} root={'simgpu' if redirect else '/':7} Ir without {ir['without']:,}"
                      f" old +{ir['old'] - ir['without']:,} new +{ir['new'] - ir['without']:,}"
                      f" (new-old {ir['new'] - ir['old']:+,}) | wall added old {med['old']:+.3f}"
                      f" new {med['new']:+.3f} ms, new-old"
                      f" {statistics.median(diff('new', 'old')) / 1e6:+.3f}"
                      f" [{q[0] / 1e6:+.3f}..{q[2] / 1e6:+.3f}] ms", flush=True)
        print("startup_modes: load average", os.getloadavg())
    finally:
        shutil.rmtree(shm, ignore_errors=True)


if __name__ == "__main__":
    main()
