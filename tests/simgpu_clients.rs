//! simgpu judged by real clients: C programs built against NVIDIA's cuda.h (linked with -lcuda, or
//! dlopen/dlsym), NVIDIA's cuda-bindings (cuGetProcAddress) and nvidia-ml-py (NVML). Each client is a
//! separate process finding simgpu through LD_LIBRARY_PATH as it would find the real driver.

use gpuslice_testkit as common;

use common::*;

/// Device memory of the simulated device in these tests, and simgpu's default per-context cost.
const MEMORY: u64 = GIB;
const CONTEXT_MEMORY: u64 = 300 * MIB;
const CHUNK: u64 = 64 * MIB;

fn sim(tag: &str) -> Sim {
    Sim::new(tag).env("SIMGPU_MEMORY", "1GiB")
}

fn assert_uuid_format(uuid: &str) {
    let parts: Vec<&str> = uuid.strip_prefix("GPU-").unwrap_or("").split('-').collect();
    let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
    assert!(
        lens == [8, 4, 4, 4, 12]
            && parts.iter().all(|p| p
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())),
        "not a GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx UUID: {uuid}"
    );
}

/// The `full` run of a client (C or Python): every printed figure, exactly.
fn assert_full_run(sim: &Sim, run: &Run) {
    run.assert_success();
    let ctx = |what: &str| format!("{what}\n{}", run.report());
    assert_eq!(
        run.get("driver_version"),
        "12080",
        "{}",
        ctx("default SIMGPU_DRIVER_VERSION")
    );
    assert_eq!(
        run.get("device_count"),
        "1",
        "{}",
        ctx("default SIMGPU_DEVICES")
    );
    let name = run.get("device_name");
    assert!(name.starts_with("NVIDIA "), "{}", ctx("device name"));
    assert_uuid_format(&run.get("device_uuid"));
    assert_eq!(
        run.get_u64("total_mem"),
        MEMORY,
        "{}",
        ctx("cuDeviceTotalMem = SIMGPU_MEMORY")
    );
    assert_eq!(
        run.get("compute_capability"),
        "9.0",
        "{}",
        ctx("compute capability")
    );
    assert_eq!(
        run.get("ctx_current"),
        "1",
        "{}",
        ctx("primary context current")
    );
    assert_eq!(
        run.get_u64("mem_info_total"),
        MEMORY,
        "{}",
        ctx("cuMemGetInfo total")
    );
    assert_eq!(
        run.get_u64("mem_info_free"),
        MEMORY - CONTEXT_MEMORY,
        "{}",
        ctx("cuMemGetInfo free = capacity - context memory")
    );
    assert_eq!(run.get("alloc_nonnull"), "1", "{}", ctx("allocation"));
    assert_eq!(
        run.get("roundtrip_equal"),
        "1",
        "{}",
        ctx("HtoD/DtoH round trip")
    );
    assert_eq!(run.get("memset_equal"), "1", "{}", ctx("memset read back"));
    let ms = run.get_f64("kernel_elapsed_ms");
    assert!(
        (1.95..500.0).contains(&ms),
        "{}",
        ctx("2000 us kernel between events")
    );
    assert_eq!(
        run.get_u64("oom_allocs"),
        (MEMORY - CONTEXT_MEMORY) / CHUNK,
        "{}",
        ctx("64 MiB allocations until out of memory")
    );
    assert_eq!(
        run.get("oom_rc"),
        "2",
        "{}",
        ctx("CUDA_ERROR_OUT_OF_MEMORY")
    );
    assert_eq!(
        run.get_u64("mem_info_free_after"),
        MEMORY - CONTEXT_MEMORY,
        "{}",
        ctx("all freed")
    );
    assert_eq!(run.get("done"), "1");

    // The judge: simgpu's shared state after the client exited.
    let stat = sim.stat();
    assert_eq!(stat.u64("devices.0.capacity"), MEMORY, "stat: {stat}");
    assert_eq!(
        stat.u64("devices.0.used"),
        0,
        "memory left used after exit: {stat}"
    );
    assert!(
        stat.u64("devices.0.kernels") >= 1,
        "kernel not counted: {stat}"
    );
    assert!(
        stat.u64("devices.0.busy_ns") >= 2_000_000,
        "2000 us kernel not counted: {stat}"
    );
}

