//! simgpu models what a multi-GPU server does without any sharing layer: devices arbitrated on their
//! own, contexts time-sliced by the hardware (so NCCL-like collectives spanning devices and processes
//! meet), kernels of one context concurrent across streams with busy time counted once. Judged by
//! simgpu-stat and the clients' own output.

use gpuslice_testkit as common;

use common::*;
use std::process::Child;
use std::time::{Duration, Instant};

/// Waits for every child to exit, at most `timeout`; on timeout kills them all and panics saying
/// which were still running and what each device was doing.
fn wait_all(
    sim: &Sim,
    mut children: Vec<(String, Child)>,
    timeout: Duration,
) -> Vec<(String, Run)> {
    let deadline = Instant::now() + timeout;
    loop {
        let running: Vec<&str> = children
            .iter_mut()
            .filter_map(|(name, c)| c.try_wait().unwrap().is_none().then_some(name.as_str()))
            .collect();
        if running.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            let running: Vec<String> = running.iter().map(|s| s.to_string()).collect();
            let stat = sim.stat();
            let pids: Vec<String> = children
                .iter()
                .map(|(n, c)| format!("{n}: pid {}", c.id()))
                .collect();
            for (_, c) in &mut children {
                let _ = c.kill();
            }
            panic!(
                "still running after {timeout:?}: {running:?}\n({})\nsimgpu: each device's `serving` \
                 context, `running` kernels and `queued` kernels by pid:\n{stat}",
                pids.join(", ")
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    children
        .into_iter()
        .map(|(name, c)| {
            let run = finish(c, &name);
            (name, run)
        })
        .collect()
}

/// Tenants J and K, each one rank per device (four processes), each rank looping compute then a
/// barrier with its peer rank on the other device. Whatever order the ranks reach the devices in
/// (including J's rank holding device 0 while K's holds device 1, each spinning for a peer queued
/// behind the other), the hardware's time slice lets every barrier meet.
#[test]
fn collectives_across_devices_and_processes_complete() {
    const ITERS: &str = "40";
    let sim = Sim::new("barrier").env("SIMGPU_DEVICES", "2");
    let client = compile(&MULTIGPU);
    let mut children = Vec::new();
    for (tenant, tag) in [("J", "1"), ("K", "2")] {
        for device in ["0", "1"] {
            let mut cmd = sim.command(&client);
            cmd.env("SIMGPU_GROUP", tenant)
                .args(["rank", device, tag, "2", ITERS, "300"]);
            children.push((format!("{tenant} rank {device}"), sim.spawn(&mut cmd)));
        }
    }
    let runs = wait_all(&sim, children, Duration::from_secs(120));
    for (_, r) in &runs {
        r.assert_success();
        assert_eq!(r.get("iterations"), ITERS, "{}", r.report());
    }
    let stat = sim.stat();
    // Each device ran 2 ranks x ITERS x (spin + barrier), and nothing is left on it.
    for d in 0..2 {
        assert_eq!(stat.u64(&format!("devices.{d}.kernels")), 160, "{stat}");
        assert_eq!(stat.u64(&format!("devices.{d}.running")), 0, "{stat}");
        // Both tenants ran there (busy per group, per device).
        for g in ["J", "K"] {
            assert!(group(&stat, g).u64(&format!("busy_ns.{d}")) > 0, "{stat}");
        }
    }
}

/// The same ranks with time-slicing turned off: the device runs each kernel to its end, so a
/// barrier kernel spinning for a peer rank queued behind the other tenant's spinning barrier never
/// completes. This is the deadlock the hardware's time slice prevents; shown here with one
/// iteration and a forced arrival order.
#[test]
fn without_time_slicing_crossed_collectives_deadlock() {
    let sim = Sim::new("deadlock")
        .env("SIMGPU_DEVICES", "2")
        .env("SIMGPU_TIMESLICE_US", "0");
    let client = compile(&MULTIGPU);
    let rank = |tenant: &str, device: &str, tag: &str| {
        let mut cmd = sim.command(&client);
        cmd.env("SIMGPU_GROUP", tenant)
            .args(["rank", device, tag, "2", "1", "0"]);
        sim.spawn(&mut cmd)
    };
    // The state file exists once the first client has initialised the driver.
    let state = std::path::Path::new("/dev/shm").join(&sim.state);
    let serving = |d: usize| {
        if state.exists() {
            sim.stat().u64(&format!("devices.{d}.running"))
        } else {
            0
        }
    };
    let wait_running = |d: usize| {
        let until = Instant::now() + Duration::from_secs(60);
        while serving(d) == 0 {
            assert!(
                Instant::now() < until,
                "device {d} never ran the first rank's barrier"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    // J's rank on device 0 and K's rank on device 1 spin first; the peers queue behind them.
    let mut j0 = rank("J", "0", "1");
    wait_running(0);
    let mut k1 = rank("K", "1", "2");
    wait_running(1);
    let mut j1 = rank("J", "1", "1");
    let mut k0 = rank("K", "0", "2");
    std::thread::sleep(Duration::from_millis(500));
    let still: Vec<bool> = [&mut j0, &mut k1, &mut j1, &mut k0]
        .into_iter()
        .map(|c| c.try_wait().unwrap().is_none())
        .collect();
    let stat = sim.stat();
    for c in [&mut j0, &mut k1, &mut j1, &mut k0] {
        let _ = c.kill();
        let _ = c.wait();
    }
    assert_eq!(
        still, [true; 4],
        "a rank completed without time-slicing: {stat}"
    );
    assert_eq!(
        stat.u64("devices.0.switches") + stat.u64("devices.1.switches"),
        0
    );
}

/// One context, four streams issuing kernels at once: they overlap (up to SIMGPU_CONCURRENT_KERNELS),
/// and the process, its group and the device are charged the union of the kernels' running
/// intervals: never more than wall time, and well under the sum of the kernels' durations.
#[test]
fn concurrent_streams_are_charged_the_union_of_their_kernels() {
    const STREAMS: u64 = 4;
    const N: u64 = 50;
    const US: u64 = 2000;
    let sim = Sim::new("streams").env("SIMGPU_CONCURRENT_KERNELS", "4");
    let client = compile(&MULTIGPU);
    let mut cmd = sim.command(&client);
    cmd.env("SIMGPU_GROUP", "s").args([
        "streams",
        "0",
        &STREAMS.to_string(),
        &N.to_string(),
        &US.to_string(),
    ]);
    let run = sim.run_cmd(&mut cmd);
    run.assert_success();
    let stat = sim.stat();
    let wall = run.get_u64("wall_ns");
    let busy = stat.u64("devices.0.busy_ns");
    let sum = STREAMS * N * US * 1000;
    assert_eq!(stat.u64("devices.0.kernels"), STREAMS * N, "{stat}");
    assert!(
        busy <= wall,
        "device busy {busy} ns > wall time {wall} ns: {stat}"
    );
    // Every stream's kernels ran (N x US each at least), overlapping: the union is far below the sum.
    assert!(busy >= N * US * 1000, "busy {busy} ns: {stat}");
    assert!(
        busy < sum / 2,
        "busy {busy} ns, sum of kernel durations {sum} ns: streams did not overlap or were charged \
         more than once\n{stat}"
    );
    assert_eq!(group(&stat, "s").u64("busy_ns.0"), busy, "{stat}");
}

/// A destroyed context takes its streams and events with it: their handles are invalid afterwards
/// (CUDA_ERROR_INVALID_HANDLE = 400); the destroyed primary context is not current-usable
/// (CUDA_ERROR_CONTEXT_IS_DESTROYED = 709) until it is retained again; a destroyed created context is
/// popped from the thread's stack (no current context: CUDA_ERROR_INVALID_CONTEXT = 201).
#[test]
fn destroyed_contexts_invalidate_their_streams_and_events() {
    let sim = Sim::new("teardown");
    let client = compile(&MULTIGPU);
    for (how, ctx_sync) in [("reset", "709"), ("release", "709"), ("destroy", "201")] {
        let run = sim.run(&client, &["teardown", how]);
        run.assert_success();
        let r = run.report();
        assert_eq!(run.get("teardown"), "0", "{how}: {r}");
        for call in [
            "stream_query",
            "stream_sync",
            "event_query",
            "event_sync",
            "launch",
        ] {
            assert_eq!(run.get(call), "400", "{how}: {call}: {r}");
        }
        assert_eq!(run.get("ctx_sync"), ctx_sync, "{how}: {r}");
        if how != "destroy" {
            // The primary context comes back with the same handle; a reset kept the retain, so
            // the release after it succeeds (and a release after a release to zero would not).
            assert_eq!(run.get("retain_again"), "0", "{how}: {r}");
            assert_eq!(run.get("same_handle"), "1", "{how}: {r}");
            assert_eq!(run.get("release_after"), "0", "{how}: {r}");
        }
    }
    // The queued kernel ran before the teardown returned, in every case; no memory is left.
    let stat = sim.stat();
    assert_eq!(stat.u64("devices.0.kernels"), 3, "{stat}");
    assert_eq!(stat.u64("devices.0.used"), 0, "{stat}");
}

/// Capture modes as cuThreadExchangeStreamCaptureMode documents them: while a thread captures in
/// GLOBAL mode, a potentially unsafe call (event/stream query or synchronize, context synchronize,
/// cuMemAlloc) from any thread in GLOBAL mode fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900)
/// and invalidates the capture (cuStreamEndCapture: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, 901, and
/// no graph); a THREAD_LOCAL capture is only broken by its own thread; RELAXED callers never break
/// anything.
#[test]
fn capture_modes_decide_which_calls_invalidate_a_capture() {
    let sim = Sim::new("capture");
    let client = compile(&MULTIGPU);
    // (capture mode, caller, caller's mode, call, broken?)
    let cases = [
        ("global", "other", "default", "event_query", true),
        ("global", "other", "default", "event_sync", true),
        ("global", "other", "default", "stream_query", true),
        ("global", "other", "default", "stream_sync", true),
        ("global", "other", "default", "ctx_sync", true),
        ("global", "other", "default", "mem_alloc", true),
        ("global", "self", "default", "event_query", true),
        ("global", "other", "relaxed", "event_query", false),
        ("global", "other", "thread_local", "event_query", false),
        ("global", "other", "relaxed", "mem_alloc", false),
        ("thread_local", "other", "default", "event_query", false),
        ("thread_local", "other", "default", "stream_sync", false),
        ("thread_local", "self", "default", "event_query", true),
        ("relaxed", "self", "default", "event_query", false),
        ("relaxed", "other", "default", "mem_alloc", false),
    ];
    for (cap, who, mode, call, broken) in cases {
        let run = sim.run(&client, &["capture", cap, who, mode, call]);
        run.assert_success();
        let what = format!("{cap} capture, {call} from {who} thread in mode {mode}");
        let r = run.report();
        if broken {
            assert_eq!(run.get("call"), "900", "{what}: {r}");
            assert_eq!(run.get("capture_launch"), "901", "{what}: {r}");
            assert_eq!(run.get("end"), "901", "{what}: {r}");
            assert_eq!(run.get("graph_null"), "1", "{what}: {r}");
        } else {
            assert_eq!(run.get("call"), "0", "{what}: {r}");
            assert_eq!(run.get("capture_launch"), "0", "{what}: {r}");
            assert_eq!(run.get("end"), "0", "{what}: {r}");
            assert_eq!(run.get("graph_launch"), "0", "{what}: {r}");
        }
    }
}

/// Graph memory nodes: a captured cuMemAllocAsync (or cuGraphAddMemAllocNode) allocates nothing at
/// capture time; the graph's launch allocates (counted in the device's memory in use), a free node
/// or a later free returns it to the device's graph memory pool, which keeps it (still in use on the
/// device, reserved for graphs) until cuDeviceGraphMemTrim, AUTO_FREE_ON_LAUNCH frees before a relaunch, a relaunch with the
/// allocation still held fails (CUDA_ERROR_INVALID_VALUE = 1), and a graph whose allocation does
/// not fit captures fine but fails to launch (CUDA_ERROR_OUT_OF_MEMORY = 2). A graph with memory
/// nodes has at most one executable graph at a time (a second instantiation fails,
/// CUDA_ERROR_INVALID_VALUE, until the first is destroyed).
#[test]
fn graph_memory_is_allocated_when_the_graph_is_launched() {
    let sim = Sim::new("graphmem")
        .env("SIMGPU_MEMORY", "4GiB")
        .env("SIMGPU_CONTEXT_MEMORY", "0");
    let client = compile(&MULTIGPU);
    let run = sim.run(&client, &["graphmem", "256"]);
    run.assert_success();
    let r = run.report();
    let mib = |k: &str| run.get_u64(k);
    let start = mib("start_used_mib");
    assert_eq!(run.get("captured_ptr_nonzero"), "1", "{r}");
    assert_eq!(
        mib("captured_used_mib"),
        start,
        "capture allocated memory: {r}"
    );
    assert_eq!(mib("captured_graph_mib"), 0, "{r}");
    assert_eq!(run.get("launch1"), "0", "{r}");
    // Freed by its free node, the memory stays cached in the graph memory pool until trimmed.
    assert_eq!(mib("freed_in_graph_used_mib"), start + 256, "{r}");
    assert_eq!(mib("freed_in_graph_graph_mib"), 0, "{r}");
    assert_eq!(mib("freed_in_graph_reserved_mib"), 256, "{r}");
    assert_eq!(mib("graph_high_mib"), 256, "{r}");
    assert_eq!(run.get("trim1"), "0", "{r}");
    assert_eq!(mib("trimmed_used_mib"), start, "{r}");
    assert_eq!(mib("trimmed_reserved_mib"), 0, "{r}");
    assert_eq!(run.get("launch2"), "0", "{r}");
    assert_eq!(mib("escaped_used_mib"), start + 256, "{r}");
    assert_eq!(mib("escaped_graph_mib"), 256, "{r}");
    assert_eq!(run.get("relaunch_unfreed"), "1", "{r}");
    assert_eq!(mib("freed_after_used_mib"), start + 256, "{r}");
    assert_eq!(mib("freed_after_graph_mib"), 0, "{r}");
    assert_eq!(run.get("relaunch_freed"), "0", "{r}");
    // The relaunch took its memory from the pool's cache: nothing more from the device.
    assert_eq!(mib("freed_sync_used_mib"), start + 256, "{r}");
    assert_eq!(mib("freed_sync_reserved_mib"), 256, "{r}");
    assert_eq!(mib("freed_trimmed_used_mib"), start, "{r}");
    assert_eq!(run.get("auto1"), "0", "{r}");
    assert_eq!(run.get("auto2"), "0", "{r}");
    assert_eq!(mib("auto_used_mib"), start + 256, "{r}");
    assert_eq!(run.get("add_alloc"), "0", "{r}");
    assert_eq!(run.get("built_ptr_nonzero"), "1", "{r}");
    assert_eq!(run.get("add_free"), "0", "{r}");
    assert_eq!(run.get("add_free_twice"), "1", "{r}");
    assert_eq!(run.get("add_free_unknown"), "1", "{r}");
    assert_eq!(run.get("instantiate_twice"), "1", "{r}");
    assert_eq!(run.get("launch_built"), "0", "{r}");
    assert_eq!(run.get("instantiate_after_destroy"), "0", "{r}");
    assert_eq!(mib("built_used_mib"), start + 256, "{r}");
    assert_eq!(mib("built_graph_mib"), 0, "{r}");
    assert_eq!(run.get("capture_big"), "0", "{r}");
    assert_eq!(run.get("end_big"), "0", "{r}");
    assert_eq!(run.get("launch_big"), "2", "{r}");
    assert_eq!(mib("big_used_mib"), start, "{r}");
}
