//! Compute shares through a tenant's lifecycle (docs/COMPUTE.md, "The runtime in a process"): contexts
//! destroyed or reset under contention, a tenant leaving with kernels queued, and a high-priority
//! tenant that is present without work. Judged by simgpu's busy counters, never gpuslice's own figures.
//!
//! Every bound here is one only a hang, a deadlock or a broken mechanism misses (seconds, or a large
//! fraction of the device): the tests must pass on a busy 2-core machine. The scenarios run one after
//! the other in one test, so they do not compete for the CPU.

use gpuslice_testkit as common;

use common::libgpuslice as shim;
use common::*;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

local_scene!();

impl Scene {
    /// A client of tenant `tenant` (its own memory ledger), judged as simgpu group `tenant`;
    /// `gpuslice` false: the same client without the shim (a control).
    fn client(&self, tenant: &str, gpuslice: bool, env: &[(&str, &str)], args: &[String]) -> Child {
        let mut cmd: Command = self.sim.command(compile(&COMPUTE));
        cmd.env("SIMGPU_GROUP", tenant).args(args);
        if gpuslice {
            cmd.env("LD_PRELOAD", shim())
                .env("GPUSLICE_TENANT", tenant)
                .env("GPUSLICE_LEDGER", self.dir.join(format!("{tenant}.ledger")))
                .env("GPUSLICE_DEVICE_DIR", self.dir.join("devices"))
                .envs(env.iter().copied());
        }
        self.sim.spawn(&mut cmd)
    }

    /// The fraction of the wall time `group` kept the device busy over the next `window`.
    fn busy_over(&self, group: &str, window: Duration) -> f64 {
        let (t0, b0) = (Instant::now(), self.busy(group));
        std::thread::sleep(window);
        let (t1, b1) = (Instant::now(), self.busy(group));
        b1.saturating_sub(b0) as f64 / (t1 - t0).as_nanos() as f64
    }
}

impl Scene {
    /// The part of the device's busy time that went to `group` over the next `window`.
    fn part_of_busy(&self, group: &str, window: Duration) -> f64 {
        let device = |sim: &Sim| sim.stat().u64("devices.0.busy_ns");
        let (g0, d0) = (self.busy(group), device(&self.sim));
        std::thread::sleep(window);
        let (g1, d1) = (self.busy(group), device(&self.sim));
        g1.saturating_sub(g0) as f64 / d1.saturating_sub(d0).max(1) as f64
    }
}

/// Waits for a client at most until `deadline`: a client still running then is killed and reported
/// as hung (with what it printed), so a deadlock fails the test instead of hanging it.
fn finish_by(mut child: Child, desc: &str, deadline: Instant) -> Result<Run, String> {
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return Ok(finish(child, desc)),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let threads = where_threads_wait(child.id()) + &stacks_of(child.id());
                let _ = child.kill();
                let run = finish(child, desc);
                return Err(format!(
                    "{desc} did not finish in time (hung); its threads were waiting in:\n{threads}it printed:\n{}",
                    run.report()
                ));
            }
        }
    }
}

/// Each thread's user-space stack in process `pid`, from gdb when the machine has it (a hung
/// client's own frames say which lock it waits for; `/proc` only says that it waits).
fn stacks_of(pid: u32) -> String {
    let out = Command::new("timeout")
        .args(["20", "gdb", "-batch", "-nx", "-p", &pid.to_string()])
        .args(["-ex", "thread apply all bt 30"])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout);
            let frames: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with("Thread ") || l.starts_with('#'))
                .take(300)
                .collect();
            format!("  stacks (gdb):\n    {}\n", frames.join("\n    "))
        }
        _ => String::new(),
    }
}

/// Each thread of process `pid`: its name, the kernel function it sleeps in and its system call
/// (number and arguments), from `/proc`: where a hung process is stuck, for the failure message.
fn where_threads_wait(pid: u32) -> String {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return String::from("  (no /proc entry)\n");
    };
    let mut out = String::new();
    for task in tasks.flatten() {
        let read = |what: &str| {
            std::fs::read_to_string(task.path().join(what))
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        out.push_str(&format!(
            "  {} {}: wchan {}, syscall {}\n",
            task.file_name().to_string_lossy(),
            read("comm"),
            read("wchan"),
            read("syscall")
        ));
    }
    out
}

/// Finishes `child` by `deadline`; on success its `key=value` output, else the failure is recorded.
fn expect_success(
    child: Child,
    desc: &str,
    deadline: Instant,
    failures: &mut Vec<String>,
) -> Option<Run> {
    match finish_by(child, desc, deadline) {
        Ok(run) if run.status.success() => Some(run),
        Ok(run) => {
            failures.push(format!("{desc} failed:\n{}", run.report()));
            None
        }
        Err(e) => {
            failures.push(e);
            None
        }
    }
}

