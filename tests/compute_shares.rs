//! Compute shares (docs/COMPUTE.md) on simgpu. The judge is simgpu's busy counters per
//! `SIMGPU_GROUP` (= tenant), never gpuslice's own figures. Every scenario runs in one test, one after
//! the other: they are timing measurements on a 2-core machine and must not compete for the CPU.
//! Each prints `compute-table: ...` lines (the figures in docs/BENCHMARKS.md).

mod common;

use common::*;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const CLIENT: CBuild = CBuild {
    name: "compute-client",
    source: "compute_client.c",
    include: "cu13",
    link_cuda: true,
};

fn shim() -> PathBuf {
    let p = target_dir().join("debug/libgpuslice.so");
    assert!(p.exists(), "{} is not built", p.display());
    p
}

/// One scenario: a simulated machine and a private ledger/device directory.
struct Scene {
    sim: Sim,
    dir: PathBuf,
}

impl Scene {
    fn new(tag: &str) -> Scene {
        let tag: String = tag
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("compute-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scene {
            sim: Sim::new(&format!("compute-{tag}")),
            dir,
        }
    }

    /// A client process of `tenant` with `env` (compute settings), judged as group `tenant`.
    fn client(&self, tenant: &str, env: &[(&str, &str)], args: &[String]) -> Command {
        let mut cmd = self.sim.command(compile(&CLIENT));
        cmd.env("LD_PRELOAD", shim())
            .env("SIMGPU_GROUP", tenant)
            .env("GPUSLICE_TENANT", tenant)
            .env("GPUSLICE_LEDGER", self.dir.join(format!("{tenant}.ledger")))
            .env("GPUSLICE_DEVICE_DIR", self.dir.join("devices"))
            .envs(env.iter().copied())
            .args(args);
        cmd
    }

    fn spawn(&self, tenant: &str, env: &[(&str, &str)], args: &[String]) -> Child {
        self.sim.spawn(&mut self.client(tenant, env, args))
    }

    fn busy(&self, tenant: &str) -> u64 {
        let stat = self.sim.stat();
        stat.find("groups", "name", &Json::Str(tenant.into()))
            .map_or(0, |g| g.u64("busy_ns.0"))
    }

