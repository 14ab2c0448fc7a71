//! The ledger's tests, through its API and real files (one file of about 800 lines: they share the
//! fixtures at the top, and each drives several of the ledger's files at once).

use super::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const UUID_A: &str = "GPU-1b2c3d4e-0000-1111-2222-333344445555";
const UUID_B: &str = "GPU-99999999-0000-1111-2222-333344445555";

/// A fresh directory (that does not exist yet) for one test's ledger.
fn ledger_path(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let base = std::env::temp_dir().join(format!(
        "gpuslice-ledger-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&base);
    base.join("sub").join(format!("{name}.ledger"))
}

fn opts(default: Limit, devices: &[(&str, Limit)]) -> LedgerOptions {
    LedgerOptions {
        tenant: "test".into(),
        default_limit: default,
        devices: devices
            .iter()
            .map(|(u, l)| (u.to_string(), l.clone()))
            .collect(),
        group: None,
    }
}

/// The node's word for claim `claim`.
fn word(claim: u64, host_pid: u32, overhead: [u64; MAX_DEVICES], now_ms: u64) -> NodeWord {
    NodeWord {
        claim,
        host_pid,
        overhead,
        now_ms,
    }
}

fn limited(bytes: u64) -> LedgerOptions {
    opts(Limit::Unlimited, &[(UUID_A, Limit::Bytes(bytes))])
}

#[test]
fn create_and_join() {
    let _serial = crate::slotfile::serial_test();
    let path = ledger_path("join");
    let a = Ledger::open(&path, &limited(4 * GIB)).unwrap();
    assert!(a.created());
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let dir_mode = std::fs::metadata(path.parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(dir_mode & 0o777, 0o700);
    // No temporary file left behind.
    assert_eq!(
        std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
        1
    );

    // The joiner's own configuration (unlimited, then 64 GiB) does not loosen the quota.
    let b = Ledger::open(
        &path,
        &opts(Limit::Unlimited, &[(UUID_A, Limit::Unlimited)]),
    )
    .unwrap();
    let c = Ledger::open(&path, &limited(64 * GIB)).unwrap();
    assert!(!b.created() && !c.created());
    let (da, db) = (
        a.device_index(UUID_A).unwrap(),
        b.device_index(UUID_A).unwrap(),
    );
    assert_eq!(da, db);
    assert_eq!(b.limit(db), 4 * GIB);
    assert_eq!(c.limit(db), 4 * GIB);
    // Slots are claimed at a process's first reservation: joining reads only.
    assert_eq!((a.slot(), b.slot(), c.slot()), (None, None, None));
    assert!(a.snapshot().processes.is_empty());

    // One quota shared by all.
    a.try_reserve(da, 3 * GIB).unwrap();
    let e = b.try_reserve(db, 2 * GIB).unwrap_err();
    assert_eq!(
        e,
        QuotaExceeded {
            requested: 2 * GIB,
            used: 3 * GIB,
            limit: 4 * GIB,
            closed: false,
        }
    );
    assert_eq!(
        e.to_string(),
        "memory quota exceeded: requested 2 GiB, 3 GiB of 4 GiB in use"
    );
    b.try_reserve(db, GIB).unwrap();
    assert!(a.slot().is_some() && b.slot().is_some() && c.slot().is_none());
    assert_ne!(a.slot(), b.slot());
    assert_eq!(c.snapshot().processes.len(), 2);
    assert_eq!(a.used(da), 4 * GIB);
    assert_eq!(b.used_by_me(db), GIB);
    b.release(db, GIB);
    a.release(da, 3 * GIB);
    assert_eq!(c.used(da), 0);
    assert_eq!(c.snapshot().devices[0].peak, 4 * GIB);
}

#[test]
fn joiner_adds_device_with_creators_default() {
    let _serial = crate::slotfile::serial_test();
    let path = ledger_path("default");
    let a = Ledger::open(
        &path,
        &opts(Limit::Bytes(2 * GIB), &[(UUID_A, Limit::Bytes(4 * GIB))]),
    )
    .unwrap();
    let b = Ledger::open(
        &path,
        &opts(Limit::Unlimited, &[(UUID_B, Limit::Unlimited)]),
    )
    .unwrap();
    let d = b.device_index(&UUID_B.replace("GPU-", "gpu-")).unwrap();
    assert_eq!(b.limit(d), 2 * GIB);
    assert_eq!(a.device_index(UUID_B), Some(d));
    assert_eq!(a.limit(a.device_index(UUID_A).unwrap()), 4 * GIB);
    // Invalid configuration at creation: limit 0, flagged.
    let path = ledger_path("invalid");
    let l = Ledger::open(&path, &opts(Limit::Invalid("bad".into()), &[])).unwrap();
    let d = l.device_index(UUID_A).unwrap();
    assert_eq!(l.try_reserve(d, 1).unwrap_err().limit, 0);
    assert!(l.snapshot().devices[0].invalid_config);
}

#[test]
fn set_limit_applies_to_next_reservation() {
    let _serial = crate::slotfile::serial_test();
    let path = ledger_path("setlimit");
    let a = Ledger::open(&path, &limited(4 * GIB)).unwrap();
    let d = a.device_index(UUID_A).unwrap();
    a.try_reserve(d, GIB).unwrap();
    let admin = Ledger::open_existing(&path).unwrap();
    assert_eq!(admin.slot(), None);
    admin.set_limit(d, GIB + 512 * MIB).unwrap();
    assert_eq!(a.try_reserve(d, GIB).unwrap_err().limit, GIB + 512 * MIB);
    a.try_reserve(d, 512 * MIB).unwrap();
    admin.set_limit(d, UNLIMITED).unwrap();
    a.try_reserve(d, 100 * GIB).unwrap();
    assert!(Ledger::open_readonly(&path)
        .unwrap()
        .set_limit(d, 0)
        .is_err());
    assert!(admin.set_limit(MAX_DEVICES, 0).is_err());
}

#[test]
fn bad_device_and_release_underflow() {
    let _serial = crate::slotfile::serial_test();
    let path = ledger_path("bounds");
    let a = Ledger::open(&path, &limited(GIB)).unwrap();
    assert!(a.try_reserve(MAX_DEVICES, 1).is_err());
    assert!(a.try_reserve(usize::MAX, 1).is_err());
    a.release(usize::MAX, 1);
    assert_eq!(a.used(99), 0);
    assert_eq!(a.device_index("not a uuid but a key"), Some(1));
    assert_eq!(a.device_index(""), None);
    let d = a.device_index(UUID_A).unwrap();
    a.try_reserve(d, 10).unwrap();
    a.release(d, 100); // clamped, warned once
    a.release(d, 100);
    assert_eq!(a.used(d), 0);
    assert_eq!(a.used_by_me(d), 0);
    // Table full: 16 devices, then None.
    for i in 0..MAX_DEVICES {
        let _ = a.device_index(&format!("GPU-{i:08x}-0000-0000-0000-000000000000"));
    }
    assert_eq!(
        a.device_index("GPU-ffffffff-0000-0000-0000-000000000000"),
        None
    );
}

#[test]
fn concurrent_reservations_never_exceed_the_limit() {
    let _serial = crate::slotfile::serial_test();
    let path = ledger_path("threads");
    const LIMIT: u64 = 100 * MIB;
    let a = Arc::new(Ledger::open(&path, &limited(LIMIT)).unwrap());
    // A second process-like participant (own OFD and slot) in the same test.
    let b = Arc::new(Ledger::open(&path, &limited(LIMIT)).unwrap());
    let d = a.device_index(UUID_A).unwrap();
    let over = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..8u64)
        .map(|t| {
            let l = if t % 2 == 0 { a.clone() } else { b.clone() };
            let over = over.clone();
            std::thread::spawn(move || {
                let mut held = Vec::new();
                for i in 0..5000u64 {
                    let size = ((t * 7919 + i * 104729) % 16 + 1) * MIB;
                    if l.try_reserve(d, size).is_ok() {
                        held.push(size);
                    }
                    if l.used(d) > LIMIT {
                        over.store(true, Ordering::Relaxed);
                    }
                    // Up to 8 held (up to 128 MiB): one thread alone reaches the limit, so the
                    // peak below does not depend on the threads overlapping on a busy machine.
                    if held.len() > 7 || (i % 3 == 0 && !held.is_empty()) {
                        l.release(d, held.remove(0));
                    }
                }
                for s in held {
                    l.release(d, s);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(!over.load(Ordering::Relaxed));
    assert_eq!(a.used(d), 0);
    assert_eq!(a.used_by_me(d), 0);
    assert_eq!(b.used_by_me(d), 0);
    assert!(a.snapshot().devices[0].peak <= LIMIT);
    assert!(a.snapshot().devices[0].peak > LIMIT / 2);
}

/// Runs `f` in a forked child that exits with 0 if it returns true (never returns into the harness).
fn fork_child(f: impl FnOnce() -> bool) -> libc::pid_t {
    // SAFETY: the child only runs `f` (ledger calls: open/fcntl/atomics) and then _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(false);
        // SAFETY: terminates the child without running the parent's atexit handlers or destructors.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    pid
}

fn wait(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    // SAFETY: `status` is a valid out-pointer.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    status
}

/// Retries until the reservation succeeds; returns how long it took.
fn reserve_within(l: &Ledger, d: usize, bytes: u64, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if l.try_reserve(d, bytes).is_ok() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn dead_child_is_reclaimed_exactly_once() {
    let _serial = crate::slotfile::serial_test();
    let path = ledger_path("exit");
    let parent = Ledger::open(&path, &limited(GIB + 256 * MIB)).unwrap();
    let other = Ledger::open(&path, &limited(0)).unwrap();
    let d = parent.device_index(UUID_A).unwrap();
    other.try_reserve(d, 0).unwrap(); // a second live participant
    parent.try_reserve(d, 256 * MIB).unwrap();
    let before = parent.snapshot().reclaims;

    // The child inherits `parent` (fork without exec): it must get a slot of its own.
    let child = fork_child(|| {
        parent.reattach_after_fork().is_ok()
            && parent.slot().is_none()
            && parent.try_reserve(d, GIB).is_ok()
            && parent.slot().is_some()
            && parent.used_by_me(d) == GIB
    });
    assert_eq!(wait(child), 0, "child failed");
    // The child _exited without releasing: its GiB is still counted...
    assert_eq!(parent.used(d), GIB + 256 * MIB);
    // ... until a refused reservation (at most one sweep per interval and process) reclaims it.
    // How soon is a benchmark figure (tests/shim_robustness.rs measures it through the real ABI),
    // not a bound a loaded machine could miss here.
    reserve_within(&parent, d, GIB, Duration::from_secs(30)).expect("not reclaimed");
    assert_eq!(parent.snapshot().reclaims, before + 1);
    assert_eq!(parent.used(d), GIB + 256 * MIB);
    assert_eq!(parent.used_by_me(d), GIB + 256 * MIB);
    // Further sweeps by anyone find nothing to reclaim (exactly once).
    assert_eq!(other.sweep(), 0);
    assert_eq!(parent.sweep(), 0);
    assert_eq!(parent.snapshot().reclaims, before + 1);
    // The parent's own slot survived the child's exit (the child closed its copy of the fd only).
    let snap = parent.snapshot();
    assert_eq!(snap.processes.len(), 2);
    assert!(snap.processes.iter().all(|p| p.alive));
}

#[test]
fn sigkilled_child_is_reclaimed() {
    let _serial = crate::slotfile::serial_test();
    let path = ledger_path("kill");
    let parent = Ledger::open(&path, &limited(GIB)).unwrap();
    let d = parent.device_index(UUID_A).unwrap();
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let child = fork_child(|| {
        // A fresh process joining on its own (as an unrelated program would).
        let mine = Ledger::open(&path, &limited(0)).unwrap();
        let ok = mine.try_reserve(d, GIB).is_ok();
        // SAFETY: writes one byte from a valid buffer to the pipe.
        unsafe { libc::write(fds[1], [ok as u8].as_ptr().cast(), 1) };
        std::thread::sleep(Duration::from_secs(30));
        false
    });
    let mut b = [0u8];
    // SAFETY: reads one byte into a valid buffer.
    assert_eq!(unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 1) }, 1);
    assert_eq!(b[0], 1, "child could not reserve");
    assert!(parent.try_reserve(d, GIB).is_err());
    let snap = Ledger::open_readonly(&path).unwrap().snapshot();
    assert!(snap
        .processes
        .iter()
        .any(|p| p.pid == child as u32 && p.alive && p.used == vec![(d, GIB)]));
    // SAFETY: kills the child we forked.
    unsafe { libc::kill(child, libc::SIGKILL) };
    wait(child);
    let snap = Ledger::open_readonly(&path).unwrap().snapshot();
    assert!(snap
        .processes
        .iter()
        .any(|p| p.pid == child as u32 && !p.alive));
    reserve_within(&parent, d, GIB, Duration::from_secs(30)).expect("not reclaimed");
    assert_eq!(parent.used(d), GIB);
    // SAFETY: closes the pipe we created.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
}

#[test]
fn a_dead_slot_claiming_more_than_it_can_hold_leaves_the_live_charges() {
    let _serial = crate::slotfile::serial_test();
    let path = ledger_path("impossible-slot");
    let live = Ledger::open(&path, &limited(GIB)).unwrap();
    let d = live.device_index(UUID_A).unwrap();
    live.try_reserve(d, 700 * MIB).unwrap();
    let child = fork_child(|| {
        let mine = Ledger::open(&path, &limited(0)).unwrap();
        let ok = mine.try_reserve(d, 100 * MIB).is_ok();
        std::mem::forget(mine); // dies holding it, as a killed process
        ok
    });
    assert_eq!(wait(child), 0, "child could not reserve");
    assert_eq!(live.used(d), 800 * MIB);
    let dead = live
        .snapshot()
        .processes
        .iter()
        .find(|p| p.pid == child as u32)
        .map(|p| p.slot)
        .expect("the dead child's slot");
    // Something else writes an impossible figure into the dead process's slot.
    live.layout().slots[dead].used[d].store(4 * GIB, Ordering::Release);
    assert_eq!(live.sweep(), 1);
    // Only what the dead slot could hold (the device's count beyond the live slot) went back.
    assert_eq!(live.used(d), 700 * MIB);
    assert!(live.try_reserve(d, 400 * MIB).is_err());
    live.try_reserve(d, 324 * MIB).unwrap();
}

#[test]
fn a_full_slot_table_refuses_only_the_processes_without_a_slot() {
    let _serial = crate::slotfile::serial_test();
    let path = ledger_path("full");
    let joined: Vec<Ledger> = (0..MAX_SLOTS)
        .map(|_| Ledger::open(&path, &limited(GIB)).unwrap())
        .collect();
    let d = joined[0].device_index(UUID_A).unwrap();
    for l in &joined {
        l.try_reserve(d, MIB).unwrap();
    }
    // One more joins (reading needs no slot), and its first reservation finds none.
    let late = Ledger::open(&path, &limited(GIB)).unwrap();
    assert_eq!(late.used(d), MAX_SLOTS as u64 * MIB);
    let refused = late.try_reserve(d, MIB).unwrap_err();
    assert!(refused.closed, "{refused:?}");
    assert_eq!(late.used(d), MAX_SLOTS as u64 * MIB);
    // The others go on; once one leaves, the late one gets its slot.
    joined[1].try_reserve(d, MIB).unwrap();
    drop(joined);
    late.try_reserve(d, MIB).unwrap();
    assert_eq!(late.used(d), MIB);
}

#[test]
fn drop_gives_usage_back() {
    let _serial = crate::slotfile::serial_test();
    let path = ledger_path("drop");
    let a = Ledger::open(&path, &limited(GIB)).unwrap();
    let d = a.device_index(UUID_A).unwrap();
    {
        let b = Ledger::open(&path, &limited(GIB)).unwrap();
        b.try_reserve(d, GIB).unwrap();
    }
    assert_eq!(a.used(d), 0);
    // b's slot is free again; a, which reserved nothing, never took one.
    assert!(a.snapshot().processes.is_empty());
}

#[test]
fn snapshot_and_readonly() {
    let _serial = crate::slotfile::serial_test();
    let path = ledger_path("snap");
    let a = Ledger::open(&path, &limited(2 * GIB)).unwrap();
    let d = a.device_index(UUID_A).unwrap();
    a.try_reserve(d, GIB).unwrap();
    // Refusals at the quota are counted per device.
    assert!(a.try_reserve(d, 2 * GIB).is_err());
    assert!(a.try_reserve(d, 2 * GIB).is_err());
    let r = Ledger::open_readonly(&path).unwrap();
    assert_eq!(r.slot(), None);
    assert!(r.try_reserve(d, 1).is_err());
    assert_eq!(r.device_index(UUID_B), None); // read-only never adds
    let s = r.snapshot();
    assert_eq!(s.tenant, "test");
    assert_eq!(s.creator_pid, std::process::id());
    assert_eq!(s.default_limit, UNLIMITED);
    assert_eq!(
        s.devices,
        vec![DeviceSnapshot {
            index: d,
            uuid: UUID_A.into(),
            limit: 2 * GIB,
            invalid_config: false,
            used: GIB,
            peak: GIB,
            denied: 2,
        }]
    );
    assert_eq!(
        s.processes,
        vec![ProcessSnapshot {
            slot: a.slot().unwrap(),
            pid: std::process::id(),
            alive: true,
            used: vec![(d, GIB)],
            overhead: vec![],
            reconciled: RECONCILED_UNKNOWN,
            node: None,
        }]
    );
}

/// The node's word reaches the process it was read for, and never the next holder of its slot.
#[test]
fn the_nodes_word_is_for_the_claim_it_was_read_for() {
    let _serial = crate::slotfile::serial_test();
    let path = ledger_path("node-word");
    let a = Ledger::open(&path, &limited(GIB)).unwrap();
    let d = a.device_index(UUID_A).unwrap();
    a.try_reserve(d, MIB).unwrap();
    let slot = a.slot().unwrap();
    assert_eq!(
        a.node_word_for_me(d),
        None,
        "nothing before the node writes"
    );
    let node = Ledger::open_existing(&path).unwrap();
    assert_eq!(node.find_device(UUID_A), Some(d));
    let (claim, used, _) = node.slot_charges(slot, d).unwrap();
    assert_eq!(used, MIB);
    let mut words = [NODE_NOT_LISTED; MAX_DEVICES];
    words[d] = 7 * MIB;
    node.publish_node_word(slot, &word(claim, 4242, words, 1234));
    node.publish_node_pass(1235);
    assert_eq!(a.node_word_for_me(d), Some((7 * MIB, 1234)));
    assert_eq!(a.node_stamp_for_me(), 1234);
    let s = Ledger::open_readonly(&path).unwrap().snapshot();
    assert_eq!(s.node_ms, Some(1235));
    assert_eq!(s.processes[0].node, Some((4242, 1234)));
    // A word for an earlier claim of the slot is nobody's.
    node.publish_node_word(slot, &word(claim.wrapping_sub(1), 1, words, 99));
    assert_eq!(a.node_word_for_me(d), None);
    node.publish_node_word(slot, &word(claim, 4242, words, 1300));
    drop(a);
    let b = Ledger::open(&path, &limited(GIB)).unwrap();
    b.try_reserve(d, MIB).unwrap();
    assert_eq!(b.slot(), Some(slot), "the slot is claimed again");
    assert_eq!(
        b.node_word_for_me(d),
        None,
        "the last holder's word is not the new one's"
    );
    assert!(node.slot_charges(slot, d).unwrap().0 > claim);
    // A lock byte names its slot.
    use crate::slotfile::SlotLayout;
    assert_eq!(slot_of_lock_offset(Layout::lock_offset(slot)), Some(slot));
    assert_eq!(slot_of_lock_offset(0), None);
    assert_eq!(slot_of_lock_offset(Layout::lock_offset(MAX_SLOTS)), None);
}

/// The allocation path's quick reservation stops at a word of the node this process has not
/// applied, reserving nothing, and leaves it to the checked path (which applies it first).
#[test]
fn the_quick_reservation_stops_at_a_word_of_the_node_not_applied() {
    let _serial = crate::slotfile::serial_test();
    let path = ledger_path("node-quick");
    let a = Ledger::open(&path, &limited(GIB)).unwrap();
    let d = a.device_index(UUID_A).unwrap();
    a.try_reserve(d, MIB).unwrap();
    let slot = a.slot().unwrap();
    // The quick path also steps aside when its periodic size check is due (every 50 ms): the
    // checked path (a reservation of nothing) does it, then the quick one is asked again.
    let quick = |seen: u64| {
        (0..200).any(|_| {
            a.try_reserve(d, 0).unwrap();
            a.reserve_quickly_unless_node(d, MIB, seen)
        })
    };
    assert!(quick(0), "no word of the node yet");
    let node = Ledger::open_existing(&path).unwrap();
    let (claim, used, _) = node.slot_charges(slot, d).unwrap();
    assert_eq!(used, 2 * MIB);
    let mut words = [NODE_NOT_LISTED; MAX_DEVICES];
    words[d] = 7 * MIB;
    node.publish_node_word(slot, &word(claim, 4242, words, 1234));
    for seen in [0, 1233] {
        a.try_reserve(d, 0).unwrap();
        assert!(
            !a.reserve_quickly_unless_node(d, MIB, seen),
            "a word stamped 1234, the last applied {seen}"
        );
    }
    assert_eq!(
        node.slot_charges(slot, d).unwrap().1,
        2 * MIB,
        "nothing reserved when the word is not applied"
    );
    assert!(quick(1234), "the word applied");
    assert_eq!(node.slot_charges(slot, d).unwrap().1, 3 * MIB);
}

#[test]
fn a_published_wait_is_seen_by_every_process_of_the_tenant() {
    let _serial = crate::slotfile::serial_test();
    let path = ledger_path("stall");
    let a = Ledger::open(&path, &limited(GIB)).unwrap();
    let b = Ledger::open(&path, &limited(GIB)).unwrap();
    assert_eq!(b.stall(), (0, 0, 0), "a new ledger publishes no wait");
    a.publish_stall(7, 100, 250);
    assert_eq!(b.stall(), (7, 100, 250));
    // A read-only view sees it and publishes nothing.
    let r = Ledger::open_readonly(&path).unwrap();
    assert_eq!(r.stall(), (7, 100, 250));
    r.publish_stall(9, 1, 2);
    assert_eq!(a.stall(), (7, 100, 250));
}

#[test]
fn group_shared_ledger() {
    let _serial = crate::slotfile::serial_test();
    let path = ledger_path("group");
    // SAFETY: no arguments.
    let gid = unsafe { libc::getegid() };
    let mut o = limited(GIB);
    o.group = Some(gid.to_string());
    let _a = Ledger::open(&path, &o).unwrap();
    let m = std::fs::metadata(&path).unwrap();
    assert_eq!(m.permissions().mode() & 0o777, 0o660);
    assert_eq!(m.gid(), gid);
    o.group = Some("no-such-group-gpuslice".into());
    let err = Ledger::open(&ledger_path("group2"), &o).err().unwrap();
    assert!(err.to_string().contains("GPUSLICE_LEDGER_GROUP"), "{err}");
}

/// Bytes of a valid, ready ledger (with no live slot).
fn valid_bytes() -> Vec<u8> {
    let path = ledger_path("template");
    drop(Ledger::open(&path, &limited(GIB)).unwrap());
    std::fs::read(&path).unwrap()
}

fn open_bytes(name: &str, bytes: &[u8]) -> (PathBuf, Result<Ledger, LedgerError>) {
    let path = ledger_path(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, bytes).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let r = Ledger::open(&path, &limited(GIB));
    (path, r)
}

#[test]
fn damaged_files_are_refused() {
    let _serial = crate::slotfile::serial_test();
    let good = valid_bytes();
    assert_eq!(good.len(), TOTAL_SIZE);
    assert!(open_bytes("good", &good).1.is_ok());

    let (p, r) = open_bytes("short", &good[..100]);
    let e = r.err().unwrap();
    assert!(
        matches!(&e, LedgerError::Truncated { size: 100, .. }),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "ledger {}: truncated (100 bytes, a ledger has {TOTAL_SIZE})",
            p.display()
        )
    );
    let (_, r) = open_bytes("empty", &[]);
    assert!(matches!(r, Err(LedgerError::Truncated { size: 0, .. })));
    let (_, r) = open_bytes("cut", &good[..TOTAL_SIZE - 8]);
    assert!(matches!(r, Err(LedgerError::Truncated { .. })));

    let mut b = good.clone();
    b[..8].copy_from_slice(b"NOTALEDG");
    let (p, r) = open_bytes("magic", &b);
    let e = r.err().unwrap();
    assert!(matches!(e, LedgerError::BadMagic { .. }));
    assert_eq!(
        e.to_string(),
        format!("ledger {}: not a gpuslice ledger (bad magic)", p.display())
    );

    let mut b = good.clone();
    b[8..12].copy_from_slice(&99u32.to_ne_bytes());
    let (_, r) = open_bytes("version", &b);
    assert!(matches!(
        r,
        Err(LedgerError::WrongVersion {
            found: 99,
            expected: LAYOUT_VERSION,
            ..
        })
    ));

    let mut b = good.clone();
    b.extend_from_slice(&[0; 4096]);
    let (_, r) = open_bytes("long", &b);
    let e = r.err().unwrap();
    assert!(
        matches!(&e, LedgerError::Corrupt { what, .. } if what.contains("its header declares")),
        "{e}"
    );

    let mut b = good.clone();
    b[16..24].copy_from_slice(&12345u64.to_ne_bytes());
    let (_, r) = open_bytes("declared", &b);
    assert!(
        matches!(r, Err(LedgerError::Corrupt { what, .. }) if what == format!("declared size is 12345, expected {TOTAL_SIZE}"))
    );

    let mut b = good.clone();
    b[28..32].copy_from_slice(&1000u32.to_ne_bytes());
    let (_, r) = open_bytes("count", &b);
    assert!(
        matches!(r, Err(LedgerError::Corrupt { what, .. }) if what == "device count is 1000, expected 16")
    );

    let mut b = good.clone();
    b[12..16].copy_from_slice(&0xdeadu32.to_ne_bytes());
    let (_, r) = open_bytes("state", &b);
    assert!(matches!(r, Err(LedgerError::Corrupt { what, .. }) if what == "state word 0x0000dead"));

    // A garbage slot state past the header.
    let mut b = good.clone();
    let at = shm::SLOT_TABLE_OFFSET + 7 * std::mem::size_of::<shm::Slot>();
    b[at..at + 4].copy_from_slice(&77u32.to_ne_bytes());
    let (_, r) = open_bytes("slot", &b);
    assert!(
        matches!(r, Err(LedgerError::Corrupt { what, .. }) if what == "process slot 7 has state 0x4d")
    );

    // Pure garbage, and garbage behind a valid header: errors or (used fields only) a usable
    // ledger, never a panic or a crash.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..20 {
        let mut b: Vec<u8> = (0..TOTAL_SIZE).map(|_| rnd() as u8).collect();
        if round % 2 == 1 {
            b[..shm::HEADER_SIZE].copy_from_slice(&good[..shm::HEADER_SIZE]);
        }
        let (_, r) = open_bytes("garbage", &b);
        if round % 2 == 0 {
            assert!(matches!(r, Err(LedgerError::BadMagic { .. })));
        } else if let Ok(l) = r {
            let _ = l.device_index(UUID_A).map(|d| l.try_reserve(d, 1));
            let _ = l.snapshot();
            l.sweep();
        }
    }
}

#[test]
fn symlink_is_refused() {
    let _serial = crate::slotfile::serial_test();
    let real = ledger_path("real");
    drop(Ledger::open(&real, &limited(GIB)).unwrap());
    let link = real.with_file_name("link.ledger");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let e = Ledger::open(&link, &limited(GIB)).err().unwrap();
    assert!(matches!(e, LedgerError::Symlink { .. }), "{e}");
    assert!(e.to_string().contains("symbolic link"));
    assert!(matches!(
        Ledger::open_readonly(&link),
        Err(LedgerError::Symlink { .. })
    ));
    // A dangling symlink is not followed to create a file either.
    let dangling = real.with_file_name("dangling.ledger");
    std::os::unix::fs::symlink(real.with_file_name("nowhere"), &dangling).unwrap();
    assert!(matches!(
        Ledger::open(&dangling, &limited(GIB)),
        Err(LedgerError::Symlink { .. })
    ));
    assert!(!real.with_file_name("nowhere").exists());
}

#[test]
fn half_created_file_times_out() {
    let _serial = crate::slotfile::serial_test();
    let mut b = valid_bytes();
    b[12..16].copy_from_slice(&shm::STATE_INITIALISING.to_ne_bytes());
    let start = Instant::now();
    let (p, r) = open_bytes("init", &b);
    let e = r.err().unwrap();
    assert!(start.elapsed() >= Duration::from_millis(900));
    assert!(matches!(e, LedgerError::NotReady { .. }), "{e}");
    assert!(e.to_string().starts_with(&format!(
        "ledger {}: still being initialised after",
        p.display()
    )));

    // One that becomes ready while we wait is accepted.
    let good = valid_bytes();
    let path = ledger_path("late");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, &b).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let p2 = path.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        use std::io::{Seek, Write};
        let mut f = std::fs::OpenOptions::new().write(true).open(&p2).unwrap();
        f.seek(std::io::SeekFrom::Start(12)).unwrap();
        f.write_all(&good[12..16]).unwrap();
    });
    assert!(Ledger::open(&path, &limited(GIB)).is_ok());
    t.join().unwrap();
}

#[test]
fn world_writable_is_refused() {
    let _serial = crate::slotfile::serial_test();
    let path = ledger_path("ww");
    drop(Ledger::open(&path, &limited(GIB)).unwrap());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert!(matches!(
        Ledger::open(&path, &limited(GIB)),
        Err(LedgerError::Insecure { .. })
    ));
}

#[test]
fn from_config() {
    let _serial = crate::slotfile::serial_test();
    let cfg = crate::config::load_from(
        &|k| match k {
            "GPUSLICE_MEMORY_LIMIT" => Some(format!("1GiB,0=2GiB,{UUID_B}=3GiB")),
            _ => None,
        },
        Path::new("/nonexistent"),
    );
    let o = LedgerOptions::from_config(&cfg, &[(0, UUID_A.to_string())]);
    assert_eq!(o.default_limit, Limit::Bytes(GIB));
    assert_eq!(
        o.devices,
        vec![
            (UUID_A.to_string(), Limit::Bytes(2 * GIB)),
            (UUID_B.to_string(), Limit::Bytes(3 * GIB))
        ]
    );
    assert_eq!(o.tenant, "default");
}

#[test]
fn per_device_keys_matching_no_visible_device_refuse() {
    let _serial = crate::slotfile::serial_test();
    let load = |v: &str| {
        let v = v.to_string();
        crate::config::load_from(
            &move |k| (k == "GPUSLICE_MEMORY_LIMIT").then(|| v.clone()),
            Path::new("/nonexistent"),
        )
    };
    let visible = [(0, UUID_A.to_string())];
    for typo in ["1=1GiB", "GPU-99999999-0000-1111-2222-333344445555=1GiB"] {
        let o = LedgerOptions::from_config(&load(typo), &visible);
        let Limit::Invalid(msg) = &o.devices[0].1 else {
            panic!("{typo}: {:?}", o.devices)
        };
        assert!(
            msg.contains("none of them is visible") && msg.contains(UUID_A),
            "{msg}"
        );
        assert!(matches!(o.default_limit, Limit::Invalid(_)));
    }
    // A list that names a visible device (and others) stays valid.
    let o = LedgerOptions::from_config(&load(&format!("1=1GiB,{UUID_A}=2GiB")), &visible);
    assert_eq!(o.devices[0], (UUID_A.to_string(), Limit::Bytes(2 * GIB)));
    // `,` is not "no limit".
    for v in [",", ",,", " , "] {
        let c = load(v);
        assert!(c.memory.poison.is_some(), "{v:?}");
        assert!(
            c.errors.iter().any(|e| e.contains("GPUSLICE_MEMORY_LIMIT")),
            "{v:?}"
        );
    }
}