/// A tenant destroys its own context (`cuCtxDestroy`) and another resets its primary context
/// (`cuDevicePrimaryCtxReset`), both with kernels queued, while a third contends: nobody crashes or
/// hangs, the two go on in new contexts (whose addresses the driver may reuse), and the third keeps
/// getting the device.
fn teardown_scenario(failures: &mut Vec<String>) {
    const MS: u64 = 4_000;
    let scene = Scene::new("lifecycle", "teardown");
    let start = start_in(700);
    let t0 = Instant::now() + Duration::from_millis(700);
    let share = [("GPUSLICE_COMPUTE_SHARE", "33")];
    let kernels = s(500);
    let destroyer = scene.client(
        "destroyer",
        true,
        &share,
        &[
            s("teardown"),
            s(start),
            s(MS),
            kernels.clone(),
            s("destroy"),
        ],
    );
    let resetter = scene.client(
        "resetter",
        true,
        &share,
        &[s("teardown"), s(start), s(MS), kernels.clone(), s("reset")],
    );
    let other = scene.client(
        "other",
        true,
        &share,
        &[s("spin"), s(start), s(MS), kernels],
    );
    // The teardowns happen at MS / 2: the other tenant's part of the device's busy time from half a
    // second after them. A third of it is its share; a tenant the scheduler forgot (waiting on an
    // owner whose context is gone) would get nothing. A part of the busy time, not of the wall time:
    // a busy machine feeds the device less, not one tenant less than the others.
    std::thread::sleep(
        (t0 + Duration::from_millis(MS / 2 + 500)).saturating_duration_since(Instant::now()),
    );
    let other_rate = scene.part_of_busy("other", Duration::from_millis(1_000));
    let deadline = t0 + Duration::from_millis(MS + 10_000);
    let d = expect_success(destroyer, "destroyer (cuCtxDestroy)", deadline, failures);
    let r = expect_success(
        resetter,
        "resetter (cuDevicePrimaryCtxReset)",
        deadline,
        failures,
    );
    let o = expect_success(other, "the other tenant", deadline, failures);
    println!(
        "lifecycle: teardown: other tenant had {:.1}% of the device's busy time after the teardowns; \
         launches after: destroyer {:?}, resetter {:?}; other launched {:?}",
        other_rate * 100.0,
        d.as_ref().map(|r| r.get_u64("launches_after")),
        r.as_ref().map(|r| r.get_u64("launches_after")),
        o.as_ref().map(|r| r.get_u64("launches")),
    );
    for (run, who) in [(&d, "destroyer"), (&r, "resetter")] {
        if let Some(run) = run {
            if run.get_u64("launches_after") == 0 {
                failures.push(format!(
                    "teardown: the {who} launched nothing in its new context"
                ));
            }
        }
    }
    if other_rate < 0.15 {
        failures.push(format!(
            "teardown: the other tenant had only {:.1}% of the device's busy time after the \
             teardowns (share 33%; bound 15%)",
            other_rate * 100.0
        ));
    }
}

/// A tenant tears its context down again and again under contention (`how`: `cuCtxDestroy`, or
/// `cuDevicePrimaryCtxReset`), each time with kernels queued, and then times a kernel with events of
/// its own. simgpu, as a driver does, gives a destroyed context's event handles to the next events
/// created: the program's events then have the handles of the shim's events of the old context.
/// The shim must have let go of those (never recorded them again, nor waited on them), so the
/// program's timings stay what they were, and nobody hangs.
fn reuse_scenario(how: &str, failures: &mut Vec<String>) {
    const CYCLES: u64 = 20;
    const OTHER_MS: u64 = 3_000;
    let scene = Scene::new("lifecycle", &format!("reuse-{how}"));
    let start = start_in(700);
    let t0 = Instant::now() + Duration::from_millis(700);
    let share = [("GPUSLICE_COMPUTE_SHARE", "50")];
    let reuser = scene.client(
        "reuser",
        true,
        &share,
        &[s("reuse"), s(start), s(CYCLES), s(500), s(how)],
    );
    let other = scene.client(
        "other",
        true,
        &share,
        &[s("spin"), s(start), s(OTHER_MS), s(500)],
    );
    let deadline = t0 + Duration::from_millis(OTHER_MS + 10_000);
    let r = expect_success(reuser, &format!("reuser ({how})"), deadline, failures);
    expect_success(other, "the other tenant", deadline, failures);
    if let Some(r) = r {
        println!(
            "lifecycle: reuse-{how}: {}",
            r.stdout.trim().replace('\n', " ")
        );
        if r.get_u64("moved") != 0 {
            failures.push(format!(
                "reuse ({how}): the program's own events were recorded again by someone else in {} \
                 of {CYCLES} teardowns:\n{}",
                r.get_u64("moved"),
                r.report()
            ));
        }
    }
}

/// A tenant leaves (`how`: returns from main, or `exit()` from another thread while it launches) with
/// kernels queued while another contends: the other has the device at once and finishes.
fn quit_scenario(how: &str, failures: &mut Vec<String>) {
    const QUITTER_MS: u64 = 1_500;
    const OTHER_MS: u64 = 4_500;
    let scene = Scene::new("lifecycle", &format!("quit-{how}"));
    let start = start_in(700);
    let t0 = Instant::now() + Duration::from_millis(700);
    let share = [("GPUSLICE_COMPUTE_SHARE", "50")];
    // 2 ms kernels, 8 queued: the leaver leaves ~16 ms of work behind.
    let quitter = scene.client(
        "quitter",
        true,
        &share,
        &[s("quit"), s(start), s(QUITTER_MS), s(2_000), s(how)],
    );
    let other = scene.client(
        "other",
        true,
        &share,
        &[s("spin"), s(start), s(OTHER_MS), s(200)],
    );
    let q = expect_success(
        quitter,
        &format!("quitter ({how})"),
        t0 + Duration::from_millis(QUITTER_MS + 10_000),
        failures,
    );
    // From a second after it left: the device is the other tenant's alone. A tenant left waiting at
    // the gate (for an owner that is gone) would run nothing; alone on an idle machine it keeps the
    // device >= 95% busy. The bound is far below that: a busy machine feeds the device less.
    std::thread::sleep(
        (t0 + Duration::from_millis(QUITTER_MS + 1_000)).saturating_duration_since(Instant::now()),
    );
    let rate = scene.busy_over("other", Duration::from_millis(1_500));
    let o = expect_success(
        other,
        "the other tenant",
        t0 + Duration::from_millis(OTHER_MS + 10_000),
        failures,
    );
    println!(
        "lifecycle: quit ({how}): quitter left at {:?}; the other tenant kept the device {:.1}% busy \
         from 1 s after, launched {:?}",
        q.as_ref().map(|r| r.get("leaving_ns")),
        rate * 100.0,
        o.as_ref().map(|r| r.get_u64("launches")),
    );
    if rate < 0.05 {
        failures.push(format!(
            "quit ({how}): the other tenant kept the device only {:.1}% busy after the quitter left \
             (alone it keeps it >= 95% busy on an idle machine; bound 5%)",
            rate * 100.0
        ));
    }
}

