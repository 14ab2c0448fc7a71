//! The memory tests' tenants (`tests/memory_*.rs`): processes of a tenant with a 1 GiB quota
//! ([`QUOTA`]), its ledger and device directory in a private directory, run on a simulated machine
//! with 4 GiB ([`sim`]) in each deployment ([`Deploy`]: preloaded, drop-in, both), and what the
//! tests read from them. A test file says `use common::memory::*;`.

use crate::*;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every tenant's quota (`GPUSLICE_MEMORY_LIMIT` of [`client`]).
pub const QUOTA: u64 = GIB;
/// The driver reserves device memory in 2 MiB pages: measured charges are exact to one of them.
pub const GRANULE: u64 = 2 * MIB;
/// simgpu's default context cost (SIMGPU_CONTEXT_MEMORY).
pub const SIM_CONTEXT: u64 = 300 * MIB;
/// The simulated device's multiprocessors and resident threads per multiprocessor.
pub const THREADS: u64 = 132 * 2048;

/// A private directory for one test's ledgers and measurement locks.
pub fn scratch(tag: &str) -> PathBuf {
    scratch_dir("memory", tag)
}

/// How a tenant's process gets gpuslice.
#[derive(Clone, Copy, Debug)]
pub enum Deploy {
    /// `LD_PRELOAD=libgpuslice.so` over simgpu.
    Preload,
    /// The drop-in libraries first on `LD_LIBRARY_PATH`, simgpu behind them.
    Dropin,
    /// Preloaded over the drop-in: everything counted once.
    Mixed,
}

/// One test per deployment (preload, drop-in, both) of `$check(deploy)`, named by the three names.
#[macro_export]
macro_rules! in_every_deployment {
    ($check:ident: $preloaded:ident, $dropin:ident, $mixed:ident) => {
        #[test]
        fn $preloaded() {
            $check($crate::memory::Deploy::Preload);
        }
        #[test]
        fn $dropin() {
            $check($crate::memory::Deploy::Dropin);
        }
        #[test]
        fn $mixed() {
            $check($crate::memory::Deploy::Mixed);
        }
    };
}

/// A holder process (64 MiB, kernels every 500 ms) of tenants `a` and `b` each, with their pids.
pub fn holders_of_a_and_b(
    sim: &Sim,
    deploy: Deploy,
    dir: &Path,
) -> (Vec<std::process::Child>, Vec<String>) {
    ["a", "b"]
        .into_iter()
        .map(|tenant| {
            let mut cmd = client_of(
                &LINKED_CU12,
                sim,
                deploy,
                dir,
                tenant,
                &["hold", "64", "500"],
            );
            let mut child = sim.spawn(&mut cmd);
            let pid = wait_for_key(&mut child, "pid")["pid"].clone();
            (child, pid)
        })
        .unzip()
}

/// A client of `tenant` (quota 1 GiB, its ledger and device directory in `dir`) on `sim`.
pub fn client(sim: &Sim, deploy: Deploy, dir: &Path, tenant: &str, args: &[&str]) -> Command {
    client_of(&QUOTA_OVERHEAD, sim, deploy, dir, tenant, args)
}

/// [`client`] for another C client.
pub fn client_of(
    build: &CBuild,
    sim: &Sim,
    deploy: Deploy,
    dir: &Path,
    tenant: &str,
    args: &[&str],
) -> Command {
    tenant_command(compile(build), sim, deploy, dir, tenant, args)
}

