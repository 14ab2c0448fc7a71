//! The device ledger (compute shares) truncated to 0, truncated to half, and overwritten with
//! garbage while two processes of a capped tenant launch kernels on simgpu through the preloaded
//! shim: no process dies of a signal, each finishes within its run time + 2 s, and the cap works
//! again afterwards (by the processes' own repair, or once the file is removed and the processes
//! restart). The time to recovery is measured and printed (`recovery:` lines), not asserted.
//! The judge is simgpu's busy counter: a tenant capped at 20% with two spinning processes keeps
//! the device about 20% busy when scheduled, nearly 100% when not.

use gpuslice_testkit as common;

use common::libgpuslice as shim;
use common::*;
use std::io::Write as _;
use std::os::unix::fs::FileExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Busy fraction below which the cap counts as working (capped: ~0.2; unscheduled: ~1.0).
const CAPPED: f64 = 0.5;
const RUN_MS: u64 = 9000;

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// The device's busy fraction over the next `ms` milliseconds.
fn busy_over(sim: &Sim, ms: u64) -> f64 {
    let (t0, b0) = (Instant::now(), sim.stat().u64("devices.0.busy_ns"));
    std::thread::sleep(Duration::from_millis(ms));
    let (t1, b1) = (Instant::now(), sim.stat().u64("devices.0.busy_ns"));
    (b1 - b0) as f64 / (t1 - t0).as_nanos() as f64
}

fn device_ledger(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "dev"))
}

/// Pseudo-random bytes (xorshift), the same for a seed.
fn garbage(len: usize, mut seed: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect()
}

local_scene!();

impl Scene {
    fn spawn(&self, start: u64) -> Vec<std::process::Child> {
        (0..2)
            .map(|_| {
                let mut cmd = self.sim.command(compile(&COMPUTE));
                cmd.env("LD_PRELOAD", shim())
                    .env("SIMGPU_GROUP", "a")
                    .env("GPUSLICE_TENANT", "a")
                    .env("GPUSLICE_LEDGER", self.dir.join("a.ledger"))
                    .env("GPUSLICE_DEVICE_DIR", self.dir.join("devices"))
                    .env("GPUSLICE_COMPUTE_LIMIT", "20")
                    .env("GPUSLICE_COMPUTE_SHARE", "20")
                    .args(["spin", &start.to_string(), &RUN_MS.to_string(), "200"]);
                self.sim.spawn(&mut cmd)
            })
            .collect()
    }

    /// Waits for the processes; each must end normally within its run time + 2 s. A process that
    /// hangs is killed (all of them are waited for first, so none is left behind) and reported.
    fn finish(&self, children: Vec<std::process::Child>, start: u64, what: &str) {
        let deadline = Instant::now() + Duration::from_millis(RUN_MS + 30_000);
        let mut runs = Vec::new();
        for (i, mut c) in children.into_iter().enumerate() {
            let hung = loop {
                if c.try_wait().unwrap().is_some() {
                    break false;
                }
                if Instant::now() > deadline {
                    let _ = c.kill();
                    break true;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            runs.push((i, hung, finish(c, &format!("{what}: process {i}"))));
        }
        for (i, hung, run) in runs {
            assert!(!hung, "{what}: process {i} hung:\n{}", run.report());
            assert_eq!(
                run.status.signal(),
                None,
                "died of a signal:\n{}",
                run.report()
            );
            run.assert_success();
            let ended = run.get_u64("end_ns");
            let late_ms = ended.saturating_sub(start + RUN_MS * 1_000_000) / 1_000_000;
            assert!(
                late_ms <= 2000,
                "{what}: process {i} finished {late_ms} ms after its run time\n{}",
                run.report()
            );
        }
    }
}

/// Polls the device's busy fraction in 250 ms windows until the cap works again (or `limit`);
/// returns how long that took.
fn time_to_cap(sim: &Sim, limit: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if busy_over(sim, 250) < CAPPED {
            return Some(t0.elapsed());
        }
    }
    None
}

#[derive(Clone, Copy)]
enum Damage {
    TruncatedToZero,
    TruncatedToHalf,
    Overwritten,
}

/// One scenario; returns the recovery line it prints.
fn damaged_while_two_processes_launch(damage: Damage) -> String {
    let (what, tag) = match damage {
        Damage::TruncatedToZero => ("truncated to 0", "zero"),
        Damage::TruncatedToHalf => ("truncated to half", "half"),
        Damage::Overwritten => ("overwritten with garbage", "garbage"),
    };
    let scene = Scene::new("hostile-dev", tag);
    let start = now_ns() + 1_000_000_000;
    let children = scene.spawn(start);
    // Scheduled before the damage (otherwise the test shows nothing).
    std::thread::sleep(Duration::from_millis(2000));
    let before = busy_over(&scene.sim, 1000);
    assert!(
        before < CAPPED,
        "{what}: the cap does not work even before the damage ({:.0}% busy)",
        before * 100.0
    );
    let path = device_ledger(&scene.dir.join("devices")).expect("a device ledger");
    let size = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    match damage {
        Damage::TruncatedToZero => f.set_len(0).unwrap(),
        Damage::TruncatedToHalf => f.set_len(size / 2).unwrap(),
        Damage::Overwritten => f
            .write_all_at(&garbage(size as usize, 0x9e37_79b9_7f4a_7c15), 0)
            .unwrap(),
    }
    drop(f);
    // Recovery by the running processes themselves (their sweeps), within the run.
    let repaired = time_to_cap(&scene.sim, Duration::from_millis(4000));
    scene.finish(children, start, what);
    let line = match repaired {
        Some(t) => format!(
            "recovery: {what}: cap working again {} ms after the damage (the processes' own repair)",
            t.as_millis()
        ),
        None => {
            // Recovery by a restart, the file removed first (as the node recreates it).
            let _ = std::fs::remove_file(&path);
            let start = now_ns() + 1_000_000_000;
            let children = scene.spawn(start);
            std::thread::sleep(Duration::from_millis(1000));
            let t = time_to_cap(&scene.sim, Duration::from_millis(5000));
            scene.finish(children, start, what);
            let t = t.unwrap_or_else(|| panic!("{what}: compute never recovered, even after a restart"));
            format!(
                "recovery: {what}: not repaired by the running processes within 4 s; after removal and restart, cap working {} ms after the processes started launching",
                t.as_millis()
            )
        }
    };
    println!("{line}");
    let _ = std::io::stdout().flush();
    line
}

#[test]
fn device_ledger_truncated_to_zero_while_two_processes_launch() {
    damaged_while_two_processes_launch(Damage::TruncatedToZero);
}

/// The half restored as zeros holds every process slot: a process whose thread was waiting for a
/// grant must announce itself again, or the arbitration never sees it wait.
#[test]
fn device_ledger_truncated_to_half_while_two_processes_launch() {
    damaged_while_two_processes_launch(Damage::TruncatedToHalf);
}

/// Random bytes everywhere: every word the processes read back is bounded or written again.
#[test]
fn device_ledger_overwritten_while_two_processes_launch() {
    damaged_while_two_processes_launch(Damage::Overwritten);
}
