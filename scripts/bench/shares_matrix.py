#!/usr/bin/env python3
"""Compute shares over a matrix of workloads, judged every second (docs/BENCHMARKS.md, "Shares
over the workload matrix").

Each cell runs two tenants, each one process of tests/clients/compute_client.c with
libgpuslice.so preloaded (GPUSLICE_COMPUTE_SHARE set, one memory ledger each, one device
directory), on one simgpu device for SECONDS, and reads simgpu's per-group busy counters (the
judge: simgpu-stat, never gpuslice's own figures) once a second. A tenant's part of the busy time
in every 1 s window after the first is compared with its policy share.

The cells: shares 10/90, 30/70, 50/50, each with
  - spin kernels of 50 us, 200 us and 2 ms at queue depths 1, 8 and 32 (eager launches);
  - mixed lengths: the first tenant 50 us kernels, the second 2 ms (depth 8);
  - graph launches (10 captured spin launches of 200 us per graph);
  - per-thread default streams: each tenant 3 threads launching 200 us kernels through the `_ptsz`
    entry points and CU_STREAM_PER_THREAD.

With --hog N, `stress --cpu N` (or N Python busy loops when stress is absent) runs beside every
cell, and a **control** runs at the same moment: the same two clients without gpuslice, on a second
simgpu instance (its own state). A window in which the control kept its device less than 95% busy
is one in which this host could not feed a device: marked "host-starved" (h) and reported, not
judged, as the issue's rule has it (a tenant gets its share of the time it can use).

Usage: scripts/bench/shares_matrix.py [--seconds S (5)] [--hog N (0)] [--only SUBSTRING]
                                      [--tolerance P (2)]
Builds the release profile into $CARGO_TARGET_DIR (default target/). Prints one line per cell
(worst deviation over the judged windows, in points) and a summary; exits 0 (a benchmark, not a
test: the tests' bounds are in tests/compute_shares.rs).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from simgpu_setup import prepare


def cells():
    for shares in ((10, 90), (30, 70), (50, 50)):
        tag = f"{shares[0]}/{shares[1]}"
        for us in (50, 200, 2000):
            for depth in (1, 8, 32):
                spin = ["spin", None, None, str(us), str(depth)]
                yield (f"{tag} spin {us}us depth {depth}", shares, (spin, spin))
        yield (f"{tag} mixed 50us/2ms", shares,
               (["spin", None, None, "50", "8"], ["spin", None, None, "2000", "8"]))
        graph = ["graph", None, None, "200", "10"]
        yield (f"{tag} graph 10x200us", shares, (graph, graph))
        ptsz = ["ptsz", None, None, "200", "3"]
        yield (f"{tag} ptsz 3 threads 200us", shares, (ptsz, ptsz))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--hog", type=int, default=0, help="CPU hogs beside each cell (stress --cpu N)")
    ap.add_argument("--only", help="run only the cells whose name contains this")
    ap.add_argument("--tolerance", type=float, default=2.0)
    a = ap.parse_args()
    if a.seconds < 3:
        sys.exit("shares_matrix: --seconds must be at least 3 (the first window is not judged)")
    rel, work, lib, client = prepare("gpuslice-bench-matrix-")
    ctx = {"work": work, "lib": lib, "client": client, "shim": os.path.join(rel, "libgpuslice.so"),
           "stat": os.path.join(rel, "simgpu-stat")}
    hogs = start_hogs(a.hog)
    print(f"shares_matrix: {a.seconds} s per cell, windows of 1 s after the first, tolerance "
          f"+-{a.tolerance:g} points; hog: {a.hog} CPU(s); load average {os.getloadavg()[0]:.2f}")
    results = []
    try:
        for n, (name, shares, args) in enumerate(cells()):
            if a.only and a.only not in name:
                continue
            r = run_cell(ctx, n, name, shares, args, a)
            results.append(r)
            print(line(r, a), flush=True)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        shutil.rmtree(work, ignore_errors=True)
    judged = [r for r in results if r["judged"]]
    within = [r for r in judged if r["worst"] <= a.tolerance]
    starved = sum(r["starved"] for r in results)
    print(f"shares_matrix: {len(within)} of {len(judged)} judged cells within +-{a.tolerance:g} in "
          f"every judged window; {starved} window(s) host-starved (not judged); load average "
          f"{os.getloadavg()[0]:.2f}")
    print("shares_matrix: raw", json.dumps(results))


def start_hogs(n):
    if n <= 0:
        return []
    if shutil.which("stress"):
        return [subprocess.Popen(["stress", "--cpu", str(n)], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)]
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def spawn(ctx, state, tenant, share, argv, start, ms, shim, tag):
    env = {"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": ctx["lib"], "SIMGPU_STATE": state,
           "SIMGPU_GROUP": tenant}
    env.update({k: v for k, v in os.environ.items() if k.startswith("SIMGPU_COST_")})
    if shim:
        env.update({"LD_PRELOAD": ctx["shim"], "GPUSLICE_COMPUTE_SHARE": str(share),
                    "GPUSLICE_TENANT": tenant,
                    "GPUSLICE_LEDGER": os.path.join(ctx["work"], f"{tag}-{tenant}.ledger"),
                    "GPUSLICE_DEVICE_DIR": os.path.join(ctx["work"], f"{tag}-devices")})
    args = list(argv)
    args[1], args[2] = str(start), str(ms)
    return subprocess.Popen([ctx["client"]] + args, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def busy(ctx, state):
    out = subprocess.run([ctx["stat"]], env={"SIMGPU_STATE": state}, capture_output=True,
                         text=True)
    if out.returncode != 0:
        return None
    s = json.loads(out.stdout)
    groups = {g["name"]: g["busy_ns"][0] for g in s.get("groups", [])}
    return time.monotonic_ns(), s["devices"][0]["busy_ns"], groups


def run_cell(ctx, n, name, shares, args, a):
    ms = a.seconds * 1000
    start = time.time_ns() + 800_000_000
    tag = f"c{n}"
    states = {"shim": f"gpuslice-bench-matrix-{os.getpid()}-{n}",
              "control": f"gpuslice-bench-matrix-{os.getpid()}-{n}-control"}
    procs = []
    for side, state in states.items():
        if side == "control" and a.hog <= 0:
            continue
        for tenant, share, argv in zip(("a", "b"), shares, args):
            procs.append(spawn(ctx, state, tenant, share, argv, start, ms, side == "shim",
                               f"{tag}-{side}"))
    # Samples at the start and every second after it.
    samples = {side: [] for side in states}
    t_start = time.monotonic_ns() + (start - time.time_ns())
    for k in range(a.seconds + 1):
        due = t_start + k * 1_000_000_000 + 50_000_000
        time.sleep(max(0, due - time.monotonic_ns()) / 1e9)
        for side, state in states.items():
            if side == "control" and a.hog <= 0:
                continue
            samples[side].append(busy(ctx, state))
    failed = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            failed.append(f"client exited {p.returncode}: {err.strip()[-300:]}")
    for state in states.values():
        try:
            os.unlink(f"/dev/shm/{state}")
        except OSError:
            pass
    target = [s * 100.0 / sum(shares) for s in shares]
    windows = []
    s, c = samples["shim"], samples.get("control", [])
    # Window k covers [k, k+1] s; the first (k = 0) is not judged.
    for k in range(1, len(s) - 1):
        if s[k] is None or s[k + 1] is None:
            continue
        d = {t: s[k + 1][2].get(t, 0) - s[k][2].get(t, 0) for t in ("a", "b")}
        total = sum(d.values())
        got = [d[t] * 100.0 / max(total, 1) for t in ("a", "b")]
        wall = s[k + 1][0] - s[k][0]
        dev_busy = (s[k + 1][1] - s[k][1]) / max(wall, 1)
        ctl_busy = None
        if c and c[k] is not None and c[k + 1] is not None:
            ctl_busy = (c[k + 1][1] - c[k][1]) / max(c[k + 1][0] - c[k][0], 1)
        starved = ctl_busy is not None and ctl_busy < 0.95
        windows.append({"got": got, "busy": dev_busy, "control_busy": ctl_busy,
                        "starved": starved,
                        "dev": max(abs(g - t) for g, t in zip(got, target))})
    judged = [w for w in windows if not w["starved"]]
    return {"cell": name, "target": target, "windows": windows, "failed": failed,
            "judged": bool(judged) and not failed,
            "worst": max((w["dev"] for w in judged), default=0.0),
            "starved": sum(w["starved"] for w in windows)}


def line(r, a):
    if r["failed"]:
        return f"shares_matrix: {r['cell']:34} FAILED: {r['failed']}"
    per = " ".join(
        ("h" if w["starved"] else "") + f"{w['got'][0]:.1f}" for w in r["windows"])
    busy = min((w["busy"] for w in r["windows"]), default=0.0)
    ok = "ok  " if r["judged"] and r["worst"] <= a.tolerance else ("-   " if not r["judged"] else "MISS")
    return (f"shares_matrix: {ok} {r['cell']:34} target {r['target'][0]:.0f}: first tenant per "
            f"window {per}; worst {r['worst']:.1f} points; device busy >= {busy * 100:.1f}%")


if __name__ == "__main__":
    main()
