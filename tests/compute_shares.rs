//! Compute shares (docs/COMPUTE.md) on simgpu. The judge is simgpu's busy counters per
//! `SIMGPU_GROUP` (= tenant), never gpuslice's own figures. Every scenario runs in one test, one after
//! the other: they are timing measurements on a 2-core machine and must not compete for the CPU.
//! Each prints `compute-table: ...` lines (the figures in docs/BENCHMARKS.md).
//!
//! A busy machine must not fail this test: when a scenario misses its target, a control runs at
//! once — the same kind of clients **without** gpuslice, which keep a device at least 95% busy on a
//! machine that can feed it — and is printed beside the miss, then the scenario runs once more; a
//! second miss fails the test. A control run afterwards cannot see a neighbour's burst of CPU that
//! took one of a scenario's one- or two-second windows (it once passed at 98.8% after SIGCONT's
//! window measured 46%), so a single miss is not trusted either way; a fault that misses every time
//! still fails, with both runs' figures.

use gpuslice_testkit as common;

use common::libgpuslice as shim;
use common::*;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

local_scene!();

impl Scene {
    fn two_gpus(tag: &str) -> Scene {
        let mut scene = Scene::new("compute", tag);
        scene.sim = Sim::new(&format!("compute-{tag}")).env("SIMGPU_DEVICES", "2");
        scene
    }

    /// A client process of `tenant` (its own memory ledger) with `env` (compute settings), judged as
    /// group `tenant`; named `tenant` too unless `env` says `GPUSLICE_TENANT=` (no name).
    fn client(&self, tenant: &str, env: &[(&str, &str)], args: &[String]) -> Command {
        let mut cmd = self.sim.command(compile(&COMPUTE));
        cmd.env("LD_PRELOAD", shim())
            .env("SIMGPU_GROUP", tenant)
            .env("GPUSLICE_TENANT", tenant)
            .env("GPUSLICE_LEDGER", self.dir.join(format!("{tenant}.ledger")))
            .env("GPUSLICE_DEVICE_DIR", self.dir.join("devices"))
            .envs(env.iter().copied())
            .args(args);
        if env.contains(&("GPUSLICE_TENANT", "")) {
            cmd.env_remove("GPUSLICE_TENANT");
        }
        cmd
    }

    /// The same client without gpuslice (the control).
    fn bare_client(&self, tenant: &str, args: &[String]) -> Command {
        let mut cmd = self.sim.command(compile(&COMPUTE));
        cmd.env("SIMGPU_GROUP", tenant).args(args);
        cmd
    }

    fn spawn(&self, tenant: &str, env: &[(&str, &str)], args: &[String]) -> Child {
        self.sim.spawn(&mut self.client(tenant, env, args))
    }

    fn device_busy(&self) -> u64 {
        self.sim.stat().u64("devices.0.busy_ns")
    }
}

/// A tenant of a share scenario: name, share, client arguments after START_NS.
struct T<'a> {
    name: &'a str,
    share: u32,
    procs: usize,
    args: Vec<String>,
}

/// The control: `clients` (spin arguments `MS US [DEPTH]` without the start) run without gpuslice for
/// 1.5 s; the fraction of that time the device was busy. Below 95%, the machine could not feed it.
fn control(tag: &str, clients: &[Vec<String>]) -> f64 {
    let scene = Scene::new("compute", &format!("{tag}-control"));
    let start = start_in(500);
    let t0 = Instant::now() + Duration::from_millis(500);
    let children: Vec<Child> = clients
        .iter()
        .enumerate()
        .map(|(i, a)| {
            // A leading "batch" or "ptsz": that mode, its `US N` after the duration.
            let (mode, skip) = match a.first().map(String::as_str) {
                Some(m @ ("batch" | "ptsz")) => (m, 2),
                _ => ("spin", 1),
            };
            let mut args = vec![s(mode), s(start), s(2000)];
            args.extend(a.iter().skip(skip).cloned());
            scene
                .sim
                .spawn(&mut scene.bare_client(&format!("c{i}"), &args))
        })
        .collect();
    let (dev, _) = rate(
        &scene,
        &[],
        t0,
        Duration::from_millis(300),
        Duration::from_millis(1800),
    );
    for c in children {
        finish(c, "control client").assert_success();
    }
    dev
}

/// Runs a scenario (`run` returns its failures); on a miss, it runs once more and only a second
/// miss fails: the windows are a second or two, and a neighbour's burst of CPU (a build beside
/// the tests) can take one of them from a 2-core machine, which no control run afterwards sees.
/// The control without gpuslice is run and printed with the miss, to tell starvation from a
/// scheduling fault.
fn judged(
    tag: &str,
    clients: &[Vec<String>],
    failures: &mut Vec<String>,
    mut run: impl FnMut() -> Vec<String>,
) {
    let missed = run();
    if missed.is_empty() {
        return;
    }
    let busy = control(tag, clients);
    println!(
        "compute-table: {tag}: missed ({missed:?}); control without gpuslice kept the device {:.1}% busy; running the scenario once more",
        busy * 100.0
    );
    failures.extend(run().into_iter().map(|f| {
        format!(
            "{f} (second run; the first: {missed:?}; control {:.1}% busy)",
            busy * 100.0
        )
    }));
}