/// How busy one normal tenant of 50 us kernels keeps the device beside a high-priority tenant that
/// worked briefly at the start and then launches nothing, and (the control) alone: two simulated
/// machines side by side at the same time, so that a busy host slows both alike.
fn idle_high_pair() -> (f64, f64) {
    const MS: u64 = 3_000;
    let beside = Scene::new("lifecycle", "idle-high");
    let alone = Scene::new("lifecycle", "idle-control");
    let start = start_in(700);
    let t0 = Instant::now() + Duration::from_millis(700);
    let high = beside.client(
        "high",
        true,
        &[("GPUSLICE_PRIORITY", "high")],
        &[s("idle"), s(start), s(MS)],
    );
    let normal_args = [s("spin"), s(start), s(MS), s(50)];
    let share = [("GPUSLICE_COMPUTE_SHARE", "50")];
    let normal = beside.client("normal", true, &share, &normal_args);
    let control = alone.client("normal", true, &share, &normal_args);
    // From 1 s on: the high-priority tenant's few kernels at the start are long past.
    std::thread::sleep(
        (t0 + Duration::from_millis(1_000)).saturating_duration_since(Instant::now()),
    );
    let (a0, b0, w0) = (beside.busy("normal"), alone.busy("normal"), Instant::now());
    std::thread::sleep(Duration::from_millis(1_500));
    let (a1, b1, w1) = (beside.busy("normal"), alone.busy("normal"), Instant::now());
    let wall = (w1 - w0).as_nanos() as f64;
    let deadline = t0 + Duration::from_millis(MS + 10_000);
    let mut failures = Vec::new();
    expect_success(normal, "normal tenant", deadline, &mut failures);
    expect_success(control, "normal tenant alone", deadline, &mut failures);
    expect_success(high, "idle high-priority tenant", deadline, &mut failures);
    assert!(failures.is_empty(), "{failures:?}");
    (
        a1.saturating_sub(a0) as f64 / wall,
        b1.saturating_sub(b0) as f64 / wall,
    )
}

/// An idle high-priority tenant costs a normal tenant nothing: measured against a control (the normal
/// tenant alone, at the same time); up to three attempts, as a busy host disturbs one run more than
/// the other. (A normal tenant held to one launch in flight, what an *active* high-priority tenant
/// costs, keeps the device about half as busy as alone.)
fn idle_high_scenario(failures: &mut Vec<String>) {
    let mut last = String::new();
    for attempt in 0..3 {
        let (beside, control) = idle_high_pair();
        println!(
            "lifecycle: idle high-priority tenant: the normal tenant keeps the device {:.1}% busy \
             beside it, {:.1}% alone at the same time (attempt {})",
            beside * 100.0,
            control * 100.0,
            attempt + 1
        );
        if beside >= 0.8 * control {
            return;
        }
        last = format!(
            "idle high: the normal tenant kept the device {:.1}% busy beside an idle high-priority \
             tenant, {:.1}% alone (bound 80% of alone)",
            beside * 100.0,
            control * 100.0
        );
    }
    failures.push(last);
}

/// Flow control never hangs a program: a host function on the stream waits for a flag its own
/// thread sets only after 40 more launches behind it (as a kernel spinning on a host flag would).
/// Without gpuslice the launches queue and the program finishes; under contention the gate keeps
/// `Q` launches in flight per stream, and a wait for the oldest that completes nothing while the
/// tenant owns the device ends in letting one launch through (docs/COMPUTE.md, "Flow control").
/// An unbounded wait (`cuEventSynchronize`) hung here.
fn hostflag_scenario(failures: &mut Vec<String>) {
    const OTHER_MS: u64 = 8_000;
    let scene = Scene::new("lifecycle", "hostflag");
    let start = start_in(300);
    let share = [("GPUSLICE_COMPUTE_SHARE", "50")];
    let other = scene.client(
        "other",
        true,
        &share,
        &[s("spin"), s(start), s(OTHER_MS), s(200)],
    );
    // Under contention from the start: the other tenant launches for a second first.
    std::thread::sleep(Duration::from_millis(1_300));
    let t0 = Instant::now();
    // Half a second of synchronised launches first: the client is gated by then (a process's first
    // launches may pass before its scheduler thread has seen the neighbour want the device).
    let flag = scene.client(
        "flag",
        true,
        &share,
        &[s("hostflag"), s(200), s(40), s(500)],
    );
    // Then 40 launches at one per bound (10 ms of owned time) beside a tenant of equal share: under a
    // second of owned time, about 2 s here and 4.8 s seen on a loaded machine, all within the other
    // tenant's run (under contention). The old wait never returned.
    let deadline = t0 + Duration::from_millis(OTHER_MS);
    if let Some(run) = expect_success(flag, "hostflag client", deadline, failures) {
        println!(
            "lifecycle: hostflag: 40 launches behind a host function waiting for them finished in {} ms under contention",
            t0.elapsed().as_millis()
        );
        if run.get("done") != "1" {
            failures.push(format!("hostflag: no done=1\n{}", run.report()));
        }
    }
    let _ = expect_success(
        other,
        "hostflag's neighbour",
        Instant::now() + Duration::from_millis(OTHER_MS + 10_000),
        failures,
    );
}

