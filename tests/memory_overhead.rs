//! Memory quotas at the device's real cost: contexts, module code and context limits are charged
//! what the driver spent on them, and every view of memory agrees with the charge. Judged by
//! simgpu's own counters (per-process and per-group used memory, which is what a GPU holds) through
//! a C client (tests/clients/quota_overhead.c) in preload, drop-in and mixed deployments.

use gpuslice_testkit as common;

use common::memory::*;
use common::*;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

#[test]
fn free_contexts_leave_the_whole_quota() {
    for n in [1, 3] {
        let dir = scratch("free-contexts");
        let sim = sim("overhead-free").env("SIMGPU_CONTEXT_MEMORY", "0");
        let results = fill_in_turn(&sim, Deploy::Preload, &dir, "free", n, &[]);
        let filled: u64 = results.iter().map(|r| r.0).sum();
        assert!(
            filled + GRANULE >= QUOTA && filled <= QUOTA,
            "{n} process(es) with free contexts: {filled} bytes allocated of a {QUOTA}-byte quota \
             ({results:?})"
        );
        for (fill, shown, real, _) in &results {
            assert_eq!(shown, real, "shown usage is simgpu's ({results:?})");
            assert_eq!(
                fill, real,
                "nothing charged beyond the allocations ({results:?})"
            );
        }
        assert!(group_peak_on(&sim.stat(), "free", 0) <= QUOTA);
    }
}

/// Each allocation is charged what the driver spends on it at least: its size rounded up to the
/// 256 bytes every allocation is aligned to (CUDA C++ Programming Guide, "Device Memory Accesses";
/// simgpu spends that). One-byte allocations fill the last MiB of the quota 4096 at a time, and
/// never take the tenant past it.
#[test]
fn small_allocations_are_charged_the_driver_alignment() {
    for deploy in [Deploy::Preload, Deploy::Dropin] {
        let dir = scratch("tiny");
        let sim = sim("overhead-tiny").env("SIMGPU_CONTEXT_MEMORY", "0");
        let run = sim.run_cmd(&mut client(&sim, deploy, &dir, "tiny", &["tiny", "1"]));
        run.assert_success();
        let report = run.report();
        assert_eq!(run.get_u64("tiny"), MIB / 256, "{deploy:?}\n{report}");
        assert_eq!(run.get_u64("tiny_free"), 0, "{deploy:?}\n{report}");
        assert!(
            group_peak_on(&sim.stat(), "tiny", 0) <= QUOTA,
            "{deploy:?}: simgpu's peak passed the quota\n{report}"
        );
    }
}

/// Whether another process holds the per-device measurement lock file `path` now (probed with a
/// lock of our own, at once given back).
fn measurement_locked(path: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    // SAFETY: flock on a descriptor we own; LOCK_NB never blocks.
    let taken = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    if taken {
        // SAFETY: as above.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
    }
    !taken
}

/// A context measured while another tenant allocates: NVML lists a process once it has a context,
/// here holding nothing (contexts cost 0), so the context is charged its own figure, nothing,
/// whatever the device's used memory did meanwhile. (The device-wide figure would charge it the
/// other tenant's allocation; simgpu used to leave a process holding nothing out of the list.)
#[test]
fn a_context_is_not_charged_what_another_tenant_allocates_meanwhile() {
    for deploy in [Deploy::Preload, Deploy::Dropin] {
        let dir = scratch("ctx-meanwhile");
        let sim = sim("overhead-meanwhile").env("SIMGPU_CONTEXT_MEMORY", "0");
        let mut other = sim.spawn(&mut client(&sim, deploy, &dir, "other", &["hold"]));
        wait_for_key(&mut other, "ready");
        let lock = std::fs::read_dir(dir.join("devices"))
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "measure"))
            .expect("the device's measurement lock file, made by the first context");
        // Its context takes 3 s to create, measured under the device's lock.
        let slow = sim.spawn(
            client(&sim, deploy, &dir, "slow", &["views"])
                .env("SIMGPU_CONTEXT_CREATE_US", "3000000"),
        );
        while !measurement_locked(&lock) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        other.stdin.as_mut().unwrap().write_all(b"fill\n").unwrap();
        let filled = wait_for_key(&mut other, "fill_bytes");
        let run = finish(slow, "slow");
        finish(other, "other").assert_success();
        run.assert_success();
        let report = run.report();
        assert_eq!(filled["fill_bytes"], QUOTA.to_string(), "{report}");
        assert_eq!(
            run.get_u64("ctx_free"),
            QUOTA,
            "{deploy:?}: a context that costs nothing is charged nothing\n{report}"
        );
    }
}

#[test]
fn contexts_are_charged_what_they_cost() {
    for deploy in [Deploy::Preload, Deploy::Dropin] {
        for n in [1, 3] {
            let dir = scratch("contexts");
            let sim = sim("overhead-contexts");
            let results = fill_in_turn(&sim, deploy, &dir, "ctx", n, &[]);
            let filled: u64 = results.iter().map(|r| r.0).sum();
            let want = QUOTA - n as u64 * SIM_CONTEXT;
            assert!(
                filled <= want && filled + n as u64 * GRANULE >= want,
                "{deploy:?}, {n} process(es): {filled} allocated, want {want} \
                 (each context charged its 300 MiB): {results:?}"
            );
            for (fill, shown, real, overhead) in &results {
                assert_eq!(
                    shown, real,
                    "{deploy:?}: shown usage is simgpu's ({results:?})"
                );
                assert!(
                    near(real - fill, SIM_CONTEXT),
                    "{deploy:?}: a process's overhead is its context ({results:?})"
                );
                assert_eq!(
                    *overhead,
                    real - fill,
                    "{deploy:?}: the ledger shows overhead and allocations apart ({results:?})"
                );
            }
            assert!(
                group_peak_on(&sim.stat(), "ctx", 0) <= QUOTA,
                "{deploy:?}: the tenant passed its quota by simgpu's counters"
            );
        }
    }
}

/// A context the quota has no room for is refused before the driver creates it: with three 300 MiB
/// contexts of a 1 GiB tenant held, a fourth process's context is refused, and by simgpu's own
/// counters the tenant never held more than its quota (the driver never spent the fourth's 300 MiB
/// to have it taken back).
#[test]
fn a_context_without_room_is_refused_before_the_driver_spends_it() {
    for deploy in [Deploy::Preload, Deploy::Dropin] {
        let dir = scratch("context-refused");
        let sim = sim("overhead-context-refused");
        let mut holders: Vec<_> = (0..3)
            .map(|_| {
                let mut h = sim.spawn(&mut client(&sim, deploy, &dir, "full", &["hold"]));
                wait_for_key(&mut h, "ready");
                h
            })
            .collect();
        let fourth = sim.run_cmd(&mut client(&sim, deploy, &dir, "full", &["hold"]));
        fourth.assert_failure();
        assert!(
            fourth.stdout.contains("error=cuCtxCreate") && fourth.stdout.contains("rc=2"),
            "{deploy:?}: the fourth context is refused (out of memory)\n{}",
            fourth.report()
        );
        let peak = group_peak_on(&sim.stat(), "full", 0);
        assert!(
            peak <= QUOTA,
            "{deploy:?}: the tenant held {peak} bytes by simgpu's counters, more than its quota"
        );
        for h in holders.drain(..) {
            finish(h, "holder").assert_success();
        }
    }
}

/// The same when four processes create their contexts at once (each takes 100 ms): the measurement
/// lock serialises them, and each one expects what the previous ones were charged, so exactly three
/// start and the tenant never holds more than its quota by simgpu's counters.
#[test]
fn contexts_created_at_once_never_take_the_tenant_past_its_quota() {
    use std::io::BufRead;
    for deploy in [Deploy::Preload, Deploy::Dropin] {
        let dir = scratch("contexts-at-once");
        let sim = sim("overhead-contexts-at-once").env("SIMGPU_CONTEXT_CREATE_US", "100000");
        let mut children: Vec<_> = (0..4)
            .map(|_| sim.spawn(&mut client(&sim, deploy, &dir, "once", &["hold"])))
            .collect();
        // Each one either gets its context (ready=1) or ends refused.
        let started: Vec<bool> = children
            .iter_mut()
            .map(|c| {
                let out = std::io::BufReader::new(c.stdout.as_mut().expect("piped stdout"));
                out.lines()
                    .map_while(Result::ok)
                    .any(|l| l.starts_with("ready="))
            })
            .collect();
        let peak = group_peak_on(&sim.stat(), "once", 0);
        let runs: Vec<Run> = children.into_iter().map(|c| finish(c, "client")).collect();
        let report: String = runs.iter().map(Run::report).collect();
        assert_eq!(
            started.iter().filter(|s| **s).count(),
            3,
            "{deploy:?}: three 300 MiB contexts fit in 1 GiB\n{report}"
        );
        assert!(
            peak <= QUOTA,
            "{deploy:?}: the tenant held {peak} bytes by simgpu's counters\n{report}"
        );
    }
}

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

