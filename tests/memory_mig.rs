//! Memory quotas on MIG instances: a MIG instance is keyed `MIG-<uuid>` (as NVML, `nvidia-smi -L`,
//! `CUDA_VISIBLE_DEVICES` and device plugins name it), a limit keyed so is enforced, every view of
//! memory (driver API and NVML, by the instance's handle) shows the instance's quota, and a context
//! there is charged what it costs, as NVML measures it on the instance. Judged on simgpu in MIG mode
//! (`SIMGPU_MIG`) by its own counters, through a Python client (tests/clients/mig_views.py) preloaded
//! and under the drop-in.

use gpuslice_testkit as common;

use common::memory::{tenant_command, Deploy, GRANULE, SIM_CONTEXT};
use common::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// simgpu's UUIDs of GPU 0's MIG instances 0 and 1 (`simgpu_core::mig::instance_uuid`).
const INSTANCE0: &str = "MIG-53494d47-4d49-4000-8000-000000000000";
const INSTANCE1: &str = "MIG-53494d47-4d49-4000-8000-000000000001";
const GPU0: &str = "GPU-53494d47-5055-4000-8000-000000000000";
/// The fallback charge gpuslice takes when it cannot measure (beside simgpu's default context cost,
/// `SIM_CONTEXT`).
const FALLBACK: u64 = 512 * MIB;

/// An 80 GiB GPU 0 in MIG mode with a 10 GiB and a 20 GiB instance.
fn sim(tag: &str) -> Sim {
    Sim::new(tag)
        .env("SIMGPU_MEMORY", "80GiB")
        .env("SIMGPU_MIG", "0:10GiB,20GiB")
}

fn scratch(tag: &str) -> PathBuf {
    scratch_dir("mig", tag)
}

/// The client on `visible` (a `CUDA_VISIBLE_DEVICES` value), as a process of tenant `tenant` with
/// `GPUSLICE_MEMORY_LIMIT=limit`.
fn client(
    sim: &Sim,
    deploy: Deploy,
    dir: &Path,
    tenant: &str,
    visible: &str,
    limit: &str,
    args: &[&str],
) -> Command {
    let script = client_source("mig_views.py");
    let mut all = vec![script.to_str().unwrap()];
    all.extend_from_slice(args);
    let mut cmd = tenant_command(venv_python(), sim, deploy, dir, tenant, &all);
    cmd.env("CUDA_VISIBLE_DEVICES", visible)
        .env("GPUSLICE_MEMORY_LIMIT", limit);
    cmd
}

fn near(a: u64, b: u64) -> bool {
    a.abs_diff(b) <= GRANULE
}

/// The tenant's peak on simgpu device `device` (device 1 is GPU 0's instance 1).
fn group_peak(stat: &Json, tenant: &str, device: usize) -> u64 {
    group(stat, tenant).u64(&format!("peak.{device}"))
}