/// A long kernel on one stream does not hold up another stream of the process: a tenant loops
/// 20 ms kernels on one stream (two queued) and 50 us kernels on another (four queued) beside an
/// idle neighbour (one 50 us kernel every 100 ms), and keeps at least `bound` of the rate of 50 us
/// kernels of the same program without gpuslice, run at the same moment on a device of its own.
/// Twice: as is (95%: beside an idle neighbour the launches take the fast path), and with a cap
/// of 99% (40%: a capped tenant's launches always take the slow path, flow control included,
/// whose driver calls cost simgpu's host about 20 us each, and the cap hands the device over now
/// and then; about 65% here, where one queue for all streams, the 50 us launches waiting behind
/// the 20 ms kernels, kept it below 1%).
/// A run that misses its bound is run once more (the control shares the machine with it, but a
/// noisy moment on 2 busy cores can still cost one run a few points); both must miss to fail.
fn sidestream_scenario(failures: &mut Vec<String>) {
    for (cap, bound) in [(None, 0.95), (Some("99"), 0.40)] {
        let mut first = Vec::new();
        sidestream_run(cap, bound, &mut first);
        if !first.is_empty() {
            println!("lifecycle: sidestream missed ({first:?}); running it once more");
            sidestream_run(cap, bound, failures);
        }
    }
}

fn sidestream_run(cap: Option<&str>, bound: f64, failures: &mut Vec<String>) {
    const MS: u64 = 3_000;
    let what = if cap.is_some() {
        "sidestream-cap"
    } else {
        "sidestream"
    };
    let scene = Scene::new("lifecycle", what);
    let control = Scene::new("lifecycle", &format!("{what}-control"));
    let start = start_in(500);
    let mut share = vec![("GPUSLICE_COMPUTE_SHARE", "50")];
    let neighbour_share = share.clone();
    share.extend(cap.map(|c| ("GPUSLICE_COMPUTE_LIMIT", c)));
    let neighbour_args = [s("request"), s(start), s(MS), s(100), s(1), s(50)];
    let side_args = [s("sidestream"), s(start), s(MS), s(20_000), s(50)];
    let neighbour = scene.client("neighbour", true, &neighbour_share, &neighbour_args);
    let side = scene.client("side", true, &share, &side_args);
    let c_neighbour = control.client("neighbour", false, &[], &neighbour_args);
    let c_side = control.client("side", false, &[], &side_args);
    let deadline = Instant::now() + Duration::from_millis(MS + 15_000);
    let run = expect_success(side, "sidestream tenant", deadline, failures);
    let c_run = expect_success(c_side, "sidestream control", deadline, failures);
    let _ = expect_success(neighbour, "idle neighbour", deadline, failures);
    let _ = expect_success(c_neighbour, "idle neighbour (control)", deadline, failures);
    let (Some(run), Some(c_run)) = (run, c_run) else {
        return;
    };
    let n = |r: &Run| r.get("short_launches").parse::<f64>().unwrap_or(0.0);
    let ratio = n(&run) / n(&c_run).max(1.0);
    println!(
        "lifecycle: {what}: {} 50 us launches beside a 20 ms kernel loop, {} without gpuslice ({:.1}%, bound {:.0}%)",
        n(&run),
        n(&c_run),
        ratio * 100.0,
        bound * 100.0
    );
    if ratio < bound {
        failures.push(format!(
            "{what}: {:.1}% of the 50 us launch rate without gpuslice, bound {:.0}%\n{}",
            ratio * 100.0,
            bound * 100.0,
            run.report()
        ));
    }
}

/// Driver calls one client made, by name, from simgpu's trace of it.
fn calls(trace: &std::path::Path) -> std::collections::HashMap<String, u64> {
    let mut m = std::collections::HashMap::new();
    for line in std::fs::read_to_string(trace).unwrap_or_default().lines() {
        if let Some(name) = line.split_whitespace().nth(1) {
            if name.starts_with("cu") {
                *m.entry(name.to_string()).or_insert(0) += 1;
            }
        }
    }
    m
}

