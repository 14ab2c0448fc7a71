//! Module code and context limits under a memory quota: modules and limits (stack, malloc heap) are
//! charged what the device loads or maps for them, a load or a limit without room is refused before
//! the driver spends it, and processes mixing every kind of charge keep the tenant within its quota.
//! Judged by simgpu's own counters through tests/clients/quota_overhead.c.

use gpuslice_testkit as common;

use common::memory::*;
use common::*;
use std::io::Write;
use std::path::Path;

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
