//! Hostile and broken shared state (docs/SECURITY.md): a full filesystem when a ledger is created, a
//! ledger truncated under running programs, special files at a ledger path, and the device ledger's
//! join, fork and repair guarantees. Clients are real CUDA programs on simgpu with the shim
//! preloaded; every directory is private to the test.

use gpuslice_testkit as common;

use common::libgpuslice as shim_lib;
use common::*;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gpuslice::scheduling::device::{path_for, DeviceLedger};
use gpuslice::scheduling::TenantId;

/// `CUDA_ERROR_OUT_OF_MEMORY` as the client prints it.
const OOM: &str = "2";

fn tmp_dir(tag: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("hostile_shm")
        .join(format!("{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn shimmed(sim: &Sim, ledger: &Path) -> Command {
    let mut cmd = sim.command(compile(&ROBUST));
    cmd.env("LD_PRELOAD", shim_lib())
        .env("GPUSLICE_LEDGER", ledger)
        .env("GPUSLICE_DEVICE_DIR", ledger.with_file_name("devices"))
        .env("GPUSLICE_MEMORY_LIMIT", "4GiB");
    cmd
}

fn is_root() -> bool {
    // SAFETY: no arguments.
    unsafe { libc::geteuid() == 0 }
}

/// Mounts a tmpfs of `size` on `dir` (root only); unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn full_filesystem_at_ledger_creation_refuses_with_a_clear_message() {
    if !is_root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let dir = tmp_dir("full");
    let Some(_fs) = Tmpfs::mount(&dir, "32k") else {
        eprintln!("skipped: mount -t tmpfs failed");
        return;
    };
    // Fill it (the ledger needs more than what is left in any case).
    let _ = std::fs::write(dir.join("filler"), vec![7u8; 32 * 1024]);
    let sim = Sim::new("full");
    let ledger = dir.join("t.ledger");
    let mut cmd = shimmed(&sim, &ledger);
    cmd.arg("cmd");
    let run = feed(
        sim.spawn(&mut cmd),
        "alloc 64\ninfo\nexit\n",
        "client on a full tmpfs",
    );
    assert!(
        run.status.success(),
        "client did not exit normally:\n{}",
        run.report()
    );
    assert_eq!(run.get("retain"), OOM, "{}", run.report());
    let expected = format!("ledger {}: no space left", ledger.display());
    assert!(
        run.stderr.contains(&expected),
        "stderr lacks {expected:?}:\n{}",
        run.report()
    );
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, vec!["filler".to_string()], "left behind: {left:?}");
}

/// Sends one line to a running client and waits for its answer `key=`.
/// Two programs of the tenant at `ledger`, each holding 64 MiB.
fn two_holders(sim: &Sim, ledger: &Path) -> (std::process::Child, std::process::Child) {
    let mut a = sim.spawn(shimmed(sim, ledger).arg("cmd"));
    let mut b = sim.spawn(shimmed(sim, ledger).arg("cmd"));
    assert_eq!(ask(&mut a, "alloc 64", "alloc"), "0");
    assert_eq!(ask(&mut b, "alloc 64", "alloc"), "0");
    (a, b)
}

fn ask(child: &mut std::process::Child, line: &str, key: &str) -> String {
    let stdin = child.stdin.as_mut().unwrap();
    stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
    stdin.flush().unwrap();
    wait_for_key(child, key)
        .get(key)
        .cloned()
        .unwrap_or_default()
}

