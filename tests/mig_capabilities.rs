//! Telling a MIG instance from a GPU without NVML: running CUDA on a MIG instance takes access to
//! its capabilities, which the NVIDIA kernel driver lists in `/proc/driver/nvidia/capabilities` and
//! exposes in `/dev/nvidia-caps` (MIG user guide, "Device Nodes and Capabilities"). Where neither
//! exists beside the driver's `/proc/driver/nvidia`, gpuslice keys a device `GPU-…` without
//! loading NVML; otherwise it asks NVML. Judged on simgpu's model of those files
//! (`SIMGPU_NVIDIA_ROOT`, the library looking at the same root through `GPUSLICE_NVIDIA_ROOT`)
//! by the program's own results, its memory map and simgpu's counters, including a wrong answer:
//! a MIG instance keyed `GPU-…` fails closed.

use gpuslice_testkit as common;

use common::memory::{tenant_command, Deploy};
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// simgpu's UUID of GPU 0's MIG instance 1 (`simgpu_core::mig::instance_uuid`), and of GPU 0 when
/// it is not in MIG mode.
const INSTANCE1: &str = "MIG-53494d47-4d49-4000-8000-000000000001";
const GPU0: &str = "GPU-53494d47-5055-4000-8000-000000000000";

/// A machine whose NVIDIA files simgpu models under `<dir>/nvidia`; in MIG mode (GPU 0 with a 10
/// GiB and a 20 GiB instance) or not.
fn sim(tag: &str, mig: bool) -> (Sim, PathBuf) {
    let probe = Sim::new(tag);
    let root = probe.dir.join("nvidia");
    let mut sim = probe.env("SIMGPU_NVIDIA_ROOT", root.to_str().unwrap());
    if mig {
        sim = sim
            .env("SIMGPU_MEMORY", "80GiB")
            .env("SIMGPU_MIG", "0:10GiB,20GiB");
    }
    (sim, root)
}

