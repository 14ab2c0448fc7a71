//! Arbitration that no tenant can freeze or lock others out of (docs/COMPUTE.md, "Failure";
//! docs/SECURITY.md). Each attack is performed as a tenant would, from its container (its uid,
//! the CDI mounts, no capabilities), on node tenants created by root, with simgpu's busy counters
//! as the judge; each test passes only when the attack fails:
//!
//! * a tenant whose CUDA process re-stamps the arbitration lock (naming its own slot) every 5 ms
//!   while it owns the GPU: the shares stay within 3 points of policy, and root's `tenant create`
//!   answers within 2 s meanwhile;
//! * a tenant whose CUDA process writes the owner word naming its own slot, a fresh grant,
//!   heartbeat and epoch every 5 ms (forged ownership): the shares stay within 3 points of policy
//!   during and after the attack, the victims report it, and `tenant create` answers within 2 s;
//! * the same forgery naming a *victim's* live slot (found by index and tenant word: in a
//!   container every process is pid 1): the named process's library does not use what it did not
//!   win beyond its fair fraction, and the shares hold during and after the attack;
//! * a tenant that `lockf`s every slot-lock byte of the device ledger: every process started
//!   afterwards still gets a slot (claimed with a lock in its tenant's own memory ledger) and the
//!   shares stay within 3 points of policy during and after the attack, `status --compute` reports
//!   the ledger unhealthy meanwhile, and `tenant create` answers within 2 s;
//! * a tenant that marks every free slot in use (state word and byte lock), under any label,
//!   refilling those freed: every process still gets a slot (each tenant holds at most its part
//!   of the slots) and the shares stay within 3 points of policy;
//! * a tenant that grows the device ledger by a byte (`truncate -s +1`), or shrinks it: the next
//!   process repairs it, and the shares hold;
//! * a share-10 tenant that overwrites a share-30 tenant's identity words every 1 ms: the victim
//!   keeps its share (its entry's settings are the node's policy's for that entry);
//! * a share-10 tenant that labels its process slot with a share-30 tenant's entry, or writes that
//!   tenant's identity into its own entry, every 1 ms: it gets no more than its own share (a slot
//!   counts for an entry only while the kernel lists its tenant's lock on it).

mod support;

use gpuslice_state::compute::device::DeviceLedger;
use gpuslice_state::compute::shm::{unpack, Header, Layout, SlotEntry, TenantEntry, MAX_SLOTS};
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use support::*;

/// How far (percentage points) a tenant's part of the busy time may be from its policy.
const TOLERANCE: f64 = 3.0;
const RUN_MS: u64 = 8000;

fn device_ledger(scene: &Scene) -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir(scene.state.join("devices"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "dev"))
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found.remove(0)
}

fn inside(ledger: &Path) -> String {
    format!(
        "/run/gpuslice/devices/{}",
        ledger.file_name().unwrap().to_string_lossy()
    )
}

/// `tenant create`, timed. `--overcommit`: the scenarios add a tenant past 100% of promised
/// shares on purpose (arbitration normalises among the tenants that want the GPU).
fn create(scene: &Scene, name: &str, share: &str) -> Duration {
    let t0 = Instant::now();
    scene
        .gpuslice(&[
            "tenant",
            "create",
            name,
            "--memory",
            "1GiB",
            "--share",
            share,
            "--overcommit",
        ])
        .assert_success();
    t0.elapsed()
}

/// A tenant's program in its container, output piped.
fn spawn(scene: &Scene, tenant: &str, uid: u32, program: &Path, args: &[&str]) -> Child {
    scene
        .in_container(tenant, uid, program, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The tenants spin 2 ms kernels from a common start for `RUN_MS`; returns their children.
fn spin(scene: &Scene, client: &Path, tenants: &[(&str, u32)], start: u64) -> Vec<Child> {
    let (start, ms) = (start.to_string(), RUN_MS.to_string());
    tenants
        .iter()
        .map(|&(t, uid)| spawn(scene, t, uid, client, &["spin", &start, &ms, "2000"]))
        .collect()
}

fn finish_all(children: Vec<Child>, what: &str) -> Vec<Run> {
    children
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let r = Run::new(format!("{what} {i}"), c.wait_with_output().unwrap());
            r.assert_success();
            r
        })
        .collect()
}

