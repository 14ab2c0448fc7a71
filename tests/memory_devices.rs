//! Memory quotas on several devices: contexts, allocations, pools and streams are charged on the
//! device they belong to, whichever device is current. Judged by simgpu's own counters through
//! tests/clients/quota_overhead.c, preloaded and through the drop-in libraries.

use gpuslice_testkit as common;

use common::memory::*;
use common::*;
use std::collections::BTreeMap;

/// Each device's context is measured on that device: a process with contexts on two GPUs (device
/// 0's measured first, and 256 MiB allocated there before device 1's context) is charged each
/// one's cost on its own device, and nothing of device 0's usage on device 1.
#[test]
fn contexts_on_two_devices_are_each_charged_on_their_device() {
    for deploy in [Deploy::Preload, Deploy::Dropin] {
        let dir = scratch("two-devices");
        let sim = sim("overhead-two").env("SIMGPU_DEVICES", "2");
        let mut holder = sim.spawn(&mut client(&sim, deploy, &dir, "two", &["second"]));
        let pid = wait_for_key(&mut holder, "ready")["pid"].clone();
        let stat = sim.stat();
        let Json::Array(procs) = stat.at("processes") else {
            panic!("simgpu-stat: no processes in {stat}")
        };
        let process = procs
            .iter()
            .find(|p| p.u64("pid").to_string() == pid)
            .unwrap_or_else(|| panic!("process {pid} not in {stat}"));
        let real = [process.u64("used.0") - 256 * MIB, process.u64("used.1")];
        let ledger = gpuslice::ledger::Ledger::open_readonly(&dir.join("two.ledger"))
            .expect("the tenant's ledger");
        let snapshot = ledger.snapshot();
        let mut charged: Vec<u64> = snapshot
            .processes
            .iter()
            .find(|p| p.pid.to_string() == pid)
            .unwrap_or_else(|| panic!("process {pid} not in the ledger: {snapshot:?}"))
            .overhead
            .iter()
            .map(|&(_, bytes)| bytes)
            .collect();
        charged.sort_unstable();
        drop(holder.stdin.take());
        finish(holder, "holder").assert_success();
        for used in real {
            assert!(
                near(used, SIM_CONTEXT),
                "{deploy:?}: simgpu holds one context per device ({real:?})"
            );
        }
        assert_eq!(
            charged.len(),
            2,
            "{deploy:?}: overhead on both devices ({charged:?}, simgpu {real:?})"
        );
        for bytes in &charged {
            assert!(
                near(*bytes, SIM_CONTEXT),
                "{deploy:?}: each device charged its context ({charged:?}, simgpu {real:?})"
            );
        }
    }
}

/// A context handle the driver gives again to a context on another device: a thread that used the
/// old context and makes the new one current has its allocation charged on the new context's device
/// (simgpu gives a destroyed context's handle to the next one created).
#[test]
fn a_context_handle_given_again_is_charged_on_its_new_device() {
    for deploy in [Deploy::Preload, Deploy::Dropin] {
        let dir = scratch("reused-handle");
        let sim = sim("overhead-reused").env("SIMGPU_DEVICES", "2");
        let run = sim.run_cmd(&mut client(&sim, deploy, &dir, "reused", &["reused", "64"]));
        run.assert_success();
        let report = run.report();
        assert_eq!(run.get("same_handle"), "1", "{deploy:?}\n{report}");
        assert_eq!(
            run.get_u64("free1"),
            QUOTA - SIM_CONTEXT - 64 * MIB,
            "{deploy:?}: device 1 holds its context and the 64 MiB\n{report}"
        );
        assert_eq!(
            run.get_u64("free0"),
            QUOTA - SIM_CONTEXT,
            "{deploy:?}: device 0 holds its primary context only\n{report}"
        );
    }
}

