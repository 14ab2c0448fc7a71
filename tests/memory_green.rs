//! Green contexts (CUDA 12.4+) under a quota: a C client (tests/clients/green_context.c) calling
//! `cuGreenCtxCreate` and its family links against, and runs through, the drop-in and the preloaded
//! library; the primary context each green context retains is charged once, and given back when
//! the last of them and the program's own reference go. Judged by simgpu's counters.

use gpuslice_testkit as common;

use common::memory::{tenant_command, Deploy, GRANULE, QUOTA, SIM_CONTEXT};
use common::*;
use std::io::Write;
use std::path::Path;
use std::process::Command;

/// The client as a process of tenant `t` (quota 1 GiB, ledger and device directory in `dir`).
fn client(sim: &Sim, deploy: Deploy, dir: &Path, args: &[&str]) -> Command {
    tenant_command(compile(&GREEN_CONTEXT), sim, deploy, dir, "t", args)
}

/// The driver overhead the process published in the tenant's ledger.
fn ledger_overhead(dir: &Path, pid: &str) -> u64 {
    total(&ledger_process(&dir.join("t.ledger"), pid).overhead)
}

fn green_contexts_retain_the_primary_context_charged_once(deploy: Deploy, n: usize) {
    let sim = Sim::new("green").env("SIMGPU_MEMORY", "4GiB");
    let dir = sim.dir.join("tenant");
    std::fs::create_dir_all(&dir).unwrap();
    let n_arg = n.to_string();
    let mut child = sim.spawn(&mut client(&sim, deploy, &dir, &["green", &n_arg]));
    let kv = wait_for_key(&mut child, "ready");
    let pid = kv["pid"].clone();
    assert_eq!(kv["stream_green_ok"], "1", "{deploy:?}: {kv:?}");
    assert_eq!(kv["stream_ctx_ok"], "1", "{deploy:?}: {kv:?}");
    // simgpu spent one primary context for the process, whatever the number of green contexts.
    let used = process_used_on(&sim.stat(), &pid, 0);
    assert_eq!(used, SIM_CONTEXT, "{deploy:?}, {n} green contexts");
    let overhead = ledger_overhead(&dir, &pid);
    assert!(
        overhead.abs_diff(SIM_CONTEXT) <= GRANULE,
        "{deploy:?}, {n} green contexts: the primary context charged {overhead} bytes, it cost \
         {SIM_CONTEXT}"
    );
    let free0: u64 = kv["free0"].parse().unwrap();
    assert!(
        free0.abs_diff(QUOTA - SIM_CONTEXT) <= GRANULE,
        "{deploy:?}: cuMemGetInfo shows {free0} free beside the primary context ({kv:?})"
    );
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let kv = wait_for_key(&mut child, "ready2");
    let fill: u64 = kv["fill_bytes"].parse().unwrap();
    assert!(
        fill <= QUOTA - SIM_CONTEXT && fill + GRANULE >= QUOTA - SIM_CONTEXT,
        "{deploy:?}, {n} green contexts: {fill} allocated beside a {SIM_CONTEXT}-byte primary \
         context under a {QUOTA}-byte quota"
    );
    assert_eq!(kv["primary_active"], "0", "{deploy:?}: {kv:?}");
    // The last green context and the program's reference gone: so is the charge.
    assert_eq!(process_used_on(&sim.stat(), &pid, 0), 0, "{deploy:?}");
    assert_eq!(ledger_overhead(&dir, &pid), 0, "{deploy:?}");
    drop(child.stdin.take());
    let run = finish(child, "green client");
    run.assert_success();
}

#[test]
fn a_green_context_through_the_preloaded_library_charges_its_primary_context_once() {
    green_contexts_retain_the_primary_context_charged_once(Deploy::Preload, 1);
    green_contexts_retain_the_primary_context_charged_once(Deploy::Preload, 3);
}

#[test]
fn a_green_context_through_the_dropin_links_and_charges_its_primary_context_once() {
    green_contexts_retain_the_primary_context_charged_once(Deploy::Dropin, 1);
    green_contexts_retain_the_primary_context_charged_once(Deploy::Dropin, 3);
}