/// Beside a neighbour that merely exists (one 50 us kernel every 100 ms, an idle inference
/// server), a tenant with a share stays on the launch fast path: gpuslice adds no driver call to
/// its launches (docs/COMPUTE.md, "Contention"). Judged by simgpu's trace of the tenant's driver
/// calls: its own are one `cuEventSynchronize`, one `cuLaunchKernel` and one `cuEventRecord` per
/// launch (`spin` mode); the slow path adds events, queries and capture checks to every launch
/// (5 or more). Then a neighbour of share 90 wakes beside a share-10 tenant on the fast path: it
/// gets its share from about 0.1 s on (running uncontended, both would get half), judged by the
/// busy counters.
fn idle_neighbour_scenario(failures: &mut Vec<String>) {
    const MS: u64 = 3_000;
    const WAKE_MS: u64 = 2_000;
    let scene = Scene::new("lifecycle", "idle-neighbour");
    let start = start_in(500);
    let t0 = Instant::now() + Duration::from_millis(500);
    let share = [("GPUSLICE_COMPUTE_SHARE", "50")];
    let neighbour = scene.client(
        "neighbour",
        true,
        &share,
        &[s("request"), s(start), s(MS), s(100), s(1), s(50)],
    );
    let trace = scene.dir.join("busy.trace");
    let trace_s = trace.to_string_lossy().into_owned();
    let busy = scene.client(
        "busy",
        true,
        &[("GPUSLICE_COMPUTE_SHARE", "50"), ("SIMGPU_TRACE", &trace_s)],
        &[s("spin"), s(start), s(MS), s(20)],
    );
    let deadline = t0 + Duration::from_millis(MS + 15_000);
    let run = expect_success(busy, "busy tenant", deadline, failures);
    let _ = expect_success(neighbour, "idle neighbour", deadline, failures);
    let Some(run) = run else { return };
    let c = calls(&trace);
    let launches = c.get("cuLaunchKernel").copied().unwrap_or(0);
    let total: u64 = c.values().sum();
    // The client's own three calls a launch, plus its set-up (a few dozen calls).
    let added = total.saturating_sub(3 * launches) as f64 / launches.max(1) as f64;
    let line = format!(
        "idle neighbour: {launches} launches ({} printed), driver calls per launch added {added:.3} \
         (bound 0.1; slow path: 5 or more)",
        run.get("launches")
    );
    println!("lifecycle: {line}");
    if launches < 1_000 || added > 0.1 {
        let mut top: Vec<_> = c.into_iter().collect();
        top.sort_by_key(|e| std::cmp::Reverse(e.1));
        top.truncate(12);
        failures.push(format!("{line}; calls: {top:?}"));
    }

    // The neighbour wakes beside a busy tenant that has been on the fast path for a while.
    let scene = Scene::new("lifecycle", "neighbour-wakes");
    let start = start_in(300);
    let t0 = Instant::now() + Duration::from_millis(300);
    let busy = scene.client(
        "busy",
        true,
        &[("GPUSLICE_COMPUTE_SHARE", "10")],
        &[s("spin"), s(start), s(MS), s(200)],
    );
    let wake = start + WAKE_MS * 1_000_000;
    let neighbour = scene.client(
        "neighbour",
        true,
        &[("GPUSLICE_COMPUTE_SHARE", "90")],
        &[s("spin"), s(wake), s(MS - WAKE_MS), s(200)],
    );
    std::thread::sleep(
        (t0 + Duration::from_millis(WAKE_MS + 100)).saturating_duration_since(Instant::now()),
    );
    let part = scene.part_of_busy("neighbour", Duration::from_millis(600));
    let deadline = t0 + Duration::from_millis(MS + 15_000);
    let _ = expect_success(busy, "busy tenant", deadline, failures);
    let _ = expect_success(neighbour, "woken neighbour", deadline, failures);
    println!(
        "lifecycle: a share-90 neighbour waking beside a share-10 tenant on the fast path: {:.1}% \
         of the busy time over 0.1..0.7 s after it woke",
        part * 100.0
    );
    if part < 0.75 {
        failures.push(format!(
            "neighbour wakes: {:.1}% of the busy time over 0.1..0.7 s after it woke, bound 75% \
             (share 90 beside 10; 50% is what no scheduling gives)",
            part * 100.0
        ));
    }
}

/// One run of the shared-turn scenario: the two processes of tenant "pair" (one ledger), each
/// making a request every 10 ms (4 kernels of 200 us, then a synchronisation) at the same moments,
/// on a device of their own (`control`) and, at the same time, on another beside tenant "third"
/// (a request every 4 ms, 2 kernels of 200 us: it wants the device all along, so the pair is
/// contended, but it leaves most of the device free). Returns the pair's p50s (us) beside the
/// third tenant and alone.
fn turn_pair(failures: &mut Vec<String>) -> Option<([u64; 2], [u64; 2])> {
    const MS: u64 = 3_000;
    let beside = Scene::new("lifecycle", "turn");
    let alone = Scene::new("lifecycle", "turn-control");
    let start = start_in(700);
    let t0 = Instant::now() + Duration::from_millis(700);
    let share = [("GPUSLICE_COMPUTE_SHARE", "50")];
    let pair_args = [s("request"), s(start), s(MS), s(10), s(4), s(200)];
    let third = beside.client(
        "third",
        true,
        &share,
        &[s("request"), s(start), s(MS), s(4), s(2), s(200)],
    );
    let b = [
        beside.client("pair", true, &share, &pair_args),
        beside.client("pair", true, &share, &pair_args),
    ];
    let a = [
        alone.client("pair", true, &share, &pair_args),
        alone.client("pair", true, &share, &pair_args),
    ];
    let deadline = t0 + Duration::from_millis(MS + 15_000);
    let mut p50 = |runs: [Child; 2], desc: &str| {
        let mut got = [0u64; 2];
        for (g, c) in got.iter_mut().zip(runs) {
            *g = expect_success(c, desc, deadline, failures)?.get_u64("p50_us");
        }
        Some(got)
    };
    let beside_p50 = p50(b, "a process of the pair beside the third tenant");
    let alone_p50 = p50(a, "a process of the pair alone");
    let _ = expect_success(third, "third tenant", deadline, failures);
    Some((beside_p50?, alone_p50?))
}