/// A context torn down (destroyed, its primary context reset, or released for the last time) takes
/// the memory allocated in it with it, without a free call: cuMemAlloc, managed, pitch and array
/// memory never freed goes back to the tenant with the context, and the whole quota is usable again.
/// A reset keeps the primary context's references: the context it re-creates goes with the last of
/// them, not the one before.
fn allocations_go_with_their_context(deploy: Deploy) {
    for how in ["destroy", "reset", "release", "rereset"] {
        let dir = scratch("torn");
        let sim = sim("overhead-torn");
        let run = sim.run_cmd(&mut client(&sim, deploy, &dir, "torn", &["torn", how]));
        run.assert_success();
        let report = run.report();
        let (before, held, after) = (
            run.get_u64("before"),
            run.get_u64("held"),
            run.get_u64("after"),
        );
        assert!(
            held < before,
            "{deploy:?} {how}: the allocations are charged\n{report}"
        );
        assert_eq!(
            after, before,
            "{deploy:?} {how}: given back with the context\n{report}"
        );
        if how == "rereset" {
            assert_eq!(
                run.get_u64("kept"),
                held,
                "{deploy:?}: the re-created context and its allocations stay charged while referenced\n{report}"
            );
        }
        assert_eq!(
            run.get_u64("fill_bytes"),
            QUOTA - SIM_CONTEXT,
            "{deploy:?} {how}\n{report}"
        );
        assert!(
            group_peak_on(&sim.stat(), "torn", 0) <= QUOTA,
            "{deploy:?} {how}\n{report}"
        );
    }
}

in_every_deployment!(
    allocations_go_with_their_context:
    allocations_go_with_their_context_preloaded,
    allocations_go_with_their_context_dropin,
    allocations_go_with_their_context_mixed
);

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

