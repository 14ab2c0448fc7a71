//! Contexts under a memory quota: a context is charged what the driver spent on it, measured while
//! other processes of the tenant and of other tenants allocate; refused before the driver spends it
//! when there is no room; a reserve set for it overrides the measurement; the memory allocated in
//! it goes back to the tenant with it. Judged by simgpu's own
//! counters through tests/clients/quota_overhead.c.

use gpuslice_testkit as common;

use common::memory::*;
use common::*;
use std::io::Write;
use std::path::Path;

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