/// Each tenant's percentage of the busy time the tenants gained between two readings.
fn percents(before: &[u64], after: &[u64]) -> Vec<f64> {
    let d: Vec<u64> = before.iter().zip(after).map(|(b, a)| a - b).collect();
    let total = d.iter().sum::<u64>().max(1) as f64;
    d.iter().map(|&x| x as f64 * 100.0 / total).collect()
}

fn busy(scene: &Scene, tenants: &[(&str, u32)]) -> Vec<u64> {
    tenants.iter().map(|(t, _)| scene.busy(t)).collect()
}

/// Asserts every tenant within `TOLERANCE` of `want` (percent of the busy time).
/// The attacker's run wrote its words more than `min` times (the attack really ran).
fn attack_ran(tag: &str, attacker: &Run, min: u64) {
    let stamped = attacker.get_u64("stamped");
    assert!(
        stamped > min,
        "the attack never ran:\n{}",
        attacker.report()
    );
    println!("{tag}: the attacker wrote {stamped} times");
}

/// One run of t1 (share 10) and t2 (share 90) beside an attack: every process got a slot in the
/// device ledger (none ran throttled without one), and the split is 10/90 within the tolerance.
fn run_10_90(scene: &Scene, client: &Path, tenants: &[(&str, u32)], what: &str) {
    let start = start_in(2500);
    let children = spin(scene, client, tenants, start);
    let (before, after) = middle_window(scene, tenants, start);
    let runs = finish_all(children, what);
    for r in &runs {
        assert!(
            !r.stderr.contains("no process slot") && !r.stderr.contains("throttled to"),
            "{what}: a process was kept out of the device ledger:\n{}",
            r.report()
        );
    }
    let got = percents(&before, &after);
    if got
        .iter()
        .zip([10.0, 90.0])
        .any(|(g, w)| (g - w).abs() > TOLERANCE)
    {
        // What the processes said (their slots, incidents) is the evidence of what went wrong.
        for r in &runs {
            println!("{what}: {}", r.report());
        }
        println!("{what}: {}", status(scene).stdout);
    }
    assert_shares(what, &got, &[10.0, 90.0]);
}

fn assert_shares(what: &str, got: &[f64], want: &[f64]) {
    assert_shares_within(what, got, want, TOLERANCE);
}

fn assert_shares_within(what: &str, got: &[f64], want: &[f64], tolerance: f64) {
    println!("{what}: got {got:.1?}, policy {want:.1?}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= tolerance,
            "{what}: shares {got:.1?}, policy {want:.1?} (more than {tolerance} points off)"
        );
    }
}

/// Busy counters of the tenants over the middle of a run that starts at `start` (CLOCK_REALTIME
/// ns): from 1.5 s in to 1 s before its end, so that every tenant is at work throughout.
fn middle_window(scene: &Scene, tenants: &[(&str, u32)], start: u64) -> (Vec<u64>, Vec<u64>) {
    let now = || start_in(0);
    let until = |t: u64| {
        let n = now();
        if t > n {
            std::thread::sleep(Duration::from_nanos(t - n));
        }
    };
    until(start + 1_500_000_000);
    let before = busy(scene, tenants);
    until(start + (RUN_MS - 1000) * 1_000_000);
    (before, busy(scene, tenants))
}

/// The attacker's own CUDA program (`compute_client stamp`): it spins 2 ms kernels like the others
/// while a second thread of the same process attacks the device ledger every 5 ms (`what`: `lock`
/// re-stamps the arbitration lock word naming the process's own slot while it owns the GPU,
/// `owner` writes the owner word naming it, a fresh grant, heartbeat and epoch).
fn attacker(scene: &Scene, client: &Path, ledger: &Path, start: u64, what: &str) -> Child {
    attacker_naming(scene, client, ledger, start, what, RUN_MS, RUN_MS, "t1")
}