#[test]
fn tenant_ledger_truncated_under_running_programs_fails_closed_without_a_signal() {
    for (tag, cut) in [("zero", 0u64), ("half", 0)] {
        let dir = tmp_dir(&format!("cut-{tag}"));
        let sim = Sim::new("cut");
        let ledger = dir.join("t.ledger");
        let (mut a, mut b) = two_holders(&sim, &ledger);
        let size = std::fs::metadata(&ledger).unwrap().len();
        let cut = if tag == "half" { size / 2 } else { cut };
        std::fs::OpenOptions::new()
            .write(true)
            .open(&ledger)
            .unwrap()
            .set_len(cut)
            .unwrap();
        // No wait: every reservation reads the mapping's last page, so a cut below it (also one
        // that spares the pages in use) faults there and is repaired and counted at once.
        // Both go on allocating and freeing: refused (fail closed), never killed. The second try
        // comes before any size check is due: once found damaged, the file stays refused.
        for c in [&mut a, &mut b] {
            for attempt in ["first", "second"] {
                assert_eq!(
                    ask(c, "alloc 64", "alloc"),
                    OOM,
                    "cut to {cut}, {attempt} try"
                );
                ask(c, "free", "free");
            }
            // Its figures are gone: no room shown, out of the configured quota (not the card).
            c.stdin.as_mut().unwrap().write_all(b"info\n").unwrap();
            let info = wait_for_key(c, "info");
            assert_eq!(
                (info["info"].as_str(), info["info_free"].as_str()),
                ("0", "0"),
                "cut to {cut}: {info:?}"
            );
            assert_eq!(info["info_total"], (4u64 << 30).to_string(), "cut to {cut}");
        }
        for (c, name) in [(a, "a"), (b, "b")] {
            let run = feed(c, "exit\n", name);
            assert_eq!(
                run.status.signal(),
                None,
                "{name} died of a signal:\n{}",
                run.report()
            );
            assert!(run.status.success(), "{}", run.report());
            assert!(
                run.stderr.contains("truncated or replaced while in use"),
                "{}",
                run.report()
            );
        }
        // Recreated (removed; the next program creates it): allocations work again.
        std::fs::remove_file(&ledger).unwrap();
        let mut cmd = shimmed(&sim, &ledger);
        cmd.arg("cmd");
        let run = feed(sim.spawn(&mut cmd), "alloc 64\nexit\n", "after recreation");
        assert_eq!(run.get("alloc"), "0", "{}", run.report());
    }
}

/// A ledger another process marked damaged (the header's state word, as a process that caught a
/// truncation leaves it after re-extending the file): the file's size is intact, and programs that
/// never touched a truncated page find the damage only in the header, which every reservation
/// reads. From then on they refuse, also once the word reads "ready" again; a program starting
/// now is refused too.
#[test]
fn ledger_marked_damaged_by_another_process_is_refused_by_every_process() {
    use gpuslice::slotfile::{STATE_DAMAGED, STATE_READY};
    use std::os::unix::fs::FileExt;
    // The slot file's header: magic (8 bytes), version (4), state (4).
    const STATE_AT: u64 = 12;
    let set_state = |ledger: &Path, state: u32| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(ledger)
            .unwrap()
            .write_all_at(&state.to_le_bytes(), STATE_AT)
            .unwrap();
    };
    let dir = tmp_dir("marked");
    let sim = Sim::new("marked");
    let ledger = dir.join("t.ledger");
    let (mut a, mut b) = two_holders(&sim, &ledger);
    let size = std::fs::metadata(&ledger).unwrap().len();
    set_state(&ledger, STATE_DAMAGED);
    // No wait for a size check: the next reservation sees the header.
    for c in [&mut a, &mut b] {
        for attempt in ["first", "second"] {
            assert_eq!(ask(c, "alloc 64", "alloc"), OOM, "{attempt} try");
        }
        assert_eq!(ask(c, "free", "free"), "0");
    }
    let mut cmd = shimmed(&sim, &ledger);
    cmd.arg("cmd");
    let joiner = feed(sim.spawn(&mut cmd), "alloc 64\nexit\n", "joiner");
    assert_eq!(joiner.get("alloc"), OOM, "{}", joiner.report());
    set_state(&ledger, STATE_READY);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        ask(&mut a, "alloc 64", "alloc"),
        OOM,
        "after the word was restored"
    );
    assert_eq!(std::fs::metadata(&ledger).unwrap().len(), size);
    for (c, name) in [(a, "a"), (b, "b")] {
        let run = feed(c, "exit\n", name);
        assert!(run.status.success(), "{}", run.report());
        assert!(
            run.stderr.contains("truncated or replaced while in use"),
            "{}",
            run.report()
        );
    }
}

/// A program that closes every descriptor it did not open (as a daemon does) and then opens files
/// of its own under the freed numbers: gpuslice never writes to them through its old numbers (a
/// size check or a repair through a reused number once zero-filled the program's file and marked
/// the sound ledger DAMAGED for the whole tenant). The program's own allocations are refused from
/// its next size check on; the tenant's other programs go on.
#[test]
fn a_program_closing_gpuslice_descriptors_loses_only_its_own_allocations() {
    let dir = tmp_dir("steal");
    let sim = Sim::new("steal");
    let ledger = dir.join("t.ledger");
    let app_file = dir.join("app.log");
    let mut a = sim.spawn(shimmed(&sim, &ledger).arg("cmd"));
    assert_eq!(ask(&mut a, "alloc 64", "alloc"), "0");
    assert_eq!(
        ask(&mut a, &format!("steal {}", app_file.display()), "steal"),
        "8"
    );
    // Past the next size check (every 50 ms), which now finds another file under the number.
    std::thread::sleep(Duration::from_millis(100));
    for attempt in ["first", "second"] {
        assert_eq!(ask(&mut a, "alloc 64", "alloc"), OOM, "{attempt} try");
    }
    assert_eq!(
        std::fs::metadata(&app_file).unwrap().len(),
        0,
        "the program's own file was written to"
    );
    let mut cmd = shimmed(&sim, &ledger);
    cmd.arg("cmd");
    let other = feed(sim.spawn(&mut cmd), "alloc 64\nfree\nexit\n", "other");
    assert_eq!(other.get("alloc"), "0", "{}", other.report());
    let run = feed(a, "exit\n", "a");
    assert!(run.status.success(), "{}", run.report());
    assert!(
        run.stderr
            .contains("the program closed gpuslice's descriptor"),
        "{}",
        run.report()
    );
    assert!(!run.stderr.contains("truncated"), "{}", run.report());
}