fn spin_args(ms: u64, us: u64) -> Vec<String> {
    vec![s(ms), s(us)]
}

/// Runs tenants for their duration; returns (name, target %, measured % of the busy time).
fn shares(tag: &str, tenants: &[T], env: &[(&str, &str)]) -> Vec<(String, f64, f64)> {
    let scene = Scene::new("compute", tag);
    let start = start_in(700);
    let mut children = Vec::new();
    for t in tenants {
        for _ in 0..t.procs {
            // `spin` arguments; three of them: a graph tenant; a leading "streams": two streams;
            // a leading "ptsz": per-thread default streams of several threads.
            let (mode, rest) = match t.args.first().map(String::as_str) {
                Some("streams") => ("streams", &t.args[1..]),
                Some("ptsz") => ("ptsz", &t.args[1..]),
                Some("batch") => ("batch", &t.args[1..]),
                _ if t.args.len() == 3 => ("graph", &t.args[..]),
                _ => ("spin", &t.args[..]),
            };
            let mut args = vec![s(mode), s(start)];
            args.extend(rest.iter().cloned());
            let share = s(t.share);
            let mut e = vec![("GPUSLICE_COMPUTE_SHARE", share.as_str())];
            e.extend_from_slice(env);
            children.push((t.name, scene.spawn(t.name, &e, &args)));
        }
    }
    for (name, c) in children {
        finish(c, name).assert_success();
    }
    let busy: Vec<u64> = tenants.iter().map(|t| scene.busy(t.name)).collect();
    let total: u64 = busy.iter().sum();
    let sum: u32 = tenants.iter().map(|t| t.share).sum();
    let out: Vec<(String, f64, f64)> = tenants
        .iter()
        .zip(&busy)
        .map(|(t, b)| {
            (
                t.name.to_string(),
                t.share as f64 * 100.0 / sum as f64,
                *b as f64 * 100.0 / total.max(1) as f64,
            )
        })
        .collect();
    println!("compute-table: {tag}: {out:?} (busy {total} ns)");
    out
}

fn assert_shares(tag: &str, got: &[(String, f64, f64)], failures: &mut Vec<String>) {
    for (name, want, have) in got {
        if (want - have).abs() > 3.0 {
            failures.push(format!(
                "{tag}: tenant {name} got {have:.1}% (target {want:.1}% +-3)"
            ));
        }
    }
}

/// Busy of the device and of each group over `[t0, t1]` from now, sampled by simgpu-stat.
fn rate(
    scene: &Scene,
    groups: &[&str],
    from: Instant,
    t0: Duration,
    t1: Duration,
) -> (f64, Vec<f64>) {
    std::thread::sleep((from + t0).saturating_duration_since(Instant::now()));
    let a = (
        Instant::now(),
        scene.device_busy(),
        groups.iter().map(|g| scene.busy(g)).collect::<Vec<_>>(),
    );
    std::thread::sleep((from + t1).saturating_duration_since(Instant::now()));
    let b = (
        Instant::now(),
        scene.device_busy(),
        groups.iter().map(|g| scene.busy(g)).collect::<Vec<_>>(),
    );
    let wall = (b.0 - a.0).as_nanos() as f64;
    (
        (b.1 - a.1) as f64 / wall,
        a.2.iter()
            .zip(&b.2)
            .map(|(x, y)| (y - x) as f64 / wall)
            .collect(),
    )
}

