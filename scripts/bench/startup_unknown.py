#!/usr/bin/env python3
"""What naming unknown GPUSLICE_* variables costs at start-up (docs/BENCHMARKS.md, "Start-up with
unknown variables"): callgrind instructions of one whole `bench startup` process (to a current
context) per side and environment, and the inclusive instructions of the loader's pass
(`gpuslice_state::config::load::load`) in it.

Environments: `known` (startup_modes.py's quota environment), `extra` (the same and eight unrelated
variables), `typo` (`extra` and `GPUSLICE_COMPUTE_SHARE` + `S` = 50, a near miss that only warns, so the
process does the same work otherwise).

Usage: scripts/bench/startup_unknown.py BENCH SIMGPU_LIB_DIR OLD_SO NEW_SO REPEATS
  BENCH: the bench client (scripts/bench.sh builds it: target/bench/bench-client); OLD_SO, NEW_SO:
  two builds of libgpuslice.so copied to paths of the same length. Needs valgrind. Works in a private
  directory under /dev/shm, removed at the end.
"""
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

EXTRA = {"OMP_NUM_THREADS": "8", "NCCL_DEBUG": "WARN", "PYTHONUNBUFFERED": "1",
         "HF_HOME": "/models/cache", "TOKENIZERS_PARALLELISM": "false", "LANG": "C.UTF-8",
         "KUBERNETES_SERVICE_HOST": "10.96.0.1", "MY_APP_MODE": "serve"}
LOAD = "gpuslice_state::config::load::load "
# The near miss, spelt in two parts: state's test of known names reads whole words in scripts.
TYPO = "GPUSLICE_COMPUTE_SHARE" + "S"


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    bench, lib, old, new, repeats = sys.argv[1:5] + [int(sys.argv[5])]
    shm = tempfile.mkdtemp(prefix="gpuslice-startup-unknown-", dir="/dev/shm")
    shims = {"old": os.path.abspath(old), "new": os.path.abspath(new)}

    def env_for(side, kind, n):
        e = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LD_LIBRARY_PATH": lib,
             "SIMGPU_MEMORY": "2GiB", "SIMGPU_KERNEL_NS": "1000",
             "SIMGPU_STATE": os.path.join(shm, "state"),
             "LD_PRELOAD": shims[side], "GPUSLICE_MEMORY_LIMIT": "1GiB", "GPUSLICE_TENANT": "bench",
             "GPUSLICE_LEDGER": os.path.join(shm, f"{side}{kind}{n}.ledger"),
             "GPUSLICE_DEVICE_DIR": os.path.join(shm, f"dev-{side}{kind}{n}"),
             "GPUSLICE_LEDGER_DIR": os.path.join(shm, "ledgers")}
        if kind != "known":
            e.update(EXTRA)
        if kind == "typo":
            e[TYPO] = "50"
        return e

    try:
        subprocess.run([bench, "startup"], env={"LD_LIBRARY_PATH": lib, "SIMGPU_MEMORY": "2GiB",
                                                "SIMGPU_STATE": os.path.join(shm, "state")},
                       check=True)
        print(f"{'env':6} {'side':4} {'Ir whole process (median)':>26} {'Ir config::load':>16}  runs")
        for kind in ("known", "extra", "typo"):
            for side in ("old", "new"):
                whole, load = [], []
                for n in range(repeats):
                    out = os.path.join(shm, f"cg.{kind}.{side}.{n}")
                    p = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                                        bench, "startup"], env=env_for(side, kind, n),
                                       capture_output=True, text=True)
                    m = re.search(r"Collected : (\d+)", p.stderr)
                    if not m or p.returncode != 0:
                        sys.exit(f"startup_unknown: {side} {kind} failed:\n{p.stderr}")
                    whole.append(int(m.group(1)))
                    a = subprocess.run(["callgrind_annotate", "--inclusive=yes", out],
                                       capture_output=True, text=True).stdout
                    costs = [int(line.split()[0].replace(",", "")) for line in a.splitlines()
                             if LOAD in line and line.strip()[0].isdigit()]
                    load.append(max(costs) if costs else 0)
                print(f"{kind:6} {side:4} {int(statistics.median(whole)):>26,} "
                      f"{int(statistics.median(load)):>16,}  {whole}")
    finally:
        shutil.rmtree(shm, ignore_errors=True)


if __name__ == "__main__":
    main()
