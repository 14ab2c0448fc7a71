//! Allocations under a memory quota: the driver's alignment, physical (VMM) sizes, and stream-ordered
//! pools (their attributes, frees still pending on a stream, destroyed pools, blocks served from what
//! a pool holds). Judged by simgpu's own counters through tests/clients/quota_overhead.c.

use gpuslice_testkit as common;

use common::memory::*;
use common::*;

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