#[test]
fn compute_shares_on_simgpu() {
    let mut failures = Vec::new();
    // COMPUTE_SCENARIOS=priority,stop (a comma list) runs only those scenarios, for development.
    let only = std::env::var("COMPUTE_SCENARIOS").ok();
    let wanted = |name: &str| {
        only.as_deref()
            .is_none_or(|l| l.split(',').any(|w| w == name))
    };
    const MS: u64 = 6_000;

    // Shares, 200 us spin kernels, deep queues.
    for (tag, list) in [
        ("30/70", vec![("a", 30), ("b", 70)]),
        ("50/50", vec![("a", 50), ("b", 50)]),
        (
            "10/20/30/40",
            vec![("a", 10), ("b", 20), ("c", 30), ("d", 40)],
        ),
    ]
    .into_iter()
    .filter(|_| wanted("shares"))
    {
        let ts: Vec<T> = list
            .iter()
            .map(|&(name, share)| T {
                name,
                share,
                procs: 1,
                args: spin_args(MS, 200),
            })
            .collect();
        let clients: Vec<Vec<String>> = ts.iter().map(|t| t.args.clone()).collect();
        judged(tag, &clients, &mut failures, || {
            let mut f = Vec::new();
            assert_shares(tag, &shares(tag, &ts, &[]), &mut f);
            f
        });
    }
    // Tenants told apart by their memory ledgers, not by names: neither is named (both "default").
    if wanted("identity") {
        let ts = [
            T {
                name: "a",
                share: 30,
                procs: 1,
                args: spin_args(MS, 200),
            },
            T {
                name: "b",
                share: 70,
                procs: 1,
                args: spin_args(MS, 200),
            },
        ];
        let clients: Vec<Vec<String>> = ts.iter().map(|t| t.args.clone()).collect();
        judged("identity", &clients, &mut failures, || {
            let mut f = Vec::new();
            let got = shares("unnamed ledgers 30/70", &ts, &[("GPUSLICE_TENANT", "")]);
            assert_shares("identity", &got, &mut f);
            f
        });
    }
    // Deep batches then a wait: 16 kernels of 2 ms queued at once, then a wait for them (stream
    // synchronisation in `batch`, an event recorded after them in `batch-event`). The process
    // launches in few demand windows and spends the rest blocked while its queue keeps the device
    // busy; it must still count as wanting the device (it got 50/50 at shares 10/90 when only
    // launches counted).
    for (scenario, wait) in [("batch", None), ("batch-event", Some("event"))] {
        if !wanted(scenario) {
            continue;
        }
        let args = |wait: Option<&str>| {
            let mut args = vec![s("batch"), s(MS), s(2000), s(16)];
            args.extend(wait.map(s));
            args
        };
        let ts = [
            T {
                name: "a",
                share: 10,
                procs: 1,
                args: args(wait),
            },
            T {
                name: "b",
                share: 90,
                procs: 1,
                args: args(wait),
            },
        ];
        let clients: Vec<Vec<String>> = ts.iter().map(|t| t.args.clone()).collect();
        // Without the host-wait demand: 50/50; while a drained owner blocked in its
        // synchronisation was left out of the choice at hand-over: 15-22% for the share-10 tenant.
        judged(scenario, &clients, &mut failures, || {
            let mut f = Vec::new();
            let got = shares(&format!("{scenario} 10/90, 2 ms x 16"), &ts, &[]);
            assert_shares(scenario, &got, &mut f);
            f
        });
    }
    // Mixed kernel lengths: 50 us against 5 ms.
    if wanted("mixed") {
        let ts = [
            T {
                name: "a",
                share: 50,
                procs: 1,
                args: spin_args(MS, 50),
            },
            T {
                name: "b",
                share: 50,
                procs: 1,
                args: spin_args(MS, 5000),
            },
        ];
        let clients: Vec<Vec<String>> = ts.iter().map(|t| t.args.clone()).collect();
        judged("mixed", &clients, &mut failures, || {
            let mut f = Vec::new();
            assert_shares("mixed", &shares("mixed 50us/5ms 50/50", &ts, &[]), &mut f);
            f
        });
    }
    // A tenant that synchronises after every long kernel (10 ms, then cuStreamSynchronize: a
    // training step reading its loss) beside 200 us kernels, 50/50. Its queue is empty between
    // steps for as long as the host takes to launch the next one; the long kernel must not be
    // taken for a stall (the old 1 ms stall time handed the device over under it).
    if wanted("sync-long") {
        let ts = [
            T {
                name: "a",
                share: 50,
                procs: 1,
                args: vec![s("batch"), s(MS), s(10_000), s(1)],
            },
            T {
                name: "b",
                share: 50,
                procs: 1,
                args: spin_args(MS, 200),
            },
        ];
        let clients: Vec<Vec<String>> = ts.iter().map(|t| t.args.clone()).collect();
        judged("sync-long", &clients, &mut failures, || {
            let mut f = Vec::new();
            let got = shares("sync-long 10ms+sync/200us 50/50", &ts, &[]);
            assert_shares("sync-long", &got, &mut f);
            f
        });
    }
    // A tenant made of two processes.
    if wanted("two") {
        let ts = [
            T {
                name: "a",
                share: 30,
                procs: 1,
                args: spin_args(MS, 200),
            },
            T {
                name: "b",
                share: 70,
                procs: 2,
                args: spin_args(MS, 200),
            },
        ];
        let clients: Vec<Vec<String>> = vec![spin_args(MS, 200); 3];
        judged("two-process", &clients, &mut failures, || {
            let mut f = Vec::new();
            let got = shares("two-process tenant 30/70", &ts, &[]);
            assert_shares("two-process", &got, &mut f);
            f
        });
    }
    // A tenant whose kernels run on two concurrent streams against one with one stream: charged the
    // time it held the device, not the sum of its streams' intervals (simgpu's counters take the
    // union of a tenant's busy intervals).
    if wanted("streams") {
        let ts = [
            T {
                name: "a",
                share: 50,
                procs: 1,
                args: vec![s("streams"), s(MS), s(200)],
            },
            T {
                name: "b",
                share: 50,
                procs: 1,
                args: spin_args(MS, 200),
            },
        ];
        let clients = vec![spin_args(MS, 200); 2];
        judged("streams", &clients, &mut failures, || {
            let mut f = Vec::new();
            let got = shares("two streams vs one 50/50", &ts, &[]);
            assert_shares("streams", &got, &mut f);
            f
        });
    }
    // Per-thread default streams (`_ptsz` entry points with NULL, and CU_STREAM_PER_THREAD): one
    // handle names a different stream in every thread, so each thread's launches are measured on
    // their own stream (a launch chained to another thread's event would be charged short). Three
    // threads of tenant a, 30, against two of tenant b, 70.
    if wanted("ptsz") {
        let ts = [
            T {
                name: "a",
                share: 30,
                procs: 1,
                args: vec![s("ptsz"), s(MS), s(200), s(3)],
            },
            T {
                name: "b",
                share: 70,
                procs: 1,
                args: vec![s("ptsz"), s(MS), s(200), s(2)],
            },
        ];
        let clients: Vec<Vec<String>> = ts.iter().map(|t| t.args.clone()).collect();
        judged("ptsz", &clients, &mut failures, || {
            let mut f = Vec::new();
            let got = shares("per-thread streams 30/70", &ts, &[]);
            assert_shares("ptsz", &got, &mut f);
            f
        });
    }
    // A tenant that only launches CUDA graphs (10 captured spin launches each).
    if wanted("graph") {
        let ts = [
            T {
                name: "g",
                share: 30,
                procs: 1,
                args: vec![s(MS), s(200), s(10)],
            },
            T {
                name: "b",
                share: 70,
                procs: 1,
                args: spin_args(MS, 200),
            },
        ];
        let clients = vec![spin_args(MS, 200); 2];
        judged("graph", &clients, &mut failures, || {
            let mut f = Vec::new();
            assert_shares("graph", &shares("graph tenant 30/70", &ts, &[]), &mut f);
            f
        });
    }

    // Work-conserving: `a` stops after 1.5 s; within 1 s `b` keeps the device >= 95% busy (or
    // about as busy as it does alone without gpuslice, on a loaded machine).
    if wanted("conserving") {
        judged(
            "work-conserving",
            &[spin_args(MS, 200)],
            &mut failures,
            || {
                let scene = Scene::new("compute", "conserving");
                let start = start_in(700);
                let t0 = Instant::now() + Duration::from_millis(700);
                let a = scene.spawn(
                    "a",
                    &[("GPUSLICE_COMPUTE_SHARE", "50")],
                    &[s("spin"), s(start), s(1500), s(200)],
                );
                let b = scene.spawn(
                    "b",
                    &[("GPUSLICE_COMPUTE_SHARE", "50")],
                    &[s("spin"), s(start), s(3500), s(200)],
                );
                let (dev, _) = rate(
                    &scene,
                    &[],
                    t0,
                    Duration::from_millis(2500),
                    Duration::from_millis(3400),
                );
                finish(a, "a").assert_success();
                finish(b, "b").assert_success();
                println!(
                    "compute-table: work-conserving: device busy {:.1}% from 1 s after a stopped",
                    dev * 100.0
                );
                if dev >= 0.95 {
                    return Vec::new();
                }
                // Below 95%: about as busy as `b` alone keeps the device without gpuslice, measured
                // just after? One thread feeds 200 us kernels: on a loaded 2-core machine the debug
                // build's host work leaves gaps (debug builds at load 3-4: 84-93% busy beside a
                // control of 91-99%, which moves between the two runs as the load does; release
                // builds of this code and the one before it: 98-100% at load 3). A device held back
                // for the stopped tenant, or `b` kept to its share, reads 50-60%; the precise
                // figure is the benchmark's (docs/BENCHMARKS.md, "Compute shares").
                let bare = control("work-conserving-b", &[spin_args(MS, 200)]);
                println!(
                    "compute-table: work-conserving: b alone without gpuslice keeps the device {:.1}% busy",
                    bare * 100.0
                );
                if dev >= 0.75 && dev >= bare - 0.10 {
                    Vec::new()
                } else {
                    vec![format!(
                        "work-conserving: device {:.1}% busy (< 95%, and under 75% or more than 10 points under the {:.1}% that b alone keeps it without gpuslice)",
                        dev * 100.0,
                        bare * 100.0
                    )]
                }
            },
        );
    }

    // Cap: 30% alone on the device. The device runs a few points over (work in flight when the
    // bucket empties runs before it is charged); the test holds what a broken cap would miss by far
    // (alone, an uncapped tenant keeps the device ~100% busy), the precise figure is the
    // benchmark's (docs/BENCHMARKS.md, "Compute shares").
    if wanted("cap") {
        let scene = Scene::new("compute", "cap");
        let start = start_in(700);
        let run_ms = 6000;
        let c = scene.spawn(
            "c",
            &[("GPUSLICE_COMPUTE_LIMIT", "30")],
            &[s("spin"), s(start), s(run_ms), s(200)],
        );
        let r = finish(c, "c");
        r.assert_success();
        let wall = r.get_u64("end_ns") - r.get_u64("start_ns");
        let frac = scene.busy("c") as f64 / wall as f64;
        println!(
            "compute-table: cap 30 alone: {:.1}% busy over {} ms",
            frac * 100.0,
            wall / 1_000_000
        );
        if frac > 0.40 {
            failures.push(format!("cap 30: {:.1}% busy (> 40%)", frac * 100.0));
        }
    }

    // Priority: requests of 10 x 100 us every 20 ms, alone and beside 2 ms kernels.
    if wanted("priority") {
        judged(
            "priority",
            &[spin_args(MS, 2000)],
            &mut failures,
            priority_scenario,
        );
    }

    // A tenant SIGKILLed, then one SIGSTOPped, while holding the device: the other proceeds.
    for sig in [libc::SIGKILL, libc::SIGSTOP]
        .into_iter()
        .filter(|_| wanted("stop"))
    {
        let name = if sig == libc::SIGKILL {
            "SIGKILL"
        } else {
            "SIGSTOP"
        };
        judged(name, &[spin_args(MS, 200)], &mut failures, || {
            stop_scenario(name, sig)
        });
    }

    // A tenant stopped for 1 s and continued is back to its share within 1 s of continuing.
    if wanted("continue") {
        judged(
            "SIGCONT",
            &[spin_args(MS, 200), spin_args(MS, 200)],
            &mut failures,
            continue_scenario,
        );
    }

    // A share changed live reaches its target within one second.
    if wanted("live") {
        judged(
            "live",
            &[spin_args(MS, 200), spin_args(MS, 200)],
            &mut failures,
            live_scenario,
        );
    }

    // Two GPUs, contention on GPU 0 only: `a` spins on both, `b` on GPU 0. GPU 0 splits 50/50; `a`
    // keeps GPU 1 as busy as the same client does without gpuslice.
    if wanted("two-gpu") {
        judged(
            "two-gpu",
            &[spin_args(MS, 200), spin_args(MS, 200)],
            &mut failures,
            two_gpu_scenario,
        );
    }

    // Two tenants x two GPUs, each rank looping compute then a barrier with its peer rank on the
    // other GPU (like tensor-parallel servers doing an NCCL all-reduce): nobody hangs, and the whole
    // takes at most 2 x the time it takes without gpuslice. The goal is 1.5 x; on this 2-core
    // machine the ratio runs 1.0-1.35 x, quiet or beside a CPU hog (docs/BENCHMARKS.md, "Compute
    // shares"), so the test keeps a margin for a busier neighbour and the figure is the
    // benchmark's. Without a tenant's ranks passing their gates for a waiting collective
    // (`Sched::peer_pass`) it ran 1.3-1.9 x, and up to 2.7 x beside the hog; ranks that wait out a
    // whole slice or drain limit at every barrier take 10 x and more.
    if wanted("collectives") {
        judged(
            "collectives",
            &[spin_args(MS, 200), spin_args(MS, 200)],
            &mut failures,
            collectives_scenario,
        );
    }

    assert!(failures.is_empty(), "{failures:#?}");
}

