//! Graph memory near the quota (docs/MEMORY.md): a `cuMemAllocAsync` captured into a graph in
//! `CU_STREAM_CAPTURE_MODE_GLOBAL` allocates nothing at capture (the capture must succeed, as without
//! gpuslice); its memory is allocated when the graph is launched, and that launch is held to the
//! quota. Judged by the CUresults the unmodified program sees and by simgpu's own memory counters.

use gpuslice_testkit as common;

use common::libgpuslice as shim;
use common::*;
use std::path::PathBuf;

/// simgpu's memory for a context (what a process holds before it allocates anything).
const SIM_CONTEXT: u64 = 300 * MIB;
const OUT_OF_MEMORY: &str = "2";

fn run(gpuslice: bool) -> (Run, Json) {
    run_client(&GRAPH_MEMORY, gpuslice)
}

fn run_client(client: &CBuild, gpuslice: bool) -> (Run, Json) {
    let tag = format!("{}{}", client.name, if gpuslice { "" } else { "-bare" });
    let tag = tag.as_str();
    let sim = Sim::new(tag).env("SIMGPU_MEMORY", "8GiB");
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd = sim.command(compile(client));
    // A 2 GiB quota; a 1536 MiB allocation beside a graph allocating 1024 MiB exceeds it.
    cmd.env("SIMGPU_GROUP", "g").args(["1536", "1024"]);
    if gpuslice {
        cmd.env("LD_PRELOAD", shim())
            .env("GPUSLICE_MEMORY_LIMIT", "2GiB")
            .env("GPUSLICE_TENANT", "graphs")
            .env("GPUSLICE_LEDGER", dir.join("graphs.ledger"));
    }
    let run = sim.run_cmd(&mut cmd);
    let stat = sim.stat();
    let _ = std::fs::remove_dir_all(&dir);
    (run, stat)
}

#[test]
fn captured_graph_memory_is_held_to_the_quota_at_launch() {
    // Without gpuslice (8 GiB device): every step succeeds.
    let (bare, _) = run(false);
    bare.assert_success();
    for (k, v) in bare.kv() {
        assert!(
            k == "done" || v == "0",
            "without gpuslice, {k}={v}:\n{}",
            bare.report()
        );
    }

    let (run, stat) = run(true);
    run.assert_success();
    let report = run.report();
    let expect = |key: &str, want: &str, why: &str| {
        assert_eq!(run.get(key), want, "{key}: {why}\n{report}");
    };
    // The captures succeed: a captured allocation allocates nothing.
    for k in [
        "held_capture",
        "held_end",
        "transient_capture",
        "transient_end",
        "first_capture",
        "first_end",
        "second_capture",
        "second_end",
    ] {
        expect(
            k,
            "0",
            "a capture near the quota must succeed, as it does without gpuslice",
        );
    }
    expect(
        "held_launch_beside_big",
        OUT_OF_MEMORY,
        "1536 MiB + the graph's 1024 MiB exceed the 2 GiB quota: the launch is refused",
    );
    expect("held_launch_alone", "0", "the graph's 1024 MiB fit alone");
    expect(
        "big_while_held",
        OUT_OF_MEMORY,
        "the graph's allocation outlives its launch and stays charged",
    );
    expect("held_free", "0", "freeing the graph's allocation");
    expect(
        "big_before_trim",
        OUT_OF_MEMORY,
        "the freed 1 GiB stays cached in the device's graph memory pool, charged, until trimmed",
    );
    expect("trim", "0", "cuDeviceGraphMemTrim");
    expect(
        "big_after_held_free",
        "0",
        "its charge went back with the trim",
    );
    expect(
        "transient_launch_beside_big",
        OUT_OF_MEMORY,
        "a graph freeing its allocation still needs it while it runs",
    );
    expect("transient_launch_alone", "0", "fits alone");
    expect(
        "big_after_transient",
        "0",
        "an allocation the graph frees itself is not held after its launch",
    );
    expect("keeper_launch", "0", "fits alone");
    expect(
        "freer_launch_captured",
        "0",
        "a launch into a capture is recorded",
    );
    expect("freer_capture_end", "0", "the capture ends");
    expect(
        "big_after_captured_free",
        OUT_OF_MEMORY,
        "a free recorded into a capture has not run: the keeper's 1 GiB is still held",
    );
    expect("freer_launch", "0", "launched for real");
    expect(
        "big_after_free",
        "0",
        "the keeper's allocation went back with its free",
    );
    expect("first_launch", "0", "fits alone");
    expect(
        "second_launch_beside_first",
        OUT_OF_MEMORY,
        "the first graph holds its allocation until its free node runs, 3 s after its launch",
    );
    expect(
        "second_launch_after_first",
        "0",
        "the first graph's allocation went back once its work completed",
    );
    // The refusals are logged: one line each, naming the graph launch.
    let lines: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("cuGraphLaunch") && l.contains("refused"))
        .collect();
    assert_eq!(
        lines.len(),
        3,
        "one refusal line per refused launch:\n{report}"
    );
    let refused_big: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("cuMemAlloc") && l.contains("refused"))
        .collect();
    assert!(!refused_big.is_empty(), "{report}");
    assert!(
        lines
            .iter()
            .all(|l| l.contains("1 GiB") || l.contains("1024 MiB")),
        "the refusal names the graph's allocation size:\n{report}"
    );
    // simgpu's judgement: the process never held more than its context plus the quota (an escaped
    // launch would have held 1536 + 1024 MiB), and nothing is left.
    let g = group(&stat, "g");
    let peak = g.u64("peak.0");
    assert!(
        peak <= SIM_CONTEXT + 2 * GIB,
        "simgpu saw a peak of {peak} bytes: a graph launch escaped the quota\n{stat}"
    );
    assert_eq!(stat.u64("devices.0.used"), 0, "memory left: {stat}");
}

