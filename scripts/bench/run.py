#!/usr/bin/env python3
"""The measurements behind scripts/bench.sh (which builds everything and then runs this).

Every figure compares the same client (scripts/bench/bench.c) on simgpu, once without and once with
LD_PRELOAD=libgpuslice.so (a quota configured, so the hooks do their work):

  * wall time: for each repetition, every mode runs as a pair of processes (without, with; the order
    alternates between repetitions), all pinned to one CPU (taskset -c CPU). Reported: the median over
    repetitions of each side's ns/op, and the median of the paired differences ("added").
  * instructions: each mode once under `valgrind --tool=callgrind --toggle-collect=bench_loop_<mode>`
    per side: the Ir executed inside the measured loop divided by its iteration count (deterministic).
    added = with - without.
  * start-up: whole-process wall time of `bench startup` (cuInit, primary context retain, set
    current), interleaved pairs of runs, medians; plus the whole process's Ir under callgrind.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import callgrind_report  # noqa: E402

# mode -> (iterations timed, iterations under callgrind, goal ns, goal Ir, label)
MODES = {
    "alloc": (20000, 2000, 150, 200, "cuMemAlloc_v2 + cuMemFree_v2 pair (1 MiB)"),
    "launch": (20000, 2000, 10, 40, "cuLaunchKernel, no compute share"),
    "getctx": (200000, 20000, 0, 0, "cuCtxGetCurrent (not hooked)"),
    "getattr": (100000, 5000, 0, 0, "cuDeviceGetAttribute (not hooked)"),
}
STARTUP_GOAL_MS = 0.3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="the compiled bench client")
    ap.add_argument("--shim", required=True, help="libgpuslice.so")
    ap.add_argument("--simgpu-lib", required=True, help="simgpu installed as a driver")
    ap.add_argument("--simgpu-stat", required=True)
    ap.add_argument("--work", required=True, help="output dir (callgrind files, results)")
    ap.add_argument("--shm", required=True, help="scratch dir for simgpu's state file and the ledger")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--startup-runs", type=int, default=150)
    ap.add_argument("--cpu", default="1")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()

    os.makedirs(a.work, exist_ok=True)
    os.makedirs(a.shm, exist_ok=True)
    base_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LD_LIBRARY_PATH": a.simgpu_lib,
        "SIMGPU_STATE": os.path.join(a.shm, "simgpu.state"),
        # Small enough for valgrind to map simgpu's reserved address range (4x the capacity).
        "SIMGPU_MEMORY": "2GiB",
        "SIMGPU_KERNEL_NS": "1000",
    }
    with_env = dict(
        base_env,
        LD_PRELOAD=a.shim,
        GPUSLICE_MEMORY_LIMIT="1GiB",
        GPUSLICE_LEDGER=os.path.join(a.shm, "bench.ledger"),
        GPUSLICE_TENANT="bench",
    )
    sides = {"without": base_env, "with": with_env}
    pin = ["taskset", "-c", a.cpu]

    def run(env, args, check=True):
        p = subprocess.run(pin + [a.bench] + args, env=env, capture_output=True, text=True)
        if check and p.returncode != 0:
            sys.exit(f"bench {' '.join(args)} failed ({p.returncode}):\n{p.stdout}{p.stderr}")
        return p

    def ns_per_op(env, mode, n):
        out = run(env, [mode, str(n)]).stdout
        kv = dict(line.split("=", 1) for line in out.split() if "=" in line)
        return float(kv["ns_per_op"])

    # 0. The shim is really enforcing: a quota the context reserve (512 MiB) fills refuses 1 MiB.
    tight = dict(with_env, GPUSLICE_MEMORY_LIMIT="512MiB",
                 GPUSLICE_LEDGER=os.path.join(a.shm, "tight.ledger"))
    p = run(tight, ["alloc", "1"], check=False)
    if p.returncode == 0 or "OUT_OF_MEMORY" not in p.stderr:
        sys.exit(f"sanity check failed: the shim did not refuse an allocation over quota:\n"
                 f"{p.stdout}{p.stderr}")
    print("sanity: with a 512 MiB quota the shim refuses cuMemAlloc (CUDA_ERROR_OUT_OF_MEMORY): ok",
          flush=True)

    # 1. Wall time, paired and interleaved.
    ns = {m: {"without": [], "with": []} for m in MODES}
    for rep in range(a.reps):
        order = ["without", "with"] if rep % 2 == 0 else ["with", "without"]
        for mode, (n, *_rest) in MODES.items():
            for side in order:
                ns[mode][side].append(ns_per_op(sides[side], mode, n))
        print(f"timing: repetition {rep + 1}/{a.reps} done", flush=True)

    # 2. Instructions under callgrind.
    ir = {m: {} for m in MODES}
    breakdowns = {}
    for mode, (_n, cg_n, *_rest) in MODES.items():
        for side, env in sides.items():
            out = os.path.join(a.work, f"callgrind.{mode}.{side}.out")
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                   f"--toggle-collect=bench_loop_{mode}", a.bench, mode, str(cg_n)]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
            self_cost, calls, summary = callgrind_report.parse(out)
            ir[mode][side] = summary / cg_n
        print(f"callgrind: {mode} done", flush=True)
    # Where the shim's instructions go in the alloc/free pair.
    breakdowns["alloc"] = subprocess.run(
        [sys.executable, os.path.join(HERE, "callgrind_report.py"), "breakdown",
         os.path.join(a.work, "callgrind.alloc.with.out"), str(MODES["alloc"][1]),
         "libgpuslice.so", "cuMemAlloc_v2,cuMemFree_v2", "20"],
        capture_output=True, text=True, check=True).stdout

    # 3. Start-up: whole processes, interleaved pairs.
    start = {"without": [], "with": []}
    for i in range(a.startup_runs + 10):
        order = ["without", "with"] if i % 2 == 0 else ["with", "without"]
        for side in order:
            t0 = time.perf_counter_ns()
            run(sides[side], ["startup"])
            dt = time.perf_counter_ns() - t0
            if i >= 10:  # the first runs warm the page cache, create the state file and ledger
                start[side].append(dt / 1e6)
    startup_ir = {}
    for side, env in sides.items():
        out = os.path.join(a.work, f"callgrind.startup.{side}.out")
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", a.bench,
                        "startup"], env=env, capture_output=True, text=True, check=True)
        startup_ir[side] = callgrind_report.parse(out)[2]
    print("startup: done", flush=True)

    hyperfine = None
    if shutil.which("hyperfine"):
        hf_json = os.path.join(a.work, "hyperfine.json")
        envs = {s: " ".join(f"{k}={v}" for k, v in e.items()) for s, e in sides.items()}
        cmds = [f"taskset -c {a.cpu} env -i {envs[s]} {a.bench} startup" for s in ("without", "with")]
        subprocess.run(["hyperfine", "-N", "--warmup", "10", "--runs", "100", "--export-json",
                        hf_json, "-n", "without", cmds[0], "-n", "with", cmds[1]],
                       capture_output=True, text=True, check=True)
        with open(hf_json) as f:
            res = {r["command"]: r for r in json.load(f)["results"]}
        hyperfine = {s: (res[s]["median"] * 1e3, res[s]["stddev"] * 1e3) for s in ("without", "with")}

    # The judge: simgpu's counters after everything exited (every pair freed, nothing left used).
    stat = subprocess.run([a.simgpu_stat], env=base_env, capture_output=True, text=True).stdout

    # ---- table ----
    med = statistics.median
    rows = []
    for mode, (n, cg_n, goal_ns, goal_ir, label) in MODES.items():
        w, s = ns[mode]["without"], ns[mode]["with"]
        added_ns = med([b - c for b, c in zip(s, w)])
        added_ir = ir[mode]["with"] - ir[mode]["without"]
        if goal_ns == 0:
            ok = "yes" if abs(added_ir) < 0.5 else "NO"
            goal = "0"
        else:
            ok = "yes" if added_ns <= goal_ns and added_ir <= goal_ir else "NO"
            goal = f"<= {goal_ns} ns, <= {goal_ir} Ir"
        rows.append([label, f"{med(w):.1f}", f"{med(s):.1f}", f"{added_ns:+.1f}",
                     f"{ir[mode]['without']:.0f}", f"{ir[mode]['with']:.0f}", f"{added_ir:+.0f}",
                     goal, ok])
    sw, ss = start["without"], start["with"]
    added_ms = med([b - c for b, c in zip(ss, sw)])
    rows.append(["process start-up to a current context (ms, whole process)", f"{med(sw):.3f}",
                 f"{med(ss):.3f}", f"{added_ms:+.3f}", f"{startup_ir['without']}",
                 f"{startup_ir['with']}", f"{startup_ir['with'] - startup_ir['without']:+d}",
                 f"<= {STARTUP_GOAL_MS} ms", "yes" if added_ms <= STARTUP_GOAL_MS else "NO"])
    head = ["call", "ns without", "ns with", "ns added (median of pairs)", "Ir without",
            "Ir with", "Ir added", "goal", "met"]
    print()
    print(f"{a.reps} repetitions of paired runs on CPU {a.cpu}; ns = median ns/op; "
          f"Ir = callgrind instructions per op")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print()
    print("For scale (from the issue): HAMi-core adds about 240 instructions to every launch and about "
          "1,300 to every allocate/free pair.")
    if hyperfine:
        hw, hs = hyperfine["without"], hyperfine["with"]
        print(f"hyperfine cross-check (start-up, median of 100 runs each, not interleaved): without "
              f"{hw[0]:.3f} ms (sd {hw[1]:.3f}), with {hs[0]:.3f} ms (sd {hs[1]:.3f}), "
              f"added {hs[0] - hw[0]:+.3f} ms")
    print()
    print("Where the shim's instructions go in the alloc/free pair (callgrind, with the shim):")
    print(breakdowns["alloc"])
    print(f"simgpu-stat after the run: {stat.strip()}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ns": ns, "ir": ir, "startup_ms": start, "startup_ir": startup_ir,
                       "hyperfine_ms": hyperfine, "rows": rows, "head": head}, f, indent=1)


if __name__ == "__main__":
    main()