/// The four ranks of tenants J and K (`gpuslice`: preloaded with shares 50/50, one memory ledger per
/// tenant); the time the collective work took — from the moment the last rank started its loop (the
/// first barrier waits for it) until the last one finished; process start-up is not part of it (it
/// has its own benchmark) — or what was still running at the deadline.
fn collectives_run(scene: &Scene, gpuslice: bool, deadline: Duration) -> Result<Duration, String> {
    const ITERS: &str = "300";
    let client = compile(&MULTIGPU);
    let t0 = Instant::now();
    let mut children = Vec::new();
    for (tenant, tag) in [("J", "1"), ("K", "2")] {
        for device in ["0", "1"] {
            let mut cmd = scene.sim.command(&client);
            cmd.env("SIMGPU_GROUP", tenant)
                .args(["rank", device, tag, "2", ITERS, "1000"]);
            if gpuslice {
                cmd.env("LD_PRELOAD", shim())
                    .env(
                        "GPUSLICE_LEDGER",
                        scene.dir.join(format!("{tenant}.ledger")),
                    )
                    .env("GPUSLICE_DEVICE_DIR", scene.dir.join("devices"))
                    .env("GPUSLICE_COMPUTE_SHARE", "50");
            }
            children.push((
                format!("{tenant} rank on GPU {device}"),
                scene.sim.spawn(&mut cmd),
            ));
        }
    }
    let mut waiting = Vec::new();
    for (name, child) in children.iter_mut() {
        while child.try_wait().unwrap().is_none() {
            if t0.elapsed() > deadline {
                waiting.push(name.clone());
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let mut report = Vec::new();
    let (mut started, mut ended) = (0, 0);
    for (name, child) in children {
        let r = finish(child, &name);
        if !r.status.success() || r.get("iterations") != ITERS {
            report.push(format!("{name}: {}", r.report()));
            continue;
        }
        started = r.get_u64("start_ns").max(started);
        ended = r.get_u64("end_ns").max(ended);
    }
    if !waiting.is_empty() {
        let status = Command::new(common::gpuslice_bin())
            .args(["status", "--compute"])
            .env("GPUSLICE_DEVICE_DIR", scene.dir.join("devices"))
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        return Err(format!(
            "still running after {deadline:?}: {waiting:?}; devices: {}; scheduling: {status}",
            scene.sim.stat()
        ));
    }
    if !report.is_empty() {
        return Err(report.join("\n"));
    }
    Ok(Duration::from_nanos(ended.saturating_sub(started)))
}

fn collectives_scenario() -> Vec<String> {
    // Both at once, on simulated GPUs of their own: whatever else the machine does weighs on both.
    let (bare, with) = std::thread::scope(|s| {
        let bare = s.spawn(|| {
            collectives_run(
                &Scene::two_gpus("coll-bare"),
                false,
                Duration::from_secs(60),
            )
        });
        let with = collectives_run(&Scene::two_gpus("coll"), true, Duration::from_secs(60));
        (bare.join().unwrap(), with)
    });
    let bare = match bare {
        Ok(w) => w,
        Err(e) => return vec![format!("collectives without gpuslice: {e}")],
    };
    let limit = bare.mul_f64(2.0);
    match with {
        Ok(w) => {
            println!(
                "compute-table: collectives, 2 tenants x 2 GPUs: {:.0} ms with gpuslice, {:.0} ms without ({:.2}x)",
                w.as_secs_f64() * 1e3,
                bare.as_secs_f64() * 1e3,
                w.as_secs_f64() / bare.as_secs_f64()
            );
            if w > limit {
                vec![format!(
                    "collectives: {:.0} ms with gpuslice > 2 x {:.0} ms without",
                    w.as_secs_f64() * 1e3,
                    bare.as_secs_f64() * 1e3
                )]
            } else {
                Vec::new()
            }
        }
        Err(e) => vec![format!("collectives: {e}")],
    }
}

fn priority_scenario() -> Vec<String> {
    let mut failures = Vec::new();
    let alone = {
        let scene = Scene::new("compute", "prio-alone");
        let c = scene.spawn(
            "h",
            &[("GPUSLICE_PRIORITY", "high")],
            &[
                s("request"),
                s(start_in(500)),
                // As long as the run beside: both p99s from 300 requests.
                s(6000),
                s(20),
                s(10),
                s(100),
            ],
        );
        let r = finish(c, "h alone");
        r.assert_success();
        r.get_u64("p99_us")
    };
    let (scene, rh, rn) = requests_beside_kernels("prio", ("GPUSLICE_PRIORITY", "high"));
    let p99 = rh.get_u64("p99_us");
    let wall = rn.get_u64("end_ns") - rn.get_u64("start_ns");
    let (hb, nb) = (scene.busy("h"), scene.busy("n"));
    let left = wall.saturating_sub(hb) as f64;
    let kept = nb as f64 / left;
    // Working priority: a request waits for at most the one 2 ms kernel in flight, plus 500 µs for
    // a thread's wake-up on a busy 2-core machine (CI saw p99s 50 µs over the tighter bound this
    // had: 1.1 x alone + 2000 µs). Without priority it would wait behind the normal tenant's two
    // queued kernels and its slice: alone + 4000 µs or more.
    let bound = 1.1 * alone as f64 + 2500.0;
    println!("compute-table: priority: p99 alone {alone} us, beside 2 ms kernels {p99} us (bound {bound:.0}); normal tenant kept {:.1}% of the rest", kept * 100.0);
    if p99 as f64 > bound {
        // Past the bound, a busy machine's wake-ups may be to blame rather than the priority: the
        // same requests without priority, beside the same kernels and on the same machine now,
        // wait behind the queued kernels and the slice (2 ms and more above the bound). Priority
        // that works still beats that by a clear millisecond; priority that does not, cannot.
        let (_, control, _) =
            requests_beside_kernels("prio-control", ("GPUSLICE_COMPUTE_SHARE", "50"));
        let normal = control.get_u64("p99_us");
        println!("compute-table: priority: past the bound; the same requests without priority: p99 {normal} us");
        if p99 + 1000 > normal {
            failures.push(format!(
                "priority: p99 {p99} us > {bound:.0} us, and not 1 ms below the same requests \
                 without priority ({normal} us)"
            ));
        }
    }
    if kept < 0.80 {
        failures.push(format!(
            "priority: normal tenant kept {:.1}% (< 80%)",
            kept * 100.0
        ));
    }
    failures
}

/// The priority scenario's run, for 6 s: tenant h (with `h_setting`) making a request every 20 ms
/// (10 kernels of 100 µs, then a synchronisation) beside tenant n (share 50) keeping two 2 ms
/// kernels queued. Returns the scene and both runs, each a success.
fn requests_beside_kernels(tag: &str, h_setting: (&str, &str)) -> (Scene, Run, Run) {
    let scene = Scene::new("compute", tag);
    let start = start_in(700);
    let h = scene.spawn(
        "h",
        &[h_setting],
        &[s("request"), s(start), s(6000), s(20), s(10), s(100)],
    );
    let n = scene.spawn(
        "n",
        &[("GPUSLICE_COMPUTE_SHARE", "50")],
        &[s("spin"), s(start), s(6000), s(2000), s(2)],
    );
    let rh = finish(h, "h");
    let rn = finish(n, "n");
    rh.assert_success();
    rn.assert_success();
    (scene, rh, rn)
}

fn stop_scenario(name: &str, sig: i32) -> Vec<String> {
    let scene = Scene::new("compute", name);
    let mut a = scene.spawn(
        "a",
        &[("GPUSLICE_COMPUTE_SHARE", "50")],
        &[s("hold"), s(5000)],
    );
    wait_for_key(&mut a, "ready");
    let start = start_in(300);
    let b = scene.spawn(
        "b",
        &[("GPUSLICE_COMPUTE_SHARE", "50")],
        &[s("spin"), s(start), s(2500), s(200)],
    );
    std::thread::sleep(Duration::from_millis(1300));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(a.id() as i32, sig) };
    let t = Instant::now();
    // A dead owner's lock is free at once: the other tenant has the device within one slice
    // (20 ms), judged over the 200 ms after it. A stopped one keeps it for its slice plus the grace.
    let from = if sig == libc::SIGKILL { 20 } else { 120 };
    let (_, g) = rate(
        &scene,
        &["b"],
        t,
        Duration::from_millis(from),
        Duration::from_millis(if sig == libc::SIGKILL { 220 } else { 1000 }),
    );
    if sig == libc::SIGSTOP {
        // SAFETY: as above.
        unsafe { libc::kill(a.id() as i32, libc::SIGKILL) };
    }
    let _ = a.wait();
    finish(b, "b").assert_success();
    println!(
        "compute-table: {name}: the other tenant had the device {:.1}% of the time from {from} ms after",
        g[0] * 100.0
    );
    if g[0] < 0.80 {
        return vec![format!(
            "{name}: the other tenant got {:.1}% (< 80%) from {from} ms after",
            g[0] * 100.0
        )];
    }
    Vec::new()
}

fn continue_scenario() -> Vec<String> {
    let scene = Scene::new("compute", "continue");
    let start = start_in(700);
    let t0 = Instant::now() + Duration::from_millis(700);
    let args = [s("spin"), s(start), s(4500), s(200)];
    let a = scene.spawn("a", &[("GPUSLICE_COMPUTE_SHARE", "50")], &args);
    let b = scene.spawn("b", &[("GPUSLICE_COMPUTE_SHARE", "50")], &args);
    std::thread::sleep(
        (t0 + Duration::from_millis(1200)).saturating_duration_since(Instant::now()),
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(a.id() as i32, libc::SIGSTOP) };
    std::thread::sleep(Duration::from_millis(1000));
    // SAFETY: as above.
    unsafe { libc::kill(a.id() as i32, libc::SIGCONT) };
    let t = Instant::now();
    let (_, g) = rate(
        &scene,
        &["a", "b"],
        t,
        Duration::from_millis(1000),
        Duration::from_millis(2000),
    );
    finish(a, "a").assert_success();
    finish(b, "b").assert_success();
    let frac = g[0] / (g[0] + g[1]).max(1e-9) * 100.0;
    println!("compute-table: SIGSTOP 1 s then SIGCONT: a got {frac:.1}% from 1 s to 2 s after continuing (target 50)");
    if (frac - 50.0).abs() > 3.0 {
        return vec![format!(
            "SIGCONT: a got {frac:.1}% from 1 s after continuing (target 50 +-3)"
        )];
    }
    Vec::new()
}

fn live_scenario() -> Vec<String> {
    let scene = Scene::new("compute", "live");
    let start = start_in(700);
    let t0 = Instant::now() + Duration::from_millis(700);
    let a = scene.spawn(
        "a",
        &[("GPUSLICE_COMPUTE_SHARE", "50")],
        &[s("spin"), s(start), s(4500), s(200)],
    );
    let b = scene.spawn(
        "b",
        &[("GPUSLICE_COMPUTE_SHARE", "50")],
        &[s("spin"), s(start), s(4500), s(200)],
    );
    std::thread::sleep(
        (t0 + Duration::from_millis(1500)).saturating_duration_since(Instant::now()),
    );
    let set = Command::new(common::gpuslice_bin())
        .args(["set", "--tenant", "a", "--share", "80"])
        .env("GPUSLICE_DEVICE_DIR", scene.dir.join("devices"))
        .output()
        .unwrap();
    assert!(
        set.status.success(),
        "gpuslice set: {}",
        String::from_utf8_lossy(&set.stderr)
    );
    let t = Instant::now();
    let (_, g) = rate(
        &scene,
        &["a", "b"],
        t,
        Duration::from_millis(1000),
        Duration::from_millis(2800),
    );
    finish(a, "a").assert_success();
    finish(b, "b").assert_success();
    let frac = g[0] / (g[0] + g[1]) * 100.0;
    println!(
        "compute-table: live change 50 -> 80/50: a got {frac:.1}% from 1 s after (target {:.1}%)",
        80.0 / 130.0 * 100.0
    );
    if (frac - 80.0 / 130.0 * 100.0).abs() > 3.0 {
        return vec![format!("live change: a got {frac:.1}% (target 61.5% +-3)")];
    }
    Vec::new()
}

fn two_gpu_scenario() -> Vec<String> {
    const RUN_MS: u64 = 4000;
    let scene = Scene::two_gpus("two-gpu");
    let start = start_in(700);
    let t0 = Instant::now() + Duration::from_millis(700);
    let a = scene.spawn(
        "a",
        &[("GPUSLICE_COMPUTE_SHARE", "50")],
        &[s("multi"), s(start), s(RUN_MS), s(200), s(2)],
    );
    let b = scene.spawn(
        "b",
        &[("GPUSLICE_COMPUTE_SHARE", "50")],
        &[s("spin"), s(start), s(RUN_MS), s(200)],
    );
    let window = (Duration::from_millis(500), Duration::from_millis(3500));
    let sample = |scene: &Scene| {
        (
            Instant::now(),
            scene.busy_on("a", 0),
            scene.busy_on("b", 0),
            scene.busy_on("a", 1),
        )
    };
    std::thread::sleep((t0 + window.0).saturating_duration_since(Instant::now()));
    let x = sample(&scene);
    std::thread::sleep((t0 + window.1).saturating_duration_since(Instant::now()));
    let y = sample(&scene);
    finish(a, "a").assert_success();
    finish(b, "b").assert_success();
    let wall = (y.0 - x.0).as_nanos() as f64;
    let (a0, b0, a1) = ((y.1 - x.1) as f64, (y.2 - x.2) as f64, (y.3 - x.3) as f64);
    let split = a0 * 100.0 / (a0 + b0).max(1.0);
    // The same client alone without gpuslice: how busy it keeps GPU 1 on this machine now.
    let bare = {
        let scene = Scene::two_gpus("two-gpu-bare");
        let start = start_in(500);
        let t0 = Instant::now() + Duration::from_millis(500);
        let c = scene
            .sim
            .spawn(&mut scene.bare_client("a", &[s("multi"), s(start), s(2000), s(200), s(2)]));
        std::thread::sleep(
            (t0 + Duration::from_millis(300)).saturating_duration_since(Instant::now()),
        );
        let p = (Instant::now(), scene.busy_on("a", 1));
        std::thread::sleep(
            (t0 + Duration::from_millis(1800)).saturating_duration_since(Instant::now()),
        );
        let q = (Instant::now(), scene.busy_on("a", 1));
        finish(c, "bare a").assert_success();
        (q.1 - p.1) as f64 / (q.0 - p.0).as_nanos() as f64
    };
    let speed = a1 / wall / bare.max(1e-9);
    println!(
        "compute-table: two GPUs, contention on GPU 0: GPU 0 a {split:.1}% (target 50 +-3); a on GPU 1 at {:.1}% of its speed without gpuslice ({:.1}% vs {:.1}% busy)",
        speed * 100.0,
        a1 / wall * 100.0,
        bare * 100.0
    );
    let mut f = Vec::new();
    if (split - 50.0).abs() > 3.0 {
        f.push(format!("two-gpu: GPU 0 split {split:.1}% (target 50 +-3)"));
    }
    if speed < 0.95 {
        f.push(format!(
            "two-gpu: a on GPU 1 at {:.1}% of its speed alone (< 95%)",
            speed * 100.0
        ));
    }
    f
}