/// [`attacker`] running `run_ms`, attacking for the first `attack_ms` of them, its words naming
/// the slot of tenant `named`'s process (pid 1 in its container, as the attacker's is).
#[allow(clippy::too_many_arguments)]
fn attacker_naming(
    scene: &Scene,
    client: &Path,
    ledger: &Path,
    start: u64,
    what: &str,
    run_ms: u64,
    attack_ms: u64,
    named: &str,
) -> Child {
    let h = offset_of!(Layout, header);
    let args: Vec<String> = [
        "stamp".to_string(),
        start.to_string(),
        run_ms.to_string(),
        "2000".to_string(),
        what.to_string(),
        inside(ledger),
        (h + offset_of!(Header, lock)).to_string(),
        (h + offset_of!(Header, lock_ns)).to_string(),
        (h + offset_of!(Header, owner)).to_string(),
        (h + offset_of!(Header, grant_ns)).to_string(),
        (h + offset_of!(Header, epoch)).to_string(),
        (h + offset_of!(Header, owner_beat_ns)).to_string(),
        offset_of!(Layout, slots).to_string(),
        size_of::<SlotEntry>().to_string(),
        offset_of!(SlotEntry, pid).to_string(),
        attack_ms.to_string(),
        offset_of!(SlotEntry, tenant).to_string(),
        tenant_entry(ledger, named).to_string(),
    ]
    .into();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    spawn(scene, "t1", 1001, client, &args)
}

/// The entry of tenant `name` in the device ledger: the attacker's slot is the one whose pid and
/// tenant words are its own (in a PID namespace every tenant's process may be pid 1, and a slot
/// found by its pid alone may be a victim's).
fn tenant_entry(ledger: &Path, name: &str) -> usize {
    let l = DeviceLedger::open_readonly(ledger).unwrap();
    l.layout()
        .tenants
        .iter()
        .position(|e| unpack(&e.name) == name)
        .unwrap_or_else(|| panic!("no tenant {name} in {}", ledger.display()))
}

/// Three tenants of shares 10 / 30 / 30 from a common start, the share-10 one (`t1`) attacking the
/// device ledger from its own CUDA process (`attacker`); root creates a tenant meanwhile, and
/// must be answered within 2 s. The shares must hold within `TOLERANCE`.
fn attacked_shares(tag: &str, what: &str) {
    let scene = Scene::new(tag, &[("SIMGPU_MEMORY", "16GiB")]);
    let tenants = [("t1", 1001), ("t2", 1002), ("t3", 1003)];
    for ((t, _), share) in tenants.iter().zip(["10", "30", "30"]) {
        create(&scene, t, share);
    }
    let ledger = device_ledger(&scene);
    let client = compute_client(&scene.dir);
    let start = start_in(2500);
    let mut children = vec![attacker(&scene, &client, &ledger, start, what)];
    children.extend(spin(&scene, &client, &tenants[1..], start));
    let (before, after) = {
        let now = start_in(0);
        std::thread::sleep(Duration::from_nanos(
            (start + 3_000_000_000).saturating_sub(now),
        ));
        // Root's command while the attack runs: it must answer within 2 s.
        let took = create(&scene, "t4", "10");
        assert!(
            took < Duration::from_secs(2),
            "{tag}: tenant create took {took:?} during the attack"
        );
        println!("{tag}: tenant create took {took:?} during the attack");
        middle_window(&scene, &tenants, start)
    };
    let runs = finish_all(children, "spin");
    attack_ran(tag, &runs[0], 20);
    // Policy: 10 / 30 / 30 of the busy time among the three active tenants.
    assert_shares(
        tag,
        &percents(&before, &after),
        &[100.0 / 7.0, 300.0 / 7.0, 300.0 / 7.0],
    );
}