/// A tenant's processes share its turn (docs/COMPUTE.md, "A tenant's processes share its turn"):
/// two processes of one tenant beside a third tenant see p50 request latency within 1.2x of the
/// same two alone, run at the same moment on a device of their own (plus 50 us for a busy
/// machine's wake-ups). Taking turns between themselves, each process's request waited for the
/// other's (its idle hand-over) as well as for the third tenant: 1.41x (1188 against 840 us) where
/// sharing the turn measured 1.15x (962 against 839 us). Up to three attempts.
fn turn_scenario(failures: &mut Vec<String>) {
    let mut last = String::new();
    for attempt in 1..=3 {
        let mut f = Vec::new();
        let Some((beside, alone)) = turn_pair(&mut f) else {
            failures.extend(f);
            return;
        };
        let (b, a) = (beside[0].max(beside[1]), alone[0].max(alone[1]));
        let bound = a as f64 * 1.2 + 50.0;
        last = format!(
            "shared turn: p50 of the pair's requests beside a third tenant {beside:?} us, alone \
             {alone:?} us (bound on the larger: {bound:.0} us)"
        );
        println!("lifecycle: {last} (attempt {attempt})");
        if (b as f64) <= bound {
            return;
        }
    }
    failures.push(last);
}

/// Driver calls gpuslice adds per launch under contention (docs/COMPUTE.md, "Measuring device
/// time"): two tenants of shares 30 and 70 spinning 200 us kernels (eight in flight); judged by
/// simgpu's trace of the share-30 one, less the client's own three calls a launch (`spin`). Each
/// stream's launches are measured in batches (one event after about 2 ms of work, chained to the
/// previous one while the stream is busy), completions looked at only when flow control or the
/// scheduler thread needs them, and a drain sleeps for what is known to be left of its work
/// (`drain`) instead of looking every 20 us, and capture checks are made only once the process
/// has begun a capture: 0.58-0.68 calls a launch on a loaded 2-core machine (0.92-1.00 with a
/// capture check and two capture-mode exchanges at every batch and wait; 1.43-1.45 with the 20 us
/// looks; about 13 with an event pair, queries, capture-mode exchanges and stream look-ups around
/// every launch). Bounded at 0.85, a margin for a loaded host, whose late threads lengthen waits
/// and so add looks; the code before the capture flag fails it. The sparser events must keep the shares: the
/// share-30 tenant's part of the busy device over a window after the start is 30 ± 5 points.
fn contended_calls_scenario(failures: &mut Vec<String>) {
    const MS: u64 = 3_000;
    let scene = Scene::new("lifecycle", "contended-calls");
    let start = start_in(500);
    let t0 = Instant::now() + Duration::from_millis(500);
    let other = scene.client(
        "other",
        true,
        &[("GPUSLICE_COMPUTE_SHARE", "70")],
        &[s("spin"), s(start), s(MS), s(200)],
    );
    let trace = scene.dir.join("traced.trace");
    let trace_s = trace.to_string_lossy().into_owned();
    let traced = scene.client(
        "traced",
        true,
        &[("GPUSLICE_COMPUTE_SHARE", "30"), ("SIMGPU_TRACE", &trace_s)],
        &[s("spin"), s(start), s(MS), s(200)],
    );
    // From 0.7 s after the start (both running, the scheduling settled) for 1.8 s.
    let settle = (t0 + Duration::from_millis(700)).saturating_duration_since(Instant::now());
    std::thread::sleep(settle);
    let part = scene.part_of_busy("traced", Duration::from_millis(1_800));
    let deadline = t0 + Duration::from_millis(MS + 15_000);
    let run = expect_success(traced, "traced tenant", deadline, failures);
    let _ = expect_success(other, "other tenant", deadline, failures);
    if run.is_none() {
        return;
    }
    let c = calls(&trace);
    let launches = c.get("cuLaunchKernel").copied().unwrap_or(0);
    let total: u64 = c.values().sum();
    let added = total.saturating_sub(3 * launches) as f64 / launches.max(1) as f64;
    let mut top: Vec<_> = c.into_iter().collect();
    top.sort_by_key(|e| std::cmp::Reverse(e.1));
    top.truncate(10);
    let line = format!(
        "contended: {launches} launches, driver calls per launch added {added:.2} (bound 0.85), \
         share-30 tenant's part of the busy device {:.1}% (30 +- 5); calls: {top:?}",
        part * 100.0
    );
    println!("lifecycle: {line}");
    if launches < 100 || added > 0.85 || (part - 0.30).abs() > 0.05 {
        failures.push(line);
    }
}