#[test]
fn linked_client_cuda12_header() {
    let sim = sim("linked12");
    let run = sim.run(compile(&LINKED_CU12), &["full"]);
    assert_full_run(&sim, &run);
}

#[test]
fn linked_client_cuda13_header() {
    // Built with CUDA 13's header: links cuEventElapsedTime_v2, cuDeviceGetUuid_v2, ...
    let sim = sim("linked13");
    let run = sim.run(compile(&LINKED_CU13), &["full"]);
    assert_full_run(&sim, &run);
}

#[test]
fn dlopen_client() {
    let sim = sim("dlopen");
    let run = sim.run(compile(&DLOPEN), &["full"]);
    assert_full_run(&sim, &run);
}

#[test]
fn cuda_bindings_client() {
    let sim = sim("bindings");
    let run = sim.run_python("bindings_client.py", &[]);
    assert_full_run(&sim, &run);
}

#[test]
fn clients_agree_with_each_other() {
    // Same machine, three ways in: every figure identical.
    let sim = sim("agree");
    let linked = sim.run(compile(&LINKED_CU12), &["full"]);
    let dlopen = sim.run(compile(&DLOPEN), &["full"]);
    let py = sim.run_python("bindings_client.py", &[]);
    for r in [&linked, &dlopen, &py] {
        r.assert_success();
    }
    let strip = |r: &Run| {
        let mut kv = r.kv();
        kv.remove("kernel_elapsed_ms");
        kv
    };
    assert_eq!(strip(&linked), strip(&dlopen), "linked vs dlopen");
    assert_eq!(strip(&linked), strip(&py), "linked vs cuda-bindings");
}

#[test]
fn nvml_client_idle_and_with_a_process() {
    let sim = sim("nvml");
    let cuda = sim.run(compile(&LINKED_CU12), &["devices"]);
    cuda.assert_success();

    // Idle machine.
    let idle = sim.run_python("nvml_client.py", &[]);
    idle.assert_success();
    assert_eq!(idle.get("device_count"), "1", "{}", idle.report());
    assert_eq!(
        idle.get("device0_name"),
        cuda.get("device0_name"),
        "NVML and CUDA name"
    );
    assert_eq!(
        idle.get("device0_uuid"),
        cuda.get("device0_uuid"),
        "NVML and CUDA UUID"
    );
    assert_eq!(
        idle.get_u64("device0_mem_total"),
        MEMORY,
        "{}",
        idle.report()
    );
    assert_eq!(
        idle.get_u64("device0_mem2_total"),
        MEMORY,
        "{}",
        idle.report()
    );
    assert_eq!(idle.get_u64("device0_mem2_used"), 0, "{}", idle.report());
    assert_eq!(idle.get("device0_procs"), "0", "{}", idle.report());

    // A process holding 256 MiB and running kernels.
    let held = 256 * MIB;
    let mut cmd = sim.command(compile(&LINKED_CU12));
    cmd.args(["hold", "256", "2000"]);
    let mut holder = sim.spawn(&mut cmd);
    let ready = wait_for_key(&mut holder, "pid");
    let pid: u32 = ready["pid"].parse().unwrap();
    // NVML's utilization is over its past sample period (up to 1 s on real GPUs): let a whole
    // period of back-to-back kernels pass.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let busy = sim.run_python("nvml_client.py", &[]);
    let stat = sim.stat();
    let holder_run = finish(holder, "hold");
    holder_run.assert_success();
    busy.assert_success();
    let report = || format!("{}\nstat: {stat}", busy.report());

    // The client's small PTX module takes one 2 MiB page of device memory while loaded.
    let used = CONTEXT_MEMORY + 2 * MIB + held;
    assert_eq!(
        stat.u64("devices.0.used"),
        used,
        "stat: context + allocation\n{}",
        report()
    );
    let total = busy.get_u64("device0_mem_total");
    let v1_used = busy.get_u64("device0_mem_used");
    let v1_free = busy.get_u64("device0_mem_free");
    let reserved = busy.get_u64("device0_mem2_reserved");
    let v2_used = busy.get_u64("device0_mem2_used");
    let v2_free = busy.get_u64("device0_mem2_free");
    assert_eq!(total, MEMORY, "{}", report());
    assert_eq!(
        v2_used,
        used,
        "NVML v2 used = what simgpu-stat counts\n{}",
        report()
    );
    assert_eq!(
        v1_used,
        v2_used + reserved,
        "NVML v1 used = reserved + allocated\n{}",
        report()
    );
    assert_eq!(
        v1_used + v1_free,
        total,
        "v1 used + free = total\n{}",
        report()
    );
    assert_eq!(
        reserved + v2_used + v2_free,
        total,
        "v2 reserved + used + free = total\n{}",
        report()
    );
    assert_eq!(busy.get("device0_procs"), "1", "{}", report());
    assert_eq!(
        busy.get_u64(&format!("device0_proc_{pid}")),
        used,
        "the holder's memory in running processes\n{}",
        report()
    );
    assert!(
        busy.get_u64("device0_util_gpu") >= 90,
        "utilization while kernels run back to back\n{}",
        report()
    );

    // The holder exited without freeing: the driver reclaims a dead process's memory.
    let after = sim.run_python("nvml_client.py", &[]);
    after.assert_success();
    let stat = sim.stat();
    assert_eq!(
        stat.u64("devices.0.used"),
        0,
        "memory of the exited holder: {stat}"
    );
    assert_eq!(after.get_u64("device0_mem2_used"), 0, "{}", after.report());
    assert_eq!(after.get("device0_procs"), "0", "{}", after.report());
}