/// `program` run as a process of `tenant` (see [`client`]).
pub fn tenant_command(
    program: PathBuf,
    sim: &Sim,
    deploy: Deploy,
    dir: &Path,
    tenant: &str,
    args: &[&str],
) -> Command {
    let simgpu = simgpu_lib_dir();
    let mut cmd = match deploy {
        Deploy::Preload => sim.command(program),
        Deploy::Dropin | Deploy::Mixed => {
            let mut cmd = sim.command_with_driver(program, &dropin_dir());
            cmd.env(
                "LD_LIBRARY_PATH",
                format!("{}:{}", dropin_dir().display(), simgpu.display()),
            )
            .env("GPUSLICE_REAL_LIBCUDA", simgpu.join("libcuda.so.1"))
            .env("GPUSLICE_REAL_NVML", simgpu.join("libnvidia-ml.so.1"));
            cmd
        }
    };
    if matches!(deploy, Deploy::Preload | Deploy::Mixed) {
        cmd.env("LD_PRELOAD", libgpuslice());
    }
    cmd.args(args)
        .env("GPUSLICE_MEMORY_LIMIT", "1GiB")
        .env("GPUSLICE_TENANT", tenant)
        .env("GPUSLICE_LEDGER", dir.join(format!("{tenant}.ledger")))
        .env("GPUSLICE_DEVICE_DIR", dir.join("devices"))
        .env("SIMGPU_GROUP", tenant);
    cmd
}

pub fn sim(tag: &str) -> Sim {
    Sim::new(tag).env("SIMGPU_MEMORY", "4GiB")
}

/// `a` is `b` to within one granule.
pub fn near(a: u64, b: u64) -> bool {
    a.abs_diff(b) <= GRANULE
}

/// The driver overhead a process of `tenant` published in the ledger (what `gpuslice status` shows
/// apart from its allocations).
pub fn ledger_overhead(dir: &Path, tenant: &str, pid: &str) -> u64 {
    total(&ledger_process(&dir.join(format!("{tenant}.ledger")), pid).overhead)
}

/// Holders: each creates its context (optionally a module and limits), then fills the quota in 2
/// MiB chunks one after the other; returns each one's (fill, shown used, simgpu's used, the
/// overhead it published in the ledger).
pub fn fill_in_turn(
    sim: &Sim,
    deploy: Deploy,
    dir: &Path,
    tenant: &str,
    n: usize,
    extra: &[&str],
) -> Vec<(u64, u64, u64, u64)> {
    let mut args = vec!["hold"];
    args.extend_from_slice(extra);
    let mut holders: Vec<_> = (0..n)
        .map(|_| sim.spawn(&mut client(sim, deploy, dir, tenant, &args)))
        .collect();
    let pids: Vec<String> = holders
        .iter_mut()
        .map(|h| wait_for_key(h, "ready")["pid"].clone())
        .collect();
    let mut results = Vec::new();
    for (h, pid) in holders.iter_mut().zip(&pids) {
        h.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        let kv = wait_for_key(h, "held_procs3_sum");
        let stat = sim.stat();
        let get = |k: &str| -> u64 {
            kv.get(k)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {k} in {kv:?}"))
        };
        results.push((
            get("fill_bytes"),
            get("held_procs3_mine"),
            process_used_on(&stat, pid, 0),
            ledger_overhead(dir, tenant, pid),
        ));
    }
    for h in holders {
        finish(h, "holder").assert_success();
    }
    results
}

/// The module images NVIDIA's tools built (`tests/fixtures/modules`).
pub fn fixture(name: &str) -> PathBuf {
    root().join("tests/fixtures/modules").join(name)
}

/// The `key=value` figures of one step.
pub fn step(kv: &BTreeMap<String, String>, step: &str, key: &str) -> u64 {
    let k = format!("{step}_{key}");
    kv.get(&k)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {k}"))
}

