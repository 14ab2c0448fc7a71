//! `gpuslice doctor` reports every reason enforcement would not work, and exits non-zero: a ledger
//! path the filesystem refuses (file name too long), a damaged ledger, another user's ledger, a
//! device-ledger directory it cannot use, an invalid compute setting, an unknown `GPUSLICE_*`
//! variable. The same environment without the fault passes (exit 0), so each failure is the fault's.

use gpuslice_testkit as common;

use common::*;
use gpuslice::config::Limit;
use gpuslice::ledger::{Ledger, LedgerOptions};
use std::path::{Path, PathBuf};
use std::process::Command;

fn dir(tag: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("doctor-reasons-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn is_root() -> bool {
    // SAFETY: no arguments.
    unsafe { libc::geteuid() == 0 }
}

/// `gpuslice doctor`, preloaded, with a quota, a compute share, `ledger` and `devices`.
fn doctor(ledger: &Path, devices: &Path, setup: impl FnOnce(&mut Command)) -> Run {
    let sim = Sim::new("doctor-reasons");
    let mut cmd = sim.command(gpuslice_bin());
    cmd.arg("doctor")
        .env(
            "LD_PRELOAD",
            gpuslice_bin().with_file_name("libgpuslice.so"),
        )
        .env("GPUSLICE_MEMORY_LIMIT", "1GiB")
        .env("GPUSLICE_COMPUTE_SHARE", "50")
        .env("GPUSLICE_LEDGER", ledger)
        .env("GPUSLICE_DEVICE_DIR", devices);
    setup(&mut cmd);
    sim.run_cmd(&mut cmd)
}

fn assert_problem(run: &Run, needle: &str) {
    assert_eq!(
        run.status.code(),
        Some(1),
        "doctor should fail\n{}",
        run.report()
    );
    let said = run
        .stdout
        .lines()
        .any(|l| l.starts_with("problem:") && l.contains(needle));
    assert!(said, "no problem line with {needle:?}\n{}", run.report());
}

/// A real ledger made with the library's API (no slot kept).
fn make_ledger(path: &Path) {
    let opts = LedgerOptions {
        tenant: "t".into(),
        default_limit: Limit::Bytes(1 << 30),
        devices: vec![],
        group: None,
    };
    drop(Ledger::open(path, &opts).unwrap());
}

#[test]
fn healthy_environment_passes() {
    let d = dir("ok");
    make_ledger(&d.join("ok.ledger"));
    let run = doctor(&d.join("ok.ledger"), &d.join("devices"), |_| {});
    assert_eq!(run.status.code(), Some(0), "{}", run.report());
    assert!(
        run.stdout.contains("enforcement: ACTIVE"),
        "{}",
        run.report()
    );
    // Where each setting comes from, derived from the settings table (config::table).
    for line in [
        "setting memory limit: GPUSLICE_MEMORY_LIMIT=\"1GiB\"",
        "setting compute share: GPUSLICE_COMPUTE_SHARE=\"50\"",
    ] {
        assert!(run.stdout.contains(line), "no {line:?}\n{}", run.report());
    }
}

#[test]
fn ledger_file_name_too_long() {
    let d = dir("long");
    let ledger = d.join(format!("{}.ledger", "n".repeat(300)));
    let run = doctor(&ledger, &d.join("devices"), |_| {});
    assert_problem(&run, "name too long");
}

#[test]
fn damaged_ledger() {
    let d = dir("damaged");
    let ledger = d.join("t.ledger");
    make_ledger(&ledger);
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&ledger)
        .unwrap();
    f.write_all_at(b"DMGD", 12).unwrap();
    let run = doctor(&ledger, &d.join("devices"), |_| {});
    assert_problem(&run, "truncated while in use");
}

#[test]
fn another_users_ledger() {
    if !is_root() {
        eprintln!("skipped: giving a file to another uid needs root");
        return;
    }
    let d = dir("foreign");
    let ledger = d.join("t.ledger");
    make_ledger(&ledger);
    std::os::unix::fs::chown(&ledger, Some(65534), Some(65534)).unwrap();
    let run = doctor(&ledger, &d.join("devices"), |_| {});
    assert_problem(&run, "owned by uid 65534");
}

#[test]
fn device_directory_it_cannot_use() {
    let d = dir("devdir");
    make_ledger(&d.join("t.ledger"));
    // A file where the directory should be.
    let not_dir = d.join("devices-file");
    std::fs::write(&not_dir, b"x").unwrap();
    let run = doctor(&d.join("t.ledger"), &not_dir, |_| {});
    assert_problem(&run, "is not a directory");

    // A device ledger that is not one: a file of another kind is never rewritten, and said.
    let devices = d.join("devices");
    std::fs::create_dir(&devices).unwrap();
    let bad = devices.join("GPU-1b2c3d4e-0000-1111-2222-333344445555.dev");
    let foreign = b"not a device ledger\n".repeat(200);
    std::fs::write(&bad, &foreign).unwrap();
    let run = doctor(&d.join("t.ledger"), &devices, |_| {});
    assert_problem(&run, "compute shares would not be enforced on that GPU");
    assert_eq!(
        std::fs::read(&bad).unwrap(),
        foreign,
        "a foreign file was rewritten"
    );

    // A device ledger shrunk and zeroed (what a tenant can do to it) is repaired in place by its
    // next user, which says so; then it is usable.
    std::fs::write(&bad, vec![0u8; 4096]).unwrap();
    let run = doctor(&d.join("t.ledger"), &devices, |_| {});
    assert!(
        run.stderr.contains("repaired in place"),
        "no repair said\n{}",
        run.report()
    );
    assert!(
        std::fs::metadata(&bad).unwrap().len() > 4096,
        "not repaired"
    );

    if is_root() {
        // Another user's device ledger.
        std::fs::remove_file(&bad).unwrap();
        let uuid = "GPU-1b2c3d4e-0000-1111-2222-333344445555";
        let path = gpuslice::scheduling::device::path_for(&devices, uuid);
        drop(gpuslice::scheduling::device::DeviceLedger::open(&path, uuid, true).unwrap());
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
        let run = doctor(&d.join("t.ledger"), &devices, |_| {});
        assert_problem(&run, "owned by uid 65534");
    }
}

#[test]
fn invalid_compute_setting() {
    let d = dir("compute");
    make_ledger(&d.join("t.ledger"));
    let run = doctor(&d.join("t.ledger"), &d.join("devices"), |c| {
        c.env("GPUSLICE_COMPUTE_SHARE", "0");
    });
    assert_problem(&run, "GPUSLICE_COMPUTE_SHARE=\"0\": out of range");
}

/// An unknown `GPUSLICE_*` variable is a problem naming it and the closest setting, whether the
/// library only warns about it (`GPUSLICE_LOGG`) or fails closed (`GPUSLICE_COMPUTE_CAP`, no cap set).
#[test]
fn unknown_variable() {
    let d = dir("unknown");
    make_ledger(&d.join("t.ledger"));
    for (var, meant) in [
        ("GPUSLICE_LOGG", "GPUSLICE_LOG"),
        ("GPUSLICE_COMPUTE_CAP", "GPUSLICE_COMPUTE_LIMIT"),
    ] {
        let run = doctor(&d.join("t.ledger"), &d.join("devices"), |c| {
            c.env(var, "30");
        });
        assert_problem(
            &run,
            &format!("{var}=\"30\": unknown variable (did you mean {meant}?)"),
        );
    }
}
