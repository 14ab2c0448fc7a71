//! A damaged device ledger never hangs or kills a tenant (docs/COMPUTE.md, "Failure"): two tenants
//! launch while the test scribbles over their device ledger — random bytes over the whole file (100
//! seeds), and single words that cannot be genuine (an owner naming no slot, a lock stamped at the end
//! of time, a grant ten minutes ahead). Every process must finish within its run time plus 2 s, with
//! every call answered successfully.

use gpuslice_testkit as common;

use common::libgpuslice as shim;
use common::*;
use gpuslice::scheduling::shm::{Header, TOTAL_SIZE};
use std::io::{Seek, SeekFrom, Write};
use std::mem::offset_of;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const RUN_MS: u64 = 1200;

/// CLOCK_MONOTONIC now, in ns (the clock the ledger's stamps use).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What the test does to the ledger while the tenants launch.
#[derive(Clone, Copy, Debug)]
enum Damage {
    Random(u64),
    Words(&'static str),
}

fn write_at(path: &Path, offset: usize, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(offset as u64)).unwrap();
    f.write_all(bytes).unwrap();
}

fn damage(path: &Path, how: Damage) {
    match how {
        Damage::Random(seed) => {
            // xorshift64*: reproducible bytes from the seed.
            let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let bytes: Vec<u8> = (0..TOTAL_SIZE)
                .map(|_| {
                    x ^= x >> 12;
                    x ^= x << 25;
                    x ^= x >> 27;
                    (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
                })
                .collect();
            write_at(path, 0, &bytes);
        }
        Damage::Words("owner") => write_at(
            path,
            offset_of!(Header, owner),
            &0xffff_fff0u32.to_ne_bytes(),
        ),
        Damage::Words("lock") => {
            // A live slot (the first tenant's) holds the lock, stamped at the end of time.
            write_at(path, offset_of!(Header, lock), &1u32.to_ne_bytes());
            write_at(path, offset_of!(Header, lock_ns), &u64::MAX.to_ne_bytes());
        }
        Damage::Words("grant") => {
            let future = monotonic_ns() + 600_000_000_000;
            write_at(path, offset_of!(Header, grant_ns), &future.to_ne_bytes());
            write_at(
                path,
                offset_of!(Header, owner_beat_ns),
                &future.to_ne_bytes(),
            );
        }
        Damage::Words(w) => panic!("no such damage {w}"),
    }
}

/// Two tenants launch for RUN_MS; the ledger is damaged 400 ms in. Returns what went wrong.
fn round(how: Damage) -> Option<String> {
    let sim = Sim::new("compute-hostile");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("compute-hostile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let devices = dir.join("devices");
    let start = start_in(400);
    let spawn = |name: &str| -> Child {
        let mut cmd = sim.command(compile(&COMPUTE));
        cmd.env("LD_PRELOAD", shim())
            .env("SIMGPU_GROUP", name)
            .env("GPUSLICE_LEDGER", dir.join(format!("{name}.ledger")))
            .env("GPUSLICE_DEVICE_DIR", &devices)
            .env("GPUSLICE_COMPUTE_SHARE", "50")
            .args(["spin", &start.to_string(), &RUN_MS.to_string(), "200"]);
        sim.spawn(&mut cmd)
    };
    let mut children = vec![("a", spawn("a")), ("b", spawn("b"))];
    let t0 = Instant::now() + Duration::from_millis(400);
    std::thread::sleep((t0 + Duration::from_millis(400)).saturating_duration_since(Instant::now()));
    // The device ledger among the files there (its per-tenant counters, the measurement lock).
    let ledger = std::fs::read_dir(&devices).ok().and_then(|d| {
        d.filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "dev"))
    });
    let Some(ledger) = ledger else {
        return Some(format!(
            "{how:?}: no device ledger in {}",
            devices.display()
        ));
    };
    damage(&ledger, how);
    let deadline = t0 + Duration::from_millis(RUN_MS + 2000);
    let mut problems = Vec::new();
    for (name, child) in children.iter_mut() {
        loop {
            match child.try_wait().unwrap() {
                Some(_) => break,
                None if Instant::now() > deadline => {
                    let _ = child.kill();
                    problems.push(format!("{name} still running {} ms after its end", 2000));
                    break;
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
    for (name, child) in children {
        let r = finish(child, name);
        if problems.is_empty() && !r.status.success() {
            problems.push(format!("{name}: {}", r.report()));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    (!problems.is_empty()).then(|| format!("{how:?}: {}", problems.join("; ")))
}

#[test]
fn damaged_device_ledger_never_hangs_a_tenant() {
    let mut failures = Vec::new();
    for word in ["owner", "lock", "grant"] {
        failures.extend(round(Damage::Words(word)));
    }
    let seeds: u64 = std::env::var("COMPUTE_FUZZ_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    for seed in 1..=seeds {
        failures.extend(round(Damage::Random(seed)));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A tenant whose stderr nobody reads stays scheduled: its stderr is a pipe already full, and a
/// line of its library's (debug logging: one a hand-over) that stderr cannot take is dropped, never
/// waited for. The scheduler thread used to block in the write for as long as nobody read, and its
/// process, no longer held to its share, took about half of the device beside a share-90 tenant.
#[test]
fn a_tenant_whose_stderr_nobody_reads_keeps_to_its_share() {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::process::Stdio;
    const RUN: u64 = 3000;
    let sim = Sim::new("compute-stderr");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("compute-stderr-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // A one-page pipe, filled: what a pipe nobody reads becomes after a few dozen lines.
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two new descriptors, owned below.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: each descriptor was just made and is owned once.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: fcntl on the pipe's write end: its size, then non-blocking writes of a live buffer
    // until it is full, then blocking again, as a program's stderr is.
    unsafe {
        libc::fcntl(fds[1], libc::F_SETPIPE_SZ, 4096);
        libc::fcntl(fds[1], libc::F_SETFL, libc::O_NONBLOCK);
        let page = [b'.'; 512];
        while libc::write(fds[1], page.as_ptr().cast(), page.len()) > 0 {}
        libc::fcntl(fds[1], libc::F_SETFL, 0);
    }
    let start = start_in(400);
    let t0 = Instant::now() + Duration::from_millis(400);
    let client = |name: &str, share: &str, log: &str| -> Command {
        let mut cmd = sim.command(compile(&COMPUTE));
        cmd.env("LD_PRELOAD", shim())
            .env("SIMGPU_GROUP", name)
            .env("GPUSLICE_LEDGER", dir.join(format!("{name}.ledger")))
            .env("GPUSLICE_DEVICE_DIR", dir.join("devices"))
            .env("GPUSLICE_COMPUTE_SHARE", share)
            .env("GPUSLICE_LOG", log)
            .args(["spin", &start.to_string(), &RUN.to_string(), "200"]);
        cmd
    };
    let quiet = sim.spawn(&mut client("quiet", "90", "warn"));
    let logging = client("logging", "10", "debug")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(write_end))
        .spawn()
        .expect("start the logging tenant");
    let busy = |name: &str| group(&sim.stat(), name)["busy_ns"][0].as_u64().unwrap_or(0);
    std::thread::sleep(
        (t0 + Duration::from_millis(1000)).saturating_duration_since(Instant::now()),
    );
    let (l0, q0) = (busy("logging"), busy("quiet"));
    std::thread::sleep(Duration::from_millis(1500));
    let (l1, q1) = (busy("logging"), busy("quiet"));
    let part = (l1 - l0) as f64 / ((l1 - l0) + (q1 - q0)).max(1) as f64;
    // Its process must end on its own, with nobody reading yet: a thread waiting on the full
    // pipe would keep it. Then the pipe is read, so that a process that waited can end.
    let deadline = t0 + Duration::from_millis(RUN + 5000);
    let mut logging = logging;
    let ended = loop {
        match logging.try_wait().unwrap() {
            Some(_) => break true,
            None if Instant::now() > deadline => break false,
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::fs::File::from(read_end), &mut text);
        text
    });
    let logged = finish(logging, "logging tenant");
    let quiet = finish(quiet, "quiet tenant");
    let stderr = String::from_utf8_lossy(&reader.join().unwrap()).into_owned();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        ended,
        "the logging tenant did not end within 5 s of its run while its stderr was full"
    );
    logged.assert_success();
    quiet.assert_success();
    assert!(
        part < 0.2,
        "the share-10 tenant whose stderr nobody read got {:.1}% of the device (10% by policy)\n{}",
        part * 100.0,
        stderr.trim_start_matches('.')
    );
}