/// NVML as NVIDIA's nvidia-ml-py shows it to a tenant: memory (v1, v2), the process list, and the
/// per-process utilisation (`nvmlDeviceGetProcessUtilization`, and R550's
/// `nvmlDeviceGetProcessesUtilizationInfo`), its count asked first with a NULL buffer as NVML's
/// protocol has it; and the answers of accounting mode (`nvmlDeviceGetAccountingPids` count query,
/// `nvmlDeviceGetAccountingStats`) and of the confidential-computing memory view.
pub const NVML_VIEW: &str = "import ctypes, pynvml as nv\nnv.nvmlInit()\nh = nv.nvmlDeviceGetHandleByIndex(0)\n\
    m = nv.nvmlDeviceGetMemoryInfo(h)\nm2 = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)\n\
    print(f'total={m.total}\\nused={m.used}\\nfree={m.free}')\n\
    print(f'total2={m2.total}\\nreserved2={m2.reserved}\\nused2={m2.used}\\nfree2={m2.free}')\n\
    print('procs=' + ','.join(f'{p.pid}:{p.usedGpuMemory}' for p in nv.nvmlDeviceGetComputeRunningProcesses(h)))\n\
    fn = nv._nvmlGetFunctionPointer('nvmlDeviceGetProcessUtilization')\nn = ctypes.c_uint(0)\n\
    rc = fn(h, None, ctypes.byref(n), ctypes.c_ulonglong(0))\n\
    print(f'util_query_rc={rc}\\nutil_query_count={n.value}')\n\
    try:\n    samples = nv.nvmlDeviceGetProcessUtilization(h, 0)\nexcept nv.NVMLError:\n    samples = []\n\
    print('util=' + ','.join(str(s.pid) for s in samples))\n\
    info = nv.c_nvmlProcessesUtilizationInfo_v1_t(version=nv.ProcessesUtilizationInfo_v1)\n\
    rc = nv._nvmlGetFunctionPointer('nvmlDeviceGetProcessesUtilizationInfo')(h, ctypes.byref(info))\n\
    print(f'utilinfo_query_rc={rc}\\nutilinfo_query_count={info.processSamplesCount}')\n\
    try:\n    samples = nv.nvmlDeviceGetProcessesUtilizationInfo(h, 0)\nexcept nv.NVMLError:\n    samples = []\n\
    print('utilinfo=' + ','.join(str(s.pid) for s in samples))\n\
    n = ctypes.c_uint(0)\n\
    print(f'acct_rc={nv._nvmlGetFunctionPointer(\"nvmlDeviceGetAccountingPids\")(h, ctypes.byref(n), None)}')\n\
    st = nv.c_nvmlAccountingStats_t()\n\
    print(f'stats_rc={nv._nvmlGetFunctionPointer(\"nvmlDeviceGetAccountingStats\")(h, ctypes.c_uint(1), ctypes.byref(st))}')\n\
    cc = nv.c_nvmlMemory_t()\n\
    print(f'cc_rc={nv._nvmlGetFunctionPointer(\"nvmlDeviceGetConfComputeProtectedMemoryUsage\")(h, ctypes.byref(cc))}')\n";

/// What NVML shows a tenant, through [`NVML_VIEW`].
pub fn nvml_view(sim: &Sim, deploy: Deploy, dir: &Path, tenant: &str) -> Run {
    python_as(sim, deploy, dir, tenant, &["-c", NVML_VIEW])
}

/// The venv's Python with `args`, run to success as a process of `tenant` (see [`client`]).
pub fn python_as(sim: &Sim, deploy: Deploy, dir: &Path, tenant: &str, args: &[&str]) -> Run {
    let run = sim.run_cmd(&mut tenant_command(
        venv_python(),
        sim,
        deploy,
        dir,
        tenant,
        args,
    ));
    run.assert_success();
    run
}

/// `unshare` arguments that run `program args` in a container of its own, as a Kubernetes pod
/// runs it: its namespace's init, with a PID namespace and its own `/proc`. The host's `/proc` is
/// bind-mounted first at `$SIMGPU_HOST_PROC` ([`host_proc`]) where simgpu alone reads it: a real
/// driver lives in the kernel and still lists the process under its host PID, which the process
/// cannot read.
pub fn container_args(program: &Path, args: &[&str]) -> Vec<String> {
    let mount =
        r#"mount --bind /proc "$SIMGPU_HOST_PROC" && mount -t proc proc /proc && exec "$0" "$@""#;
    let prefix = [
        "--pid",
        "--fork",
        "--kill-child",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        mount,
    ];
    prefix
        .iter()
        .map(|s| s.to_string())
        .chain(std::iter::once(program.to_string_lossy().into_owned()))
        .chain(args.iter().map(|s| s.to_string()))
        .collect()
}

/// A fresh directory for `tenant`'s view of the host's `/proc` ([`container_args`]), under `dir`.
pub fn host_proc(dir: &Path, tenant: &str) -> PathBuf {
    let path = dir.join(format!("hostproc-{tenant}"));
    std::fs::create_dir_all(&path).unwrap();
    path
}