/// Runs the client's two-device `mode` (`peerpool`, `peerstream`) as a process of a tenant with
/// 4 GiB on device 0 and 1 GiB on device 1, until it reports `ready`; returns what it printed and
/// what simgpu says the process holds on devices 0 and 1.
fn held_on_two_devices(deploy: Deploy, mode: &str) -> (BTreeMap<String, String>, u64, u64) {
    let dir = scratch(mode);
    let sim = sim(&format!("overhead-{mode}")).env("SIMGPU_DEVICES", "2");
    let mut cmd = client(&sim, deploy, &dir, "peer", &[mode]);
    let mut holder = sim.spawn(cmd.env("GPUSLICE_MEMORY_LIMIT", "0=4GiB,1=1GiB"));
    let kv = wait_for_key(&mut holder, "ready");
    let stat = sim.stat();
    let Json::Array(procs) = stat.at("processes") else {
        panic!("simgpu-stat: no processes in {stat}")
    };
    let process = procs
        .iter()
        .find(|p| p.u64("pid").to_string() == kv["pid"])
        .unwrap_or_else(|| panic!("{deploy:?}: {kv:?}: not in {stat}"));
    let held = (process.u64("used.0"), process.u64("used.1"));
    drop(holder.stdin.take());
    finish(holder, "holder").assert_success();
    (kv, held.0, held.1)
}

/// After [`held_on_two_devices`]: device 1 held to its 1 GiB by simgpu's counters, the client's
/// 64 MiB blocks (`blocks` in its output) up to that quota beside the context, and device 0 charged
/// its context only.
fn assert_device1_held_to_its_quota(
    report: &str,
    kv: &BTreeMap<String, String>,
    blocks: &str,
    on_device1: u64,
) {
    assert!(
        on_device1 <= QUOTA,
        "{report}: simgpu holds {on_device1} on device 1, past its 1 GiB quota"
    );
    assert_eq!(
        kv[blocks].parse::<u64>().unwrap(),
        (QUOTA - SIM_CONTEXT) / (64 * MIB),
        "{report}: blocks up to device 1's quota"
    );
    let used0: u64 = kv["used0"].parse().unwrap();
    assert!(
        near(used0, SIM_CONTEXT),
        "{report}: device 0 is charged {used0}, its context costs {SIM_CONTEXT}"
    );
}

/// A pool on another device than the current context's (NVIDIA: `cuMemAllocFromPoolAsync`'s pool
/// "may be from a device different than that of the specified stream"): its memory is charged to the
/// pool's device, whose quota holds by simgpu's counters, and nothing to the current context's.
#[test]
fn a_pool_on_another_device_is_charged_to_that_device() {
    for deploy in [Deploy::Preload, Deploy::Dropin] {
        // Room on device 0 (the current context's) for everything device 1's pool could take.
        let (kv, _, on_device1) = held_on_two_devices(deploy, "peerpool");
        let report = format!("{deploy:?}: {kv:?}");
        assert_eq!(kv["default_rc"], "2", "{report}: device 1's default pool");
        assert_device1_held_to_its_quota(&report, &kv, "pool_blocks", on_device1);
    }
}

/// `cuMemAllocAsync` on a stream of another device than the current context's (NVIDIA: the memory
/// comes from "the current mempool of the provided stream's device"): charged to the stream's
/// device, whose quota holds by simgpu's counters, and nothing to the current context's.
#[test]
fn a_stream_of_another_device_allocates_on_that_device() {
    for deploy in [Deploy::Preload, Deploy::Dropin] {
        let (kv, on_device0, on_device1) = held_on_two_devices(deploy, "peerstream");
        let report = format!("{deploy:?}: {kv:?}");
        assert!(
            near(on_device0, SIM_CONTEXT),
            "{report}: simgpu holds {on_device0} on device 0, its context costs {SIM_CONTEXT}"
        );
        assert_device1_held_to_its_quota(&report, &kv, "stream_blocks", on_device1);
    }
}
