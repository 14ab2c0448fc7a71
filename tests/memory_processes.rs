//! A tenant's processes in its ledger: memory left by an exited or killed process is free when the
//! quota says so, memory spent outside any call is charged by reconciliation, one slot per process,
//! and `gpuslice status` shows each process's allocations and overhead. Judged by simgpu's own
//! counters through tests/clients/quota_overhead.c.

use gpuslice_testkit as common;

use common::memory::*;
use common::*;
use std::io::Write;
use std::path::Path;
use std::process::Command;

/// A process of tenant `tenant` waits (registered with simgpu, its context made) while `end` has
/// another process of the tenant take memory and end; then it allocates 700 MiB. The tenant never
/// holds more than its quota by simgpu's counters: what the ended process held is free, on the
/// device, by the time the quota says so. `end` describes what it did, for the messages.
fn allocate_after_a_sibling_ends(tag: &str, end: impl FnOnce(&Sim, &Path) -> String) {
    let dir = scratch(tag);
    let sim = sim(&format!("overhead-{tag}"));
    let mut waiting = sim.spawn(&mut client(
        &sim,
        Deploy::Preload,
        &dir,
        tag,
        &["leave", "700", "wait"],
    ));
    wait_for_key(&mut waiting, "ready");
    let ended = end(&sim, &dir);
    waiting.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let second = finish(waiting, "second");
    second.assert_success();
    assert_eq!(second.get("left"), "1", "{ended}\n{}", second.report());
    let peak = group_peak_on(&sim.stat(), tag, 0);
    assert!(
        peak <= QUOTA,
        "{ended}, and its memory was still held when the other allocated: {peak}\n{}",
        second.report()
    );
}

/// A driver frees what a process holds as the process ends.
#[test]
fn memory_left_by_an_exited_process_is_free_when_the_quota_says_so() {
    allocate_after_a_sibling_ends("exited", |sim, dir| {
        let first = sim.run_cmd(&mut client(
            sim,
            Deploy::Preload,
            dir,
            "exited",
            &["leave", "400"],
        ));
        first.assert_success();
        format!("a process exited holding 400 MiB\n{}", first.report())
    });
}

/// The same when the process is killed, holding what it filled: the driver frees a killed
/// process's memory as it dies, and the quota's room it held comes back no sooner.
#[test]
fn memory_of_a_killed_process_is_free_when_the_quota_says_so() {
    allocate_after_a_sibling_ends("killed", |sim, dir| {
        let mut victim = sim.spawn(&mut client(sim, Deploy::Preload, dir, "killed", &["hold"]));
        wait_for_key(&mut victim, "ready");
        victim.stdin.as_mut().unwrap().write_all(b"fill\n").unwrap();
        let filled = wait_for_key(&mut victim, "fill_bytes")["fill_bytes"].clone();
        victim.kill().unwrap();
        victim.wait().unwrap();
        // Not a timing assertion: simgpu reclaims a dead process's memory at the first
        // reservation 10 ms after its last sweep, as a driver frees it at the process's death.
        std::thread::sleep(std::time::Duration::from_millis(20));
        format!("a process was killed holding {filled} bytes of allocations")
    });
}

/// Memory the shim sees no call for (a graph's memory node, allocated when the graph is launched) is
/// charged by reconciliation before the program is next told how much memory it has.
#[test]
fn memory_spent_outside_any_call_is_charged_by_reconciliation() {
    // A memory node added to a graph, and the same made by capturing a stream-ordered allocation.
    for how in ["node", "captured"] {
        let dir = scratch("graph");
        let sim = sim("overhead-graph");
        let mut cmd = client(&sim, Deploy::Preload, &dir, "graph", &["graph", "64", how]);
        let run = sim.run_cmd(&mut cmd);
        run.assert_success();
        let kv = run.kv();
        let report = run.report();
        assert!(
            !run.stderr.contains("gpuslice"),
            "{how}: no complaint\n{report}"
        );
        let before = QUOTA - SIM_CONTEXT;
        assert_eq!(step(&kv, "before", "free"), before, "{how}\n{report}");
        assert_eq!(step(&kv, "instantiated", "free"), before, "{how}\n{report}");
        assert_eq!(
            step(&kv, "launched", "free"),
            before - 64 * MIB,
            "{how}: the graph's 64 MiB are charged\n{report}"
        );
        assert_eq!(
            step(&kv, "launched", "nvml_used"),
            SIM_CONTEXT + 64 * MIB,
            "{how}\n{report}"
        );
    }
}

/// The processes `gpuslice status --json` lists in `tenant`'s ledger under `dir` (alive or not).
fn ledger_pids(sim: &Sim, dir: &Path, tenant: &str) -> Vec<u64> {
    let mut cmd = Command::new(common::gpuslice_bin());
    cmd.args(["status", "--json", "--ledger"])
        .arg(dir.join(format!("{tenant}.ledger")))
        .env("GPUSLICE_DEVICE_DIR", dir.join("devices"));
    let run = sim.run_cmd(&mut cmd);
    run.assert_success();
    let doc = parse_json(&run.stdout).unwrap_or_else(|e| panic!("{e}\n{}", run.report()));
    let Json::Array(processes) = doc.at("memory.processes") else {
        panic!("no memory.processes in {}", run.stdout)
    };
    processes.iter().map(|p| p.u64("pid")).collect()
}

