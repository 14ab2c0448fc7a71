#!/usr/bin/env python3
"""Contended path of compute shares, side by side in one run (docs/BENCHMARKS.md):

two tenants, each one process launching `spin` kernels of KERNEL_US back to back (a queue of 8),
for SECONDS, on one simgpu device: once without gpuslice, once with it (shares 50/50, one memory
ledger each), alternating, ROUNDS times. Reported (medians over the rounds):

- CPU time per launch (user + system of both client processes, divided by their launches): the
  difference is what the contended path adds per launch (the simulated driver's own CPU, including
  the stream workers' handling of the events the shim records, is inside both figures);
- the same less the device's busy time (simgpu runs a kernel by spinning its stream worker on
  the CPU, so kernel time is client CPU time too; what remains is the host's own work per launch);
- the device's busy fraction (simgpu's counter): the difference is the device time lost to
  hand-overs (and to the shim's events on the stream);
- the launching thread's CPU time over its whole loop per launch (its own waits for its kernels
  included: with gpuslice, part of the program's waiting moves from its `cuEventSynchronize` into
  the launch, where flow control waits in sleeps);
- host time per launch: the launching thread's CPU time inside each `cuLaunchKernel` (the client
  reads its thread's CPU clock around each call, `COMPUTE_CLIENT_LAUNCH_CPU`, and takes off what
  the two reads cost): without gpuslice, a launch's own host cost (simgpu's call costs, a real
  driver's: 2.5 us a launch); with it, what the contended path adds on the launching thread (its
  event records, queries, capture checks, flow-control looks; sleeps are not CPU time).

simgpu runs with its host call costs (SIMGPU_COST_*, tests/simgpu/README.md) unless the
environment sets them. SIMGPU_LAUNCH_STATS=1 prints each client's launch statistics at its exit
(simgpu's own CPU time in a launch, and the launches that woke their stream's worker);
COMPUTE_CLIENT_PAUSE_US=N makes each client sleep N us before each launch (a launch that follows a
sleep, as one that follows a wait for the device does).

With --baseline LIB (another build's libgpuslice.so, e.g. the main branch's), a third run per round
uses it, so that two versions of the shim are compared side by side in one run on one machine.

Usage: scripts/bench/compute_contended.py [--rounds N (3)] [--seconds S (4)] [--kernel-us U (20)]
                                          [--baseline LIB]
       --kernel-us takes a comma list (5,20,200): each length is run in turn, rounds alternating.
Builds the release profile into $CARGO_TARGET_DIR (default target/).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from simgpu_setup import prepare


# Passed to the clients from the environment: simgpu's launch statistics (printed by each client
# at exit), and a pause before each launch (tests/clients/compute_client.c).
PASSED = ("SIMGPU_LAUNCH_STATS", "COMPUTE_CLIENT_PAUSE_US")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--kernel-us", default="20", help="kernel length(s) in us, a comma list")
    ap.add_argument("--baseline", help="another libgpuslice.so, run as a third mode")
    a = ap.parse_args()
    if a.baseline:
        a.baseline = os.path.abspath(a.baseline)
    rel, work, lib, client = prepare("gpuslice-bench-contended-")
    stat_bin = os.path.join(rel, "simgpu-stat")
    try:
        modes = ("none", "shim") + (("base",) if a.baseline else ())
        lengths = [int(k) for k in str(a.kernel_us).split(",")]
        for us in lengths:
            rows = {m: [] for m in modes}
            for r in range(a.rounds):
                for mode in modes:
                    rows[mode].append(run(mode, r, a, work, lib, client, rel, stat_bin, us))
            report(rows, a, us)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(mode, r, a, work, lib, client, rel, stat_bin, us):
    state = f"gpuslice-bench-contended-{os.getpid()}-{mode}-{us}-{r}"
    ms = int(a.seconds * 1000)
    start = time.time_ns() + 500_000_000
    procs = []
    for tenant in ("a", "b"):
        env = {"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": lib, "SIMGPU_STATE": state,
               "SIMGPU_GROUP": tenant, "COMPUTE_CLIENT_LAUNCH_CPU": "1"}
        env.update({k: v for k, v in os.environ.items()
                    if k.startswith("SIMGPU_COST_") or k in PASSED})
        if mode in ("shim", "base"):
            shim = a.baseline if mode == "base" else os.path.join(rel, "libgpuslice.so")
            env.update({"LD_PRELOAD": shim,
                        "GPUSLICE_COMPUTE_SHARE": "50",
                        "GPUSLICE_LEDGER": os.path.join(work, f"{mode}{us}-{r}-{tenant}.ledger"),
                        "GPUSLICE_DEVICE_DIR": os.path.join(work, f"{mode}{us}-{r}-devices")})
        p = subprocess.Popen([client, "spin", str(start), str(ms), str(us), "8"], env=env,
                             stdout=subprocess.PIPE, text=True)
        procs.append(p)
    cpu, launches, wall, in_launch, in_loop = 0.0, 0, 0, 0.0, 0.0
    for p in procs:
        _, status, ru = os.wait4(p.pid, 0)
        out = dict(line.split("=", 1) for line in p.stdout.read().split() if "=" in line)
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            sys.exit(f"client failed ({mode}): {out}")
        cpu += ru.ru_utime + ru.ru_stime
        launches += int(out["launches"])
        in_launch += int(out["launch_cpu_ns"]) * int(out["launches"])
        in_loop += int(out["loop_cpu_ns"]) * int(out["launches"])
        wall = max(wall, int(out["end_ns"]) - int(out["start_ns"]))
    stat = json.loads(subprocess.run([stat_bin], env={"SIMGPU_STATE": state}, check=True,
                                     capture_output=True, text=True).stdout)
    busy = stat["devices"][0]["busy_ns"]
    try:
        os.unlink(f"/dev/shm/{state}")
    except OSError:
        pass
    # simgpu runs a kernel by spinning its stream worker on the CPU: the device's busy time is CPU
    # time of the clients too. What is left is the host's own work per launch.
    host = max(cpu * 1e9 - busy, 0.0)
    return {"cpu_per_launch_ns": cpu * 1e9 / max(launches, 1), "busy": busy / wall,
            "host_cpu_per_launch_ns": host / max(launches, 1), "launches": launches,
            "launch_cpu_ns": in_launch / max(launches, 1),
            "loop_cpu_ns": in_loop / max(launches, 1)}


def report(rows, a, us):
    med = lambda mode, k: statistics.median(x[k] for x in rows[mode])
    cn, cs = med("none", "cpu_per_launch_ns"), med("shim", "cpu_per_launch_ns")
    bn, bs = med("none", "busy"), med("shim", "busy")
    ln, ls = med("none", "launch_cpu_ns"), med("shim", "launch_cpu_ns")
    print(f"compute_contended: 2 tenants, {us} us kernels, {a.seconds} s, {a.rounds} rounds")
    print(f"compute_contended: host time per launch (launching thread's CPU in cuLaunchKernel): "
          f"without {ln:.0f} ns, with gpuslice {ls:.0f} ns, added {ls - ln:.0f} ns "
          f"({(ls - ln) / max(ln, 1) * 100:.1f}% of the launch's own)")
    pn, ps = med("none", "loop_cpu_ns"), med("shim", "loop_cpu_ns")
    print(f"compute_contended: launching thread's CPU per launch over the whole loop (its own "
          f"waits included): without {pn:.0f} ns, with gpuslice {ps:.0f} ns, added {ps - pn:.0f} ns")
    print(f"compute_contended: CPU per launch: without {cn:.0f} ns, with gpuslice {cs:.0f} ns, "
          f"added {cs - cn:.0f} ns")
    hn, hs = med("none", "host_cpu_per_launch_ns"), med("shim", "host_cpu_per_launch_ns")
    print(f"compute_contended: CPU per launch besides simulated kernel time (CPU - device busy): "
          f"without {hn:.0f} ns, with gpuslice {hs:.0f} ns, added {hs - hn:.0f} ns")
    print(f"compute_contended: device busy: without {bn * 100:.1f}%, with gpuslice {bs * 100:.1f}%, "
          f"lost {(bn - bs) * 100:.1f} points")
    print(f"compute_contended: launches per round: without {med('none', 'launches'):.0f}, "
          f"with {med('shim', 'launches'):.0f}")
    if "base" in rows:
        cb, bb = med("base", "cpu_per_launch_ns"), med("base", "busy")
        hb = med("base", "host_cpu_per_launch_ns")
        lb = med("base", "launch_cpu_ns")
        print(f"compute_contended: baseline host time per launch {lb:.0f} ns, added {lb - ln:.0f} ns "
              f"({(lb - ln) / max(ln, 1) * 100:.1f}%)")
        print(f"compute_contended: baseline ({a.baseline}): CPU per launch {cb:.0f} ns, added "
              f"{cb - cn:.0f} ns; besides kernel time {hb:.0f} ns, added {hb - hn:.0f} ns; device busy {bb * 100:.1f}%, lost {(bn - bb) * 100:.1f} points; "
              f"launches per round {med('base', 'launches'):.0f}")
    print("compute_contended: raw", json.dumps(rows))


if __name__ == "__main__":
    main()