/// Finding: a share-10 tenant that re-stamped the lock every 5 ms while it owned the GPU got
/// 90.6%, the two share-30 tenants 4.5% and 4.9%, and root's `tenant create` hung.
#[test]
fn a_tenant_restamping_the_arbitration_lock_cannot_freeze_it() {
    attacked_shares("freeze", "lock");
}

/// Finding (left open when the lock-freeze was closed): a tenant's own CUDA process that writes
/// the owner word naming its slot, a fresh grant, heartbeat and epoch every 5 ms keeps the GPU:
/// its gate launches, the others' wait, and every revocation is undone at the next write. Shares
/// 10 / 30 / 30, the share-10 tenant forging for the first 7 s of a 13 s run; judged over
/// [1.5 s, 6.5 s] (during) and [9.5 s, 12 s] (after, once the victims have seen their due again).
#[test]
fn a_tenant_forging_ownership_cannot_keep_the_gpu() {
    forged_shares("forge", "t1");
}

/// The same forgery naming a *victim's* process: the share-10 tenant writes the owner word naming
/// the live slot of the share-30 tenant `t3` (its slot found by index and tenant word; in a
/// container every process is pid 1), with a fresh grant, heartbeat and epoch every 5 ms. Runs
/// that did this by mistake gave the named tenant up to 59.7% against 42.9%. The named process's
/// library must not use ownership it did not win beyond its fair fraction: the shares stay within
/// 3 points of policy during and after the attack, and `tenant create` answers within 2 s.
#[test]
fn a_tenant_forging_ownership_for_another_tenant_cannot_give_it_the_gpu() {
    forged_shares("forge-other", "t3");
}

/// Shares 10 / 30 / 30; `t1` forges ownership naming the slot of `named`'s process (its own, or a
/// victim's) for the first 7 s of a 13 s run.
fn forged_shares(tag: &str, named: &str) {
    const RUN: u64 = 13_000;
    const ATTACK: u64 = 7_000;
    let scene = Scene::new(tag, &[("SIMGPU_MEMORY", "16GiB")]);
    let tenants = [("t1", 1001), ("t2", 1002), ("t3", 1003)];
    for ((t, _), share) in tenants.iter().zip(["10", "30", "30"]) {
        create(&scene, t, share);
    }
    let ledger = device_ledger(&scene);
    let client = compute_client(&scene.dir);
    let start = start_in(2500);
    let mut children = vec![attacker_naming(
        &scene, &client, &ledger, start, "owner", RUN, ATTACK, named,
    )];
    let (s, ms) = (start.to_string(), RUN.to_string());
    children.extend(
        tenants[1..]
            .iter()
            .map(|&(t, uid)| spawn(&scene, t, uid, &client, &["spin", &s, &ms, "2000"])),
    );
    let at = |ms: u64| {
        let (n, t) = (start_in(0), start + ms * 1_000_000);
        if t > n {
            std::thread::sleep(Duration::from_nanos(t - n));
        }
        busy(&scene, &tenants)
    };
    let during0 = at(1500);
    let took = {
        at(3000);
        let took = create(&scene, "t4", "10");
        println!("{tag}: tenant create took {took:?} during the attack");
        took
    };
    let during1 = at(6500);
    let after0 = at(9500);
    let after1 = at(12_000);
    let runs = finish_all(children, "spin");
    let st = status(&scene);
    println!(
        "{tag}: status: {}",
        st.stdout
            .lines()
            .find(|l| l.contains("FORGED"))
            .unwrap_or("-")
    );
    assert!(
        took < Duration::from_secs(2),
        "{tag}: tenant create took {took:?} during the attack"
    );
    attack_ran(tag, &runs[0], 100);
    let policy = [100.0 / 7.0, 300.0 / 7.0, 300.0 / 7.0];
    let during = percents(&during0, &during1);
    let after = percents(&after0, &after1);
    println!("{tag}: during {during:.1?}, after {after:.1?}, policy {policy:.1?}");
    let off = |got: &[f64]| {
        got.iter()
            .zip(&policy)
            .any(|(g, w)| (g - w).abs() > TOLERANCE)
    };
    if off(&during) || off(&after) {
        for r in &runs {
            println!("{tag}: {}", r.report());
        }
    }
    // During the attack the named process is held to its due by its own library and the others
    // launch paced to theirs, each in its tenant's window and only what ends in it; after it,
    // arbitration is back to policy. Without the defence: 100/0/0 (the forger named), the named
    // victim well above its share (another named).
    assert_shares(&format!("{tag}: during the attack"), &during, &policy);
    assert_shares(&format!("{tag}: after the attack"), &after, &policy);
    assert!(
        st.stdout.contains("FORGED OWNER"),
        "status must report the forged owner:\n{}",
        st.stdout
    );
    for (r, (t, _)) in runs.iter().zip(&tenants) {
        if *t == "t1" && named != "t1" {
            // The forger's own process may or may not have been kept out long enough to say so.
            continue;
        }
        assert!(
            r.stderr.contains("launches paced"),
            "{tag}: a process kept out by (or handed) a forged owner must say so:\n{}",
            r.report()
        );
    }
}