/// What gpuslice adds to a high-priority tenant's requests beside a saturating normal tenant
/// (docs/COMPUTE.md, "Priority"): requests of 10 x 100 us every 20 ms (`request`) beside 2 ms
/// kernels, judged by simgpu's trace of the high-priority client, whose own calls record no event.
/// It keeps 32 launches in flight and records an event every 16 launches (`priority`), so a
/// request's launches never wait in flow control for its own kernels and record none; the batch a
/// request leaves open is closed once it stops launching: about one event record a request (the
/// code before recorded one after every launch, 10 a request, and kept 4 launches in flight).
/// Bounded at 3 a request. And its ownership is not handed over as stalled while its request
/// waits behind the normal kernel that ran before its grant (`priority::stall_ns`; with a stall
/// time of 1 ms, 109 of 200 requests were, and the normal tenant queued a second kernel ahead of
/// them): at most one request in ten (its debug log's hand-overs). The normal tenant, whose thread
/// waits in flow control for its one kernel in flight, is not idle meanwhile: it hands the device
/// to itself as idle at most once in ten requests (its debug log; `turn::may_go_idle`: ~2,200 times
/// in these 2 s before).
fn high_priority_calls_scenario(failures: &mut Vec<String>) {
    const MS: u64 = 2_000;
    let scene = Scene::new("lifecycle", "high-calls");
    let start = start_in(500);
    let trace = scene.dir.join("high.trace");
    let trace_s = trace.to_string_lossy().into_owned();
    let high = scene.client(
        "high",
        true,
        &[
            ("GPUSLICE_PRIORITY", "high"),
            ("SIMGPU_TRACE", &trace_s),
            ("GPUSLICE_LOG", "debug"),
        ],
        &[s("request"), s(start), s(MS), s(20), s(10), s(100)],
    );
    let normal = scene.client(
        "normal",
        true,
        &[("GPUSLICE_COMPUTE_SHARE", "50"), ("GPUSLICE_LOG", "debug")],
        &[s("spin"), s(start), s(MS), s(2000), s(2)],
    );
    let deadline = Instant::now() + Duration::from_millis(MS + 15_000);
    let run = expect_success(high, "high-priority tenant", deadline, failures);
    let normal = expect_success(normal, "normal tenant", deadline, failures);
    let (Some(run), Some(normal)) = (run, normal) else {
        return;
    };
    // The normal tenant's thread waits in flow control for its one kernel in flight: not idle.
    // Counted idle, it handed the device to itself every ~0.55 ms (~2,200 times in 2 s; the debug
    // log keeps what fits in the pipe, a few hundred lines).
    let own = normal
        .stderr
        .split("(slot ")
        .nth(1)
        .and_then(|t| t.split(')').next())
        .map(|n| format!("-> Grant {{ slot: {n},"));
    let selfish = own.map_or(0, |own| {
        normal
            .stderr
            .lines()
            .filter(|l| l.contains("released (Idle)") && l.contains(&own))
            .count() as u64
    });
    let requests = run.get_u64("requests");
    let c = calls(&trace);
    let records = c.get("cuEventRecord").copied().unwrap_or(0);
    let per = records as f64 / requests.max(1) as f64;
    let stalled = run.stderr.matches("released (Stalled)").count() as u64;
    let line = format!(
        "high priority: {requests} requests of 10 launches, {records} event records ({per:.2} a \
         request, bound 3), handed over as stalled {stalled} times (bound {}), p50 {} us, p99 {} \
         us; the normal tenant handed the device to itself as idle {selfish} times (bound {})",
        requests / 10,
        run.get_u64("p50_us"),
        run.get_u64("p99_us"),
        requests / 10
    );
    println!("lifecycle: {line}");
    if requests < 20 || per > 3.0 || stalled > requests / 10 || selfish > requests / 10 {
        failures.push(line);
    }
}

/// A high-priority tenant that asks rarely (10 x 100 us every 60 ms: active in one demand window of
/// three) beside a normal tenant keeping four 2 ms kernels queued: the normal tenant is gated for
/// its requests (docs/COMPUTE.md, "Priority"; `demand::DEMAND_MIN_HIGH`): it owns the device and
/// is preempted at nearly every request (its debug log), keeping one kernel in flight. With demand
/// counted as for a normal tenant (three windows of four) the high-priority tenant never wanted
/// the device, the normal tenant stayed on the fast path and was never preempted, and each request
/// waited behind up to four normal kernels.
fn high_priority_sparse_scenario(failures: &mut Vec<String>) {
    const MS: u64 = 2_000;
    let scene = Scene::new("lifecycle", "high-sparse");
    let start = start_in(500);
    let high = scene.client(
        "high",
        true,
        &[("GPUSLICE_PRIORITY", "high")],
        &[s("request"), s(start), s(MS), s(60), s(10), s(100)],
    );
    let normal = scene.client(
        "normal",
        true,
        &[("GPUSLICE_COMPUTE_SHARE", "50"), ("GPUSLICE_LOG", "debug")],
        &[s("spin"), s(start), s(MS), s(2000), s(4)],
    );
    let deadline = Instant::now() + Duration::from_millis(MS + 15_000);
    let run = expect_success(high, "high-priority tenant", deadline, failures);
    let normal = expect_success(normal, "normal tenant", deadline, failures);
    let (Some(run), Some(normal)) = (run, normal) else {
        return;
    };
    let requests = run.get_u64("requests");
    let preempted = normal.stderr.matches("released (Preempted)").count() as u64;
    let line = format!(
        "sparse high priority: {requests} requests every 60 ms, the normal tenant preempted \
         {preempted} times (bound: at least {}), p50 {} us, p99 {} us",
        requests / 2,
        run.get_u64("p50_us"),
        run.get_u64("p99_us")
    );
    println!("lifecycle: {line}");
    if requests < 10 || preempted < requests / 2 {
        failures.push(line);
    }
}

