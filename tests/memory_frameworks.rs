//! Memory quotas as frameworks meet them: what frameworks ask the driver at start-up and when memory
//! runs short (docs/FRAMEWORKS.md), Python bindings and dlopen clients, NVIDIA's cuda.core. Judged by
//! simgpu's own counters.

use gpuslice_testkit as common;

use common::memory::*;
use common::*;

/// The claims of docs/FRAMEWORKS.md, each made by a client that asks the driver what the framework
/// asks, in the same order, under a 1 GiB quota with 300 MiB contexts.
#[test]
fn frameworks_see_the_quota_and_fit_with_the_documented_settings() {
    let dir = scratch("frameworks");
    let sim = sim("overhead-frameworks");
    let run = |args: &[&str]| {
        let mut cmd = client_of(&QUOTA_FRAMEWORKS, &sim, Deploy::Preload, &dir, "fw", args);
        let run = sim.run_cmd(cmd.env("GPUSLICE_LOG", "error"));
        run.assert_success();
        run
    };
    let usable = QUOTA - SIM_CONTEXT;
    // JAX/XLA: 75% of the quota does not fit beside a 300 MiB context; 70% does.
    let xla = run(&["xla", "0.75"]);
    assert_eq!(xla.get_u64("start_total"), QUOTA);
    assert_eq!(xla.get_u64("start_free"), usable);
    assert_eq!(xla.get("prealloc_rc"), "2", "{}", xla.report());
    assert_eq!(run(&["xla", "0.70"]).get("prealloc_rc"), "0");
    // vLLM: gpu_memory_utilization 0.9 refuses to start (free < 0.9 x total); 0.7 starts, and its KV
    // cache fits.
    assert_eq!(run(&["vllm", "0.9", "100"]).get("refused_to_start"), "1");
    let vllm = run(&["vllm", "0.7", "100"]);
    assert_eq!(vllm.get("refused_to_start"), "0");
    assert_eq!(vllm.get("kv_rc"), "0", "{}", vllm.report());
    // PyTorch's caching allocator: after an out-of-memory, emptying its cache lets the retry through.
    let torch = run(&["torch"]);
    assert_eq!(torch.get_u64("segments"), usable / (20 * MIB));
    assert_eq!(torch.get("retry_rc"), "0", "{}", torch.report());
    // expandable_segments: pages mapped up to the quota exactly.
    let expandable = run(&["torch_expandable"]);
    assert_eq!(
        expandable.get_u64("mapped"),
        usable,
        "{}",
        expandable.report()
    );
    assert_eq!(expandable.get_u64("end_free"), 0);
    // backend:cudaMallocAsync: blocks up to the quota; after frees a new block is served (the shim
    // trims the pool's freed blocks itself before refusing).
    let pool = run(&["torch_async"]);
    assert_eq!(pool.get_u64("blocks"), usable / (32 * MIB));
    assert_eq!(pool.get("first_rc"), "0", "{}", pool.report());
    // TensorFlow without allow_growth: the free memory less the 225 MiB it leaves the system, in
    // one region.
    let tf = run(&["tf"]);
    assert_eq!(tf.get("region_rc"), "0", "{}", tf.report());
    assert_eq!(tf.get_u64("end_free"), 225 * MIB, "{}", tf.report());
    assert!(group_peak_on(&sim.stat(), "fw", 0) <= QUOTA);
}