/// `tests/clients/mig_caps.py UNDER PAST` as tenant `tenant` with `limit`, the library looking at
/// `root` for the driver's files.
fn client(sim: &Sim, deploy: Deploy, tenant: &str, limit: &str, root: &Path) -> Command {
    let script = client_source("mig_caps.py");
    let dir = sim.dir.join(format!("ledgers-{tenant}"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd = tenant_command(
        venv_python(),
        sim,
        deploy,
        &dir,
        tenant,
        &[script.to_str().unwrap(), "1024", "2048"],
    );
    cmd.env("GPUSLICE_MEMORY_LIMIT", limit)
        .env("GPUSLICE_NVIDIA_ROOT", root);
    cmd
}

fn ledger_keys(sim: &Sim, tenant: &str) -> Vec<String> {
    let path = sim
        .dir
        .join(format!("ledgers-{tenant}"))
        .join(format!("{tenant}.ledger"));
    let ledger = gpuslice::ledger::Ledger::open_readonly(&path).expect("ledger");
    ledger
        .snapshot()
        .devices
        .iter()
        .map(|d| d.uuid.clone())
        .collect()
}

/// A directory standing for a machine with the NVIDIA driver and no MIG capabilities at all.
fn driver_without_capabilities(sim: &Sim) -> PathBuf {
    let root = sim.dir.join("no-caps");
    std::fs::create_dir_all(root.join("proc/driver/nvidia")).unwrap();
    root
}

/// On a GPU that is not in MIG mode, with no capability files beside the driver's: the device is
/// resolved (its quota shown by `cuDeviceTotalMem`) without NVML's library in the process, and the
/// quota holds. With a `dev/nvidia-caps` directory (a MIG instance could be in use) NVML is asked,
/// as it is where the driver's files say nothing (no `proc/driver/nvidia`).
#[test]
fn no_nvml_is_loaded_to_key_a_device_when_no_mig_instance_can_be_used() {
    for deploy in [Deploy::Preload, Deploy::Dropin] {
        let (sim, root) = sim("caps-none", false);
        let run = run_command(&mut client(&sim, deploy, "n", "2GiB", &root));
        run.assert_success();
        let report = run.report();
        assert_eq!(
            run.get("nvml_after_lookup"),
            "0",
            "{deploy:?}: NVML loaded: {report}"
        );
        assert_eq!(
            run.get_u64("cuda_total_mem"),
            2 * GIB,
            "{deploy:?}: {report}"
        );
        assert_eq!(run.get("under"), "CUDA_SUCCESS", "{deploy:?}: {report}");
        assert_eq!(
            run.get("past"),
            "CUDA_ERROR_OUT_OF_MEMORY",
            "{deploy:?}: {report}"
        );
        assert_eq!(ledger_keys(&sim, "n"), [GPU0], "{deploy:?}");

        let maybe = sim.dir.join("maybe-mig");
        std::fs::create_dir_all(maybe.join("proc/driver/nvidia")).unwrap();
        std::fs::create_dir_all(maybe.join("dev/nvidia-caps")).unwrap();
        for (tenant, root) in [("m", maybe.as_path()), ("x", Path::new("/nonexistent"))] {
            let run = run_command(&mut client(&sim, deploy, tenant, "2GiB", root));
            run.assert_success();
            assert_eq!(
                run.get("nvml_after_lookup"),
                "1",
                "{deploy:?}: {tenant}: NVML not asked: {}",
                run.report()
            );
            assert_eq!(ledger_keys(&sim, tenant), [GPU0], "{deploy:?}");
        }
    }
}

/// On a MIG instance whose capabilities the driver's files show: NVML is asked, the instance is
/// keyed `MIG-…`, and a limit keyed so holds there (by the program's results and simgpu's counters).
#[test]
fn a_mig_limit_holds_when_the_capabilities_say_mig() {
    for deploy in [Deploy::Preload, Deploy::Dropin] {
        let (sim, root) = sim("caps-mig", true);
        let limit = format!("{INSTANCE1}=2GiB");
        let run = run_command(
            client(&sim, deploy, "m", &limit, &root).env("CUDA_VISIBLE_DEVICES", INSTANCE1),
        );
        run.assert_success();
        let report = run.report();
        assert_eq!(
            format!("MIG-{}", run.get("cuda_uuid")),
            INSTANCE1,
            "{report}"
        );
        assert_eq!(run.get("nvml_after_lookup"), "1", "{deploy:?}: {report}");
        assert_eq!(
            run.get_u64("cuda_total_mem"),
            2 * GIB,
            "{deploy:?}: {report}"
        );
        assert_eq!(run.get("under"), "CUDA_SUCCESS", "{deploy:?}: {report}");
        assert_eq!(
            run.get("past"),
            "CUDA_ERROR_OUT_OF_MEMORY",
            "{deploy:?}: {report}"
        );
        assert_eq!(ledger_keys(&sim, "m"), [INSTANCE1], "{deploy:?}");
        let stat = sim.stat();
        assert!(
            group_peak_on(&stat, "m", 1) <= 2 * GIB,
            "{deploy:?}: past the quota on the instance by simgpu's counters: {stat}"
        );
    }
}

/// A wrong answer fails closed: the library told that no MIG instance can be in use (a root with
/// the driver's directory and no capabilities) while the program runs on one keys the instance
/// `GPU-<its UUID>`. A limit keyed by the instance's `MIG-` UUID then matches no device: every
/// allocation is refused, none reaches simgpu. A limit for every device still holds.
#[test]
fn a_mig_instance_keyed_as_a_gpu_fails_closed() {
    let (sim, _root) = sim("caps-wrong", true);
    let wrong = driver_without_capabilities(&sim);
    let limit = format!("{INSTANCE1}=2GiB");
    let run = run_command(
        client(&sim, Deploy::Preload, "k", &limit, &wrong).env("CUDA_VISIBLE_DEVICES", INSTANCE1),
    );
    let report = run.report();
    assert_eq!(run.get("nvml_after_lookup"), "0", "{report}");
    // Refused at the context or at the allocation: nothing is allocated.
    let kv = run.kv();
    assert!(
        kv.get("retain").is_some_and(|r| r != "CUDA_SUCCESS")
            || kv
                .get("under")
                .is_some_and(|u| u == "CUDA_ERROR_OUT_OF_MEMORY"),
        "a MIG instance keyed GPU-… must refuse: {report}"
    );
    assert_ne!(
        kv.get("past").map(String::as_str),
        Some("CUDA_SUCCESS"),
        "{report}"
    );
    let stat = sim.stat();
    assert!(
        group_peak_on(&stat, "k", 1) < GIB,
        "an allocation reached the instance: {stat}"
    );

    let run = run_command(
        client(&sim, Deploy::Preload, "a", "2GiB", &wrong).env("CUDA_VISIBLE_DEVICES", INSTANCE1),
    );
    run.assert_success();
    let report = run.report();
    assert_eq!(run.get("under"), "CUDA_SUCCESS", "{report}");
    assert_eq!(run.get("past"), "CUDA_ERROR_OUT_OF_MEMORY", "{report}");
    assert_eq!(
        ledger_keys(&sim, "a"),
        [format!("GPU-{}", &INSTANCE1[4..])],
        "the wrong key"
    );
    let stat = sim.stat();
    assert!(
        group_peak_on(&stat, "a", 1) <= 2 * GIB,
        "past the quota on the instance by simgpu's counters: {stat}"
    );
}

/// simgpu's model, without gpuslice: the state's creator makes the driver's files for each
/// instance, and a process uses only the instances whose two capabilities (GPU and compute
/// instance) it can open; without them the instance is not enumerated (`cuInit` fails when no
/// device is left), and the first usable one is.
#[test]
fn simgpu_enumerates_only_instances_whose_capabilities_are_accessible() {
    let (sim, root) = sim("caps-model", true);
    let script = r#"
from cuda.bindings import driver as cu
err = cu.cuInit(0)[0]
print(f"init={err.name}")
if err == 0:
    print(f"count={cu.cuDeviceGetCount()[1]}")
    raw = bytes(cu.cuDeviceGetUuid_v2(0)[1].bytes).hex()
    print(f"uuid={raw}")
"#;
    let path = sim.dir.join("enumerate.py");
    std::fs::write(&path, script).unwrap();
    let enumerate = |visible: Option<&str>| {
        let mut cmd = sim.command(venv_python());
        cmd.arg(&path);
        if let Some(v) = visible {
            cmd.env("CUDA_VISIBLE_DEVICES", v);
        }
        let run = run_command(&mut cmd);
        run.assert_success();
        run
    };
    let run = enumerate(Some(INSTANCE1));
    assert_eq!(run.get("init"), "CUDA_SUCCESS", "{}", run.report());
    assert!(
        INSTANCE1.ends_with(&run.get("uuid")[20..]),
        "{}",
        run.report()
    );
    let access = root.join("proc/driver/nvidia/capabilities/gpu0/mig/gi2/ci0/access");
    let text = std::fs::read_to_string(&access).expect("the instance's capability");
    let minor: u32 = text
        .lines()
        .find_map(|l| l.strip_prefix("DeviceFileMinor: "))
        .and_then(|m| m.trim().parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    std::fs::remove_file(root.join(format!("dev/nvidia-caps/nvidia-cap{minor}"))).unwrap();
    let run = enumerate(Some(INSTANCE1));
    assert_eq!(
        run.get("init"),
        "CUDA_ERROR_NO_DEVICE",
        "an instance without access: {}",
        run.report()
    );
    // Without a list: the first instance this process can use (instance 0).
    let run = enumerate(None);
    assert_eq!(run.get("init"), "CUDA_SUCCESS", "{}", run.report());
    assert_eq!(run.get_u64("count"), 1, "{}", run.report());
    assert!(run.get("uuid").ends_with("0000"), "{}", run.report());
}