#[test]
fn memory_nodes_of_moved_child_graphs_are_held_to_the_quota_at_launch() {
    // Without gpuslice (8 GiB device): every step succeeds.
    let (bare, _) = run_client(&GRAPH_CHILD, false);
    bare.assert_success();
    for (k, v) in bare.kv() {
        assert!(
            k == "done" || v == "0",
            "without gpuslice, {k}={v}:\n{}",
            bare.report()
        );
    }

    let (run, stat) = run_client(&GRAPH_CHILD, true);
    run.assert_success();
    let report = run.report();
    let expect = |key: &str, want: &str, why: &str| {
        assert_eq!(run.get(key), want, "{key}: {why}\n{report}");
    };
    for k in ["clone", "move", "nested_move_inner", "nested_move_outer"] {
        expect(k, "0", "building the graphs passes through");
    }
    expect(
        "moved_launch_beside_big",
        OUT_OF_MEMORY,
        "1536 MiB + the moved child's 1024 MiB exceed the 2 GiB quota: the launch is refused",
    );
    expect("moved_launch_alone", "0", "the child's 1024 MiB fit alone");
    expect(
        "big_while_held",
        OUT_OF_MEMORY,
        "the child's allocation outlives the parent's launch and stays charged",
    );
    expect("held_free", "0", "freeing the child's allocation");
    expect(
        "big_after_held_free",
        "0",
        "its charge went back with cuMemFreeAsync",
    );
    expect(
        "nested_launch_beside_big",
        OUT_OF_MEMORY,
        "an allocation two levels down, freed one level down, must fit while the graph runs",
    );
    expect("nested_launch_alone", "0", "fits alone");
    expect(
        "big_after_nested",
        "0",
        "an allocation freed inside the launched graph is not held after its launch",
    );
    let lines: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("cuGraphLaunch") && l.contains("refused"))
        .collect();
    assert_eq!(
        lines.len(),
        2,
        "one refusal line per refused launch:\n{report}"
    );
    // simgpu's judgement: never more than the context plus the quota (an escaped launch would have
    // held 1536 + 1024 MiB), and nothing left.
    let peak = group(&stat, "g").u64("peak.0");
    assert!(
        peak <= SIM_CONTEXT + 2 * GIB,
        "simgpu saw a peak of {peak} bytes: a child graph's allocation escaped the quota\n{stat}"
    );
    assert_eq!(stat.u64("devices.0.used"), 0, "memory left: {stat}");
}