/// A capture begun late by a process on a contended device (docs/COMPUTE.md, "Capture"): until
/// the process begins a capture, the shim makes no capture check on the launch path (no
/// `cuStreamIsCapturing`, no capture-mode exchange: they cost each contended launch driver calls;
/// its scheduler thread relaxes its own mode once, when it starts); its begin, resolved
/// through `cuGetProcAddress` as the CUDA runtime resolves it, reaches the shim's hook, and from
/// then on the shim checks: 40 launches of 200 us captured on the stream it measured batches of
/// (more than two batches) give a graph of exactly those 40 kernels, the capture ends without
/// error, and no event is recorded while it goes on (the client records none itself then;
/// simgpu's trace of the process, between the begin and the end). The graph then runs.
fn capture_late_scenario(failures: &mut Vec<String>) {
    const MS: u64 = 1_500;
    const N: u64 = 40;
    let scene = Scene::new("lifecycle", "capture-late");
    let start = start_in(500);
    let t0 = Instant::now() + Duration::from_millis(500);
    let other = scene.client(
        "other",
        true,
        &[("GPUSLICE_COMPUTE_SHARE", "50")],
        &[s("spin"), s(start), s(MS + 1_000), s(200)],
    );
    let trace = scene.dir.join("capturing.trace");
    let trace_s = trace.to_string_lossy().into_owned();
    let capturing = scene.client(
        "capturing",
        true,
        &[("GPUSLICE_COMPUTE_SHARE", "50"), ("SIMGPU_TRACE", &trace_s)],
        &[s("capturelate"), s(start), s(MS), s(200), s(N)],
    );
    let deadline = t0 + Duration::from_millis(MS + 15_000);
    let run = expect_success(capturing, "capturing tenant", deadline, failures);
    let _ = expect_success(other, "other tenant", deadline, failures);
    let Some(run) = run else { return };
    let text = std::fs::read_to_string(&trace).unwrap_or_default();
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    let begin = names
        .iter()
        .position(|n| n.starts_with("cuStreamBeginCapture"));
    let end = names
        .iter()
        .position(|n| n.starts_with("cuStreamEndCapture"));
    let (Some(begin), Some(end)) = (begin, end) else {
        failures.push(format!(
            "capture-late: no begin or end of capture in the trace\n{}",
            run.report()
        ));
        return;
    };
    let count = |part: &[&str], name: &str| part.iter().filter(|n| n.starts_with(name)).count();
    let before = &names[..begin];
    let during = &names[begin..end];
    let line = format!(
        "capture-late: before the capture {} launches, {} cuStreamIsCapturing (0 expected), {} \
         capture-mode exchanges (at most 1: the scheduler thread's, once); during it {} launches, {} cuStreamIsCapturing (> 0), {} \
         event records (0); capture_end={} graph_nodes={} ({N}) graph_launch={}",
        count(before, "cuLaunchKernel"),
        count(before, "cuStreamIsCapturing"),
        count(before, "cuThreadExchangeStreamCaptureMode"),
        count(during, "cuLaunchKernel"),
        count(during, "cuStreamIsCapturing"),
        count(during, "cuEventRecord"),
        run.get_u64("capture_end"),
        run.get_u64("graph_nodes"),
        run.get_u64("graph_launch"),
    );
    println!("lifecycle: {line}");
    if count(before, "cuLaunchKernel") < 100
        || count(before, "cuStreamIsCapturing") != 0
        || count(before, "cuThreadExchangeStreamCaptureMode") > 1
        || count(during, "cuStreamIsCapturing") == 0
        || count(during, "cuEventRecord") != 0
        || run.get_u64("capture_end") != 0
        || run.get_u64("graph_nodes") != N
        || run.get_u64("graph_launch") != 0
    {
        failures.push(line);
    }
}

#[test]
fn compute_lifecycle_on_simgpu() {
    // COMPUTE_SCENARIOS=teardown,reuse,quit,idle,neighbour,hostflag,sidestream,turn,calls,capture,highcalls,highsparse (a comma list) runs
    // only those, for development.
    let only = std::env::var("COMPUTE_SCENARIOS").ok();
    let wanted = |name: &str| {
        only.as_deref()
            .is_none_or(|l| l.split(',').any(|w| w == name))
    };
    let mut failures = Vec::new();
    if wanted("teardown") {
        teardown_scenario(&mut failures);
    }
    if wanted("reuse") {
        reuse_scenario("reset", &mut failures);
        reuse_scenario("destroy", &mut failures);
    }
    if wanted("quit") {
        quit_scenario("return", &mut failures);
        quit_scenario("exit", &mut failures);
    }
    if wanted("idle") {
        idle_high_scenario(&mut failures);
    }
    if wanted("neighbour") {
        idle_neighbour_scenario(&mut failures);
    }
    if wanted("hostflag") {
        hostflag_scenario(&mut failures);
    }
    if wanted("sidestream") {
        sidestream_scenario(&mut failures);
    }
    if wanted("turn") {
        turn_scenario(&mut failures);
    }
    if wanted("calls") {
        contended_calls_scenario(&mut failures);
    }
    if wanted("capture") {
        capture_late_scenario(&mut failures);
    }
    if wanted("highcalls") {
        high_priority_calls_scenario(&mut failures);
    }
    if wanted("highsparse") {
        high_priority_sparse_scenario(&mut failures);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