#[test]
fn cuda_visible_devices_by_index_and_uuid() {
    let sim = Sim::new("cvd").env("SIMGPU_DEVICES", "2");
    let client = compile(&DLOPEN);
    let devices = |cvd: Option<&str>| {
        let mut cmd = sim.command(&client);
        cmd.arg("devices");
        if let Some(v) = cvd {
            cmd.env("CUDA_VISIBLE_DEVICES", v);
        }
        let run = sim.run_cmd(&mut cmd);
        run.assert_success();
        run
    };
    let all = devices(None);
    assert_eq!(all.get("device_count"), "2", "{}", all.report());
    let (u0, u1) = (all.get("device0_uuid"), all.get("device1_uuid"));
    assert_uuid_format(&u0);
    assert_uuid_format(&u1);
    assert_ne!(u0, u1, "two devices, one UUID");

    let uuids = |run: &Run| -> Vec<String> {
        let n = run.get_u64("device_count");
        (0..n)
            .map(|i| run.get(&format!("device{i}_uuid")))
            .collect()
    };
    for (cvd, want) in [
        ("1", vec![u1.clone()]),
        ("0", vec![u0.clone()]),
        ("1,0", vec![u1.clone(), u0.clone()]),
        (u1.as_str(), vec![u1.clone()]),
        (&format!("{u1},{u0}"), vec![u1.clone(), u0.clone()]),
        // An invalid entry hides itself and everything after it.
        ("0,7,1", vec![u0.clone()]),
    ] {
        let run = devices(Some(cvd));
        assert_eq!(
            uuids(&run),
            want,
            "CUDA_VISIBLE_DEVICES={cvd}\n{}",
            run.report()
        );
    }
    for cvd in ["7", "", "GPU-00000000-0000-0000-0000-000000000000"] {
        let run = devices(Some(cvd));
        assert_eq!(
            run.get("init"),
            "100",
            "CUDA_VISIBLE_DEVICES={cvd:?}: cuInit is CUDA_ERROR_NO_DEVICE\n{}",
            run.report()
        );
    }

    // NVML ignores CUDA_VISIBLE_DEVICES: it sees the machine.
    let mut cmd = sim.command(venv_python());
    cmd.arg(client_source("nvml_client.py"))
        .env("CUDA_VISIBLE_DEVICES", "1");
    let nvml = sim.run_cmd(&mut cmd);
    nvml.assert_success();
    assert_eq!(nvml.get("device_count"), "2", "{}", nvml.report());
    assert_eq!(nvml.get("device0_uuid"), u0);
    assert_eq!(nvml.get("device1_uuid"), u1);
}