/// `gpuslice status` and `gpuslice doctor` with a FIFO, a directory, a device node or another
/// user's file at the ledger path: each answers (an error naming the path) instead of hanging.
#[test]
fn cli_answers_whatever_is_at_the_ledger_path() {
    let dir = tmp_dir("special");
    let fifo = dir.join("fifo.ledger");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let sub = dir.join("dir.ledger");
    std::fs::create_dir(&sub).unwrap();
    let mut paths = vec![
        fifo,
        sub,
        PathBuf::from("/dev/null"),
        PathBuf::from("/dev/zero"),
    ];
    if is_root() {
        // Another uid's private file.
        let other = dir.join("other.ledger");
        std::fs::write(&other, vec![0u8; 4096]).unwrap();
        std::os::unix::fs::chown(&other, Some(65534), Some(65534)).unwrap();
        paths.push(other);
    }
    let sim = Sim::new("special");
    for p in &paths {
        for args in [
            vec!["status", "--ledger", p.to_str().unwrap()],
            vec!["doctor"],
        ] {
            let mut cmd = sim.command(gpuslice_bin());
            cmd.args(&args)
                .env("GPUSLICE_LEDGER", p)
                .env("GPUSLICE_DEVICE_DIR", dir.join("devices"))
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            let mut child = cmd.spawn().unwrap();
            // Generous: a hang is forever, an answer takes milliseconds.
            let start = Instant::now();
            let status = loop {
                if let Some(s) = child.try_wait().unwrap() {
                    break Some(s);
                }
                if start.elapsed() > Duration::from_secs(30) {
                    let _ = child.kill();
                    break None;
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            let out = child.wait_with_output().unwrap();
            assert!(
                status.is_some(),
                "gpuslice {args:?} hung on {}",
                p.display()
            );
            let text = String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr);
            if args[0] == "status" {
                assert!(!out.status.success(), "{}: {text}", p.display());
                assert!(
                    text.contains(&p.display().to_string()),
                    "{}: {text}",
                    p.display()
                );
            }
        }
    }
}

/// The threads of one process share its slot, so the arbitration lock word cannot tell them apart:
/// one thread holding the lock for longer than another spins must still exclude the other (it once
/// took the word over as bogus and logged a damaged ledger).
#[test]
fn threads_of_one_process_take_turns_at_the_arbitration_lock() {
    let dir = tmp_dir("devledger-threads");
    let uuid = "GPU-1b2c3d4e-0000-1111-2222-333344446666";
    let path = path_for(&dir, uuid);
    let ledger = DeviceLedger::open(&path, uuid, true).unwrap();
    let slot = ledger.claim_slot(0).unwrap();
    let inside = std::sync::atomic::AtomicU32::new(0);
    let overlaps = std::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                for _ in 0..20 {
                    let _g = ledger.lock(slot);
                    if inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0 {
                        overlaps.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    // Far longer than the 64 spins a waiter makes before judging the holder.
                    std::thread::sleep(Duration::from_millis(1));
                    inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                }
            });
        }
    });
    assert_eq!(
        overlaps.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "two threads held the arbitration lock at once"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The device ledger's guarantees, through its public API: a joiner arriving while the file is
/// being initialised waits and then succeeds; a read-only handle's stores reach nothing shared; a
/// truncated file is repaired by the next sweep of a process using it, which writes back its slot
/// and tenant, so arbitration resumes and a new process can join.
#[test]
fn device_ledger_join_read_only_and_repair() {
    let dir = tmp_dir("devledger");
    let uuid = "GPU-1b2c3d4e-0000-1111-2222-333344445555";
    let path = path_for(&dir, uuid);
    let a = DeviceLedger::open(&path, uuid, true).unwrap();
    assert!(a.writable());
    let slot = a.claim_slot(0).unwrap();
    let t = {
        let g = a.lock(slot);
        a.find_or_add_tenant(&g, TenantId(7), &"t".repeat(64), 50, 0, false)
            .unwrap()
    };
    // A 64-byte tenant name (the configuration's limit) fits.
    assert_eq!(a.find_tenant(&"t".repeat(64)), Some(t));

    // Joiner during initialisation: flip the state word to INIT, flip it back 200 ms later.
    let bytes = std::fs::read(&path).unwrap();
    let mut init = bytes.clone();
    init[12..16].copy_from_slice(b"INIT");
    let write_at = |b: &[u8]| {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&b[12..16], 12).unwrap();
    };
    write_at(&init);
    let ready = bytes.clone();
    let p2 = path.clone();
    let flip = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&p2).unwrap();
        f.write_all_at(&ready[12..16], 12).unwrap();
    });
    let start = Instant::now();
    let b = DeviceLedger::open(&path, uuid, true).expect("joiner waits for READY");
    assert!(start.elapsed() >= Duration::from_millis(150));
    flip.join().unwrap();

    // Read-only: a private copy.
    let r = DeviceLedger::open_readonly(&path).unwrap();
    assert!(!r.writable());
    assert_eq!(r.claim_slot(0), None);
    r.layout()
        .header
        .hand_overs
        .store(12345, std::sync::atomic::Ordering::Relaxed);
    assert_ne!(
        a.layout()
            .header
            .hand_overs
            .load(std::sync::atomic::Ordering::Relaxed),
        12345
    );

    // Truncated to 0 while mapped by a and b: the next sweep repairs it.
    drop(b);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    a.sweep(Some(slot));
    assert!(std::fs::metadata(&path).unwrap().len() > 0);
    let c = DeviceLedger::open(&path, uuid, false).expect("a new process joins the repaired file");
    assert_eq!(c.uuid(), uuid);
    assert_eq!(c.find_tenant(&"t".repeat(64)), Some(t));
    assert!(
        c.slot_alive(slot, None),
        "the sweeper's slot is marked again"
    );
}