/// `cuMemCreate` sizes the driver must refuse as invalid (0, not a multiple of the granularity,
/// `SIZE_MAX`) and `cuMemAllocPitch` arguments it must refuse (an element size not 4, 8 or 16, an
/// empty extent) get the driver's own `CUDA_ERROR_INVALID_VALUE`, as without gpuslice, and no
/// quota refusal line; a valid size over the quota gets `CUDA_ERROR_OUT_OF_MEMORY`.
#[test]
fn invalid_physical_sizes_get_the_drivers_answer() {
    let dir = scratch("vmm-sizes");
    let sim = sim("overhead-vmm-sizes");
    let bare = sim.run_cmd(sim.command(compile(&QUOTA_OVERHEAD)).arg("vmmsizes"));
    bare.assert_success();
    for deploy in [Deploy::Preload, Deploy::Dropin] {
        let run = sim.run_cmd(&mut client(&sim, deploy, &dir, "sizes", &["vmmsizes"]));
        run.assert_success();
        for (key, want) in [
            ("unaligned_rc", "1"),
            ("zero_rc", "1"),
            ("size_max_rc", "1"),
            ("over_quota_rc", "2"),
            ("fits_rc", "0"),
            ("pitch_element_rc", "1"),
            ("pitch_empty_rc", "1"),
        ] {
            assert_eq!(run.get(key), want, "{deploy:?}: {key}\n{}", run.report());
        }
        for key in [
            "unaligned_rc",
            "zero_rc",
            "size_max_rc",
            "pitch_element_rc",
            "pitch_empty_rc",
        ] {
            assert_eq!(
                run.get(key),
                bare.get(key),
                "{deploy:?}: {key} as without gpuslice"
            );
        }
        let refusals = run.stderr.matches("refused").count();
        assert_eq!(
            refusals,
            1,
            "{deploy:?}: one refusal line, the over-quota one\n{}",
            run.report()
        );
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

#[test]
fn modules_and_limits_are_charged_what_they_cost() {
    let dir = scratch("module-limits");
    let sim = sim("overhead-module");
    // A 20 MiB module, a 72 MiB heap (64 MiB over the default), a 1536-byte stack (512 over).
    let results = fill_in_turn(&sim, Deploy::Preload, &dir, "mod", 1, &["20", "72", "1536"]);
    let (fill, shown, real, overhead) = results[0];
    assert_eq!(overhead, real - fill, "the ledger shows the overhead apart");
    let overhead = SIM_CONTEXT + 20 * MIB + 64 * MIB + 512 * THREADS;
    assert_eq!(shown, real, "shown usage is simgpu's");
    assert!(real <= QUOTA, "simgpu's figure {real} passed the quota");
    assert!(
        near(real - fill, overhead) && fill + GRANULE >= QUOTA - overhead,
        "allocated {fill}: the overhead {} should be {overhead} (what simgpu spent)",
        real - fill
    );
    assert!(group_peak_on(&sim.stat(), "mod", 0) <= QUOTA);
}

/// The real fatbinary with a `mib` MiB PTX entry for compute capability 10.0 appended: an image
/// far larger than what a 9.0 device loads from it (its sm_90 cubin).
fn fatbin_with_ptx_for_a_newer_device(mib: u64) -> Vec<u8> {
    let mut image = std::fs::read(fixture("kernel.fatbin")).unwrap();
    let ptx = {
        let mut text = b".version 8.0\n.target sm_100\n.address_size 64\n//".to_vec();
        text.resize((mib * MIB) as usize - 1, b'x');
        text.push(b'\n');
        text
    };
    let mut entry = Vec::new();
    entry.extend_from_slice(&1u16.to_le_bytes()); // PTX
    entry.extend_from_slice(&0x101u16.to_le_bytes());
    entry.extend_from_slice(&64u32.to_le_bytes()); // entry header size
    entry.extend_from_slice(&(ptx.len() as u64).to_le_bytes());
    entry.extend_from_slice(&[0; 12]);
    entry.extend_from_slice(&100u32.to_le_bytes()); // compute capability 10.0
    entry.extend_from_slice(&[0; 8]);
    entry.extend_from_slice(&0x11u64.to_le_bytes()); // 64-bit, Linux, not compressed
    entry.resize(64, 0);
    image.extend_from_slice(&entry);
    image.extend_from_slice(&ptx);
    let payload = (image.len() - 16) as u64;
    image[8..16].copy_from_slice(&payload.to_le_bytes());
    image
}

/// What a module needs on the device is reserved before the driver loads it: a load the quota has
/// no room for is refused without the driver ever spending the memory (simgpu's peak stays within
/// the quota), on every load path; what an image takes is what the device loads from it, not its
/// size: a fatbinary far larger than the room left loads when its cubin for the device fits.
#[test]
fn a_module_without_room_is_refused_before_the_driver_loads_it() {
    let dir = scratch("module-room");
    let sim = sim("overhead-module-room");
    let big_ptx = dir.join("big.ptx");
    let mut text = std::fs::read(fixture("kernel.compute_90.ptx")).unwrap();
    text.retain(|&b| b != 0);
    text.extend_from_slice(b"\n//");
    text.resize(text.len() + (20 * MIB) as usize, b'x');
    text.push(b'\n');
    std::fs::write(&big_ptx, &text).unwrap();
    let big_fatbin = dir.join("big.fatbin");
    std::fs::write(&big_fatbin, fatbin_with_ptx_for_a_newer_device(24)).unwrap();
    let cubin = fixture("kernel.sm_80.cubin");
    // 10 MiB of room: the 20 MiB PTX does not fit, the fatbinary's sm_90 cubin (one 2 MiB page)
    // does; then no room at all: the sm_80 cubin's page (its 256 KiB global) does not fit. A driver
    // loading eagerly spends it all at the load; lazily, at the kernel's lookup.
    for mode in ["EAGER", "LAZY"] {
        let loads = |room: &str, images: &[&Path]| {
            let mut args = vec!["modules", room];
            args.extend(images.iter().map(|p| p.to_str().unwrap()));
            let mut cmd = client(&sim, Deploy::Preload, &dir, "mods", &args);
            let run = sim.run_cmd(cmd.env("CUDA_MODULE_LOADING", mode));
            run.assert_success();
            run
        };
        let expect = |run: &Run, load: usize, fits: bool| {
            for path in ["data", "file", "library"] {
                let (load_rc, lookup_rc) = match (fits, mode) {
                    (true, _) => ("0", Some("0")),
                    (false, "EAGER") => ("2", None),
                    (false, _) => ("0", Some("2")),
                };
                let key = format!("load{load}_{path}");
                assert_eq!(
                    run.get(&format!("{key}_rc")),
                    load_rc,
                    "{mode} {key}\n{}",
                    run.report()
                );
                assert_eq!(
                    run.kv()
                        .get(&format!("{key}_lookup_rc"))
                        .map(String::as_str),
                    lookup_rc,
                    "{mode} {key}\n{}",
                    run.report()
                );
            }
            assert!(
                group_peak_on(&sim.stat(), "mods", 0) <= QUOTA,
                "{mode}: the driver was let load code the quota had no room for\n{}",
                run.report()
            );
        };
        let run = loads("10", &[&big_ptx, &big_fatbin]);
        expect(&run, 0, false);
        expect(&run, 1, true);
        let run = loads("0", &[&cubin]);
        expect(&run, 0, false);
    }
}

/// Processes of one tenant coming and going while the others allocate, load modules and change
/// limits at random, in every deployment mode: the tenant never holds more than its quota by
/// simgpu's counters, at any instant (its group's peak).
#[test]
fn processes_mixing_every_kind_of_charge_never_take_the_tenant_past_its_quota() {
    let dir = scratch("mix");
    // Every kind of step; the processes run 150 to 600 steps, so that they exit at different
    // times, holding what they hold, while the others go on.
    let kinds = "0123456789";
    for (round, deploy) in [Deploy::Preload, Deploy::Mixed, Deploy::Dropin]
        .into_iter()
        .enumerate()
    {
        let sim = sim("overhead-mix");
        let tenant = format!("mix{round}");
        let children: Vec<_> = (0..4)
            .map(|i| {
                let seed = (round * 10 + i).to_string();
                let steps = (150 * (i + 1)).to_string();
                let args = ["mix", &seed, &steps, kinds];
                sim.spawn(&mut client(&sim, deploy, &dir, &tenant, &args))
            })
            .collect();
        let runs: Vec<Run> = children.into_iter().map(|c| finish(c, "mix")).collect();
        let report: String = runs.iter().map(Run::report).collect();
        for run in &runs {
            run.assert_success();
        }
        let refused: u64 = runs
            .iter()
            .map(|r| {
                let kv = r.kv();
                let steps = kv.get("refused").and_then(|n| n.parse::<u64>().ok());
                steps.unwrap_or(0) + u64::from(kv.contains_key("context_refused"))
            })
            .sum();
        assert!(
            refused > 0,
            "{deploy:?}: the quota was never reached\n{report}"
        );
        let peak = group_peak_on(&sim.stat(), &tenant, 0);
        assert!(
            peak <= QUOTA,
            "{deploy:?}: the tenant held {peak} bytes, past its quota\n{report}"
        );
    }
}

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

/// A limit is charged what the driver maps for it, in 2 MiB pages: a heap 3 MiB over its default
/// takes 4 MiB, and is refused with 3 MiB of room, before the driver maps it.
#[test]
fn a_limit_is_charged_the_pages_the_driver_maps() {
    let dir = scratch("heapfit");
    let sim = sim("overhead-heapfit");
    for (room, rc) in [("3", "2"), ("4", "0")] {
        let tenant = format!("heapfit{room}");
        let run = sim.run_cmd(&mut client(
            &sim,
            Deploy::Preload,
            &dir,
            &tenant,
            &["heapfit", room, "11"],
        ));
        run.assert_success();
        assert_eq!(
            run.get("heap_rc"),
            rc,
            "{room} MiB of room\n{}",
            run.report()
        );
        let peak = group_peak_on(&sim.stat(), &tenant, 0);
        assert!(
            peak <= QUOTA,
            "{room} MiB of room: {peak}\n{}",
            run.report()
        );
    }
}

/// Every view agrees with the others and with the charge after each step, and the charge moves by
/// what simgpu spends at each step; another tenant's process and usage are never shown.
fn views_agree(deploy: Deploy) {
    let dir = scratch("views");
    let sim = sim("overhead-views");
    // A neighbour tenant holding memory on the same GPU.
    let mut neighbour = sim.spawn(&mut client(&sim, deploy, &dir, "other", &["hold"]));
    wait_for_key(&mut neighbour, "ready");
    let run = sim.run_cmd(&mut client(
        &sim,
        deploy,
        &dir,
        "views",
        &["steps", "10", "64", "2048"],
    ));
    finish(neighbour, "neighbour").assert_success();
    run.assert_success();
    let kv = run.kv();
    let report = run.report();
    let mut used_before = 0;
    // What each step costs the device by simgpu's model (signed).
    let stack = (2048 - 1024) * THREADS as i64;
    let costs: [i64; 10] = [
        SIM_CONTEXT as i64,
        256 * MIB as i64,
        10 * MIB as i64,
        56 * MIB as i64,
        stack,
        -256 * MIB as i64,
        -10 * MIB as i64,
        -56 * MIB as i64,
        -stack,
        0,
    ];
    for (i, cost) in costs.iter().enumerate() {
        let s = format!("s{i}");
        let total = step(&kv, &s, "total");
        let free = step(&kv, &s, "free");
        let used = step(&kv, &s, "nvml_used");
        assert_eq!(total, QUOTA, "{deploy:?} {s}: cuMemGetInfo total\n{report}");
        assert_eq!(
            step(&kv, &s, "device_total"),
            QUOTA,
            "{s}: cuDeviceTotalMem\n{report}"
        );
        assert_eq!(
            step(&kv, &s, "nvml_total"),
            QUOTA,
            "{s}: NVML total\n{report}"
        );
        // The legacy 32-bit entry points show the same (a 1 GiB quota fits in 32 bits).
        for (legacy, current) in [
            ("free_v1", free),
            ("total_v1", QUOTA),
            ("device_total_v1", QUOTA),
        ] {
            assert_eq!(
                step(&kv, &s, legacy),
                current,
                "{deploy:?} {s}: {legacy}\n{report}"
            );
        }
        assert_eq!(
            free + used,
            total,
            "{deploy:?} {s}: free + used = total\n{report}"
        );
        assert_eq!(step(&kv, &s, "nvml_free"), free, "{s}: NVML free\n{report}");
        assert_eq!(
            step(&kv, &s, "nvml2_total"),
            QUOTA,
            "{s}: NVML v2 total\n{report}"
        );
        assert_eq!(
            step(&kv, &s, "nvml2_used"),
            used,
            "{s}: NVML v2 used\n{report}"
        );
        assert_eq!(
            step(&kv, &s, "nvml2_free"),
            free,
            "{s}: NVML v2 free\n{report}"
        );
        assert_eq!(
            step(&kv, &s, "nvml2_reserved"),
            0,
            "{s}: NVML v2 reserved\n{report}"
        );
        for list in ["procs1", "procs2", "procs3"] {
            assert_eq!(
                step(&kv, &s, &format!("{list}_rc")),
                0,
                "{s} {list}\n{report}"
            );
            assert_eq!(
                step(&kv, &s, &format!("{list}_count")),
                1,
                "{deploy:?} {s}: {list} shows the tenant's one process, not its neighbour\n{report}"
            );
            assert_eq!(
                step(&kv, &s, &format!("{list}_mine")),
                used,
                "{s} {list}\n{report}"
            );
        }
        if i < 9 {
            let moved = used as i64 - used_before as i64;
            assert!(
                moved.abs_diff(*cost) <= GRANULE,
                "{deploy:?} {s}: the charge moved by {moved}, simgpu spent {cost}\n{report}"
            );
        }
        used_before = used;
    }
    assert_eq!(
        step(&kv, "s9", "free"),
        0,
        "{deploy:?}: filled to the quota\n{report}"
    );
    assert!(
        group_peak_on(&sim.stat(), "views", 0) <= QUOTA,
        "{deploy:?}\n{report}"
    );
}

in_every_deployment!(
    views_agree:
    views_agree_preloaded,
    views_agree_dropin,
    views_agree_mixed
);

#[test]
fn pool_attributes_answering_zero_do_not_loosen_the_quota() {
    let dir = scratch("pool-zero");
    let sim = sim("overhead-pool-zero").env("SIMGPU_POOL_ATTRIBUTES_ZERO", "1");
    let run = sim.run_cmd(&mut client(
        &sim,
        Deploy::Preload,
        &dir,
        "pools",
        &["async", "3"],
    ));
    run.assert_success();
    let peak = group_peak_on(&sim.stat(), "pools", 0);
    assert!(
        peak <= QUOTA,
        "simgpu's peak {peak} passed the quota:\n{}",
        run.report()
    );
    let blocks = (QUOTA - SIM_CONTEXT) / (64 * MIB);
    for r in 0..3 {
        assert_eq!(
            run.get_u64(&format!("round{r}_blocks")),
            blocks,
            "round {r}: freed blocks are usable again\n{}",
            run.report()
        );
    }
    assert!(
        run.stderr.contains("no longer believed"),
        "the impossible answer is logged:\n{}",
        run.report()
    );
}

/// A pool whose figures are not believed is charged every block the driver cannot be seen (by its
/// address) to have cut from memory the pool already had: freed blocks too small for a larger one
/// do not let the larger one in for free, while smaller ones are still served from them. Near the
/// quota such a pool is trimmed to nothing, after which it holds only its outstanding blocks.
#[test]
fn pool_attributes_answering_zero_do_not_let_larger_blocks_pass_the_quota() {
    let dir = scratch("pool-zero-sizes");
    let sim = sim("overhead-pool-zero-sizes").env("SIMGPU_POOL_ATTRIBUTES_ZERO", "1");
    let run = sim.run_cmd(&mut client(
        &sim,
        Deploy::Preload,
        &dir,
        "pools",
        &["mixedasync", "64", "600", "20"],
    ));
    run.assert_success();
    let report = run.report();
    let peak = group_peak_on(&sim.stat(), "pools", 0);
    assert!(
        peak <= QUOTA,
        "simgpu's peak {peak} passed the quota:\n{report}"
    );
    let room = QUOTA - SIM_CONTEXT;
    assert_eq!(run.get_u64("blocks_64"), room / (64 * MIB), "{report}");
    // The freed 64 MiB blocks cannot serve 600: the pool, trimmed to its outstanding blocks
    // (none) to make room, is charged nothing more, and one 600 MiB block fits.
    assert_eq!(run.get_u64("blocks_600"), 1, "{report}");
    assert!(
        run.get_u64("blocks_20") >= 3 * (room / (64 * MIB)),
        "20 MiB blocks cut from the freed 64 MiB ones\n{report}"
    );
}

/// A block freed on a stream still busy stays in its pool until the stream reaches the free: a pool
/// whose figures are not believed is trimmed to its outstanding blocks only once the streams of its
/// frees have been waited for, so a block on another stream never slips in beside the freed one.
#[test]
fn a_free_still_pending_on_another_stream_is_waited_for() {
    for zero in ["0", "1"] {
        let dir = scratch("pending-free");
        let sim = sim("overhead-pending-free").env("SIMGPU_POOL_ATTRIBUTES_ZERO", zero);
        let run = sim.run_cmd(&mut client(
            &sim,
            Deploy::Preload,
            &dir,
            "pools",
            &["pendingfree"],
        ));
        run.assert_success();
        let report = run.report();
        if zero == "1" {
            // Made room for by waiting for the free. (With the driver's figures, the pool has
            // nothing idle to trim until the free runs: refused, as on a GPU of the quota's size,
            // unless the free ran first.)
            assert_eq!(
                run.get("second_rc"),
                "0",
                "it fits once the free ran\n{report}"
            );
        }
        let peak = group_peak_on(&sim.stat(), "pools", 0);
        assert!(peak <= QUOTA, "zero={zero}: peak {peak}\n{report}");
    }
}

/// A stream destroyed before its free ran cannot be waited for: once everything has run, the pool
/// (whose figures are not believed) serves an allocation at the latest at the second asking.
#[test]
fn a_free_on_a_stream_destroyed_since_is_counted_once_it_ran() {
    let dir = scratch("pending-destroyed");
    let sim = sim("overhead-pending-destroyed").env("SIMGPU_POOL_ATTRIBUTES_ZERO", "1");
    let run = sim.run_cmd(&mut client(
        &sim,
        Deploy::Preload,
        &dir,
        "pools",
        &["pendingfree", "destroyed"],
    ));
    run.assert_success();
    let report = run.report();
    assert_eq!(run.get("after_destroyed_rc"), "0", "{report}");
    assert!(group_peak_on(&sim.stat(), "pools", 0) <= QUOTA, "{report}");
}

/// A pool destroyed while a block of it is still allocated lives on until that block is freed
/// (NVIDIA's `cuMemPoolDestroy`), charged: its 600 MiB leave no room for another 600 until then.
#[test]
fn a_pool_destroyed_with_a_block_allocated_stays_charged_until_it_is_freed() {
    for zero in ["0", "1"] {
        let dir = scratch("pool-destroy");
        let sim = sim("overhead-pool-destroy").env("SIMGPU_POOL_ATTRIBUTES_ZERO", zero);
        let run = sim.run_cmd(&mut client(
            &sim,
            Deploy::Preload,
            &dir,
            "pools",
            &["pooldestroy"],
        ));
        run.assert_success();
        let report = run.report();
        assert_eq!(run.get("after_destroy_rc"), "2", "out of memory\n{report}");
        assert_eq!(run.get("after_free_rc"), "0", "{report}");
        assert!(group_peak_on(&sim.stat(), "pools", 0) <= QUOTA, "{report}");
    }
}

#[test]
fn a_pool_serves_smaller_blocks_from_the_memory_it_holds() {
    // Blocks of one size freed (stream-ordered, not synchronised) and then smaller ones asked for,
    // as a caching allocator does: the pool serves them from the memory it holds, so the whole
    // quota is usable whatever the sizes.
    let dir = scratch("pool-sizes");
    let sim = sim("overhead-pool-sizes");
    let run = sim.run_cmd(&mut client(
        &sim,
        Deploy::Preload,
        &dir,
        "sizes",
        &["mixedasync", "128", "20", "2"],
    ));
    run.assert_success();
    let room = QUOTA - SIM_CONTEXT;
    for mib in [128, 20, 2] {
        assert_eq!(
            run.get_u64(&format!("blocks_{mib}")),
            room / (mib * MIB),
            "{mib} MiB blocks after larger ones were freed\n{}",
            run.report()
        );
    }
    let peak = group_peak_on(&sim.stat(), "sizes", 0);
    assert!(
        peak <= QUOTA,
        "simgpu's peak {peak} passed the quota:\n{}",
        run.report()
    );
}

/// A limit's default memory is the context's: a stack lowered below its default and raised again,
/// and a heap raised while the stack is below its default, are each charged what they take beyond
/// their defaults, which is what simgpu spends (by its per-process counter), and the rest of the
/// quota stays usable.
#[test]
fn limits_are_charged_beyond_their_defaults() {
    let dir = scratch("limits");
    let sim = sim("overhead-limits");
    let mut child = sim.spawn(&mut client(
        &sim,
        Deploy::Preload,
        &dir,
        "limits",
        &["limits", "s512", "s1536", "s768", "h134217728"],
    ));
    let kv = wait_for_key(&mut child, "limits_set");
    let simgpu_used = process_used_on(&sim.stat(), &kv["pid"], 0);
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let run = finish(child, "limits");
    run.assert_success();
    let beyond_stack = |bytes: u64| bytes.saturating_sub(1024) * THREADS;
    let heap = 120 * MIB;
    let expected = [
        beyond_stack(512),
        beyond_stack(1536),
        beyond_stack(768),
        beyond_stack(768) + heap,
    ];
    for (i, overhead) in expected.iter().enumerate() {
        let used = step(&kv, &format!("limit{i}"), "nvml2_used");
        assert!(
            near(used, SIM_CONTEXT + overhead),
            "step {i}: charged {used}, simgpu's model spends {}\n{}",
            SIM_CONTEXT + overhead,
            run.report()
        );
    }
    let charged = step(&kv, "limit3", "nvml2_used");
    assert!(
        near(charged, simgpu_used),
        "charged {charged}, simgpu's counter says the process holds {simgpu_used}\n{}",
        run.report()
    );
    assert!(
        near(run.get_u64("fill_bytes"), QUOTA - simgpu_used),
        "the rest of the quota is usable\n{}",
        run.report()
    );
    assert!(
        group_peak_on(&sim.stat(), "limits", 0) <= QUOTA,
        "{}",
        run.report()
    );
}

#[test]
fn a_malloc_heap_beyond_the_quota_is_refused_before_the_driver_reserves_it() {
    let dir = scratch("heap");
    // A device with room for the heap: only the quota can refuse it.
    let sim = Sim::new("overhead-heap").env("SIMGPU_MEMORY", "16GiB");
    let run = sim.run_cmd(&mut client(
        &sim,
        Deploy::Preload,
        &dir,
        "heap",
        &["steps", "10", "8192", "1024"],
    ));
    run.assert_success();
    let kv = run.kv();
    assert_eq!(
        run.get("heap_rc"),
        "2",
        "an 8 GiB heap under a 1 GiB quota\n{}",
        run.report()
    );
    assert_eq!(
        step(&kv, "s3", "nvml_used"),
        step(&kv, "s2", "nvml_used"),
        "a refused limit changes nothing\n{}",
        run.report()
    );
    assert!(
        group_peak_on(&sim.stat(), "heap", 0) <= QUOTA,
        "the driver was let reserve the heap\n{}",
        run.report()
    );
    // 8 GiB less the default 8 MiB heap the context already has.
    assert!(
        run.stderr.contains("cuCtxSetLimit of 7.99 GiB"),
        "{}",
        run.report()
    );
}

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

#[test]
fn an_explicit_context_reserve_overrides_the_measurement() {
    let dir = scratch("explicit");
    let sim = sim("overhead-explicit");
    let mut cmd = client(
        &sim,
        Deploy::Preload,
        &dir,
        "explicit",
        &["steps", "10", "8", "1024"],
    );
    let run = sim.run_cmd(cmd.env("GPUSLICE_CONTEXT_RESERVE", "100MiB"));
    run.assert_success();
    let kv = run.kv();
    assert_eq!(step(&kv, "s0", "nvml_used"), 100 * MIB, "{}", run.report());
    assert_eq!(
        run.get_u64("fill_bytes"),
        QUOTA - 100 * MIB,
        "{}",
        run.report()
    );
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

/// NVML's per-process views show the tenant's own processes only: two tenants run kernels on one
/// GPU; each one's NVML lists (compute processes, process utilisation) name its process, never the
/// other's, which the driver's own answer (no shim) does list.
#[test]
fn nvml_process_views_show_only_the_tenants_processes() {
    let dir = scratch("nvml-procs");
    let sim = sim("overhead-nvml-procs");
    let (holders, pids) = holders_of_a_and_b(&sim, Deploy::Preload, &dir);
    // Each holder ran a kernel before printing its pid: samples since time 0 include both.
    let script = "import pynvml as nv\nnv.nvmlInit()\nh = nv.nvmlDeviceGetHandleByIndex(0)\n\
        print('procs=' + ','.join(str(p.pid) for p in nv.nvmlDeviceGetComputeRunningProcesses(h)))\n\
        try:\n    samples = nv.nvmlDeviceGetProcessUtilization(h, 0)\nexcept nv.NVMLError:\n    samples = []\n\
        print('util=' + ','.join(str(s.pid) for s in samples))\n";
    let view = |tenant: Option<&str>| {
        let args = ["-c", script];
        let mut py = match tenant {
            Some(t) => tenant_command(venv_python(), &sim, Deploy::Preload, &dir, t, &args),
            None => {
                let mut cmd = sim.command(venv_python());
                cmd.args(args);
                cmd
            }
        };
        let run = sim.run_cmd(&mut py);
        run.assert_success();
        let list = |k: &str| -> Vec<String> {
            run.get(k)
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        };
        (list("procs"), list("util"), run.report())
    };
    let (procs, util, report) = view(None);
    for pid in &pids {
        assert!(procs.contains(pid), "the driver lists {pid}\n{report}");
        assert!(util.contains(pid), "the driver samples {pid}\n{report}");
    }
    for (i, tenant) in ["a", "b"].iter().enumerate() {
        let (procs, util, report) = view(Some(tenant));
        assert_eq!(
            procs,
            [pids[i].clone()],
            "tenant {tenant}'s process list\n{report}"
        );
        assert_eq!(
            util,
            [pids[i].clone()],
            "tenant {tenant}'s utilisation samples\n{report}"
        );
    }
    for h in holders {
        finish(h, "holder").assert_success();
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

/// NVML shows a tenant its quota and its own processes only, also before any of its processes has
/// charged anything (a monitoring tool started first: no ledger yet), and even the number of
/// utilisation samples it is told to make room for counts its own processes only.
fn nvml_never_shows_another_tenant(deploy: Deploy) {
    let dir = scratch("nvml-fresh");
    let sim = sim("overhead-nvml-fresh");
    // A neighbour tenant on the GPU with memory and a kernel run (a utilisation sample).
    let mut neighbour = sim.spawn(&mut client_of(
        &LINKED_CU12,
        &sim,
        deploy,
        &dir,
        "neighbour",
        &["hold", "64", "500"],
    ));
    wait_for_key(&mut neighbour, "pid");
    let ledger = dir.join("fresh.ledger");
    let fresh = nvml_view(&sim, deploy, &dir, "fresh");
    let report = fresh.report();
    for (key, want) in [
        ("total", QUOTA),
        ("used", 0),
        ("free", QUOTA),
        ("total2", QUOTA),
        ("reserved2", 0),
        ("used2", 0),
        ("free2", QUOTA),
    ] {
        assert_eq!(
            fresh.get_u64(key),
            want,
            "{deploy:?}: {key} of a tenant with nothing charged\n{report}"
        );
    }
    assert_eq!(fresh.get("procs"), "", "{deploy:?}: process list\n{report}");
    assert_eq!(fresh.get("util"), "", "{deploy:?}: samples\n{report}");
    assert_eq!(fresh.get("utilinfo"), "", "{deploy:?}: samples\n{report}");
    // NVML_ERROR_NOT_FOUND: no sample of the tenant's processes, as a driver with none answers.
    for query in ["util_query", "utilinfo_query"] {
        assert_eq!(
            (
                fresh.get_u64(&format!("{query}_rc")),
                fresh.get_u64(&format!("{query}_count"))
            ),
            (6, 0),
            "{deploy:?}: the sample count ({query})\n{report}"
        );
    }
    // Accounting mode and confidential computing are off (the driver's default): the driver's
    // NVML_ERROR_NOT_SUPPORTED stands.
    for key in ["acct_rc", "stats_rc", "cc_rc"] {
        assert_eq!(fresh.get_u64(key), 3, "{deploy:?}: {key}\n{report}");
    }
    assert!(
        !ledger.exists(),
        "{deploy:?}: asking NVML created the tenant's ledger"
    );

    // A tenant with a process of its own is told of exactly one sample.
    let mut mine = sim.spawn(&mut client_of(
        &LINKED_CU12,
        &sim,
        deploy,
        &dir,
        "mine",
        &["hold", "64", "500"],
    ));
    let my_pid = wait_for_key(&mut mine, "pid")["pid"].clone();
    let view = nvml_view(&sim, deploy, &dir, "mine");
    let report = view.report();
    for query in ["util_query", "utilinfo_query"] {
        assert_eq!(
            (
                view.get_u64(&format!("{query}_rc")),
                view.get_u64(&format!("{query}_count"))
            ),
            (7, 1),
            "{deploy:?}: the count query ({query}: NVML_ERROR_INSUFFICIENT_SIZE, room for one sample)\n{report}"
        );
    }
    assert_eq!(view.get("util"), my_pid, "{deploy:?}: samples\n{report}");
    assert_eq!(
        view.get("utilinfo"),
        my_pid,
        "{deploy:?}: samples\n{report}"
    );
    let procs = view.get("procs");
    assert!(
        procs.starts_with(&format!("{my_pid}:")) && !procs.contains(','),
        "{deploy:?}: process list\n{report}"
    );
    finish(mine, "mine").assert_success();
    finish(neighbour, "neighbour").assert_success();
}

in_every_deployment!(
    nvml_never_shows_another_tenant:
    nvml_never_shows_another_tenant_preloaded,
    nvml_never_shows_another_tenant_dropin,
    nvml_never_shows_another_tenant_mixed
);

/// Every NVML process list through the raw ABI (ctypes) and through nvidia-ml-py's own wrappers:
/// compute, graphics and MPS processes (v1, v2, v3) and the detail list of each mode. For each raw
/// call: `NAME.query=RC:COUNT` (NULL buffer, count 0), `NAME.short=RC:COUNT` (room for one fewer
/// than the count, when there is any), `NAME=pid:used,...` (room to spare); and the detail list's
/// answer to a version and a mode it does not know.
const NVML_LISTS: &str = r#"import ctypes, pynvml as nv
nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex(0)
print(f'used={nv.nvmlDeviceGetMemoryInfo(h).used}')
class V1(ctypes.Structure):
    _fields_ = [('pid', ctypes.c_uint), ('usedGpuMemory', ctypes.c_ulonglong)]
def shown(entries, n):
    return ','.join(f'{entries[i].pid}:{entries[i].usedGpuMemory}' for i in range(n))
def raw(name, struct):
    fn = nv._nvmlGetFunctionPointer(name)
    n = ctypes.c_uint(0)
    rc = fn(h, ctypes.byref(n), None)
    print(f'{name}.query={rc}:{n.value}')
    if n.value > 0:
        short = ctypes.c_uint(n.value - 1)
        rc = fn(h, ctypes.byref(short), (struct * n.value)())
        print(f'{name}.short={rc}:{short.value}')
    room = ctypes.c_uint(n.value + 4)
    entries = (struct * room.value)()
    rc = fn(h, ctypes.byref(room), entries)
    print(f'{name}=' + (shown(entries, room.value) if rc == 0 else f'error {rc}'))
for kind in ('Compute', 'Graphics', 'MPSCompute'):
    base = 'nvmlDeviceGet' + kind + 'RunningProcesses'
    raw(base, V1)
    raw(base + '_v2', nv.c_nvmlProcessInfo_v2_t)
    raw(base + '_v3', nv.c_nvmlProcessInfo_v3_t)
print('py_compute=' + ','.join(f'{p.pid}:{p.usedGpuMemory}' for p in nv.nvmlDeviceGetComputeRunningProcesses(h)))
print('py_graphics=' + ','.join(f'{p.pid}:{p.usedGpuMemory}' for p in nv.nvmlDeviceGetGraphicsRunningProcesses(h)))
print('py_mps=' + ','.join(f'{p.pid}:{p.usedGpuMemory}' for p in nv.nvmlDeviceGetMPSComputeRunningProcesses(h)))
detail = nv._nvmlGetFunctionPointer('nvmlDeviceGetRunningProcessDetailList')
for mode in (nv.NVML_PROCESS_MODE_COMPUTE, nv.NVML_PROCESS_MODE_GRAPHICS, nv.NVML_PROCESS_MODE_MPS):
    plist = nv.c_nvmlProcessDetailList_t()
    plist.version = nv.nvmlProcessDetailList_v1
    plist.mode = mode
    rc = detail(h, ctypes.byref(plist))
    print(f'detail{mode}.query={rc}:{plist.numProcArrayEntries}')
    if plist.numProcArrayEntries > 0:
        room = plist.numProcArrayEntries
        plist.numProcArrayEntries = room - 1
        plist.procArray = ctypes.cast((nv.c_nvmlProcessDetail_v1_t * room)(), ctypes.POINTER(nv.c_nvmlProcessDetail_v1_t))
        rc = detail(h, ctypes.byref(plist))
        print(f'detail{mode}.short={rc}:{plist.numProcArrayEntries}')
    procs = nv.nvmlDeviceGetRunningProcessDetailList(h, nv.nvmlProcessDetailList_v1, mode)
    print(f'detail{mode}=' + ','.join(f'{p.pid}:{p.usedGpuMemory}' for p in procs))
plist = nv.c_nvmlProcessDetailList_t()
plist.version = nv.nvmlProcessDetailList_v1 + (1 << 24)
print(f'detail_bad_version={detail(h, ctypes.byref(plist))}')
plist.version = nv.nvmlProcessDetailList_v1
plist.mode = 7
print(f'detail_bad_mode={detail(h, ctypes.byref(plist))}')
"#;

/// The raw lists [`NVML_LISTS`] prints that name the simulated processes (compute and graphics; the
/// detail list's modes 0 and 1), and those that are empty on simgpu (MPS; mode 2).
const LISTS_OF_PROCESSES: [&str; 8] = [
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "detail0",
    "detail1",
];
const EMPTY_LISTS: [&str; 4] = [
    "nvmlDeviceGetMPSComputeRunningProcesses",
    "nvmlDeviceGetMPSComputeRunningProcesses_v2",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "detail2",
];

/// The pids a `pid:used,...` value names.
fn pids_of(list: &str) -> Vec<String> {
    list.split(',')
        .filter(|e| !e.is_empty())
        .map(|e| e.split(':').next().unwrap_or_default().to_owned())
        .collect()
}

/// Two tenants, each with a process holding memory, running kernels and (simgpu's
/// `SIMGPU_GRAPHICS_CLIENTS`) holding a graphics context on one GPU: through every NVML process list
/// (compute, graphics, MPS in v1, v2, v3; the detail list of each mode), raw and through
/// nvidia-ml-py, each tenant sees its own process only, with its charge (its usage, as NVML's memory
/// view shows it), and the count protocol tells it of its own processes only (NULL buffer:
/// `INSUFFICIENT_SIZE` with its count; one entry short: the same). The driver's own answer (no shim)
/// lists both processes in the compute, graphics and detail lists, so those are filtered, not just
/// empty. simgpu runs no MPS server: the MPS lists are empty on the driver, and the tenant sees them
/// empty too, with the same count protocol.
fn nvml_every_process_list_shows_only_the_tenant(deploy: Deploy) {
    let dir = scratch("nvml-lists");
    let sim = sim("overhead-nvml-lists").env("SIMGPU_GRAPHICS_CLIENTS", "1");
    let (holders, pids) = holders_of_a_and_b(&sim, deploy, &dir);
    let args = ["-c", NVML_LISTS];
    let mut driver_view = sim.command(venv_python());
    driver_view.args(args);
    let driver = sim.run_cmd(&mut driver_view);
    driver.assert_success();
    for key in LISTS_OF_PROCESSES {
        let listed = pids_of(&driver.get(key));
        for pid in &pids {
            assert!(
                listed.contains(pid),
                "{deploy:?}: the driver's {key} lists {pid}\n{}",
                driver.report()
            );
        }
    }
    for (i, tenant) in ["a", "b"].iter().enumerate() {
        let run = python_as(&sim, deploy, &dir, tenant, &args);
        let report = run.report();
        let mine = format!("{}:{}", pids[i], run.get_u64("used"));
        for key in LISTS_OF_PROCESSES {
            assert_eq!(
                run.get(&format!("{key}.query")),
                "7:1",
                "{deploy:?}: tenant {tenant}'s count query of {key} (INSUFFICIENT_SIZE, 1)\n{report}"
            );
            assert_eq!(
                run.get(&format!("{key}.short")),
                "7:1",
                "{deploy:?}: tenant {tenant}'s {key} with too little room\n{report}"
            );
            assert_eq!(
                run.get(key),
                mine,
                "{deploy:?}: tenant {tenant}'s {key}\n{report}"
            );
        }
        for key in ["py_compute", "py_graphics"] {
            assert_eq!(run.get(key), mine, "{deploy:?}: {key}\n{report}");
        }
        for key in EMPTY_LISTS {
            assert_eq!(
                run.get(&format!("{key}.query")),
                "0:0",
                "{deploy:?}: tenant {tenant}'s count query of {key} (SUCCESS, none)\n{report}"
            );
            assert_eq!(
                run.get(key),
                "",
                "{deploy:?}: tenant {tenant}'s {key}\n{report}"
            );
        }
        assert_eq!(run.get("py_mps"), "", "{deploy:?}: py_mps\n{report}");
        // NVML_ERROR_INVALID_ARGUMENT, as nvml.h documents and the driver answers: a list gpuslice
        // cannot filter is refused, never passed on.
        for key in ["detail_bad_version", "detail_bad_mode"] {
            assert_eq!(run.get(key), driver.get(key), "{deploy:?}: {key}\n{report}");
            assert_eq!(run.get_u64(key), 2, "{deploy:?}: {key}\n{report}");
        }
    }
    for h in holders {
        finish(h, "holder").assert_success();
    }
}

in_every_deployment!(
    nvml_every_process_list_shows_only_the_tenant:
    nvml_every_process_list_shows_only_the_tenant_preloaded,
    nvml_every_process_list_shows_only_the_tenant_dropin,
    nvml_every_process_list_shows_only_the_tenant_mixed
);

/// Accounting mode and the confidential-computing memory view as a tenant sees them, raw (ctypes)
/// and through nvidia-ml-py: `acct.query=RC:COUNT` (NULL buffer, count 0), `acct.short=RC:COUNT`
/// (room for one fewer), `acct=pid,...` (room to spare), `py_acct=` (nvidia-ml-py sizes its buffer
/// by `nvmlDeviceGetAccountingBufferSize`), `statsPID=RC:maxMemoryUsage:isRunning:startTime:time`
/// for every pid given as an argument, and `cc=`/`mem=` as `total:used:free`.
const NVML_ACCOUNTING: &str = r#"import ctypes, sys, pynvml as nv
nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex(0)
acct = nv._nvmlGetFunctionPointer('nvmlDeviceGetAccountingPids')
n = ctypes.c_uint(0)
rc = acct(h, ctypes.byref(n), None)
print(f'acct.query={rc}:{n.value}')
if n.value > 0:
    short = ctypes.c_uint(n.value - 1)
    rc = acct(h, ctypes.byref(short), (ctypes.c_uint * n.value)())
    print(f'acct.short={rc}:{short.value}')
room = ctypes.c_uint(n.value + 4)
pids = (ctypes.c_uint * room.value)()
rc = acct(h, ctypes.byref(room), pids)
print('acct=' + (','.join(str(pids[i]) for i in range(room.value)) if rc == 0 else f'error {rc}'))
print('py_acct=' + ','.join(map(str, nv.nvmlDeviceGetAccountingPids(h))))
stats = nv._nvmlGetFunctionPointer('nvmlDeviceGetAccountingStats')
for pid in sys.argv[1:]:
    st = nv.c_nvmlAccountingStats_t()
    rc = stats(h, ctypes.c_uint(int(pid)), ctypes.byref(st))
    print(f'stats{pid}={rc}:{st.maxMemoryUsage}:{st.isRunning}:{st.startTime}:{st.time}')
cc = nv.nvmlDeviceGetConfComputeProtectedMemoryUsage(h)
m = nv.nvmlDeviceGetMemoryInfo(h)
print(f'cc={cc.total}:{cc.used}:{cc.free}')
print(f'mem={m.total}:{m.used}:{m.free}')
"#;

/// Two tenants, each with a process holding memory and running kernels, on one GPU with accounting
/// mode on and in confidential-computing mode (simgpu's `SIMGPU_ACCOUNTING_MODE`,
/// `SIMGPU_CONF_COMPUTE`). The driver's own answer (no shim) lists both processes with their
/// statistics; each tenant is told of its own process only (its count included), gets the driver's
/// statistics of it, and `NVML_ERROR_NOT_FOUND` for the other tenant's pid, as for a pid without
/// statistics; the protected-memory view is the quota view of `nvmlDeviceGetMemoryInfo`. Once the
/// processes end, the driver keeps their records (terminated, with their lifetime), and a tenant
/// still never sees the other's.
fn nvml_accounting_and_protected_memory_show_only_the_tenant(deploy: Deploy) {
    let dir = scratch("nvml-accounting");
    let sim = sim("overhead-nvml-accounting")
        .env("SIMGPU_ACCOUNTING_MODE", "1")
        .env("SIMGPU_CONF_COMPUTE", "1");
    let (holders, pids) = holders_of_a_and_b(&sim, deploy, &dir);
    let mut args = vec!["-c", NVML_ACCOUNTING];
    args.extend(pids.iter().map(String::as_str));
    let driver_view = |args: &[&str]| {
        let mut cmd = sim.command(venv_python());
        cmd.args(args);
        let run = sim.run_cmd(&mut cmd);
        run.assert_success();
        run
    };
    let driver = driver_view(&args);
    let report = driver.report();
    for key in ["acct", "py_acct"] {
        let listed = pids_of(&driver.get(key));
        for pid in &pids {
            assert!(
                listed.contains(pid),
                "{deploy:?}: the driver's {key} lists {pid}\n{report}"
            );
        }
    }
    for pid in &pids {
        let stats = driver.get(&format!("stats{pid}"));
        let fields: Vec<&str> = stats.split(':').collect();
        assert_eq!(
            (fields[0], fields[2], fields[4]),
            ("0", "1", "0"),
            "{deploy:?}: the driver's statistics of running {pid}\n{report}"
        );
        assert!(
            fields[1].parse::<u64>().unwrap() >= 64 * MIB,
            "{deploy:?}: {pid}'s peak memory\n{report}"
        );
    }
    let driver_cc = driver.get("cc");
    assert_eq!(
        driver_cc,
        driver.get("mem"),
        "{deploy:?}: the driver's protected memory is the device's\n{report}"
    );
    assert!(driver_cc.starts_with(&format!("{}:", 4 * GIB)), "{report}");

    for (i, tenant) in ["a", "b"].iter().enumerate() {
        let (mine, other) = (&pids[i], &pids[1 - i]);
        let run = python_as(&sim, deploy, &dir, tenant, &args);
        let report = run.report();
        let (my_stats, other_stats) = (format!("stats{mine}"), format!("stats{other}"));
        for (key, want) in [
            ("acct.query", "7:1".to_owned()),
            ("acct.short", "7:1".to_owned()),
            ("acct", mine.clone()),
            ("py_acct", mine.clone()),
            (my_stats.as_str(), driver.get(&my_stats)),
            // NVML_ERROR_NOT_FOUND, the struct left as it was.
            (other_stats.as_str(), "6:0:0:0:0".to_owned()),
        ] {
            assert_eq!(
                run.get(key),
                want,
                "{deploy:?}: tenant {tenant}'s {key}\n{report}"
            );
        }
        let mem = run.get("mem");
        assert!(
            mem.starts_with(&format!("{QUOTA}:")),
            "{deploy:?}: {report}"
        );
        assert_eq!(
            run.get("cc"),
            mem,
            "{deploy:?}: tenant {tenant}'s protected memory is its quota view\n{report}"
        );
    }

    for h in holders {
        finish(h, "holder").assert_success();
    }
    let driver = driver_view(&args);
    let report = driver.report();
    for pid in &pids {
        let stats = driver.get(&format!("stats{pid}"));
        let fields: Vec<&str> = stats.split(':').collect();
        assert_eq!(
            (fields[0], fields[2]),
            ("0", "0"),
            "{deploy:?}: the driver keeps the statistics of terminated {pid}\n{report}"
        );
        assert!(
            fields[4].parse::<u64>().unwrap() > 0,
            "{deploy:?}: terminated {pid}'s time\n{report}"
        );
    }
    let run = sim.run_cmd(&mut tenant_command(
        venv_python(),
        &sim,
        deploy,
        &dir,
        "a",
        &args,
    ));
    run.assert_success();
    let report = run.report();
    assert!(
        !pids_of(&run.get("acct")).contains(&pids[1]),
        "{deploy:?}: tenant a is told of b's terminated process\n{report}"
    );
    assert_eq!(
        run.get(&format!("stats{}", pids[1])),
        "6:0:0:0:0",
        "{deploy:?}: tenant a asking for b's terminated process\n{report}"
    );
}

in_every_deployment!(
    nvml_accounting_and_protected_memory_show_only_the_tenant:
    nvml_accounting_and_protected_memory_show_only_the_tenant_preloaded,
    nvml_accounting_and_protected_memory_show_only_the_tenant_dropin,
    nvml_accounting_and_protected_memory_show_only_the_tenant_mixed
);

/// A card fuller than the quotas promise (a neighbour holds more than the rest of the card leaves
/// the tenant's quota): NVML shows the tenant only what it can get as free, and what the card holds
/// back as `_v2`'s reserved and, as NVIDIA documents for the v1 struct, inside v1's used: total =
/// used + free (v1) = reserved + used + free (v2).
#[test]
fn nvml_views_of_an_overcommitted_card_add_up() {
    let dir = scratch("nvml-overcommit");
    let sim = Sim::new("overhead-nvml-overcommit").env("SIMGPU_MEMORY", "2GiB");
    let mut cmd = client_of(
        &LINKED_CU12,
        &sim,
        Deploy::Preload,
        &dir,
        "neighbour",
        &["hold", "1200", "500"],
    );
    let mut neighbour = sim.spawn(cmd.env("GPUSLICE_MEMORY_LIMIT", "2GiB"));
    let pid = wait_for_key(&mut neighbour, "pid")["pid"].clone();
    let card_free = 2 * GIB - process_used_on(&sim.stat(), &pid, 0);
    assert!(card_free < QUOTA, "the card has {card_free} free");
    for deploy in [Deploy::Preload, Deploy::Dropin, Deploy::Mixed] {
        let view = nvml_view(&sim, deploy, &dir, "views");
        let report = view.report();
        let reserved = QUOTA - card_free;
        for (key, want) in [
            ("total", QUOTA),
            ("free", card_free),
            ("used", reserved),
            ("total2", QUOTA),
            ("reserved2", reserved),
            ("used2", 0),
            ("free2", card_free),
        ] {
            assert_eq!(view.get_u64(key), want, "{deploy:?}: {key}\n{report}");
        }
    }
    finish(neighbour, "neighbour").assert_success();
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

/// [`client`] run as pid 1 of a PID namespace of its own (a container's): a real driver, and simgpu,
/// list it in NVML under its host PID, so it never finds its own `getpid()` there.
fn client_in_pid_namespace(sim: &Sim, dir: &Path, tenant: &str, args: &[&str]) -> Command {
    let mut inner = vec!["--pid", "--fork", "--kill-child"];
    let program = compile(&QUOTA_OVERHEAD);
    inner.push(program.to_str().unwrap());
    inner.extend_from_slice(args);
    tenant_command(
        PathBuf::from("unshare"),
        sim,
        Deploy::Preload,
        dir,
        tenant,
        &inner,
    )
}

/// Programs in their own PID namespaces cannot find themselves in NVML's process lists (simgpu
/// lists host PIDs, as a real driver does); their contexts are measured from the device's used
/// memory under the device's measurement lock. Three first contexts created at once are each
/// charged what simgpu spent on them, and the rest of the quota is usable.
#[test]
fn contexts_in_their_own_pid_namespaces_are_charged_what_they_cost() {
    const N: usize = 3;
    let dir = scratch("pid-namespace");
    // Each context takes 100 ms to create: started together, their creations overlap unless the
    // measurement lock serialises them (each would then see the others' contexts appear).
    let sim = sim("overhead-pidns").env("SIMGPU_CONTEXT_CREATE_US", "100000");
    let mut holders: Vec<_> = (0..N)
        .map(|_| sim.spawn(&mut client_in_pid_namespace(&sim, &dir, "ns", &["hold"])))
        .collect();
    for h in &mut holders {
        let kv = wait_for_key(h, "ready");
        assert_eq!(kv["pid"], "1", "the client is its namespace's init: {kv:?}");
    }
    let stat = sim.stat();
    let Json::Array(procs) = stat.at("processes") else {
        panic!("simgpu-stat: no processes in {stat}")
    };
    assert_eq!(procs.len(), N, "{stat}");
    for p in procs {
        assert_ne!(p.u64("pid"), 1, "simgpu lists host PIDs: {stat}");
        assert_eq!(p.u64("used.0"), SIM_CONTEXT, "{stat}");
    }
    // Each process published its context's cost as its driver overhead.
    let snapshot = gpuslice::ledger::Ledger::open_readonly(&dir.join("ns.ledger"))
        .expect("the tenant's ledger")
        .snapshot();
    let overheads: Vec<u64> = snapshot
        .processes
        .iter()
        .map(|p| p.overhead.iter().map(|(_, b)| b).sum())
        .collect();
    assert_eq!(overheads.len(), N, "{snapshot:?}");
    for o in &overheads {
        assert!(
            near(*o, SIM_CONTEXT),
            "each context charged its {SIM_CONTEXT} bytes: {overheads:?}"
        );
    }
    // The rest of the quota is usable, and never more than it.
    let mut filled = 0;
    for h in &mut holders {
        h.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        let kv = wait_for_key(h, "fill_bytes");
        filled += kv["fill_bytes"].parse::<u64>().unwrap();
    }
    let want = QUOTA - N as u64 * SIM_CONTEXT;
    assert!(
        filled <= want && filled + N as u64 * GRANULE >= want,
        "{filled} allocated by {N} processes, want {want} (each context charged 300 MiB)"
    );
    assert!(group_peak_on(&sim.stat(), "ns", 0) <= QUOTA);
    for h in holders {
        let run = finish(h, "holder");
        run.assert_success();
        assert!(
            !run.stderr.contains("stayed locked"),
            "measured under the lock\n{}",
            run.report()
        );
    }
}

/// Whether another process holds the `flock` lock on `path` (a measurement lock).
fn locked_by_another(path: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    // SAFETY: flock on a descriptor this function owns; LOCK_NB never blocks.
    let taken = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    // Closing `file` drops the lock if it was taken.
    !taken
}

/// A process killed while it holds a device's measurement lock (in the middle of creating its
/// context, which simgpu makes last a minute) does not hold up the next process's measurement: the
/// lock dies with its holder, and the next context is measured under it and charged what it cost.
#[test]
fn a_process_killed_while_measuring_does_not_hold_up_the_others() {
    let dir = scratch("killed-measurer");
    let sim = sim("overhead-killed");
    let mut victim = client(&sim, Deploy::Preload, &dir, "k", &["hold"]);
    let mut victim = sim.spawn(victim.env("SIMGPU_CONTEXT_CREATE_US", "60000000"));
    // Wait until it holds the lock of device 0 (it does for the minute its context takes).
    let devices = dir.join("devices");
    let waiting = std::time::Instant::now();
    let lock = loop {
        let found = std::fs::read_dir(&devices).ok().and_then(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|x| x == "measure") && locked_by_another(p))
        });
        if let Some(lock) = found {
            break lock;
        }
        assert!(
            victim.try_wait().unwrap().is_none(),
            "the victim ended before it measured"
        );
        assert!(
            waiting.elapsed() < std::time::Duration::from_secs(50),
            "no measurement lock held in {} while the victim created its context",
            devices.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    victim.kill().unwrap();
    victim.wait().unwrap();
    assert!(!locked_by_another(&lock), "the lock died with its holder");

    let mut next = sim.spawn(&mut client(&sim, Deploy::Preload, &dir, "k", &["hold"]));
    wait_for_key(&mut next, "ready");
    next.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let kv = wait_for_key(&mut next, "fill_bytes");
    let fill: u64 = kv["fill_bytes"].parse().unwrap();
    let run = finish(next, "next");
    run.assert_success();
    assert!(
        !run.stderr.contains("stayed locked") && !run.stderr.contains("without the device lock"),
        "measured under the lock\n{}",
        run.report()
    );
    assert!(
        fill <= QUOTA - SIM_CONTEXT && fill + GRANULE >= QUOTA - SIM_CONTEXT,
        "{fill} allocated: the context charged its {SIM_CONTEXT} bytes\n{}",
        run.report()
    );
}

/// Measured from the device's used memory (a PID namespace of its own), a context created while
/// another process frees 1 GiB would appear to give memory back: a new object cannot, so the figure
/// is not believed and the context is charged the estimate (`GPUSLICE_CONTEXT_RESERVE`'s default),
/// never less than it cost: the quota does not loosen.
#[test]
fn a_context_measured_while_another_process_frees_is_not_charged_less_than_it_cost() {
    let dir = scratch("disturbed");
    let sim = sim("overhead-disturbed");
    // Another tenant holds its context and fills its quota.
    let mut other = sim.spawn(&mut client(&sim, Deploy::Preload, &dir, "other", &["hold"]));
    wait_for_key(&mut other, "ready");
    other.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    wait_for_key(&mut other, "fill_bytes");
    // This one's context takes 3 s to create; the other exits (freeing 1 GiB) meanwhile.
    let mut cmd = client_in_pid_namespace(&sim, &dir, "ns", &["hold"]);
    let mut measured = sim.spawn(cmd.env("SIMGPU_CONTEXT_CREATE_US", "3000000"));
    let devices = dir.join("devices");
    let waiting = std::time::Instant::now();
    while !std::fs::read_dir(&devices).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            e.path().extension().is_some_and(|x| x == "measure") && locked_by_another(&e.path())
        })
    }) {
        assert!(measured.try_wait().unwrap().is_none(), "the client ended");
        if waiting.elapsed() > std::time::Duration::from_secs(60) {
            measured.kill().unwrap();
            panic!(
                "no measurement lock held in {} while the client created its context\n{}",
                devices.display(),
                finish(measured, "measured").report()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    finish(other, "other").assert_success();
    wait_for_key(&mut measured, "ready");
    measured.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let fill: u64 = wait_for_key(&mut measured, "fill_bytes")["fill_bytes"]
        .parse()
        .unwrap();
    let run = finish(measured, "measured");
    run.assert_success();
    assert!(
        fill + SIM_CONTEXT <= QUOTA,
        "{fill} allocated beside a {SIM_CONTEXT}-byte context under a {QUOTA}-byte quota\n{}",
        run.report()
    );
}

/// [`client`] in a container of its own, as a Kubernetes pod runs it: its namespace's init, with a
/// PID namespace and its own `/proc` (`unshare --pid --fork --mount-proc`). The host's `/proc` is
/// bind-mounted first where simgpu alone reads it (`SIMGPU_HOST_PROC`): a real driver lives in the
/// kernel and still lists the process under its host PID, which the process cannot read.
fn client_in_container(sim: &Sim, dir: &Path, tenant: &str, args: &[&str]) -> Command {
    let host_proc = dir.join(format!("hostproc-{tenant}"));
    std::fs::create_dir_all(&host_proc).unwrap();
    let program = compile(&QUOTA_OVERHEAD);
    let mut inner = vec![
        "--pid",
        "--fork",
        "--kill-child",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        r#"mount --bind /proc "$SIMGPU_HOST_PROC" && mount -t proc proc /proc && exec "$0" "$@""#,
        program.to_str().unwrap(),
    ];
    inner.extend_from_slice(args);
    let mut cmd = tenant_command(
        PathBuf::from("unshare"),
        sim,
        Deploy::Preload,
        dir,
        tenant,
        &inner,
    );
    cmd.env("SIMGPU_HOST_PROC", &host_proc);
    cmd
}

/// A context created in a container (its own PID namespace and `/proc`: the process cannot find
/// itself in NVML's lists by its PID) while another tenant allocates 1 GiB every 10 ms: the
/// device's used memory grows by gigabytes during the 300 ms the context takes, none of which is
/// this context's. It is charged what simgpu spent on it, to one granule, and its first
/// allocations fail only at its quota.
#[test]
fn a_context_created_in_a_container_is_not_charged_a_neighbours_allocations() {
    let dir = scratch("container-neighbour");
    let sim = Sim::new("overhead-container")
        .env("SIMGPU_MEMORY", "64GiB")
        .env("SIMGPU_CONTEXT_CREATE_US", "300000");
    let mut neighbour = client(
        &sim,
        Deploy::Preload,
        &dir,
        "neighbour",
        &["churn", "1024", "10"],
    );
    let mut neighbour = sim.spawn(neighbour.env("GPUSLICE_MEMORY_LIMIT", "48GiB"));
    wait_for_key(&mut neighbour, "churning");
    let before = sim.stat();
    let mut pod = sim.spawn(&mut client_in_container(&sim, &dir, "pod", &["hold"]));
    let ready = wait_for_key(&mut pod, "ready");
    assert_eq!(
        ready["pid"], "1",
        "the client is its container's init: {ready:?}"
    );
    let after = sim.stat();
    let Json::Array(procs) = after.at("processes") else {
        panic!("simgpu-stat: no processes in {after}")
    };
    let ours = procs
        .iter()
        .find(|p| p.at("group") == &Json::String("pod".to_string()))
        .unwrap_or_else(|| panic!("the pod's process in {after}"));
    assert_ne!(ours.u64("pid"), 1, "simgpu lists its host PID: {after}");
    assert_eq!(ours.u64("used.0"), SIM_CONTEXT, "{after}");
    let moved = after.u64("devices.0.used") as i128 - before.u64("devices.0.used") as i128;
    let pid = ours.u64("pid").to_string();
    let overhead = gpuslice::ledger::Ledger::open_readonly(&dir.join("pod.ledger"))
        .expect("the pod's ledger")
        .snapshot()
        .processes
        .iter()
        .map(|p| p.overhead.iter().map(|(_, b)| b).sum::<u64>())
        .sum::<u64>();
    assert!(
        near(overhead, SIM_CONTEXT),
        "the context charged {overhead} bytes, it cost {SIM_CONTEXT} (process {pid}; the device's \
         used memory moved {moved} bytes meanwhile)"
    );
    pod.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let fill: u64 = wait_for_key(&mut pod, "fill_bytes")["fill_bytes"]
        .parse()
        .unwrap();
    let _ = neighbour.kill();
    let _ = neighbour.wait();
    let run = finish(pod, "pod");
    run.assert_success();
    assert!(
        fill <= QUOTA - SIM_CONTEXT && fill + GRANULE >= QUOTA - SIM_CONTEXT,
        "{fill} allocated beside a {SIM_CONTEXT}-byte context under a {QUOTA}-byte quota\n{}",
        run.report()
    );
    assert!(
        group_peak_on(&sim.stat(), "pod", 0) <= QUOTA,
        "{}",
        run.report()
    );
}