/// A process takes one of its tenant's ledger slots (256), however many of gpuslice's libraries it
/// loads (the drop-in libcuda and libnvidia-ml each carry the library), and only once it charges
/// something: an NVML-only program (a monitoring tool) takes none.
fn one_slot_per_process(deploy: Deploy) {
    let dir = scratch("slots");
    let sim = sim("overhead-slots");
    // A program using both libraries (its context charged): one entry.
    let mut holder = sim.spawn(&mut client(&sim, deploy, &dir, "slots", &["hold"]));
    let pid: u64 = wait_for_key(&mut holder, "ready")["pid"].parse().unwrap();
    assert_eq!(ledger_pids(&sim, &dir, "slots"), vec![pid], "{deploy:?}");
    // A tool reading NVML only, run to its end beside it: it leaves no entry, alive or dead.
    let viewer = nvml_view(&sim, deploy, &dir, "slots");
    assert_eq!(viewer.get_u64("total"), QUOTA, "{}", viewer.report());
    assert_eq!(
        viewer.get("procs"),
        format!("{pid}:{SIM_CONTEXT}"),
        "{}",
        viewer.report()
    );
    assert_eq!(ledger_pids(&sim, &dir, "slots"), vec![pid], "{deploy:?}");
    finish(holder, "holder").assert_success();
}

in_every_deployment!(
    one_slot_per_process:
    one_slot_per_process_preloaded,
    one_slot_per_process_dropin,
    one_slot_per_process_mixed
);

/// `gpuslice status` shows each process's allocations and driver overhead apart: a process that
/// loads a module, raises its limits and fills its quota is shown with what it allocated and what
/// the driver spent for it, both as simgpu counts them (its used memory less the allocations).
#[test]
fn status_shows_allocations_and_overhead_per_process() {
    let dir = scratch("status");
    let sim = sim("overhead-status");
    let mut holder = sim.spawn(&mut client(
        &sim,
        Deploy::Preload,
        &dir,
        "shown",
        &["hold", "20", "72", "1536"],
    ));
    let pid = wait_for_key(&mut holder, "ready")["pid"].clone();
    holder.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let kv = wait_for_key(&mut holder, "held_procs3_sum");
    let fill: u64 = kv["fill_bytes"].parse().unwrap();
    let nvml_used: u64 = kv["held_procs3_mine"].parse().unwrap();
    let real = process_used_on(&sim.stat(), &pid, 0);
    let ledger = dir.join("shown.ledger");
    let status = |json: bool| {
        let mut cmd = Command::new(common::gpuslice_bin());
        cmd.arg("status").arg("--ledger").arg(&ledger);
        if json {
            cmd.arg("--json");
        }
        let run = sim.run_cmd(cmd.env("GPUSLICE_DEVICE_DIR", dir.join("devices")));
        run.assert_success();
        run.stdout
    };
    let text = status(true);
    let doc = parse_json(&text).unwrap_or_else(|e| panic!("status --json: {e}\n{text}"));
    let Json::Array(processes) = doc.at("memory.processes") else {
        panic!("no memory.processes in {text}")
    };
    let me = processes
        .iter()
        .find(|p| p.u64("pid").to_string() == pid)
        .unwrap_or_else(|| panic!("process {pid} not in {text}"));
    let (used, allocations, overhead) = (
        me.u64("used.0.bytes"),
        me.u64("allocations.0.bytes"),
        me.u64("overhead.0.bytes"),
    );
    assert_eq!(
        used, real,
        "used is simgpu's figure for the process: {text}"
    );
    assert_eq!(used, nvml_used, "and NVML's: {text}");
    assert_eq!(
        allocations, fill,
        "allocations are what it allocated: {text}"
    );
    assert_eq!(
        overhead,
        real - fill,
        "overhead is what simgpu spent beyond the allocations: {text}"
    );
    let spent = SIM_CONTEXT + 20 * MIB + 64 * MIB + 512 * THREADS;
    assert!(
        near(overhead, spent),
        "overhead {overhead}: the context, module and limits cost {spent}: {text}"
    );
    // The table shows the same figures in their own columns.
    let table = status(false);
    let row = table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(pid.as_str()))
        .unwrap_or_else(|| panic!("process {pid} not in the table:\n{table}"));
    let header = table
        .lines()
        .find(|l| l.contains("allocations") && l.contains("overhead"))
        .unwrap_or_else(|| panic!("no allocations/overhead columns:\n{table}"));
    assert!(
        header.find("allocations") < header.find("overhead"),
        "{table}"
    );
    let figures: Vec<&str> = row.split_whitespace().skip(2).collect();
    assert_eq!(
        figures,
        [
            gpuslice::config::format_bytes(allocations),
            gpuslice::config::format_bytes(overhead),
            gpuslice::config::format_bytes(used),
        ]
        .iter()
        .flat_map(|f| f.split_whitespace())
        .collect::<Vec<_>>(),
        "{table}"
    );
    finish(holder, "holder").assert_success();
}