/// A limit keyed by the instance's `MIG-` UUID holds on that instance: an allocation under it
/// succeeds, one past it is refused with `CUDA_ERROR_OUT_OF_MEMORY`, and every view shows the
/// quota as the device (`cuDeviceTotalMem`, `cuMemGetInfo`, NVML v1 and v2 by the instance's
/// handle) with the tenant's usage, its own process alone in NVML's lists. The context is charged
/// its measured 300 MiB on the instance (not the 512 MiB taken when nothing can be measured), and
/// by simgpu's counters the tenant never held more than its quota on the instance.
#[test]
fn a_limit_keyed_by_a_mig_uuid_is_enforced_and_shown_on_the_instance() {
    for deploy in [Deploy::Preload, Deploy::Dropin] {
        let sim = sim("mig-limit");
        let dir = scratch("limit");
        let limit = format!("{INSTANCE1}=2GiB");
        let run = run_command(&mut client(
            &sim,
            deploy,
            &dir,
            "m",
            INSTANCE1,
            &limit,
            &["1024", "2048"],
        ));
        run.assert_success();
        let kv = run.kv();
        let get = |k: &str| -> u64 {
            kv.get(k)
                .unwrap_or_else(|| panic!("{deploy:?}: no {k}:\n{}", run.report()))
                .parse()
                .unwrap()
        };
        let report = run.report();
        assert_eq!(
            format!("MIG-{}", run.get("cuda_uuid")),
            INSTANCE1,
            "{deploy:?}: {report}"
        );
        assert_eq!(run.get("nvml_uuid"), INSTANCE1, "{deploy:?}: {report}");
        assert_eq!(run.get("by_index_uuid"), INSTANCE1, "{deploy:?}: {report}");
        assert_eq!(run.get("under_ok"), "1", "{deploy:?}: {report}");
        assert_eq!(
            run.get("past_error"),
            "CUDA_ERROR_OUT_OF_MEMORY",
            "{deploy:?}: {report}"
        );
        for k in [
            "cuda_total_mem",
            "context_total",
            "context_nvml_total",
            "context_v2_total",
            "alloc_total",
            "alloc_nvml_total",
            "alloc_v2_total",
        ] {
            assert_eq!(get(k), 2 * GIB, "{deploy:?}: {k}: {report}");
        }
        // The context: measured on the instance.
        let context = get("context_v2_used");
        assert!(
            near(context, SIM_CONTEXT) && context < FALLBACK,
            "{deploy:?}: the context is charged {context}, want its 300 MiB: {report}"
        );
        for step in ["context", "alloc"] {
            let used = get(&format!("{step}_v2_used"));
            assert_eq!(
                get(&format!("{step}_nvml_used")),
                used,
                "{deploy:?}: {report}"
            );
            assert_eq!(
                get(&format!("{step}_nvml_free")),
                2 * GIB - used,
                "{deploy:?}: {report}"
            );
            assert_eq!(get(&format!("{step}_free")), 2 * GIB - used, "{deploy:?}");
            for list in ["procs_v1", "procs_v3"] {
                assert_eq!(
                    get(&format!("{step}_{list}_count")),
                    1,
                    "{deploy:?}: {report}"
                );
                assert_eq!(
                    get(&format!("{step}_{list}_used")),
                    used,
                    "{deploy:?}: {step} {list}: {report}"
                );
            }
        }
        assert!(
            near(get("alloc_v2_used"), SIM_CONTEXT + GIB),
            "{deploy:?}: {report}"
        );
        // The instance's process list names the instance (simgpu: GPU instance 2 for instance 1).
        assert_eq!(run.get("alloc_procs_v3_gi"), "2", "{deploy:?}: {report}");
        let stat = sim.stat();
        assert!(
            group_peak(&stat, "m", 1) <= 2 * GIB,
            "{deploy:?}: the tenant passed its quota on the instance by simgpu's counters: {stat}"
        );
        assert!(
            near(group_peak(&stat, "m", 1), SIM_CONTEXT + GIB),
            "{deploy:?}: the allocation was made on the instance: {stat}"
        );
        assert_eq!(group_peak(&stat, "m", 0), 0, "{deploy:?}: {stat}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A limit for every device applies to the instance too, and the views and measurement are the
/// instance's: the same program on instance 0 with `GPUSLICE_MEMORY_LIMIT=2GiB`.
#[test]
fn a_limit_for_every_device_holds_on_a_mig_instance() {
    let sim = sim("mig-all");
    let dir = scratch("all");
    let run = run_command(&mut client(
        &sim,
        Deploy::Preload,
        &dir,
        "a",
        INSTANCE0,
        "2GiB",
        &["1024", "2048"],
    ));
    run.assert_success();
    let report = run.report();
    assert_eq!(
        run.get("past_error"),
        "CUDA_ERROR_OUT_OF_MEMORY",
        "{report}"
    );
    assert_eq!(run.get_u64("context_nvml_total"), 2 * GIB, "{report}");
    let context = run.get_u64("context_v2_used");
    assert!(
        near(context, SIM_CONTEXT),
        "context charged {context}: {report}"
    );
    assert_eq!(run.get_u64("context_procs_v3_count"), 1, "{report}");
    // The ledger names the instance by its MIG UUID.
    let ledger = gpuslice::ledger::Ledger::open_readonly(&dir.join("a.ledger")).expect("ledger");
    let snapshot = ledger.snapshot();
    let uuids: Vec<&str> = snapshot.devices.iter().map(|d| d.uuid.as_str()).collect();
    assert_eq!(uuids, [INSTANCE0], "{snapshot:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// simgpu's MIG model, without gpuslice: CUDA sees the instance `CUDA_VISIBLE_DEVICES` names with
/// its own memory, and NVML shows the GPU in MIG mode, its instances' memory and processes apart,
/// the GPU's used memory being its instances'.
#[test]
fn simgpu_shows_mig_instances_as_nvidia_documents() {
    let sim = sim("mig-model");
    let script = r#"
import sys
import pynvml as nv
from cuda.bindings import driver as cu
assert cu.cuInit(0)[0] == 0
err, n = cu.cuDeviceGetCount()
print(f"cuda_count={n}")
err, total = cu.cuDeviceTotalMem(0)
print(f"cuda_total={total}")
err, ctx = cu.cuDevicePrimaryCtxRetain(0)
cu.cuCtxSetCurrent(ctx)
err, ptr = cu.cuMemAlloc(1 << 30)
assert err == 0, err
nv.nvmlInit()
print(f"gpus={nv.nvmlDeviceGetCount()}")
gpu = nv.nvmlDeviceGetHandleByIndex(0)
print(f"mode={nv.nvmlDeviceGetMigMode(gpu)[0]}")
print(f"max={nv.nvmlDeviceGetMaxMigDeviceCount(gpu)}")
print(f"gpu_total={nv.nvmlDeviceGetMemoryInfo(gpu).total}")
print(f"gpu_used={nv.nvmlDeviceGetMemoryInfo(gpu).used}")
for i in range(2):
    m = nv.nvmlDeviceGetMigDeviceHandleByIndex(gpu, i)
    info = nv.nvmlDeviceGetMemoryInfo(m)
    procs = nv.nvmlDeviceGetComputeRunningProcesses_v3(m)
    print(f"i{i}_uuid={nv.nvmlDeviceGetUUID(m)}")
    print(f"i{i}_total={info.total}")
    print(f"i{i}_used={info.used}")
    print(f"i{i}_procs={len(procs)}")
    print(f"i{i}_gi={','.join(str(p.gpuInstanceId) for p in procs)}")
try:
    nv.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 2)
    print("i2=found")
except nv.NVMLError_NotFound:
    print("i2=not_found")
"#;
    let script_path = scratch("model").join("model.py");
    std::fs::File::create(&script_path)
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let run = run_command(
        sim.command(venv_python())
            .arg(&script_path)
            .env("CUDA_VISIBLE_DEVICES", format!("{INSTANCE1},{GPU0}")),
    );
    run.assert_success();
    let report = run.report();
    // One instance alone, whatever else is listed.
    assert_eq!(run.get_u64("cuda_count"), 1, "{report}");
    assert_eq!(run.get_u64("cuda_total"), 20 * GIB, "{report}");
    assert_eq!(run.get_u64("gpus"), 1, "{report}");
    assert_eq!(run.get_u64("mode"), 1, "{report}");
    assert_eq!(run.get_u64("max"), 7, "{report}");
    assert_eq!(run.get_u64("gpu_total"), 80 * GIB, "{report}");
    assert_eq!(run.get("i0_uuid"), INSTANCE0, "{report}");
    assert_eq!(run.get("i1_uuid"), INSTANCE1, "{report}");
    assert_eq!(run.get_u64("i0_total"), 10 * GIB, "{report}");
    assert_eq!(run.get_u64("i1_total"), 20 * GIB, "{report}");
    assert_eq!(run.get_u64("i0_used"), 0, "{report}");
    assert_eq!(run.get_u64("i1_used"), SIM_CONTEXT + GIB, "{report}");
    assert_eq!(run.get_u64("gpu_used"), SIM_CONTEXT + GIB, "{report}");
    assert_eq!(run.get_u64("i0_procs"), 0, "{report}");
    assert_eq!(run.get_u64("i1_procs"), 1, "{report}");
    assert_eq!(run.get("i1_gi"), "2", "{report}");
    assert_eq!(run.get("i2"), "not_found", "{report}");
}

/// The exporter names a tenant's quota on a MIG instance by the instance's `MIG-` UUID, with its
/// GPU's NVML index as the `gpu` label (as dcgm-exporter labels MIG devices), and `gpuslice status`
/// shows the instance by its UUID.
#[test]
fn the_exporter_and_status_show_the_instance() {
    let sim = sim("mig-exporter");
    let limit = format!("{INSTANCE1}=2GiB");
    // The tenant's ledger in the machine's ledger directory (the Sim's private one).
    let mut cmd = sim.command(venv_python());
    cmd.env("LD_PRELOAD", libgpuslice())
        .arg(client_source("mig_views.py"))
        .args(["64", "4096"])
        .env("CUDA_VISIBLE_DEVICES", INSTANCE1)
        .env("GPUSLICE_MEMORY_LIMIT", &limit)
        .env("GPUSLICE_TENANT", "x");
    run_command(&mut cmd).assert_success();

    let status = run_command(
        sim.command(gpuslice_bin())
            .args(["status", "--tenant", "x"])
            .env("GPUSLICE_TENANT", "x"),
    );
    status.assert_success();
    assert!(status.stdout.contains(INSTANCE1), "{}", status.report());

    let mut child = sim
        .command(gpuslice_bin())
        .args(["exporter", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(sim.dir.join("node"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("start gpuslice exporter");
    let addr = exporter_address(&mut child);
    let body = scrape_metrics(&addr);
    let _ = child.kill();
    let _ = child.wait();
    let found = body.lines().find(|l| {
        l.starts_with("gpuslice_memory_limit_bytes{")
            && l.contains(&format!("UUID=\"{INSTANCE1}\""))
            && l.contains("tenant=\"x\"")
    });
    let found = found.unwrap_or_else(|| panic!("no limit series of the instance:\n{body}"));
    assert!(found.contains("gpu=\"0\""), "{found}");
    assert!(found.ends_with(" 2147483648"), "{found}");
}