#[test]
fn trace_records_driver_calls() {
    let trace = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("simgpu-trace-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&trace);
    let sim = sim("trace").env("SIMGPU_TRACE", trace.to_str().unwrap());
    sim.run(compile(&DLOPEN), &["full"]).assert_success();
    let text = std::fs::read_to_string(&trace)
        .unwrap_or_else(|e| panic!("SIMGPU_TRACE file {} not written: {e}", trace.display()));
    let _ = std::fs::remove_file(&trace);
    for call in [
        "cuInit",
        "cuDeviceGetName",
        "cuDevicePrimaryCtxRetain",
        "cuMemAlloc_v2",
        "cuMemcpyHtoD_v2",
        "cuMemcpyDtoH_v2",
        "cuMemsetD8_v2",
        "cuModuleGetFunction",
        "cuLaunchKernel",
        "cuStreamSynchronize",
        "cuEventElapsedTime",
        "cuMemFree_v2",
    ] {
        assert!(
            text.lines().any(|l| l
                .split(|c: char| !c.is_alphanumeric() && c != '_')
                .any(|w| w == call)),
            "trace has no {call} call; trace:\n{}",
            text.lines().take(60).collect::<Vec<_>>().join("\n")
        );
    }
    // Key arguments: what was allocated, copied, launched and freed.
    for what in [
        "  alloc ",
        "  copy ",
        "kernel spin_kernel 2000us",
        "  free ",
    ] {
        assert!(
            text.lines().any(|l| l.contains(what)),
            "trace has no `{what}` line; trace:\n{}",
            text.lines().take(60).collect::<Vec<_>>().join("\n")
        );
    }
}

/// A thread's current context outlives its thread-local storage: libraries release their contexts
/// from destructors that run as a thread (or the program) exits, after that storage is gone
/// (cuda.core's C++ thread-locals; here a thread-specific data destructor), and a driver still
/// answers them for the thread's context. With and without the shim.
#[test]
fn the_current_context_is_known_while_a_thread_exits() {
    let sim = sim("thread-exit");
    for preload in [false, true] {
        let mut cmd = sim.command(compile(&LINKED_CU12));
        cmd.arg("threadexit");
        if preload {
            cmd.env("LD_PRELOAD", libgpuslice())
                .env("GPUSLICE_MEMORY_LIMIT", "1GiB")
                .env("GPUSLICE_LEDGER", sim.dir.join("thread-exit.ledger"));
        }
        let run = sim.run_cmd(&mut cmd);
        run.assert_success();
        let report = run.report();
        assert_eq!(run.get("same_context"), "1", "preload {preload}\n{report}");
        assert_eq!(run.get("get_rc"), "0", "preload {preload}\n{report}");
        assert_eq!(run.get("info_rc"), "0", "preload {preload}\n{report}");
        assert!(
            !run.stderr.contains("panicked"),
            "preload {preload}\n{report}"
        );
    }
}

/// `cuOccupancy*` by NVIDIA's occupancy calculation from the function's and the device's
/// attributes (16 registers per thread, no static shared memory; 2048 threads, 32 blocks, 64 Ki
/// registers and 228 KiB of shared memory per multiprocessor, 1 KiB reserved per block), as
/// cuda.core's `Kernel.occupancy` asks for it through cuda-bindings.
#[test]
fn occupancy_follows_the_calculation() {
    let sim = sim("occupancy");
    let cubin = root().join("tests/fixtures/modules/kernel.sm_80.cubin");
    let run = sim.run_python("occupancy.py", &[cubin.to_str().unwrap()]);
    run.assert_success();
    let report = run.report();
    for (key, want) in [
        ("active_32_0", 32),        // the block limit
        ("active_256_0", 8),        // the thread limit
        ("active_1024_0", 2),       // the thread limit
        ("active_256_49152", 4),    // shared memory: 228 KiB / (48 + 1) KiB
        ("active_2048_0", 0),       // larger than a block may be
        ("potential_block", 1024),  // every multiprocessor's 64 warps, in the largest blocks
        ("limited_block", 128),     // up to 200 threads: 16 blocks of 4 warps fill it
        ("available_4x256", 49152), // 57 KiB each, capped at the function's 48 KiB
    ] {
        assert_eq!(run.get_u64(key), want, "{key}\n{report}");
    }
    let multiprocessors = run.get_u64("multiprocessors");
    assert_eq!(
        run.get_u64("potential_grid"),
        2 * multiprocessors,
        "{report}"
    );
    assert_eq!(
        run.get_u64("limited_grid"),
        16 * multiprocessors,
        "{report}"
    );
}