fn status(scene: &Scene) -> Run {
    let devices = scene.state.join("devices");
    let r = scene.gpuslice(&[
        "status",
        "--compute",
        "--device-dir",
        devices.to_str().unwrap(),
    ]);
    r.assert_success();
    r
}

/// One scrape of `gpuslice exporter` (root's, on the node's state directory): the value of
/// `name` for the node's one GPU.
fn exported(scene: &Scene, name: &str) -> f64 {
    let mut child = scene
        .command(gpuslice_bin())
        .args(["exporter", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(&scene.state)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = scrape_metrics(&exporter_address(&mut child));
    let _ = child.kill();
    let _ = child.wait();
    out.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in the scrape:\n{out}"))
}

/// Finding: `lockf` on the 256 slot-lock bytes made every process started afterwards run
/// unscheduled (cap 10% gave 99.8%, shares 10/90 gave 50/50), and no tenant could be created.
/// Now a process of a tenant with a memory ledger claims its slot with a lock in that file, which
/// no other tenant can open: the squat keeps nobody out, and the shares hold during and after it.
#[test]
fn a_tenant_locking_every_slot_byte_keeps_nobody_out() {
    let scene = Scene::new("squat", &[("SIMGPU_MEMORY", "16GiB")]);
    let tenants = [("t1", 1001), ("t2", 1002)];
    create(&scene, "t1", "10");
    create(&scene, "t2", "90");
    let ledger = device_ledger(&scene);
    let client = compute_client(&scene.dir);
    let lock_at = size_of::<Layout>();
    // The squatter also tries to reach the victim's memory ledger, where the victim's slot locks
    // now are: its container has no path to it, and its uid no permission on it.
    let victim = scene.state.join("tenants/t2/t2.ledger");
    let squat = format!(
        "import fcntl, os, sys, time\n\
         fd = os.open('{}', os.O_RDWR)\n\
         fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, {MAX_SLOTS}, {lock_at}, os.SEEK_SET)\n\
         try:\n    os.open('{}', os.O_RDONLY); print('victim_opened=1', flush=True)\n\
         except OSError:\n    print('victim_opened=0', flush=True)\n\
         print('locked=1', flush=True)\n\
         sys.stdin.read()\n",
        inside(&ledger),
        victim.display()
    );
    let mut squatter = scene
        .in_container("t1", 1001, Path::new("/usr/bin/python3"), &["-c", &squat])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let said = wait_for_key(&mut squatter, "locked");
    assert_eq!(
        said.get("victim_opened").map(String::as_str),
        Some("0"),
        "the squatter opened the victim's ledger: {said:?}"
    );
    let st = status(&scene);
    assert!(
        st.stdout.contains("UNHEALTHY") && st.stdout.contains("locked by someone not in them"),
        "status does not report the squatted slots:\n{}",
        st.report()
    );
    assert_eq!(
        exported(&scene, "gpuslice_device_ledger_squatted_slots"),
        MAX_SLOTS as f64
    );
    assert_eq!(exported(&scene, "gpuslice_device_ledger_unhealthy"), 1.0);
    let took = create(&scene, "t3", "10");
    assert!(took < Duration::from_secs(2), "tenant create took {took:?}");
    let run_phase = |what: &str| run_10_90(&scene, &client, &tenants, what);
    run_phase("squat: during");
    // Twice: the first run's processes died while the squatter held their ledger bytes (they look
    // alive to other tenants); the tenant's own next processes see through that.
    run_phase("squat: during, again");
    drop(squatter.stdin.take());
    let _ = squatter.wait();
    run_phase("squat: after");
    let st = status(&scene);
    assert!(!st.stdout.contains("UNHEALTHY"), "{}", st.report());
    assert_eq!(
        exported(&scene, "gpuslice_device_ledger_squatted_slots"),
        0.0
    );
    assert_eq!(exported(&scene, "gpuslice_device_ledger_unhealthy"), 0.0);
}

/// A squatter in t1's container (its uid, root there): every 10 ms it marks every free slot of the
/// device ledger in use (its state word ACTIVE, its tenant word `label` unless negative, a fresh
/// heartbeat) and locks its byte, and does the same to every slot in use whose byte nobody holds
/// (a dead process's) that it did not squat before, until its stdin closes. It has printed
/// `squatted=N` (the slots it filled at once) when this returns.
fn slot_filler(scene: &Scene, ledger: &Path, label: i64) -> (Child, u64) {
    let slots = offset_of!(Layout, slots);
    let (entry, state, tenant, beat) = (
        size_of::<SlotEntry>(),
        offset_of!(SlotEntry, state),
        offset_of!(SlotEntry, tenant),
        offset_of!(SlotEntry, beat_ns),
    );
    let (size, lock_at) = (size_of::<Layout>(), size_of::<Layout>());
    let fill = format!(
        "import fcntl, mmap, os, select, struct, sys, time\n\
         fd = os.open('{}', os.O_RDWR)\n\
         m = mmap.mmap(fd, {size})\n\
         mine = set()\n\
         def lock(i):\n    try:\n        \
         fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, {lock_at} + i, os.SEEK_SET)\n        \
         return True\n    except OSError:\n        return False\n\
         def fill():\n    n = 0\n    for i in range({MAX_SLOTS}):\n        \
         at = {slots} + i * {entry}\n        \
         if struct.unpack_from('<I', m, at + {state})[0] == 0:\n            lock(i)\n        \
         elif i in mine or not lock(i):\n            continue\n        \
         if {label} >= 0:\n            struct.pack_into('<I', m, at + {tenant}, {label})\n        \
         struct.pack_into('<Q', m, at + {beat}, time.monotonic_ns())\n        \
         struct.pack_into('<I', m, at + {state}, 1)\n        \
         mine.add(i)\n        n += 1\n    return n\n\
         print('squatted=%d' % fill(), flush=True)\n\
         while not select.select([sys.stdin], [], [], 0.01)[0]:\n    fill()\n",
        inside(ledger),
    );
    let mut child = scene
        .in_container("t1", 1001, Path::new("/usr/bin/python3"), &["-c", &fill])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let said = wait_for_key(&mut child, "squatted");
    let n = said["squatted"].parse().unwrap();
    (child, n)
}

fn stop(mut child: Child) {
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Finding (left open when slot bytes were claimed through tenant locks): a tenant that marks
/// every free slot's state word in use and locks its byte kept every later process of the other
/// tenants out (they ran throttled to their share). Now each tenant holds at most its part of the
/// slots (the node's policy lists three tenants: 64 each): a process finding every slot in use
/// takes back one of a group over its limit, or one labelled with its own tenant that no process
/// of it holds. The squatter fills slots under the label they had (unused slots name entry 0),
/// then under the victim's own label, refilling every slot freed; every process of both tenants
/// must get a slot and the shares hold within 3 points during and after it.
#[test]
fn a_tenant_filling_every_free_slot_keeps_nobody_out() {
    let scene = Scene::new("fill", &[("SIMGPU_MEMORY", "16GiB")]);
    let tenants = [("t1", 1001), ("t2", 1002)];
    create(&scene, "t1", "10");
    create(&scene, "t2", "90");
    let ledger = device_ledger(&scene);
    let client = compute_client(&scene.dir);
    let run_phase = |what: &str| run_10_90(&scene, &client, &tenants, what);
    let (filler, n) = slot_filler(&scene, &ledger, -1);
    assert_eq!(n, MAX_SLOTS as u64, "the squatter did not fill every slot");
    let took = create(&scene, "t3", "10");
    assert!(took < Duration::from_secs(2), "tenant create took {took:?}");
    println!("fill: tenant create took {took:?} with every slot filled");
    run_phase("fill: during");
    stop(filler);
    // The victim's own label on every squatted slot: its processes see through it by their
    // tenant locks, the squatter's count does not hide behind it.
    let victim = gpuslice_state::compute::device::DeviceLedger::open_readonly(&ledger)
        .unwrap()
        .find_tenant("t2")
        .expect("t2 has an entry");
    let (filler, n) = slot_filler(&scene, &ledger, victim as i64);
    assert_eq!(
        n, MAX_SLOTS as u64,
        "the squatter did not relabel every slot"
    );
    println!("fill: relabelled {n} slots as the victim's (entry {victim})");
    let took = create(&scene, "t4", "10");
    assert!(took < Duration::from_secs(2), "tenant create took {took:?}");
    run_phase("fill: labelled as the victim");
    stop(filler);
    run_phase("fill: after");
}

/// Finding: `truncate -s +1` made joiners refuse the device ledger (running processes accepted
/// it, nobody repaired it): every process started afterwards ran unscheduled. A shrunk file too.
#[test]
fn a_tenant_growing_or_shrinking_the_device_ledger_is_repaired() {
    let scene = Scene::new("size", &[("SIMGPU_MEMORY", "16GiB")]);
    let tenants = [("t1", 1001), ("t2", 1002)];
    create(&scene, "t1", "10");
    create(&scene, "t2", "90");
    let ledger = device_ledger(&scene);
    let client = compute_client(&scene.dir);
    let total = size_of::<Layout>() as u64;
    for (what, arg) in [("grown", "+1".to_string()), ("shrunk", "4000".to_string())] {
        let r = run(&mut scene.in_container(
            "t1",
            1001,
            Path::new("/usr/bin/truncate"),
            &["-s", &arg, &inside(&ledger)],
        ));
        r.assert_success();
        assert_ne!(std::fs::metadata(&ledger).unwrap().len(), total, "{what}");
        let start = start_in(2500);
        let children = spin(&scene, &client, &tenants, start);
        let (before, after) = middle_window(&scene, &tenants, start);
        finish_all(children, what);
        assert_eq!(
            std::fs::metadata(&ledger).unwrap().len(),
            total,
            "{what}: not repaired"
        );
        assert_shares(what, &percents(&before, &after), &[10.0, 90.0]);
    }
    let st = status(&scene);
    assert!(!st.stdout.contains("UNHEALTHY"), "{}", st.report());
}

/// Shares 10 / 30 / 30 from a common start; the share-10 tenant `t1` writes the device ledger
/// every 1 ms for the whole run from its own CUDA process (`compute_client pose`: `what` =
/// `scramble` the victim `t3`'s identity words, `label` its own slot with `t3`'s entry, `copyid`
/// `t3`'s identity into its own entry). The tenants' parts of the busy time over the middle of
/// the run.
fn posed_shares(tag: &str, what: &str) -> Vec<f64> {
    let scene = Scene::new(tag, &[("SIMGPU_MEMORY", "16GiB")]);
    let tenants = [("t1", 1001), ("t2", 1002), ("t3", 1003)];
    for ((t, _), share) in tenants.iter().zip(["10", "30", "30"]) {
        create(&scene, t, share);
    }
    let ledger = device_ledger(&scene);
    let client = compute_client(&scene.dir);
    let start = start_in(2500);
    let args: Vec<String> = [
        "pose".to_string(),
        start.to_string(),
        RUN_MS.to_string(),
        "2000".to_string(),
        what.to_string(),
        inside(&ledger),
        offset_of!(Layout, tenants).to_string(),
        size_of::<TenantEntry>().to_string(),
        offset_of!(TenantEntry, id).to_string(),
        offset_of!(TenantEntry, name).to_string(),
        offset_of!(Layout, slots).to_string(),
        size_of::<SlotEntry>().to_string(),
        offset_of!(SlotEntry, pid).to_string(),
        offset_of!(SlotEntry, tenant).to_string(),
        "t1".to_string(),
        "t3".to_string(),
    ]
    .into();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut children = vec![spawn(&scene, "t1", 1001, &client, &args)];
    children.extend(spin(&scene, &client, &tenants[1..], start));
    let (before, after) = middle_window(&scene, &tenants, start);
    let runs = finish_all(children, what);
    attack_ran(tag, &runs[0], 1000);
    let got = percents(&before, &after);
    println!("{tag}: {what}: got {got:.1?}");
    if std::env::var_os("POSE_REPORT").is_some()
        || got[0] > 100.0 / 7.0 + TOLERANCE
        || (got[2] - 300.0 / 7.0).abs() > TOLERANCE
    {
        for r in &runs {
            println!("{tag}: {}", r.report());
        }
        println!("{tag}: {}", status(&scene).stdout);
    }
    got
}

/// Finding (issue 23, left open by the previous stop): a tenant that overwrote another tenant's
/// identity words left it unlisted (share 1) until its scheduler thread wrote them back; doing it
/// in a loop kept the victim at share 1 most of the time. Now an entry's settings are those the
/// node's policy gives that entry, whatever its words say: the victim keeps its share.
#[test]
fn a_tenant_rewriting_another_tenants_identity_cannot_take_its_share() {
    let got = posed_shares("scramble", "scramble");
    assert_shares("scramble", &got, &[100.0 / 7.0, 300.0 / 7.0, 300.0 / 7.0]);
}

/// Finding (issue 23): a tenant that labelled its process slot with another tenant's entry was
/// scheduled (and charged) as that tenant. Now a slot counts for an entry the policy gives a
/// tenant only while the kernel lists that tenant's lock on the slot: the poser gets no more than
/// its own share, and the tenant it poses as keeps its own.
#[test]
fn a_tenant_labelling_its_slot_with_another_tenants_entry_gets_no_more_than_its_share() {
    posed_as_victim("label");
}

/// Finding (issue 23): a tenant that wrote another tenant's identity into its own entry got that
/// tenant's settings. Now an entry's settings are those the policy gives its index.
#[test]
fn a_tenant_writing_another_tenants_identity_into_its_entry_gets_no_more_than_its_share() {
    posed_as_victim("copyid");
}

/// [`posed_shares`] with `what`: the poser within its share, the tenant it poses as at least at
/// its own.
fn posed_as_victim(what: &str) {
    let (own, victim) = (100.0 / 7.0, 300.0 / 7.0);
    let got = posed_shares(&format!("pose-{what}"), what);
    assert!(
        got[0] <= own + TOLERANCE,
        "{what}: the poser got {:.1}% (its share: {own:.1}%): {got:.1?}",
        got[0]
    );
    assert!(
        got[2] >= victim - TOLERANCE,
        "{what}: the tenant posed as got {:.1}% (its share: {victim:.1}%): {got:.1?}",
        got[2]
    );
}