/// A forked child does not keep its parent's device-ledger slot: once the parent is gone, the
/// slot is free although the child lives on.
#[test]
fn device_ledger_slot_is_not_held_by_a_fork_child() {
    let dir = tmp_dir("devfork");
    let uuid = "GPU-1b2c3d4e-0000-1111-2222-333344445556";
    let path = path_for(&dir, uuid);
    let watcher = DeviceLedger::open(&path, uuid, true).unwrap();
    let w = watcher.claim_slot(0).unwrap();
    // The grandchild says when it runs: the fork handler has run by then (glibc runs it before
    // fork returns in the child); until then its copy of the child's descriptor exists.
    let mut ready = [0; 2];
    // SAFETY: `ready` has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe(ready.as_mut_ptr()) }, 0);
    // SAFETY: the child only uses async-signal-safe calls and the ledger, then _exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let ok = (|| {
            let mine = DeviceLedger::open(&path, uuid, false).ok()?;
            let slot = mine.claim_slot(0)?;
            // SAFETY: the grandchild writes a byte, sleeps, then _exits.
            if unsafe { libc::fork() } == 0 {
                // SAFETY: writes one byte from a valid buffer to the pipe.
                unsafe { libc::write(ready[1], [1u8].as_ptr().cast(), 1) };
                std::thread::sleep(Duration::from_secs(5));
                // SAFETY: ends the grandchild.
                unsafe { libc::_exit(0) };
            }
            std::mem::forget(mine); // die holding it, as a killed process would
            Some(slot)
        })();
        // SAFETY: ends the child with the slot number (+1; 0 = failed).
        unsafe { libc::_exit(ok.map_or(0, |s| s as i32 + 1)) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let slot = libc::WEXITSTATUS(status) - 1;
    assert!(slot >= 0, "child failed to claim a slot");
    let mut b = [0u8];
    // SAFETY: reads one byte into a valid buffer, then closes the pipe we created.
    unsafe {
        assert_eq!(libc::read(ready[0], b.as_mut_ptr().cast(), 1), 1);
        libc::close(ready[0]);
        libc::close(ready[1]);
    }
    assert!(
        !watcher.slot_alive(slot as usize, Some(w)),
        "a fork child still holds its dead parent's slot: {}",
        std::fs::read_to_string("/proc/locks").unwrap()
    );
}
