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
use std::process::Child;
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
