//! Several users on one machine (docs/SECURITY.md, "Several users"): with default directories
//! every user gets its own quota, and no user can deny another its ledger. Runs as root and
//! starts the clients as other uids with `setpriv`; the ledger directory is a private one created
//! the way the library creates `/dev/shm/gpuslice` (its parent is sticky and world-writable, as
//! `/dev/shm` is). What the clients run (their program, the library, simgpu) is copied into the
//! machine's directory, which other uids can traverse wherever the tree is.

use gpuslice_testkit as common;

use common::*;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

const OOM: &str = "2";
const ALICE: u32 = 1001;
const MALLORY: u32 = 1002;

fn is_root() -> bool {
    // SAFETY: no arguments.
    unsafe { libc::geteuid() == 0 }
}

/// A machine whose ledger directory does not exist yet, in a parent like `/dev/shm`.
fn machine(tag: &str) -> (Sim, PathBuf) {
    let sim = Sim::new(tag);
    std::fs::set_permissions(&sim.dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let ledger_dir = sim.dir.join("gpuslice");
    (sim, ledger_dir)
}

/// The machine's copies, for other uids, of what they run (`reachable_copy`).
fn reachable(sim: &Sim) -> PathBuf {
    sim.dir.join("reachable")
}

/// The library under test, where other uids can open it.
fn shim_lib(sim: &Sim) -> PathBuf {
    reachable_copy(&libgpuslice(), &reachable(sim).join("libgpuslice.so"))
}

/// `program args` run as `uid` (its own group, no supplementary groups); a program of the build
/// tree, and simgpu, come from copies that uid can reach.
fn as_user(sim: &Sim, uid: u32, program: &Path) -> Command {
    let program = if program.starts_with(root()) || program.starts_with(target_dir()) {
        reachable_copy(
            program,
            &reachable(sim).join(program.file_name().expect("a program")),
        )
    } else {
        program.to_path_buf()
    };
    let mut cmd = sim.command("setpriv");
    let id = uid.to_string();
    cmd.args(["--reuid", &id, "--regid", &id, "--clear-groups", "--"])
        .arg(program)
        .env(
            "LD_LIBRARY_PATH",
            reachable_simgpu(&reachable(sim).join("simgpu")),
        );
    cmd
}

/// A client of `uid` with a 256 MiB quota in the default layout under `ledger_dir`.
fn client(sim: &Sim, uid: u32, ledger_dir: &Path) -> Child {
    let mut cmd = as_user(sim, uid, &compile(&ROBUST));
    cmd.arg("cmd")
        .env("LD_PRELOAD", shim_lib(sim))
        .env("GPUSLICE_LEDGER_DIR", ledger_dir)
        .env("GPUSLICE_MEMORY_LIMIT", "256MiB")
        .env("GPUSLICE_CONTEXT_RESERVE", "0")
        .env("GPUSLICE_COMPUTE_SHARE", "50");
    let mut child = sim.spawn(&mut cmd);
    let kv = wait_for_key(&mut child, "ready");
    assert_eq!(kv.get("retain").map(String::as_str), Some("0"), "{kv:?}");
    child
}

fn ask(child: &mut Child, line: &str, key: &str) -> String {
    let stdin = child.stdin.as_mut().unwrap();
    stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
    stdin.flush().unwrap();
    wait_for_key(child, key)
        .get(key)
        .cloned()
        .unwrap_or_default()
}

/// Whether `uid` can create a file at `path`.
fn can_create(sim: &Sim, uid: u32, path: &Path) -> bool {
    as_user(sim, uid, Path::new("/usr/bin/touch"))
        .arg(path)
        .output()
        .unwrap()
        .status
        .success()
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// `first` runs before anyone else and so creates the ledger directory; Mallory then takes the
/// name of Alice's directory before Alice ever runs. `alice_dirs` are the names Alice's directory
/// may have: the one taken, then the one she gets.
fn both_get_their_quotas(tag: &str, first: u32, alice_dirs: impl Fn(&Path) -> [PathBuf; 2]) {
    let (sim, ledger_dir) = machine(tag);
    let mut starter = client(&sim, first, &ledger_dir);
    assert_eq!(ask(&mut starter, "alloc 10", "alloc"), "0");
    assert_eq!(mode(&ledger_dir), 0o1777, "ledger directory");
    assert_eq!(std::fs::metadata(&ledger_dir).unwrap().uid(), first);

    let mut m = client(&sim, MALLORY, &ledger_dir);
    assert_eq!(ask(&mut m, "alloc 200", "alloc"), "0");
    let [squat, alice_dir] = alice_dirs(&ledger_dir);
    assert!(as_user(&sim, MALLORY, Path::new("/usr/bin/mkdir"))
        .arg("-m")
        .arg("0777")
        .arg(&squat)
        .status()
        .unwrap()
        .success());

    // Alice gets her whole quota, in a directory of her own nobody else can write.
    let mut a = client(&sim, ALICE, &ledger_dir);
    assert_eq!(ask(&mut a, "alloc 200", "alloc"), "0");
    assert_eq!(
        ask(&mut a, "alloc 100", "alloc"),
        OOM,
        "Alice's quota holds"
    );
    assert_eq!(
        ask(&mut m, "alloc 100", "alloc"),
        OOM,
        "Mallory's quota holds"
    );
    let alice_ledger = alice_dir.join("default.ledger");
    assert_eq!(std::fs::metadata(&alice_ledger).unwrap().uid(), ALICE);
    assert_eq!(mode(&alice_dir), 0o700);

    // Mallory can neither plant a file beside Alice's ledger nor move her directory away.
    assert!(!can_create(&sim, MALLORY, &alice_dir.join("team.ledger")));
    assert!(!as_user(&sim, MALLORY, Path::new("/usr/bin/mv"))
        .arg(&alice_dir)
        .arg(sim.dir.join("moved"))
        .status()
        .unwrap()
        .success());

    // Mallory gives the first name back: Alice's next process still finds her ledger (it
    // shares the 200 MiB her first process holds), not a fresh one.
    std::fs::remove_dir(&squat).unwrap();
    let mut a2 = client(&sim, ALICE, &ledger_dir);
    assert_eq!(ask(&mut a2, "alloc 100", "alloc"), OOM, "same ledger");
    assert_eq!(ask(&mut a2, "alloc 50", "alloc"), "0");
    assert!(!squat.exists(), "no second directory for Alice");

    for (c, name) in [
        (a, "alice"),
        (a2, "alice 2"),
        (m, "mallory"),
        (starter, "first"),
    ] {
        let run = feed(c, "exit\n", name);
        assert!(run.status.success(), "{}", run.report());
    }
}

/// Another user ran first and owns the ledger directory (it could rename anything in it): Alice
/// keeps her ledgers beside it, in the parent (`/dev/shm`).
#[test]
fn two_users_when_another_user_created_the_ledger_directory() {
    if !is_root() {
        eprintln!("skipped: starting clients as other uids needs root");
        return;
    }
    both_get_their_quotas("users-m", MALLORY, |base| {
        let sibling = |s: &str| base.with_file_name(format!("gpuslice-uid-{ALICE}{s}"));
        [sibling(""), sibling(".1")]
    });
}

/// Root ran first (or the node created the directory): per-user directories inside it.
#[test]
fn two_users_when_root_created_the_ledger_directory() {
    if !is_root() {
        eprintln!("skipped: starting clients as other uids needs root");
        return;
    }
    both_get_their_quotas("users-r", 0, |base| {
        [
            base.join(format!("uid-{ALICE}")),
            base.join(format!("uid-{ALICE}.1")),
        ]
    });
}

/// The device ledgers' directory is created for every user (sticky, world-writable): each tenant
/// of each user sharing a GPU opens its file there.
#[test]
fn device_ledger_directory_is_created_for_every_user() {
    let (sim, ledger_dir) = machine("users-dev");
    let uuid = "GPU-1b2c3d4e-0000-1111-2222-333344445555";
    let dir = ledger_dir.join("devices");
    let path = gpuslice::scheduling::device::path_for(&dir, uuid);
    let _l = gpuslice::scheduling::device::DeviceLedger::open(&path, uuid, true).unwrap();
    assert_eq!(mode(&ledger_dir), 0o1777);
    assert_eq!(mode(&dir), 0o1777);
    drop(sim);
}

/// A ledger another user created, not shared through GPUSLICE_LEDGER_GROUP, named by
/// GPUSLICE_LEDGER: refused with a message saying whose it is, never used.
#[test]
fn another_users_ledger_is_reported_not_used() {
    if !is_root() {
        eprintln!("skipped: starting clients as other uids needs root");
        return;
    }
    let (sim, ledger_dir) = machine("users-foreign");
    let shared = sim.dir.join("team.ledger");
    let mut cmd = as_user(&sim, MALLORY, &compile(&ROBUST));
    cmd.arg("cmd")
        .env("LD_PRELOAD", shim_lib(&sim))
        .env("GPUSLICE_LEDGER", &shared)
        .env("GPUSLICE_MEMORY_LIMIT", "1MiB")
        .env("GPUSLICE_CONTEXT_RESERVE", "0");
    let run = feed(sim.spawn(&mut cmd), "alloc 1\nexit\n", "mallory");
    assert_eq!(run.get("alloc"), "0", "{}", run.report());
    assert_eq!(std::fs::metadata(&shared).unwrap().uid(), MALLORY);

    let mut cmd = as_user(&sim, ALICE, &compile(&ROBUST));
    cmd.arg("cmd")
        .env("LD_PRELOAD", shim_lib(&sim))
        .env("GPUSLICE_LEDGER", &shared)
        .env("GPUSLICE_LEDGER_DIR", &ledger_dir)
        .env("GPUSLICE_MEMORY_LIMIT", "256MiB")
        .env("GPUSLICE_CONTEXT_RESERVE", "0");
    let run = feed(sim.spawn(&mut cmd), "alloc 1\nexit\n", "alice");
    assert_eq!(run.get("alloc"), OOM, "{}", run.report());
    let expected = format!("owned by uid {MALLORY}");
    assert!(
        run.stderr.contains(&expected) && run.stderr.contains(&shared.display().to_string()),
        "stderr lacks {expected:?} and the path:\n{}",
        run.report()
    );
}
