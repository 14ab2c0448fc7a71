//! simgpu's device is one device shared by every process on the machine: kernels from all processes
//! run one at a time, and launches are asynchronous. Judged by simgpu-stat and by timings measured
//! inside the clients.

use gpuslice_testkit as common;

use common::*;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[test]
fn two_processes_share_the_device_fairly_and_never_overlap() {
    const RUN_MS: u64 = 2000;
    const KERNEL_US: &str = "500";
    let sim = Sim::new("share");
    let client = compile(&LINKED_CU12);
    // Both start launching at the same wall-clock instant, after their setup is done.
    let start_ns = (SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
        + Duration::from_millis(400))
    .as_nanos()
    .to_string();
    let mut children = Vec::new();
    for group in ["a", "b"] {
        let mut cmd = sim.command(&client);
        cmd.env("SIMGPU_GROUP", group)
            .args(["spin", &start_ns, &RUN_MS.to_string(), KERNEL_US]);
        children.push((group, sim.spawn(&mut cmd)));
    }
    let runs: Vec<(&str, Run)> = children
        .into_iter()
        .map(|(g, c)| (g, finish(c, &format!("spin group {g}"))))
        .collect();
    for (_, r) in &runs {
        r.assert_success();
    }
    let stat = sim.stat();
    let report = || {
        let mut s = format!("stat: {stat}\n");
        for (g, r) in &runs {
            s.push_str(&format!("group {g}:\n{}\n", r.report()));
        }
        s
    };

    let first = runs
        .iter()
        .map(|(_, r)| r.get_u64("start_ns"))
        .min()
        .unwrap();
    let last = runs.iter().map(|(_, r)| r.get_u64("end_ns")).max().unwrap();
    let wall = last - first;
    // A fresh state: everything the device did is these two processes' kernels.
    let busy = stat.u64("devices.0.busy_ns");

    // Each client's wall interval covers all of its kernels (it synchronized before printing end_ns).
    assert!(
        busy as f64 >= 0.90 * wall as f64,
        "device busy {busy} ns over {wall} ns of wall time (< 90%)\n{}",
        report()
    );
    assert!(
        busy <= wall,
        "device busy {busy} ns exceeds wall time {wall} ns: two kernels ran at once\n{}",
        report()
    );

    let share: Vec<u64> = ["a", "b"]
        .iter()
        .map(|g| group(&stat, g).u64("busy_ns.0"))
        .collect();
    let total: u64 = share.iter().sum();
    assert!(
        total as f64 >= 0.99 * busy as f64 && total <= busy,
        "groups' busy time {share:?} does not add up to the device's {busy}\n{}",
        report()
    );
    for (g, s) in ["a", "b"].iter().zip(&share) {
        let frac = *s as f64 / total as f64;
        assert!(
            (0.40..=0.60).contains(&frac),
            "group {g} got {:.1}% of the device (want 40-60%)\n{}",
            frac * 100.0,
            report()
        );
    }
}

#[test]
fn launches_are_asynchronous() {
    let sim = Sim::new("async");
    let run = sim.run(compile(&LINKED_CU12), &["async", "100", "1000"]);
    run.assert_success();
    let launch_us = run.get_u64("launch_us");
    let sync_us = run.get_u64("sync_us");
    assert!(
        launch_us < 30_000,
        "100 launches of 1000 us kernels took {launch_us} us to return (not asynchronous)\n{}",
        run.report()
    );
    assert!(
        launch_us + sync_us >= 100_000 && sync_us >= 70_000,
        "launch {launch_us} us + synchronize {sync_us} us: 100 x 1000 us of kernels cannot finish sooner\n{}",
        run.report()
    );
    let stat = sim.stat();
    assert_eq!(stat.u64("devices.0.kernels"), 100, "stat: {stat}");
    assert!(stat.u64("devices.0.busy_ns") >= 100_000_000, "stat: {stat}");
}

/// Events are stamped on the device timeline, not when simgpu's stream worker (a host thread, late
/// on a loaded machine) gets to them: two back-to-back kernels between three events measure exactly
/// their durations. The shim charges compute time from such intervals.
#[test]
fn events_measure_the_device_timeline() {
    let sim = Sim::new("event-timeline");
    let run = sim.run(compile(&EVENT_TIMELINE), &["20000"]);
    run.assert_success();
    let kernel = run.get_u64("kernel_ns") as i64;
    for key in ["first_ns", "second_ns"] {
        let got = run.get_u64(key) as i64;
        // f32 milliseconds carry ~2 ns of rounding at 20 ms.
        assert!(
            (got - kernel).abs() <= 100,
            "{key}: {got} ns between events around one {kernel} ns kernel\n{}",
            run.report()
        );
    }
    assert_eq!(run.get_u64("same_ns"), 0, "{}", run.report());
}

/// A driver gives a destroyed object's handle to a later one (its objects come from allocators
/// that reuse freed entries); simgpu gives it to the very next one created, so a program or library
/// that keeps a stale handle fails on simgpu every time (see `compute_lifecycle`'s reuse scenario).
#[test]
fn destroyed_event_and_context_handles_go_to_the_next_ones_created() {
    let sim = Sim::new("handle-reuse");
    let run = sim.run(compile(&EVENT_TIMELINE), &["1000"]);
    run.assert_success();
    assert_eq!(run.get("event_reused"), "1", "{}", run.report());
    assert_eq!(run.get("context_reused"), "1", "{}", run.report());
}
