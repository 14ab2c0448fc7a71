#!/usr/bin/env python3
"""The real-GPU check's runner (scripts/gpu-check, docs/REAL-GPU.md).

Runs from a folder packed by `scripts/gpu-check --pack DIR`: `bin/` (the check's clients, gpuslice,
gpuslice-probe), `lib/libgpuslice.so`, `dropin/` (libcuda.so.1, libnvidia-ml.so.1), `kernels.ptx`,
`hooked.txt`. Each probe measures one thing gpuslice (or simgpu, its model of a GPU) assumes about
NVIDIA's driver and GPUs, and says pass or fail against that assumption and where in the code it
lives. Writes report.json and report.md; at most 8 minutes in all (each probe has its own timeout);
every process it starts is in a process group of its own, killed when its step ends; a probe that
fails or errs does not stop the others.

Python 3.10-3.12, standard library only; PyTorch, JAX and CuPy are imported in child processes only
(missing: the probe is skipped).
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.join(HERE, "bin")
CLIENT = os.path.join(BIN, "gpu-check-client")
RESOLVE = os.path.join(BIN, "gpu-check-resolve")
LIBGPUSLICE = os.path.join(HERE, "lib", "libgpuslice.so")
DROPIN = os.path.join(HERE, "dropin")
KERNELS = os.path.join(HERE, "kernels.ptx")
MIB = 1 << 20
GIB = 1 << 30
TOTAL_BUDGET_S = 480  # the whole run, every probe included
QUOTA = 4 * GIB


class Skip(Exception):
    """A probe that cannot run here; its message is the reason."""


class Failed(Exception):
    """A step of a probe that did not give what it needed (the probe's status: error)."""


def kv(text):
    out = {}
    for line in text.splitlines():
        if "=" in line and " " not in line.split("=", 1)[0]:
            k, v = line.split("=", 1)
            out[k] = v
    return out


def num(d, k, default=None):
    try:
        return float(d[k])
    except (KeyError, ValueError):
        return default


def mib(b):
    return None if b is None else round(b / MIB, 1)


class Runner:
    def __init__(self, args):
        self.args = args
        self.simgpu = args.simgpu is not None
        self.driver_dir = os.path.abspath(args.simgpu) if self.simgpu else args.driver_dir
        self.start = time.monotonic()
        self.tmp = tempfile.mkdtemp(prefix="gpu-check-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        self.state = "simgpu-gpu-check-%d" % os.getpid()
        self.groups = set()  # process groups alive
        self.tenants = 0
        self.results = []

    # ---- time ----
    def left(self):
        return TOTAL_BUDGET_S - (time.monotonic() - self.start)

    # ---- environments ----
    def env(self, extra=None):
        e = {
            k: v
            for k, v in os.environ.items()
            if not (k.startswith(("GPUSLICE_", "SIMGPU_", "CUDA_", "PYTORCH_", "XLA_")) or k in ("LD_PRELOAD",))
        }
        if self.driver_dir:
            e["LD_LIBRARY_PATH"] = self.driver_dir
        if self.simgpu:
            e["SIMGPU_STATE"] = self.state
        e.update(extra or {})
        return e

    def tenant(self, name=None, memory=QUOTA, share=None, priority=None, extra=None):
        """The environment of a process of a gpuslice tenant. Without a name, a new tenant: a tenant's
        share and priority are its ledger's (set by its first process), so a name is never reused
        with other settings."""
        if name is None:
            self.tenants += 1
            name = "t%d" % self.tenants
        e = {
            "LD_PRELOAD": LIBGPUSLICE,
            "GPUSLICE_LEDGER_DIR": os.path.join(self.tmp, "ledgers"),
            "GPUSLICE_TENANT": name,
            "GPUSLICE_LOG": "warn",
        }
        if memory is not None:
            e["GPUSLICE_MEMORY_LIMIT"] = str(memory)
        if share is not None:
            e["GPUSLICE_COMPUTE_SHARE"] = str(share)
        if priority is not None:
            e["GPUSLICE_PRIORITY"] = priority
        e.update(extra or {})
        return self.env(e)

    # ---- processes ----
    def spawn(self, argv, env, stdin=subprocess.PIPE):
        p = subprocess.Popen(
            [str(a) for a in argv],
            env=env,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.groups.add(p.pid)
        return p

    def kill(self, p):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.groups.discard(p.pid)

    def finish(self, p, timeout, stdin_text=None):
        """The process's (stdout, stderr, rc) once it ends; killed (its whole group) at `timeout`."""
        timeout = max(1.0, min(timeout, self.left()))
        try:
            out, err = p.communicate(input=stdin_text, timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill(p)
            out, err = p.communicate()
            raise Failed("%s: no end within %.0f s; killed\n%s" % (os.path.basename(p.args[0]), timeout, err[-2000:]))
        finally:
            self.kill(p)  # whatever it started and left behind
        return out, err, p.returncode

    def run(self, argv, env, timeout=60, stdin_text="", check=True):
        p = self.spawn(argv, env)
        out, err, rc = self.finish(p, timeout, stdin_text)
        d = kv(out)
        if check and (rc != 0 or "error" in d):
            raise Failed("%s exited %s: %s %s" % (" ".join(argv[:3]), rc, d.get("error", ""), err.strip()[-1500:]))
        d["_stderr"] = err
        d["_rc"] = rc
        return d

    def hold(self, argv, env, timeout=60):
        """Starts a process that prints ready=1 and then works or waits (until its stdin closes or
        it is killed); returns once it is ready. Its stdout is read by a thread (into p.lines)."""
        p = self.spawn([str(a) for a in argv], env)
        p.lines = []
        ready = threading.Event()

        def reader():
            for line in p.stdout:
                p.lines.append(line)
                if line.startswith(("ready=1", "error=")):
                    ready.set()
            ready.set()

        p.reader = threading.Thread(target=reader, daemon=True)
        p.reader.start()
        ready.wait(min(timeout, max(1.0, self.left())))
        got = kv("".join(p.lines))
        if got.get("ready") != "1":
            self.kill(p)
            err = ""
            try:
                err = p.stderr.read()
            except (OSError, ValueError):
                pass
            raise Failed("%s not ready: %s %s" % (" ".join(p.args[:3]), got.get("error", ""), err[-1500:]))
        return p, got

    def release(self, p, timeout=30):
        """Closes a held process's stdin, waits for its end (killed at `timeout`), returns its key=values."""
        try:
            p.stdin.close()
        except OSError:
            pass
        try:
            p.wait(timeout=max(1.0, min(timeout, self.left())))
        except subprocess.TimeoutExpired:
            pass
        self.kill(p)
        p.reader.join(5)
        return kv("".join(p.lines))

    def client(self, *args, env=None, timeout=60, check=True):
        return self.run([CLIENT] + [str(a) for a in args], env or self.env(), timeout=timeout, check=check)

    def python(self, code, env, timeout=90):
        py = shutil.which("python3", path=env.get("PATH")) or sys.executable
        return self.run([py, "-c", code], env, timeout=timeout, check=False)

    def have_module(self, name):
        env = self.env()
        py = shutil.which("python3", path=env.get("PATH")) or sys.executable
        r = subprocess.run(
            [py, "-c", "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec(%r) else 1)" % name],
            env=env,
            capture_output=True,
            timeout=30,
        )
        return r.returncode == 0

    def cleanup(self):
        for pid in list(self.groups):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.groups.clear()
        shutil.rmtree(self.tmp, ignore_errors=True)
        if self.simgpu:
            try:
                os.unlink(os.path.join("/dev/shm", self.state))
            except OSError:
                pass


# ---------------------------------------------------------------------------------------------------
# Probes: each is (id, title, validates, where, timeout_s, function(runner) -> dict).
# A function returns {"status": "pass"|"fail"|"info", "figure": str, "measured": {...},
# "contradiction": str (when status is fail: which assumption the figure contradicts)}; raises Skip.

PROBES = []


def probe(pid, title, validates, where, timeout=60):
    def wrap(fn):
        PROBES.append(dict(id=pid, title=title, validates=validates, where=where, timeout=timeout, fn=fn))
        return fn

    return wrap


def need_real(r, what="NVIDIA hardware"):
    if r.simgpu:
        raise Skip("skipped: simgpu (needs %s)" % what)


def need_module(r, name):
    if not r.have_module(name):
        raise Skip("skipped: %s is not installed" % name)


@probe(
    "driver",
    "driver version and device",
    "the API tables and cuGetProcAddress rule are generated for CUDA 12 and 13 drivers",
    "src/api/driver_entry_points.tsv, scripts/gen-entry-points.py",
    timeout=30,
)
def p_driver(r):
    d = r.client("info")
    v = int(d["driver_version"])
    m = {"driver_version": v, "device": d.get("device"), "total_mib": mib(num(d, "total"))}
    ok = v >= 12000
    return dict(
        status="pass" if ok else "fail",
        figure="CUDA %d.%d driver, %s, %s MiB" % (v // 1000, v % 1000 // 10, m["device"], m["total_mib"]),
        measured=m,
        contradiction="" if ok else "the driver is older than CUDA 12: the tables assume 12.0 or later",
    )


def resolution_lines(r, env):
    p = r.spawn([RESOLVE], env)
    text, err, rc = r.finish(p, 60, "")
    if rc != 0:
        raise Failed("gpu-check-resolve exited %s: %s %s" % (rc, kv(text).get("error", ""), err[-1000:]))
    out = {}
    for line in text.splitlines():
        if " | " in line:
            key, val = line.split(" | ", 1)
            out[key] = val.split()
    return out, kv(text)


@probe(
    "resolution",
    "every hooked name resolves to gpuslice's hook exactly where the driver returns its function",
    "linked references, dlsym on the driver's handle and cuGetProcAddress_v2 (CUDA 12.0, 12.8, 13.0; "
    "default and per-thread-stream flags) give the hook for the same symbol the driver gives, and "
    "nothing where the driver gives nothing",
    "src/hooks/entry.rs, shim-c/interpose.c, src/api/ (cuGetProcAddress resolution rule)",
    timeout=90,
)
def p_resolution(r):
    hooked = set(open(os.path.join(HERE, "hooked.txt")).read().split())
    plain, info = resolution_lines(r, r.env())
    pre, _ = resolution_lines(r, r.env({"LD_PRELOAD": LIBGPUSLICE}))
    wrong = []
    counts = {"linked": 0, "dlsym": 0, "gpa": 0}
    for key, (rc, sym, owner) in plain.items():
        way = key.split()[0]
        got = pre.get(key)
        if way == "linked" and sym == "null":
            continue  # the driver lacks it: no program linked against it refers to it
        counts[way] += 1
        base = sym.split("+")[0]
        expect = [rc, sym, "gpuslice" if base in hooked else owner]
        if got != expect:
            wrong.append("%s: driver %s, under gpuslice %s (expected %s)" % (key, " ".join([rc, sym, owner]), " ".join(got or ["missing"]), " ".join(expect)))
    m = {"lookups": counts, "wrong": wrong[:40], "wrong_count": len(wrong), "driver_version": info.get("version")}
    return dict(
        status="pass" if not wrong else "fail",
        figure="%d lookups (linked %d, dlsym %d, cuGetProcAddress %d), %d wrong"
        % (sum(counts.values()), counts["linked"], counts["dlsym"], counts["gpa"], len(wrong)),
        measured=m,
        contradiction="" if not wrong else "resolution differs from the driver's: " + "; ".join(wrong[:5]),
    )


@probe(
    "resolution_dropin",
    "the same lookups through the drop-in libcuda.so.1 / libnvidia-ml.so.1 (no preload)",
    "with gpuslice's drop-in libraries first on the library path, every lookup gives the same symbol as "
    "the driver, served by the drop-in (its hook for a hooked name); cuGetProcAddress gives nothing where "
    "the driver gives nothing (linked and dlsym may find the drop-in's export of a name the driver lacks, "
    "which answers CUDA_ERROR_NOT_FOUND, docs/DEPLOYMENT.md)",
    "shim-c/dropin-cuda, shim-c/dropin-nvml, shim-c/dropin-common.rs",
    timeout=90,
)
def p_resolution_dropin(r):
    plain, _ = resolution_lines(r, r.env())
    env = {"LD_LIBRARY_PATH": DROPIN + ((":" + r.driver_dir) if r.driver_dir else "")}
    if r.driver_dir:
        # Outside the driver's standard directories (simgpu, --driver-dir): named for the drop-ins.
        env["GPUSLICE_REAL_LIBCUDA"] = os.path.join(r.driver_dir, "libcuda.so.1")
        env["GPUSLICE_REAL_NVML"] = os.path.join(r.driver_dir, "libnvidia-ml.so.1")
    dropin, _ = resolution_lines(r, r.env(env))
    wrong, extra = [], []
    n = 0
    for key, (rc, sym, owner) in plain.items():
        if key.startswith("linked") and sym == "null":
            continue
        n += 1
        got = dropin.get(key)
        if got is not None and sym == "null" and not key.startswith("gpa") and got[1] == key.split()[1] and got[2] == "gpuslice":
            # The drop-in exports the whole table; a function the installed driver lacks answers
            # CUDA_ERROR_NOT_FOUND / NVML_ERROR_FUNCTION_NOT_FOUND (docs/DEPLOYMENT.md).
            extra.append(key.split()[1])
            continue
        ok = got is not None and got[:2] == [rc, sym] and (sym == "null" or got[2] == "gpuslice")
        if not ok:
            wrong.append("%s: driver %s, through the drop-in %s" % (key, " ".join([rc, sym, owner]), " ".join(got or ["missing"])))
    return dict(
        status="pass" if not wrong else "fail",
        figure="%d lookups, %d wrong; exported by the drop-in but not the driver (answering NOT_FOUND): %s"
        % (n, len(wrong), ", ".join(sorted(set(extra))) or "none"),
        measured={"wrong": wrong[:40], "wrong_count": len(wrong), "dropin_only": sorted(set(extra))},
        contradiction="" if not wrong else "the drop-in resolves differently from the driver: " + "; ".join(wrong[:5]),
    )


@probe(
    "events_no_context",
    "events queried from a thread with no current context",
    "cuEventQuery, cuEventSynchronize and cuEventElapsedTime on an event recorded in a context succeed "
    "from a thread with no current context (gpuslice's scheduler thread does this)",
    "src/scheduling/events.rs, src/scheduling/runtime.rs",
)
def p_events(r):
    d = r.client("events", KERNELS)
    m = {k: d.get(k) for k in ("thread_context_null", "query_name", "sync_name", "elapsed_name", "elapsed_ms")}
    ok = d.get("sync_rc") == "0" and d.get("elapsed_rc") == "0" and d.get("query_rc") in ("0", "600")
    return dict(
        status="pass" if ok else "fail",
        figure="query %s, synchronize %s, elapsed %s (%s ms)" % (d.get("query_name"), d.get("sync_name"), d.get("elapsed_name"), d.get("elapsed_ms")),
        measured=m,
        contradiction="" if ok else "the scheduler thread's event calls fail without a current context",
    )


def deltas(d, steps, key="proc"):
    """Per step: the change of NVML's per-process figure (or `dev_used`) from the previous step."""
    out = {}
    prev = None
    for s in steps:
        v = num(d, "%s_%s" % (s, key))
        if v is not None and v < 0:
            v = 0.0 if s == "start" else None  # nothing listed before the first context: it holds nothing
        if prev is not None and v is not None:
            out[s] = mib(v - prev)
        if v is not None:
            prev = v
    return out


def charged_vs_spent(d, steps):
    """Under gpuslice: per step, the charge (quota - cuMemGetInfo's free) against NVML's figure."""
    rows = {}
    for s in steps:
        total, free, proc = num(d, s + "_total"), num(d, s + "_free"), num(d, s + "_proc")
        if total is None or free is None:
            continue
        rows[s] = {"charged_mib": mib(total - free), "nvml_mib": mib(proc) if proc is not None and proc >= 0 else None}
    bad = [
        s
        for s, v in rows.items()
        if v["nvml_mib"] is not None and v["charged_mib"] + 2.0 < v["nvml_mib"] * 0.98
    ]
    return rows, bad


def memory_probe(r, args, steps, model=None):
    """Runs the client raw (what the driver spends) and under a gpuslice quota (what is charged)."""
    raw = r.client(*args, timeout=120)
    under = r.client(*args, env=r.tenant(), timeout=120)
    spent = deltas(raw, steps)
    rows, bad = charged_vs_spent(under, steps)
    return raw, under, spent, rows, bad


@probe(
    "memory_context",
    "what a context costs, and whether gpuslice charges it",
    "a context takes device memory NVML attributes to the process (measured per process, "
    "not guessed); under a quota cuMemGetInfo shows the quota and the context is charged",
    "src/accounting/contexts.rs, src/accounting/overhead.rs, src/driver/measure.rs",
)
def p_memory_context(r):
    raw, under, spent, rows, bad = memory_probe(r, ["memory", KERNELS, "module"], ["start", "context"])
    ctx = spent.get("context")
    total_ok = num(under, "context_total") == QUOTA
    listed = num(raw, "context_proc", -1) >= 0
    ok = listed and total_ok and not bad
    why = []
    if not listed:
        why.append("NVML does not list the process under its PID: overhead falls back to the device figure (src/driver/measure.rs)")
    if not total_ok:
        why.append("cuMemGetInfo's total under a 4 GiB quota is %s, not the quota (src/accounting/views.rs)" % under.get("context_total"))
    if bad:
        why.append("less charged than NVML says the process holds: %s" % rows)
    return dict(
        status="pass" if ok else "fail",
        figure="context %s MiB (NVML, process); charged %s MiB under gpuslice" % (ctx, rows.get("context", {}).get("charged_mib")),
        measured={"spent_mib": spent, "under_gpuslice": rows, "device_used_delta_mib": deltas(raw, ["start", "context"], "dev_used")},
        contradiction="; ".join(why),
    )


def loading_probe(r, loading):
    steps = ["context", "load", "lookup", "launch", "lookup2"]
    env = {"CUDA_MODULE_LOADING": loading}
    out = {}
    bad_all = []
    for how in ("module", "library"):
        raw = r.client("memory", KERNELS, how, env=r.env(env), timeout=120)
        under = r.client("memory", KERNELS, how, env=r.tenant(extra=env), timeout=120)
        rows, bad = charged_vs_spent(under, steps)
        out[how] = {"spent_mib": deltas(raw, steps), "under_gpuslice": rows}
        bad_all += ["%s %s" % (how, s) for s in bad]
    return out, bad_all


@probe(
    "module_loading_lazy",
    "where a lazily loaded module spends: load, lookup (cuModuleGetFunction / cuLibraryGetKernel), first launch",
    "with CUDA_MODULE_LOADING=LAZY a load spends nothing; a module's kernel is loaded at its lookup "
    "(cuModuleGetFunction), a library's at its first launch, not at cuLibraryGetKernel (simgpu and the "
    "accounting charge there)",
    "tests/simgpu/cuda/src/module.rs, src/accounting/overhead.rs (LazyCode), src/accounting/first_launch.rs",
    timeout=120,
)
def p_lazy(r):
    out, bad = loading_probe(r, "LAZY")
    why = []
    for how, v in out.items():
        s = v["spent_mib"]
        if how == "library":
            if (s.get("lookup") or 0) > 0:
                why.append(
                    "library: lazy code is spent at cuLibraryGetKernel (%s MiB), not at the first launch: simgpu and accounting assume the latter" % s["lookup"]
                )
            if (s.get("load") or 0) > 0 and (s.get("launch") or 0) == 0:
                why.append("library: a lazy load spends at the load (%s MiB), not at the first launch" % s["load"])
            continue
        if (s.get("launch") or 0) > 0:
            why.append(
                "%s: lazy code is spent at the first launch (%s MiB), not at the lookup: simgpu and accounting assume the latter" % (how, s["launch"])
            )
        if (s.get("load") or 0) > 0 and (s.get("lookup") or 0) == 0:
            why.append("%s: a lazy load spends at the load (%s MiB), not at the lookup" % (how, s["load"]))
    if bad:
        why.append("less charged than NVML says the process holds at: %s" % ", ".join(bad))
    return dict(
        status="fail" if why else "pass",
        figure="; ".join(
            "%s: load %s, lookup %s, launch %s, 2nd lookup %s MiB" % (h, v["spent_mib"].get("load"), v["spent_mib"].get("lookup"), v["spent_mib"].get("launch"), v["spent_mib"].get("lookup2"))
            for h, v in out.items()
        ),
        measured=out,
        contradiction="; ".join(why),
    )


@probe(
    "module_loading_eager",
    "where an eagerly loaded module spends",
    "with CUDA_MODULE_LOADING=EAGER the load spends everything; lookups and launches nothing",
    "tests/simgpu/cuda/src/module.rs, src/accounting/overhead.rs",
    timeout=120,
)
def p_eager(r):
    out, bad = loading_probe(r, "EAGER")
    why = []
    for how, v in out.items():
        s = v["spent_mib"]
        later = (s.get("lookup") or 0) + (s.get("launch") or 0) + (s.get("lookup2") or 0)
        if later > 0:
            why.append("%s: an eager load still spends %s MiB after the load" % (how, later))
    if bad:
        why.append("less charged than NVML says the process holds at: %s" % ", ".join(bad))
    return dict(
        status="fail" if why else "pass",
        figure="; ".join("%s: load %s, lookups and launch %s MiB" % (h, v["spent_mib"].get("load"), sum((v["spent_mib"].get(k) or 0) for k in ("lookup", "launch", "lookup2"))) for h, v in out.items()),
        measured=out,
        contradiction="; ".join(why),
    )


@probe(
    "modules_500",
    "500 small modules",
    "module code is spent in 2 MiB pages per module (simgpu's model; gpuslice charges what NVML measures)",
    "tests/simgpu/cuda/src/module.rs, src/accounting/overhead.rs (driver_pages)",
    timeout=120,
)
def p_modules(r):
    raw, under, spent, rows, bad = memory_probe(r, ["modules", 500], ["before", "after"])
    total = spent.get("after")
    model = 500 * 2.0
    per_kib = None if total is None else round(total * 1024 / 500, 1)
    why = []
    if total is not None and abs(total - model) > model * 0.25:
        why.append("500 small modules cost %s MiB, simgpu's model says %s MiB (2 MiB pages per module)" % (total, model))
    if bad:
        why.append("less charged than NVML says the process holds: %s" % rows)
    return dict(
        status="fail" if why else "pass",
        figure="%s MiB for 500 modules (%s KiB each); charged %s MiB" % (total, per_kib, rows.get("after", {}).get("charged_mib")),
        measured={"spent_mib": spent, "under_gpuslice": rows},
        contradiction="; ".join(why),
    )


@probe(
    "local_memory",
    "a kernel with 4 KiB of local memory per thread",
    "local memory grown at a launch is driver overhead the process holds (charged by reconciliation, "
    "docs/MEMORY.md); simgpu does not model it",
    "src/accounting/overhead.rs (reconciliation), docs/MEMORY.md",
    timeout=90,
)
def p_local(r):
    raw, under, spent, rows, bad = memory_probe(r, ["localmem", KERNELS], ["before", "after"])
    grown = spent.get("after")
    why = []
    if bad:
        why.append("local memory grown at the launch is not charged: %s" % rows)
    if r.simgpu:
        return dict(status="info", figure="%s MiB grown at the launch (simgpu runs no code)" % grown, measured={"spent_mib": spent, "under_gpuslice": rows}, contradiction="")
    return dict(
        status="fail" if why else "pass",
        figure="%s MiB grown at the launch; charged %s MiB after it" % (grown, rows.get("after", {}).get("charged_mib")),
        measured={"spent_mib": spent, "under_gpuslice": rows},
        contradiction="; ".join(why),
    )


@probe(
    "context_limits",
    "cuCtxSetLimit stack and heap",
    "a stack limit costs (stack - 1 KiB) x multiprocessors x 2048 threads, the malloc heap its size "
    "beyond the 8 MiB default, each in 2 MiB pages (simgpu's model, reserved first by the accounting)",
    "tests/simgpu/cuda/src/context.rs, src/accounting/overhead.rs (limits)",
    timeout=90,
)
def p_limits(r):
    stack, heap = 4096, 256 * MIB
    raw, under, spent, rows, bad = memory_probe(r, ["limits", stack, heap], ["before", "stack", "heap"])
    sms = 132
    model_stack = (stack - 1024) * sms * 2048 / MIB
    model_heap = (heap - 8 * MIB) / MIB
    why = []
    s, h = spent.get("stack"), spent.get("heap")
    if s is not None and not (0.5 * model_stack <= s <= 2 * model_stack):
        why.append("a 4 KiB stack costs %s MiB, the model (132 SMs) says %.0f MiB" % (s, model_stack))
    if h is not None and not (0.5 * model_heap <= h <= 1.5 * model_heap + 2):
        why.append("a 256 MiB heap costs %s MiB, the model says %.0f MiB" % (h, model_heap))
    if bad:
        why.append("less charged than NVML says the process holds: %s" % rows)
    return dict(
        status="fail" if why else "pass",
        figure="stack 4 KiB: %s MiB (model %.0f); heap 256 MiB: %s MiB (model %.0f)" % (s, model_stack, h, model_heap),
        measured={"spent_mib": spent, "under_gpuslice": rows, "rc": {k: raw.get(k) for k in ("stack_rc", "heap_rc")}},
        contradiction="; ".join(why),
    )


@probe(
    "graph_memory",
    "a CUDA graph with memory nodes, and cuDeviceGraphMemTrim",
    "a graph's memory node is charged when the graph is launched; what the driver's graph memory pool "
    "keeps after the free node (simgpu: nothing, as if trimmed every time) is driver memory the "
    "reconciliation charges, and cuDeviceGraphMemTrim gives it back",
    "src/accounting/graphs.rs, docs/MEMORY.md (Graph memory), tests/simgpu/cuda/src/graph_memory.rs",
    timeout=90,
)
def p_graph(r):
    raw, under, spent, rows, bad = memory_probe(r, ["graphmem", 256], ["before", "launched", "trimmed"])
    held, trimmed = spent.get("launched"), spent.get("trimmed")
    why = []
    if raw.get("trim_rc") != "0":
        why.append("cuDeviceGraphMemTrim answers %s" % raw.get("trim_rc"))
    if held is not None and trimmed is not None and held > 2 and held + trimmed > 2:
        why.append("the graph pool keeps %s MiB after the run and the trim gives back only %s MiB" % (held, -trimmed))
    if bad:
        why.append("less charged than NVML says the process holds: %s" % rows)
    model = ""
    if held is not None and held > 2:
        model = " (the pool caches it: simgpu does not model this, tests/simgpu/cuda/src/graph_memory.rs)"
    return dict(
        status="fail" if why else "pass",
        figure="kept by the graph pool after the run %s MiB%s, after the trim %s MiB; charged %s then %s MiB"
        % (held, model, trimmed, rows.get("launched", {}).get("charged_mib"), rows.get("trimmed", {}).get("charged_mib")),
        measured={"spent_mib": spent, "under_gpuslice": rows, "trim_rc": raw.get("trim_rc")},
        contradiction="; ".join(why),
    )


def importer_probe(r, exporter_args, importer_args, steps, after):
    exp, got = r.hold([CLIENT] + exporter_args, r.env())
    try:
        stdin = got.get("handle", "") + "\n"
        d = r.run([CLIENT] + [str(a) for a in importer_args], r.env(), timeout=60, stdin_text=stdin, check=False)
    finally:
        r.kill(exp)
    return d, deltas(d, steps)


IMPORT_ASSUMPTION = (
    "an importer's mapping of another process's memory is the exporter's: NVML attributes it to the "
    "exporter and gives the importer no figure for it, so gpuslice charges only the exporter"
)


@probe("ipc_importer", "an IPC importer (cuIpcOpenMemHandle): is the mapping counted for it too?", IMPORT_ASSUMPTION, "docs/MEMORY.md (Memory the shim does not charge)", timeout=90)
def p_ipc(r):
    if r.simgpu:
        raise Skip("skipped: simgpu (its IPC model is this assumption, not a check of it)")
    d, spent = importer_probe(r, ["ipcexport", 256], ["ipcimport"], ["before", "after"], "after")
    if d.get("open_rc") != "0":
        raise Failed("cuIpcOpenMemHandle: %s %s" % (d.get("open_rc"), d.get("error", "")))
    grown = spent.get("after")
    ok = grown is not None and grown < 2
    return dict(
        status="pass" if ok else "fail",
        figure="importer's NVML figure grows %s MiB on opening 256 MiB" % grown,
        measured={"spent_mib": spent},
        contradiction="" if ok else "NVML counts the IPC mapping for the importer too (%s MiB): gpuslice's reconciliation would charge it there as well as to the exporter" % grown,
    )


@probe("fd_importer", "an fd-handle importer (cuMemImportFromShareableHandle): is the mapping counted for it too?", IMPORT_ASSUMPTION, "docs/MEMORY.md (Memory the shim does not charge)", timeout=90)
def p_fd(r):
    if r.simgpu:
        raise Skip("skipped: simgpu (no shareable handles)")
    sock = os.path.join(r.tmp, "fd.sock")
    d, spent = importer_probe(r, ["fdexport", 256, sock], ["fdimport", 256, sock], ["before", "after"], "after")
    if d.get("import_rc") != "0":
        raise Failed("cuMemImportFromShareableHandle: %s %s" % (d.get("import_rc"), d.get("error", "")))
    grown = spent.get("after")
    ok = grown is not None and grown < 2
    return dict(
        status="pass" if ok else "fail",
        figure="importer's NVML figure grows %s MiB on mapping 256 MiB" % grown,
        measured={"spent_mib": spent},
        contradiction="" if ok else "NVML counts the imported mapping for the importer too (%s MiB): gpuslice's reconciliation would charge it there as well as to the exporter" % grown,
    )


@probe(
    "pid_namespace",
    "the same process seen from a PID namespace",
    "NVML lists a process in a child PID namespace under its host PID (not getpid()), so gpuslice "
    "measures its overhead with the device figure and still charges its context there",
    "src/driver/measure.rs (pid_is_the_drivers), docs/MEMORY.md (Containers)",
    timeout=90,
)
def p_pidns(r):
    unshare = shutil.which("unshare", path=r.env().get("PATH"))
    if unshare is None:
        raise Skip("skipped: unshare is not installed")
    base = [unshare, "--pid", "--fork", "--mount-proc"]
    if os.geteuid() != 0:
        base = [unshare, "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]
    probe_run = subprocess.run(base + ["true"], capture_output=True, timeout=20)
    if probe_run.returncode != 0:
        raise Skip("skipped: cannot make a PID namespace here (%s)" % probe_run.stderr.decode(errors="replace").strip()[:200])
    raw_ctx = r.client("memory", KERNELS, "module")
    ctx_cost = deltas(raw_ctx, ["start", "context"]).get("context")
    d = r.run(base + [CLIENT, "memory", KERNELS, "module"], r.tenant(), timeout=90, check=False)
    if "context_free" not in d:
        raise Failed("client in the namespace: %s %s" % (d.get("error", ""), d["_stderr"][-800:]))
    listed = num(d, "context_proc", -1) >= 0
    charged = mib(num(d, "context_total") - num(d, "context_free"))
    why = []
    if listed and not r.simgpu:
        # simgpu names a process by its PID in /proc's namespace (tests/simgpu/README.md), which
        # --mount-proc makes the child's: there it lists the namespace PID by design.
        why.append("NVML lists the process under its namespace PID: src/driver/measure.rs and docs/MEMORY.md assume the host PID")
    if charged is None or ctx_cost is None or charged + 2 < ctx_cost:
        why.append("in the namespace the context (%s MiB) is charged %s MiB" % (ctx_cost, charged))
    return dict(
        status="fail" if why else "pass",
        figure="NVML lists it under its namespace PID (%s among %s): %s%s; context %s MiB, charged %s MiB there"
        % (d.get("context_getpid"), d.get("context_pids"), "yes" if listed else "no", " (simgpu: /proc is the namespace's)" if r.simgpu and listed else "", ctx_cost, charged),
        measured={"listed_under_namespace_pid": listed, "nvml_pids": d.get("context_pids"), "getpid": d.get("context_getpid"), "context_mib": ctx_cost, "charged_mib": charged},
        contradiction="; ".join(why),
    )


def launch_ns(r, env):
    d = r.client("launch", KERNELS, 4000, env=env, timeout=60)
    return num(d, "ns_per_launch_best")


@probe(
    "launch_cost",
    "host ns per cuLaunchKernel of a trivial kernel",
    "gpuslice's launch hook adds little (no allocation, no process-wide lock): at most 5 us per launch "
    "alone and beside an idle neighbour tenant",
    "src/hooks/launch.rs, src/scheduling/gate.rs, docs/BENCHMARKS.md",
    timeout=120,
)
def p_launch(r):
    m = {"without_gpuslice": launch_ns(r, r.env()), "gpuslice_alone": launch_ns(r, r.tenant(share=50))}
    idle, _ = r.hold([CLIENT, "hold", 64], r.tenant(name="neighbour", share=50))
    try:
        m["beside_idle_neighbour"] = launch_ns(r, r.tenant(share=50))
    finally:
        r.kill(idle)
    busy, _ = r.hold([CLIENT, "spin", KERNELS, 30000, 1000], r.tenant(name="busy", share=50))
    try:
        m["under_contention"] = launch_ns(r, r.tenant(share=50))
    finally:
        r.kill(busy)
    base = m["without_gpuslice"]
    over = {k: round((v - base) / 1000, 2) for k, v in m.items() if v is not None and base is not None and k != "without_gpuslice"}
    ok = over.get("gpuslice_alone", 99) <= 5 and over.get("beside_idle_neighbour", 99) <= 5
    return dict(
        status="pass" if ok else "fail",
        figure=", ".join("%s %s ns" % (k, None if v is None else int(v)) for k, v in m.items()),
        measured={"ns_per_launch": m, "added_us": over},
        contradiction="" if ok else "gpuslice adds %s us per launch (alone / beside an idle neighbour): more than 5 us" % over,
    )


@probe(
    "kernel_chain",
    "5 us kernels back to back, with and without an event between them (PDL on and off)",
    "an event recorded between kernels (as gpuslice's scheduler does) costs the device little: at most "
    "2 us per kernel more than none (device time, events around the chain)",
    "src/scheduling/events.rs, tests/simgpu/README.md (the device timeline)",
    timeout=120,
)
def p_chain(r):
    m = {}
    for how in ("plain", "event", "pdl"):
        d = r.client("chain", KERNELS, 1000, 5, how, timeout=60)
        m[how] = num(d, "gap_us")
        m[how + "_host"] = num(d, "host_gap_us")
        if how == "pdl":
            m["pdl_rc"] = d.get("pdl_rc")
    under = r.client("chain", KERNELS, 1000, 5, "plain", env=r.tenant(share=50), timeout=60)
    m["gpuslice_plain"] = num(under, "gap_us")
    extra = None if m["event"] is None or m["plain"] is None else round(m["event"] - m["plain"], 2)
    ok = extra is not None and extra <= 2
    if r.simgpu:
        # simgpu's device timeline starts an op when its host worker hands it over, if later than the
        # previous op's end: on a loaded host these gaps are the host's pace, not a device's.
        return dict(status="info", figure="(simgpu: host-paced) gap per 5 us kernel: plain %s us, with an event %s us, PDL %s us, under gpuslice %s us" % (m["plain"], m["event"], m["pdl"], m["gpuslice_plain"]), measured=m, contradiction="")
    return dict(
        status="pass" if ok else "fail",
        figure="gap per 5 us kernel: plain %s us, with an event %s us, PDL %s us, under gpuslice %s us" % (m["plain"], m["event"], m["pdl"], m["gpuslice_plain"]),
        measured=m,
        contradiction="" if ok else "an event between kernels costs %s us per kernel" % extra,
    )


TORCH_QUOTA = r"""
import os, torch
quota = int(os.environ["GC_QUOTA"])
free, total = torch.cuda.mem_get_info()
print("free=%d" % free); print("total=%d" % total)
held = []
try:
    for i in range(1000):
        held.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
    print("oom=none")
except torch.cuda.OutOfMemoryError as e:
    msg = str(e).replace("\n", " ")
    print("oom=OutOfMemoryError")
    print("held=%d" % (len(held) * (256 << 20)))
    print("names_quota=%d" % (("%.2f GiB" % (quota / 2**30)) in msg))
    print("message=" + msg[:300])
"""


def torch_quota(r, extra):
    need_module(r, "torch")
    env = r.tenant(extra=dict(extra, GC_QUOTA=str(QUOTA)))
    d = r.python(TORCH_QUOTA, env, timeout=120)
    if "total" not in d:
        raise Failed("torch: %s" % d["_stderr"][-1500:])
    ok = num(d, "total") == QUOTA and d.get("oom") == "OutOfMemoryError" and num(d, "held", 0) <= QUOTA and d.get("names_quota") == "1"
    return dict(
        status="pass" if ok else "fail",
        figure="mem_get_info total %s MiB; past it: %s after %s MiB; message names the quota: %s"
        % (mib(num(d, "total")), d.get("oom"), mib(num(d, "held")), d.get("names_quota")),
        measured={k: d.get(k) for k in ("free", "total", "oom", "held", "names_quota", "message")},
        contradiction="" if ok else "PyTorch under a 4 GiB quota: %s" % d.get("message", d.get("oom")),
    )


@probe("torch_quota", "PyTorch under a quota (caching allocator)", "torch.cuda.mem_get_info shows the quota; allocating past it raises OutOfMemoryError naming it", "src/accounting/views.rs, src/hooks/memory.rs", timeout=150)
def p_torch(r):
    return torch_quota(r, {})


@probe("torch_quota_expandable", "PyTorch under a quota (expandable_segments:True)", "as torch_quota, with the allocator's VMM path (cuMemCreate / cuMemMap)", "src/accounting/vmm.rs, src/hooks/memory.rs", timeout=150)
def p_torch_exp(r):
    return torch_quota(r, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})


@probe(
    "jax_prealloc",
    "JAX preallocation (XLA_PYTHON_CLIENT_MEM_FRACTION) under a quota",
    "JAX preallocates its fraction of what cuMemGetInfo shows (the quota), so it starts within it",
    "src/accounting/views.rs",
    timeout=150,
)
def p_jax(r):
    need_module(r, "jax")
    code = "import jax, jax.numpy as jnp\nx = jnp.ones((1024,1024)); x.block_until_ready()\nprint('devices=%s' % jax.devices())\nprint('ok=1')\n"
    env = r.tenant(extra={"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"})
    d = r.python(code, env, timeout=120)
    ok = d.get("ok") == "1"
    return dict(
        status="pass" if ok else "fail",
        figure="JAX with a 0.5 fraction under a 4 GiB quota: %s" % ("started" if ok else "failed"),
        measured={"devices": d.get("devices"), "stderr": d["_stderr"][-600:] if not ok else ""},
        contradiction="" if ok else "JAX does not start under a quota: " + d["_stderr"][-300:],
    )


@probe("cupy_pool", "CuPy's memory pool under a quota", "CuPy's pool grows to the quota and then raises OutOfMemoryError", "src/hooks/memory.rs", timeout=120)
def p_cupy(r):
    need_module(r, "cupy")
    code = (
        "import cupy\nheld=[]\ntry:\n    for i in range(1000): held.append(cupy.empty(256<<20, dtype=cupy.uint8))\n    print('oom=none')\n"
        "except cupy.cuda.memory.OutOfMemoryError:\n    print('oom=1')\nprint('held=%d' % (len(held)*(256<<20)))\n"
    )
    d = r.python(code, r.tenant(), timeout=100)
    ok = d.get("oom") == "1" and num(d, "held", QUOTA + 1) <= QUOTA
    return dict(
        status="pass" if ok else "fail",
        figure="CuPy held %s MiB under a 4 GiB quota, then: %s" % (mib(num(d, "held")), d.get("oom")),
        measured={"held": d.get("held"), "oom": d.get("oom")},
        contradiction="" if ok else "CuPy's pool passes the quota or fails otherwise: " + d["_stderr"][-300:],
    )


@probe(
    "nvidia_smi",
    "nvidia-smi inside a tenant (default view, -q, --query-gpu, the process list)",
    "through the drop-in NVML, nvidia-smi shows the quota as the card's memory and only the tenant's processes",
    "src/hooks/nvml.rs, shim-c/dropin-nvml",
    timeout=90,
)
def p_smi(r):
    smi = shutil.which("nvidia-smi", path=r.env().get("PATH"))
    if smi is None:
        raise Skip("skipped: nvidia-smi is not installed" + (" (simgpu)" if r.simgpu else ""))
    # The drop-in NVML first on the library path (it finds NVIDIA's in the driver's directories).
    env = r.tenant(name="smi", extra={"LD_LIBRARY_PATH": DROPIN + ":" + (r.driver_dir or "")})
    env.pop("LD_PRELOAD")
    mine, _ = r.hold([CLIENT, "hold", 256], r.tenant(name="smi"))
    views = {}
    try:
        other, _ = r.hold([CLIENT, "hold", 256], r.env())
        try:
            for name, args in (
                ("query", ["--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits"]),
                ("apps", ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]),
                ("q", ["-q"]),
                ("default", []),
            ):
                p = r.spawn([smi] + args, env)
                out, err, rc = r.finish(p, 30, "")
                views[name] = (rc, out)
        finally:
            r.kill(other)
    finally:
        r.kill(mine)
    total = views["query"][1].split(",")[0].strip()
    pids = sorted(int(x.split(",")[0]) for x in views["apps"][1].splitlines() if x.split(",")[0].strip().isdigit())
    ok = total == str(QUOTA // MIB) and pids == [mine.pid] and all(rc == 0 for rc, _ in views.values())
    why = []
    if total != str(QUOTA // MIB):
        why.append("memory.total in a tenant is %s MiB, not the quota" % total)
    if pids != [mine.pid]:
        why.append("the process list shows %s, not only the tenant's process %d" % (pids, mine.pid))
    return dict(
        status="pass" if ok else "fail",
        figure="memory.total %s MiB (quota %d); processes listed %s (the tenant's: %d)" % (total, QUOTA // MIB, pids, mine.pid),
        measured={name: {"rc": rc, "head": out[:1500]} for name, (rc, out) in views.items()},
        contradiction="; ".join(why),
    )


def share_pair(r, shares, seconds):
    """Kernels per second of two spinning tenants with `shares`, each alone and then together."""
    us = 1000
    alone = []
    for i, s in enumerate(shares):
        d = r.client("spin", KERNELS, seconds * 500, us, env=r.tenant(share=s), timeout=seconds + 30)
        alone.append(num(d, "per_s"))
    procs = [r.spawn([CLIENT, "spin", KERNELS, seconds * 1000, us], r.tenant(share=s)) for s in shares]
    together = []
    try:
        for p in procs:
            out, _, _ = r.finish(p, seconds + 30)
            together.append(num(kv(out), "per_s"))
    finally:
        for p in procs:
            r.kill(p)
    return alone, together


def shares_probe(r, shares):
    alone, together = share_pair(r, shares, 4)
    if None in alone or None in together:
        raise Failed("a spinning tenant gave no figure: alone %s, together %s" % (alone, together))
    frac = [t / a for t, a in zip(together, alone)]
    got = [round(100 * f / sum(frac), 1) for f in frac]
    ok = all(abs(g - s) <= 10 for g, s in zip(got, shares))
    return dict(
        status="pass" if ok else "fail",
        figure="promised %s%%, got %s%% (throughput against alone: %s)" % ("/".join(map(str, shares)), "/".join(map(str, got)), ", ".join("%.2f" % f for f in frac)),
        measured={"alone_per_s": alone, "together_per_s": together, "achieved_percent": got},
        contradiction="" if ok else "shares %s achieve %s on this GPU" % (shares, got),
    )


SHARES_WHERE = "state/src/compute/arbiter.rs, src/scheduling/gate.rs, docs/COMPUTE.md"


@probe("shares_30_70", "compute shares 30/70 (two tenants spinning 1 ms kernels)", "each tenant gets its share of GPU time under contention (within 10 points)", SHARES_WHERE, timeout=60)
def p_shares_30(r):
    return shares_probe(r, [30, 70])


@probe("shares_10_90", "compute shares 10/90 (two tenants spinning 1 ms kernels)", "each tenant gets its share of GPU time under contention (within 10 points)", SHARES_WHERE, timeout=60)
def p_shares_10(r):
    return shares_probe(r, [10, 90])


TORCH_LOOP = r"""
import os, time, torch
graph = os.environ.get("GC_GRAPH") == "1"
secs = float(os.environ["GC_SECONDS"])
torch.cuda.init()
if graph:
    x = torch.ones(256, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3): x.add_(1)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(100): x.add_(1)
    step = g.replay
else:
    a = torch.randn(4096, 4096, device="cuda"); b = torch.randn(4096, 4096, device="cuda")
    step = lambda: torch.mm(a, b)
n = 0; t0 = time.time()
while time.time() - t0 < secs:
    for _ in range(10): step()
    torch.cuda.synchronize(); n += 10
print("per_s=%f" % (n / (time.time() - t0)))
"""


def torch_shares(r, shares, graph):
    need_module(r, "torch")
    secs = 5
    extra = {"GC_SECONDS": str(secs), "GC_GRAPH": "1" if graph else "0"}
    alone = [num(r.python(TORCH_LOOP, r.tenant(share=s, extra=extra), timeout=90), "per_s") for s in shares]
    py = shutil.which("python3", path=r.env().get("PATH")) or sys.executable
    procs = [r.spawn([py, "-c", TORCH_LOOP], r.tenant(share=s, extra=extra)) for s in shares]
    together = []
    try:
        for p in procs:
            out, _, _ = r.finish(p, 120)
            together.append(num(kv(out), "per_s"))
    finally:
        for p in procs:
            r.kill(p)
    if None in alone or None in together:
        raise Failed("a PyTorch tenant gave no figure: alone %s, together %s" % (alone, together))
    frac = [t / a for t, a in zip(together, alone)]
    got = [round(100 * f / sum(frac), 1) for f in frac]
    ok = all(abs(g - s) <= 10 for g, s in zip(got, shares))
    return dict(
        status="pass" if ok else "fail",
        figure="promised %s%%, got %s%%" % ("/".join(map(str, shares)), "/".join(map(str, got))),
        measured={"alone_per_s": alone, "together_per_s": together, "achieved_percent": got},
        contradiction="" if ok else "PyTorch tenants with shares %s achieve %s" % (shares, got),
    )


@probe("torch_shares_30_70", "two PyTorch processes looping matmuls, shares 30/70", "shares hold for real work (within 10 points)", SHARES_WHERE, timeout=200)
def p_torch_30(r):
    return torch_shares(r, [30, 70], False)


@probe("torch_shares_10_90", "two PyTorch processes looping matmuls, shares 10/90", "shares hold for real work (within 10 points)", SHARES_WHERE, timeout=200)
def p_torch_10(r):
    return torch_shares(r, [10, 90], False)


@probe("torch_graph_shares", "small kernels under CUDA graphs (PyTorch), shares 30/70", "a graph launch is scheduled like its kernels: shares hold (within 10 points)", SHARES_WHERE + ", src/hooks/graph.rs", timeout=200)
def p_torch_graph(r):
    return torch_shares(r, [30, 70], True)


@probe(
    "priority_p99",
    "a high-priority tenant's p99 request latency beside a saturating normal tenant, against alone",
    "a high-priority tenant waits at most about one time slice beyond its own work: p99 beside a "
    "saturating tenant at most alone's p99 + 5 ms",
    "state/src/compute/arbiter.rs (priority), docs/COMPUTE.md",
    timeout=90,
)
def p_priority(r):
    n, us = 300, 1000
    alone = r.client("latency", KERNELS, n, us, env=r.tenant(name="hp", share=50, priority="high"), timeout=60)
    busy, _ = r.hold([CLIENT, "spin", KERNELS, 60000, 2000], r.tenant(name="normal", share=50))
    try:
        beside = r.client("latency", KERNELS, n, us, env=r.tenant(name="hp", share=50, priority="high"), timeout=60)
    finally:
        r.kill(busy)
    a, b = num(alone, "p99_us"), num(beside, "p99_us")
    ok = a is not None and b is not None and b <= a + 5000
    return dict(
        status="pass" if ok else "fail",
        figure="p99 alone %s us, beside a saturating tenant %s us (p50 %s / %s us)" % (a, b, alone.get("p50_us"), beside.get("p50_us")),
        measured={"alone": {k: alone.get(k) for k in ("p50_us", "p99_us")}, "beside": {k: beside.get(k) for k in ("p50_us", "p99_us")}},
        contradiction="" if ok else "a high-priority request waits %s us at p99 beside a busy tenant (alone %s us)" % (b, a),
    )


@probe(
    "timeslice",
    "the card's context time slice (two processes spinning 200 us kernels, without gpuslice)",
    "contexts are time-sliced, never concurrent, with a slice of about 2 ms (simgpu's "
    "SIMGPU_TIMESLICE_US default; within a factor of 2)",
    "tests/simgpu/core/src/config.rs, tests/simgpu/README.md (The device)",
    timeout=60,
)
def p_timeslice(r):
    us = 200
    procs = [r.spawn([CLIENT, "slice", KERNELS, 3000, us], r.env()) for _ in range(2)]
    res = []
    try:
        for p in procs:
            out, _, _ = r.finish(p, 40)
            res.append(kv(out))
    finally:
        for p in procs:
            r.kill(p)
    med = [num(d, "gap_median_us") for d in res]
    gaps = [num(d, "gaps") for d in res]
    if None in med:
        raise Failed("a spinning process gave no figure: %s" % res)
    slice_us = statistics.mean(med)
    ok = 1000 <= slice_us <= 4000
    return dict(
        status="pass" if ok else "fail",
        figure="the other context holds the device %.0f us at a time (median gap; %s gaps)" % (slice_us, gaps),
        measured={"gap_median_us": med, "gaps": gaps},
        contradiction="" if ok else "the card's time slice is about %.0f us, simgpu models 2000 us" % slice_us,
    )


# ---------------------------------------------------------------------------------------------------


def run_all(r, only):
    for p in PROBES:
        if only and p["id"] not in only:
            continue
        rec = {k: p[k] for k in ("id", "title", "validates", "where")}
        t0 = time.monotonic()
        driver = next((x for x in r.results if x["id"] == "driver"), None)
        if r.left() < 5:
            rec.update(status="skip", reason="skipped: the run's 8 minutes are spent", figure="")
        elif driver is not None and driver["status"] == "error" and p["id"] != "resolution":
            rec.update(status="skip", reason="skipped: no usable device (the driver probe failed)", figure="")
        else:
            try:
                res = p["fn"](r)
                rec.update(res)
            except Skip as e:
                rec.update(status="skip", reason=str(e), figure="")
            except Exception as e:  # noqa: BLE001 -- one probe's failure must not stop the others
                rec.update(status="error", reason="%s: %s" % (type(e).__name__, str(e)[:3000]), figure="")
            finally:
                for pid in list(r.groups):
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                r.groups.clear()
        rec["seconds"] = round(time.monotonic() - t0, 1)
        rec.setdefault("contradiction", "")
        r.results.append(rec)
        print("%-24s %-5s %s" % (rec["id"], rec["status"], rec.get("figure") or rec.get("reason", "")), flush=True)


def write_reports(r, out_dir):
    meta = {
        "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "driver": "simgpu (%s)" % r.driver_dir if r.simgpu else "NVIDIA (%s)" % (r.driver_dir or "system"),
        "host": platform.node(),
        "python": platform.python_version(),
        "seconds": round(time.monotonic() - r.start, 1),
    }
    drv = next((x for x in r.results if x["id"] == "driver"), None)
    if drv and drv.get("measured"):
        meta["driver_version"] = drv["measured"].get("driver_version")
        meta["device"] = drv["measured"].get("device")
    doc = {"meta": meta, "probes": r.results}
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(doc, f, indent=2)
    lines = [
        "# gpuslice real-GPU check",
        "",
        "- when: %s" % meta["when"],
        "- driver: %s%s" % (meta["driver"], (", CUDA %s, %s" % (meta.get("driver_version"), meta.get("device"))) if meta.get("device") else ""),
        "- took: %s s" % meta["seconds"],
        "",
        "| probe | status | figure | validates | where |",
        "|---|---|---|---|---|",
    ]
    esc = lambda s: str(s).replace("|", "\\|").replace("\n", " ")
    for x in r.results:
        fig = x.get("figure") or x.get("reason", "")
        lines.append("| %s | %s | %s | %s | %s |" % (x["id"], x["status"], esc(fig), esc(x["validates"]), esc(x["where"])))
    bad = [x for x in r.results if x["status"] in ("fail", "error")]
    lines += ["", "## Contradictions and errors", ""]
    if not bad:
        lines.append("None: every probe that ran agrees with what gpuslice assumes.")
    for x in bad:
        what = x.get("contradiction") or x.get("reason", "")
        lines.append("- **%s** (%s): %s. Assumption: %s (`%s`)." % (x["id"], x["status"], esc(what), esc(x["validates"]), x["where"]))
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description="gpuslice's real-GPU check (docs/REAL-GPU.md)")
    ap.add_argument("--simgpu", metavar="LIBDIR", help="run against simgpu's libcuda.so.1 / libnvidia-ml.so.1 in LIBDIR")
    ap.add_argument("--driver-dir", help="NVIDIA's driver libraries, when not on the system's library path")
    ap.add_argument("--out", default=None, help="where report.json and report.md go (default: reports/<UTC time> in this folder)")
    ap.add_argument("--only", nargs="*", default=None, help="probe ids to run (default: all)")
    args = ap.parse_args()
    out = args.out or os.path.join(HERE, "reports", datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
    os.makedirs(out, exist_ok=True)
    r = Runner(args)

    def on_signal(signum, _frame):
        r.cleanup()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        run_all(r, set(args.only) if args.only else None)
        write_reports(r, out)
    finally:
        r.cleanup()
    print("reports: %s/report.json, %s/report.md" % (out, out))
    counts = {}
    for x in r.results:
        counts[x["status"]] = counts.get(x["status"], 0) + 1
    print("probes: %s" % ", ".join("%s %d" % kv_ for kv_ in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
