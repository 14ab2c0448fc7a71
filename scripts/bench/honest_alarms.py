#!/usr/bin/env python3
"""False alarms in honest runs (docs/COMPUTE.md, "Failure"): compute_contended.py's shim mode alone
(two tenants, each its own memory ledger, shares 50/50, one `spin` client each), RUNS times in a
row, each client's standard error kept in OUTDIR and its error lines counted (forged ownership,
"our slot ... was overwritten", any other error; ends of paced episodes).

Usage: scripts/bench/honest_alarms.py RUNS SECONDS KERNEL_US [GPUSLICE_LOG level] [OUTDIR]"""
import os, shutil, subprocess, sys, tempfile, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from simgpu_setup import prepare
runs, secs, us = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
level = sys.argv[4] if len(sys.argv) > 4 else ""
outdir = sys.argv[5] if len(sys.argv) > 5 else tempfile.mkdtemp(prefix="gpuslice-honest-out-")
os.makedirs(outdir, exist_ok=True)
rel, work, lib, client = prepare("gpuslice-honest-")
counts = {"forged": 0, "overwritten": 0, "paced_over": 0, "other_err": 0}
try:
    for r in range(runs):
        state = f"gpuslice-honest-{os.getpid()}-{us}-{r}"
        start = time.time_ns() + 300_000_000
        procs = []
        for tenant in ("a", "b"):
            env = {"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": lib, "SIMGPU_STATE": state,
                   "SIMGPU_GROUP": tenant, "COMPUTE_CLIENT_LAUNCH_CPU": "1",
                   "LD_PRELOAD": os.path.join(rel, "libgpuslice.so"),
                   "GPUSLICE_COMPUTE_SHARE": "50",
                   "GPUSLICE_LEDGER": os.path.join(work, f"shim{us}-{r}-{tenant}.ledger"),
                   "GPUSLICE_DEVICE_DIR": os.path.join(work, f"shim{us}-{r}-devices")}
            if level:
                env["GPUSLICE_LOG"] = level
            err = open(os.path.join(outdir, f"run{r}-{tenant}.err"), "w")
            procs.append(subprocess.Popen([client, "spin", str(start), str(int(secs * 1000)), str(us), "8"],
                                          env=env, stdout=subprocess.DEVNULL, stderr=err))
        for p in procs:
            p.wait()
        try:
            os.unlink(f"/dev/shm/{state}")
        except OSError:
            pass
        for tenant in ("a", "b"):
            text = open(os.path.join(outdir, f"run{r}-{tenant}.err")).read()
            for line in text.splitlines():
                if "ownership words are forged" in line:
                    counts["forged"] += 1; print(f"run {r} {tenant}: {line[:200]}")
                elif "was overwritten" in line:
                    counts["overwritten"] += 1; print(f"run {r} {tenant}: {line[:200]}")
                elif "paced episode is over" in line:
                    counts["paced_over"] += 1
                elif "error" in line:
                    counts["other_err"] += 1; print(f"run {r} {tenant}: {line[:200]}")
    print(f"honest_alarms: {runs} runs, {secs} s, {us} us kernels: {counts}; load {os.getloadavg()}")
finally:
    shutil.rmtree(work, ignore_errors=True)