    fn device_busy(&self) -> u64 {
        self.sim.stat().u64("devices.0.busy_ns")
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// CLOCK_REALTIME ns `ms` from now (clients start together, after their setup).
fn start_in(ms: u64) -> u64 {
    (SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + Duration::from_millis(ms)).as_nanos()
        as u64
}

fn s(x: impl ToString) -> String {
    x.to_string()
}

/// A tenant of a share scenario: name, share, client arguments after START_NS.
struct T<'a> {
    name: &'a str,
    share: u32,
    procs: usize,
    args: Vec<String>,
}

fn spin_args(ms: u64, us: u64) -> Vec<String> {
    vec![s(ms), s(us)]
}

/// Runs tenants for their duration; returns (name, target %, measured % of the busy time).
fn shares(tag: &str, tenants: &[T]) -> Vec<(String, f64, f64)> {
    let scene = Scene::new(tag);
    let start = start_in(700);
    let mut children = Vec::new();
    for t in tenants {
        for _ in 0..t.procs {
            let mode = if t.args.len() == 3 { "graph" } else { "spin" };
            let mut args = vec![s(mode), s(start)];
            args.extend(t.args.iter().cloned());
            let share = s(t.share);
            children.push((
                t.name,
                scene.spawn(t.name, &[("GPUSLICE_COMPUTE_SHARE", &share)], &args),
            ));
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
    const MS: u64 = 10_000;

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
        let got = shares(tag, &ts);
        assert_shares(tag, &got, &mut failures);
    }
    // Mixed kernel lengths: 50 us against 5 ms.
    if wanted("mixed") {
        let got = shares(
            "mixed 50us/5ms 50/50",
            &[
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
            ],
        );
        assert_shares("mixed", &got, &mut failures);
    }
    // A tenant made of two processes.
    if wanted("two") {
        let got = shares(
            "two-process tenant 30/70",
            &[
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
            ],
        );
        assert_shares("two-process", &got, &mut failures);
    }
    // A tenant that only launches CUDA graphs (10 captured spin launches each).
    if wanted("graph") {
        let got = shares(
            "graph tenant 30/70",
            &[
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
            ],
        );
        assert_shares("graph", &got, &mut failures);
    }

    // Work-conserving: `a` stops after 1.5 s; within 1 s `b` keeps the device >= 95% busy.
    if wanted("conserving") {
        let scene = Scene::new("conserving");
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
        if dev < 0.95 {
            failures.push(format!(
                "work-conserving: device {:.1}% busy (< 95%)",
                dev * 100.0
            ));
        }
    }

    // Cap: 30% alone on the device.
    if wanted("cap") {
        let scene = Scene::new("cap");
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
        if frac > 0.33 {
            failures.push(format!("cap: {:.1}% busy (> 33%)", frac * 100.0));
        }
    }

    // Priority: requests of 10 x 100 us every 20 ms, alone and beside 2 ms kernels.
    if wanted("priority") {
        let alone = {
            let scene = Scene::new("prio-alone");
            let c = scene.spawn(
                "h",
                &[("GPUSLICE_PRIORITY", "high")],
                &[
                    s("request"),
                    s(start_in(500)),
                    // As long as the run beside: both p99s from 400 requests.
                    s(8000),
                    s(20),
                    s(10),
                    s(100),
                ],
            );
            let r = finish(c, "h alone");
            r.assert_success();
            r.get_u64("p99_us")
        };
        let scene = Scene::new("prio");
        let start = start_in(700);
        let h = scene.spawn(
            "h",
            &[("GPUSLICE_PRIORITY", "high")],
            &[s("request"), s(start), s(8000), s(20), s(10), s(100)],
        );
        let n = scene.spawn(
            "n",
            &[("GPUSLICE_COMPUTE_SHARE", "50")],
            &[s("spin"), s(start), s(8000), s(2000), s(2)],
        );
        let rh = finish(h, "h");
        let rn = finish(n, "n");
        rh.assert_success();
        rn.assert_success();
        let p99 = rh.get_u64("p99_us");
        let wall = rn.get_u64("end_ns") - rn.get_u64("start_ns");
        let (hb, nb) = (scene.busy("h"), scene.busy("n"));
        let left = wall.saturating_sub(hb) as f64;
        let kept = nb as f64 / left;
        let bound = 1.1 * alone as f64 + 2000.0;
        println!("compute-table: priority: p99 alone {alone} us, beside 2 ms kernels {p99} us (bound {bound:.0}); normal tenant kept {:.1}% of the rest", kept * 100.0);
        if p99 as f64 > bound {
            failures.push(format!("priority: p99 {p99} us > {bound:.0} us"));
        }
        if kept < 0.80 {
            failures.push(format!(
                "priority: normal tenant kept {:.1}% (< 80%)",
                kept * 100.0
            ));
        }
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
        let scene = Scene::new(name);
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
        let (_, g) = rate(
            &scene,
            &["b"],
            t,
            Duration::from_millis(120),
            Duration::from_millis(1000),
        );
        if sig == libc::SIGSTOP {
            // SAFETY: as above.
            unsafe { libc::kill(a.id() as i32, libc::SIGKILL) };
        }
        let _ = a.wait();
        finish(b, "b").assert_success();
        println!("compute-table: {name}: the other tenant had the device {:.1}% of the time from 120 ms after", g[0] * 100.0);
        if g[0] < 0.80 {
            failures.push(format!(
                "{name}: the other tenant got {:.1}% (< 80%) from 120 ms after",
                g[0] * 100.0
            ));
        }
    }

    // A share changed live reaches its target within one second.
    if wanted("live") {
        let scene = Scene::new("live");
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
        println!("compute-table: live change 50 -> 80/50: a got {frac:.1}% from 1 s after (target {:.1}%)", 80.0 / 130.0 * 100.0);
        if (frac - 80.0 / 130.0 * 100.0).abs() > 3.0 {
            failures.push(format!("live change: a got {frac:.1}% (target 61.5% +-3)"));
        }
    }

    assert!(failures.is_empty(), "{failures:#?}");
}