/// The same through NVIDIA's cuda-bindings (cuGetProcAddress) and through a dlopen/dlsym client:
/// contexts at 0 leave the whole quota, contexts at 300 MiB are charged 300 MiB.
#[test]
fn bindings_and_dlopen_clients_are_charged_what_contexts_cost() {
    for (context, charged) in [("0", 0), ("300MiB", SIM_CONTEXT)] {
        let dir = scratch("bindings");
        let sim = sim("overhead-bindings").env("SIMGPU_CONTEXT_MEMORY", context);
        let mut cmd = sim.command(venv_python());
        cmd.arg(client_source("quota_overhead.py"))
            .env("LD_PRELOAD", libgpuslice())
            .env("GPUSLICE_MEMORY_LIMIT", "1GiB")
            .env("GPUSLICE_LEDGER", dir.join("bindings.ledger"))
            .env("GPUSLICE_DEVICE_DIR", dir.join("devices"))
            .env("GPUSLICE_LOG", "error");
        let run = sim.run_cmd(&mut cmd);
        run.assert_success();
        let report = run.report();
        assert_eq!(run.get_u64("context_free"), QUOTA - charged, "{report}");
        // The PTX module's code: one 2 MiB page.
        assert_eq!(
            run.get_u64("module_free"),
            QUOTA - charged - GRANULE,
            "{report}"
        );
        assert_eq!(
            run.get_u64("fill_bytes"),
            QUOTA - charged - GRANULE,
            "{report}"
        );
        assert_eq!(run.get("refused_rc"), "2", "{report}");
        assert_eq!(
            (run.get_u64("param0_offset"), run.get_u64("param0_size")),
            (0, 8),
            "{report}"
        );
        assert_eq!(
            run.get("ptr_memory_type"),
            "2",
            "CU_MEMORYTYPE_DEVICE\n{report}"
        );
        assert_eq!(run.get("ptr_device"), "0", "{report}");

        let mut cmd = client_of(&DLOPEN, &sim, Deploy::Preload, &dir, "dlopen", &["full"]);
        let run = sim.run_cmd(cmd.env("GPUSLICE_LOG", "error"));
        run.assert_success();
        assert_eq!(
            run.get_u64("oom_allocs"),
            (QUOTA - charged) / (64 * MIB),
            "{}",
            run.report()
        );
    }
}

/// NVIDIA's cuda.core (tests/clients/quota_core.py): its device, a cubin loaded as object code,
/// buffers from the device's pool, a launch, a refused allocation and the pool trimmed; at each step
/// the driver API and NVML agree with each other and with the charge, and the program exits cleanly
/// (cuda.core releases its primary context from a thread-local destructor at exit).
fn cuda_core_sees_its_quota(deploy: Deploy) {
    let dir = scratch("cuda-core");
    let sim = sim("overhead-cuda-core");
    let cubin = fixture("kernel.sm_80.cubin");
    let run = python_as(
        &sim,
        deploy,
        &dir,
        "core",
        &[
            client_source("quota_core.py").to_str().unwrap(),
            cubin.to_str().unwrap(),
        ],
    );
    let report = run.report();
    let kv = run.kv();
    let at = |s: &str, key: &str| step(&kv, s, key);
    // The context; the library's kernel got (nothing loaded: a lazily loaded library's kernel is
    // loaded at its first launch); 64 MiB of buffers; the launch, which loads one page of code;
    // then the buffers trimmed away.
    let expected = [
        ("context", SIM_CONTEXT),
        ("module", SIM_CONTEXT),
        ("alloc", SIM_CONTEXT + 64 * MIB),
        ("launch", SIM_CONTEXT + GRANULE + 64 * MIB),
        ("closed", SIM_CONTEXT + GRANULE),
    ];
    for (s, used) in expected {
        assert_eq!(at(s, "total"), QUOTA, "{deploy:?} {s}\n{report}");
        assert_eq!(at(s, "free"), QUOTA - used, "{deploy:?} {s}\n{report}");
        assert_eq!(at(s, "nvml_total"), QUOTA, "{deploy:?} {s}\n{report}");
        assert_eq!(at(s, "nvml_used"), used, "{deploy:?} {s}\n{report}");
        assert_eq!(at(s, "nvml_free"), QUOTA - used, "{deploy:?} {s}\n{report}");
        assert_eq!(
            at(s, "v2_reserved") + at(s, "v2_used") + at(s, "v2_free"),
            at(s, "v2_total"),
            "{deploy:?} {s}\n{report}"
        );
        assert_eq!(at(s, "v2_total"), QUOTA, "{deploy:?} {s}\n{report}");
        assert_eq!(at(s, "procs_count"), 1, "{deploy:?} {s}\n{report}");
        assert_eq!(at(s, "procs_used"), used, "{deploy:?} {s}\n{report}");
    }
    assert_eq!(run.get("refused"), "1", "{deploy:?}\n{report}");
    assert!(
        !run.stderr.contains("panicked"),
        "{deploy:?}: no panic, the driver's or ours, at exit\n{report}"
    );
    assert!(
        group_peak_on(&sim.stat(), "core", 0) <= QUOTA,
        "{deploy:?}\n{report}"
    );
}

in_every_deployment!(
    cuda_core_sees_its_quota:
    cuda_core_sees_its_quota_preloaded,
    cuda_core_sees_its_quota_dropin,
    cuda_core_sees_its_quota_mixed
);
