//! The graph memory pool's cache (docs/MEMORY.md, "Graph memory"): graph memory freed by a graph's
//! free node stays reserved in the device's graph memory pool until `cuDeviceGraphMemTrim`, and stays
//! charged until then. Judged by simgpu's per-process used memory against the ledger's charge for
//! the process, through a C client (tests/clients/graph_pool.c) that never asks `cuMemGetInfo`, so
//! what is judged is what graph launches and trims were charged, not what reconciliation found.

use gpuslice_testkit as common;

use common::*;
use std::io::Write;
use std::path::Path;
use std::process::Child;

/// The driver reserves device memory in 2 MiB pages: charges are exact to one of them.
const GRANULE: u64 = 2 * MIB;

/// What a process of `tenant` is charged in the ledger (allocations and driver overhead).
fn charged(dir: &Path, tenant: &str, pid: &str) -> u64 {
    total(&ledger_process(&dir.join(format!("{tenant}.ledger")), pid).used)
}

fn go(child: &mut Child) {
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
}

/// After a graph that allocates and frees 512 MiB runs, simgpu's figure for the process keeps the
/// pool's 512 MiB and so does the charge: a 1536 MiB allocation does not fit the 2 GiB quota. After
/// the trim both fall by 512 MiB and it fits; relaunches take their memory from the pool again. A
/// graph allocation freed with `cuMemFree` stays charged, as the pool's cache, until a trim.
#[test]
fn the_graph_memory_pools_cache_is_charged_until_trimmed() {
    let dir = scratch_dir("graph_pool", "cache");
    let sim = Sim::new("graph-pool").env("SIMGPU_MEMORY", "8GiB");
    let mut cmd = sim.command(compile(&GRAPH_POOL));
    cmd.args(["512", "1536"])
        .env("LD_PRELOAD", libgpuslice())
        .env("GPUSLICE_MEMORY_LIMIT", "2GiB")
        .env("GPUSLICE_TENANT", "pool")
        .env("GPUSLICE_LEDGER", dir.join("pool.ledger"))
        .env("GPUSLICE_DEVICE_DIR", dir.join("devices"))
        .env("SIMGPU_GROUP", "pool");
    let mut child = sim.spawn(&mut cmd);
    let agree = |what: &str, pid: &str| -> u64 {
        let used = process_used_on(&sim.stat(), pid, 0);
        let charge = charged(&dir, "pool", pid);
        assert!(
            used.abs_diff(charge) <= GRANULE,
            "{what}: simgpu holds {used} bytes for the process, the ledger charges {charge}"
        );
        used
    };

    let kv = wait_for_key(&mut child, "launched");
    let pid = kv["pid"].clone();
    let cached = agree("after a launch that freed its 512 MiB", &pid);
    go(&mut child);
    let kv = wait_for_key(&mut child, "big_cached");
    assert_eq!(
        kv["big_cached"], "2",
        "the pool's 512 MiB are charged: 1536 MiB more exceed the 2 GiB quota"
    );
    go(&mut child);
    let kv = wait_for_key(&mut child, "trimmed");
    assert_eq!(kv["trim"], "0");
    let trimmed = agree("after cuDeviceGraphMemTrim", &pid);
    assert!(
        cached >= trimmed + 512 * MIB,
        "the trim gave the pool's 512 MiB back to simgpu: {cached} -> {trimmed}"
    );
    go(&mut child);
    let kv = wait_for_key(&mut child, "relaunched");
    assert_eq!(kv["big_trimmed"], "0", "after the trim 1536 MiB fit");
    assert_eq!(kv["relaunch"], "0");
    agree("after two more launches (the second from the pool)", &pid);
    go(&mut child);
    let kv = wait_for_key(&mut child, "done");
    assert_eq!(kv["trim2"], "0");
    let before_kept = agree("after a second trim", &pid);
    go(&mut child);
    // A graph allocation freed with cuMemFree goes to the pool's cache: simgpu keeps it, and the
    // charge keeps it at once (nothing synchronises, launches or trims after the free).
    let kv = wait_for_key(&mut child, "freed_outside");
    assert_eq!(kv["free_outside"], "0");
    let kept = agree("after cuMemFree of a graph allocation", &pid);
    assert!(
        kept >= before_kept + 256 * MIB,
        "simgpu keeps the freed 256 MiB in the pool's cache: {before_kept} -> {kept}"
    );
    go(&mut child);
    let kv = wait_for_key(&mut child, "trimmed3");
    assert_eq!(kv["trim3"], "0");
    agree("after a third trim", &pid);
    go(&mut child);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
