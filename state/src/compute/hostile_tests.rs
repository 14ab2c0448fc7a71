//! The decisions that keep a tenant from freezing the arbitration or keeping others out of a
//! device ledger: the lock's take-over (a live holder included, after its bound), slot entry when
//! every free slot's lock is held by someone not in it, and the repair of a ledger grown or shrunk.

use super::device::lock::{take_over, TakeOver};
use super::device::{now_ns, DeviceLedger};
use super::shm::*;
use crate::slotfile::{self, sys, SlotLayout};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::Ordering::*;
use std::time::{Duration, Instant};

fn scratch(tag: &str) -> PathBuf {
    super::scratch(&format!("schedsec-{tag}"))
}

const UUID: &str = "GPU-00000000-0000-0000-0000-000000000001";

#[test]
fn the_lock_is_taken_over_from_a_live_holder_after_its_bound_only() {
    let fresh = 1_000_000_000u64;
    let alive = |_| true;
    // A live holder, freshly stamped, within the bound: waited for.
    assert_eq!(take_over(Some(3), 1, fresh, fresh + 10, 0, alive), None);
    assert_eq!(
        take_over(Some(3), 1, fresh, fresh + 10, LOCK_HOLD_MAX_NS - 1, alive),
        None
    );
    // The same holder, alive and re-stamping, once we have waited the bound ourselves: taken.
    assert_eq!(
        take_over(Some(3), 1, fresh, fresh + 10, LOCK_HOLD_MAX_NS, alive),
        Some(TakeOver::Overstayed)
    );
    // Dead, naming nobody, naming us, stamped ahead of the clock, or stale: at once.
    assert_eq!(
        take_over(Some(3), 1, fresh, fresh + 10, 0, |_| false),
        Some(TakeOver::Bogus)
    );
    assert_eq!(
        take_over(None, 1, fresh, fresh + 10, 0, alive),
        Some(TakeOver::Bogus)
    );
    assert_eq!(
        take_over(Some(1), 1, fresh, fresh + 10, 0, alive),
        Some(TakeOver::Bogus)
    );
    assert_eq!(
        take_over(Some(3), 1, u64::MAX, fresh, 0, alive),
        Some(TakeOver::Future)
    );
    assert_eq!(
        take_over(Some(3), 1, fresh, fresh + 60_000_000, 0, alive),
        Some(TakeOver::Stale)
    );
}

/// A live process (another open file description holding its slot's lock) writes the lock word
/// and a fresh stamp every millisecond: `lock` still returns within its bound (with a wide margin
/// for a loaded machine), and counts the take-over.
#[test]
fn a_live_holder_restamping_the_lock_does_not_freeze_it() {
    let _serial = slotfile::serial_test();
    let dir = scratch("lock");
    let path = dir.join(format!("{UUID}.dev"));
    let ours = DeviceLedger::open(&path, UUID, true).unwrap();
    let theirs = DeviceLedger::open(&path, UUID, false).unwrap();
    let me = ours.claim_slot(0).unwrap();
    let them = theirs.claim_slot(1).unwrap();
    assert!(ours.slot_alive(them, Some(me)));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let h = std::thread::spawn({
        let stop = stop.clone();
        let path = path.clone();
        move || {
            let l = DeviceLedger::open(&path, UUID, false).unwrap();
            let hd = &l.layout().header;
            while !stop.load(Acquire) {
                hd.lock.store(Holder::of(them).word(), Release);
                hd.lock_ns.store(now_ns(), Release);
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    std::thread::sleep(Duration::from_millis(5));
    for _ in 0..5 {
        let t0 = Instant::now();
        drop(ours.lock(me));
        let took = t0.elapsed();
        assert!(
            took < Duration::from_millis(500),
            "lock took {took:?} beside a live holder re-stamping it"
        );
    }
    assert!(ours.layout().header.lock_takeovers.load(Acquire) >= 1);
    stop.store(true, Release);
    h.join().unwrap();
    drop(theirs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every free slot's lock byte held by another (POSIX, `lockf`-style) lock: no slot can be
/// claimed; the health says so from the kernel's evidence, and a tool still changes settings and
/// takes the lock (without a slot) at once.
#[test]
fn squatted_slot_locks_are_seen_and_do_not_stop_tools() {
    let _serial = slotfile::serial_test();
    let dir = scratch("squat");
    let path = dir.join(format!("{UUID}.dev"));
    let l = DeviceLedger::open(&path, UUID, true).unwrap();
    assert!(!l.health().unhealthy(), "{}", l.health().describe());
    let pid = squat_every_slot_byte(&path, &l);
    assert_eq!(l.claim_slot(0), None);
    let h = l.health();
    assert_eq!(h.squatted_slots, MAX_SLOTS);
    assert_eq!(h.free_slots, 0);
    assert!(h.unhealthy());
    assert!(h.describe().contains("locked by someone not in them"));
    let t0 = Instant::now();
    let added = l.with_admin_lock(|g| l.find_or_add_tenant(g, TenantId(5), "t", 30, 0, false));
    assert!(added.is_some());
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert_eq!(l.update_tenant("t", Some(40), None, None).unwrap().len(), 1);
    // SAFETY: our own child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
    assert!(l.claim_slot(0).is_some());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Slots claimed with a lock in the tenant's own file (its memory ledger, which no other tenant
/// can open): every slot byte of the device ledger locked by a squatter keeps nobody with such a
/// file out; a process of the tenant that died meanwhile (its byte still held by the squatter, so
/// alive to everyone else) is freed by the tenant's next sweep; once the squatter lets go, the
/// live process takes its byte back, and other tenants judge it alive by it again.
#[test]
fn a_squatter_keeps_nobody_with_a_tenant_lock_out() {
    let _serial = slotfile::serial_test();
    let dir = scratch("tenantlock");
    let path = dir.join(format!("{UUID}.dev"));
    let own = dir.join("t.ledger");
    std::fs::write(&own, b"").unwrap();
    let l = DeviceLedger::open(&path, UUID, true).unwrap();
    let pid = squat_every_slot_byte(&path, &l);
    assert_eq!(l.claim_slot(0), None, "the old claim is kept out");
    // Two processes of one tenant (two handles: two open file descriptions).
    let first = DeviceLedger::open(&path, UUID, false).unwrap();
    let second = DeviceLedger::open(&path, UUID, false).unwrap();
    first.use_tenant_locks(&own, TenantId(9)).unwrap();
    second.use_tenant_locks(&own, TenantId(9)).unwrap();
    let a = first.claim_slot(0).expect("kept out by the squatter");
    let b = second.claim_slot(0).expect("kept out by the squatter");
    assert_ne!(a, b);
    assert!(!second.holds_shared_slot_lock());
    let tenant = {
        let g = second.lock(b);
        second.find_or_add_tenant(&g, TenantId(9), "t", 30, 0, false)
    }
    .unwrap();
    for s in [a, b] {
        l.layout().slots[s].tenant.store(tenant as u32, Release);
    }
    assert!(l.health().unhealthy(), "the squat is still reported");
    // The first process dies: its byte in the device ledger is the squatter's, so it looks alive
    // to everyone else; its heartbeat stops.
    drop(first);
    l.layout().slots[a].beat_ns.store(0, Release);
    l.sweep(None);
    assert_eq!(l.layout().slots[a].state.load(Acquire), SLOT_ACTIVE);
    second.sweep(Some(b));
    assert_eq!(
        l.layout().slots[a].state.load(Acquire),
        SLOT_FREE,
        "the tenant's own sweep frees its dead process's slot"
    );
    assert_eq!(l.layout().slots[b].state.load(Acquire), SLOT_ACTIVE);
    // SAFETY: our own child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
    second.sweep(Some(b));
    assert!(second.holds_shared_slot_lock());
    assert!(l.slot_alive(b, None), "other tenants see the live slot");
    l.sweep(None);
    assert_eq!(l.layout().slots[b].state.load(Acquire), SLOT_ACTIVE);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every slot marked in use by a squatter (state words ACTIVE, every byte locked) keeps no node
/// tenant below its limit out: a process takes back a slot of the group over its limit, then one
/// labelled with its own tenant that none of its processes holds; a tenant at its limit (the
/// policy listing many tenants) is refused.
#[test]
fn a_squatter_filling_every_slot_keeps_no_tenant_below_its_limit_out() {
    use super::device::limit::slot_limit;
    use super::policy::{equal_shares, path_for_ledger, render};
    let _serial = slotfile::serial_test();
    let dir = scratch("slotlimit");
    let path = dir.join(format!("{UUID}.dev"));
    let own = dir.join("t.ledger");
    std::fs::write(&own, b"").unwrap();
    let policy = |n: u128| {
        let tmp = dir.join("policy.tmp");
        std::fs::write(&tmp, render(&equal_shares(n))).unwrap();
        std::fs::rename(&tmp, path_for_ledger(&path)).unwrap();
    };
    policy(3);
    let l = DeviceLedger::open(&path, UUID, true).unwrap();
    let (squatter, victim) = l.with_admin_lock(|g| {
        (
            l.find_or_add_tenant(g, TenantId(1), "t1", 10, 0, false)
                .unwrap(),
            l.find_or_add_tenant(g, TenantId(2), "t2", 10, 0, false)
                .unwrap(),
        )
    });
    let pid = squat_every_slot_byte(&path, &l);
    let label_all = |t: usize| {
        for s in &l.layout().slots {
            if s.state.load(Acquire) != SLOT_ACTIVE || s.tenant.load(Acquire) as usize != victim {
                s.tenant.store(t as u32, Release);
                s.state.store(SLOT_ACTIVE, Release);
            }
        }
    };
    label_all(squatter);
    let join = || {
        let h = DeviceLedger::open(&path, UUID, false).unwrap();
        h.use_tenant_locks(&own, TenantId(2)).unwrap();
        h
    };
    let first = join();
    let a = first
        .claim_slot(victim)
        .expect("a full ledger kept the victim out");
    // One of the squatting group's, at random (`limit::decide`), now under the victim's label.
    assert_eq!(l.layout().slots[a].tenant.load(Acquire) as usize, victim);
    assert_eq!(l.health().slot_reclaims, 1);
    // The highest slots but `a` and those taken since: where claims that take back a slot of
    // the victim's own label go.
    let highest_but = |taken: &[usize]| (0..MAX_SLOTS).rev().find(|i| !taken.contains(i)).unwrap();
    // Every other slot labelled with the victim's own tenant: none holds its tenant lock.
    label_all(victim);
    let second = join();
    let b = second
        .claim_slot(victim)
        .expect("slots under the victim's label kept it out");
    assert_eq!(b, highest_but(&[a]));
    assert_eq!(l.health().slot_reclaims, 2);
    // The policy lists 63 tenants: 4 slots each. The victim's four live processes are its
    // limit, whatever the other slots say.
    policy(63);
    assert_eq!(slot_limit(63), 4);
    let more: Vec<DeviceLedger> = (0..2).map(|_| join()).collect();
    let mut taken = vec![a, b];
    for h in &more {
        let want = highest_but(&taken);
        assert_eq!(h.claim_slot(victim), Some(want));
        taken.push(want);
    }
    let third = join();
    assert_eq!(third.claim_slot(victim), None, "past the tenant's limit");
    drop(second);
    let fourth = join();
    assert_eq!(
        fourth.claim_slot(victim),
        Some(b),
        "the slot of the victim's dead process, under its label"
    );
    // SAFETY: our own child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
    drop((first, more, third, fourth));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A child forked without exec does not keep its dead parent's tenant lock: with every device-ledger
/// slot byte squatted (so only the tenant lock says whether the slot lives), the tenant's next
/// sweep frees the slot of a parent that died while its fork child still runs.
#[test]
fn a_fork_child_does_not_keep_its_parents_tenant_lock() {
    let _serial = slotfile::serial_test();
    let dir = scratch("tlfork");
    let path = dir.join(format!("{UUID}.dev"));
    let own = dir.join("t.ledger");
    std::fs::write(&own, b"").unwrap();
    let l = DeviceLedger::open(&path, UUID, true).unwrap();
    let squatter = squat_every_slot_byte(&path, &l);
    let mut ready = [0; 2];
    // SAFETY: `ready` has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe(ready.as_mut_ptr()) }, 0);
    // SAFETY: fork in a test holding the serial guard; the child uses the ledger, forks a
    // grandchild that writes a byte and sleeps, then _exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let ok = (|| {
            let mine = DeviceLedger::open(&path, UUID, false).ok()?;
            mine.use_tenant_locks(&own, TenantId(11)).ok()?;
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
    assert!(slot >= 0, "the child could not claim a slot");
    let slot = slot as usize;
    let mut b = [0u8];
    // SAFETY: reads one byte into a valid buffer, then closes the pipe we created.
    unsafe {
        assert_eq!(libc::read(ready[0], b.as_mut_ptr().cast(), 1), 1);
        libc::close(ready[0]);
        libc::close(ready[1]);
    }
    let next = DeviceLedger::open(&path, UUID, false).unwrap();
    next.use_tenant_locks(&own, TenantId(11)).unwrap();
    let mine = next.claim_slot(0).unwrap();
    let tenant = {
        let g = next.lock(mine);
        next.find_or_add_tenant(&g, TenantId(11), "t", 30, 0, false)
    }
    .unwrap();
    l.layout().slots[slot].tenant.store(tenant as u32, Release);
    l.layout().slots[slot].beat_ns.store(0, Release);
    next.sweep(Some(mine));
    assert_eq!(
        l.layout().slots[slot].state.load(Acquire),
        SLOT_FREE,
        "a fork child still holds its dead parent's tenant lock"
    );
    // SAFETY: our own child.
    unsafe {
        libc::kill(squatter, libc::SIGKILL);
        libc::waitpid(squatter, std::ptr::null_mut(), 0);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A ledger grown by a byte or shrunk while nobody uses it: the next process to open it repairs
/// it in place (it used to be refused, leaving every later process unscheduled); one grown while
/// in use is cut back by the user's sweep.
#[test]
fn a_ledger_grown_or_shrunk_is_repaired_by_the_next_user() {
    let _serial = slotfile::serial_test();
    let dir = scratch("size");
    let path = dir.join(format!("{UUID}.dev"));
    let total = TOTAL_SIZE as u64;
    drop(DeviceLedger::open(&path, UUID, true).unwrap());
    for size in [total + 1, total + 4096, total / 2, 100, 0] {
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(size).unwrap();
        drop(f);
        let l = DeviceLedger::open(&path, UUID, false)
            .unwrap_or_else(|e| panic!("a ledger of {size} bytes refused: {e}"));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), total, "{size}");
        assert!(l.layout().header.size_repairs.load(Acquire) >= 1);
        assert_ne!(l.layout().header.epoch.load(Acquire), 0);
        assert_eq!(l.uuid(), UUID);
        assert!(l.claim_slot(0).is_some());
        assert!(!l.health().unhealthy(), "{}", l.health().describe());
    }
    // Grown while in use: joiners refuse nothing, and the sweep cuts it back.
    let l = DeviceLedger::open(&path, UUID, false).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(total + 1).unwrap();
    drop(DeviceLedger::open(&path, UUID, false).unwrap());
    f.set_len(total + 1).unwrap();
    l.sweep(None);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), total);
    // Another kind of file is never touched.
    std::fs::write(&path, b"not a ledger at all, and shorter").unwrap();
    assert!(DeviceLedger::open(&path, UUID, false).is_err());
    assert_eq!(
        std::fs::read(&path).unwrap(),
        b"not a ledger at all, and shorter"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Demand is said with a lock only its process releases: another open of the file (a tenant)
/// sees it, cannot clear it (its unlock of someone else's OFD lock does nothing), and a demand
/// byte it locks itself only makes that slot look wanting (the safe side: contention).
#[test]
fn demand_locks_are_seen_and_cannot_be_cleared_by_another() {
    let _serial = slotfile::serial_test();
    let dir = scratch("demand");
    let path = dir.join(format!("{UUID}.dev"));
    let ours = DeviceLedger::open(&path, UUID, true).unwrap();
    let theirs = DeviceLedger::open(&path, UUID, true).unwrap();
    let slot = ours.claim_slot(0).unwrap();
    assert!(!theirs.slot_wants(slot), "nobody said anything yet");
    ours.set_demand(slot, true);
    assert!(theirs.slot_wants(slot));
    // Another descriptor unlocking the byte (what a tenant could do) leaves our lock.
    let at = DeviceLedger::demand_offset(slot);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    sys::unlock(f.as_raw_fd(), at);
    assert!(theirs.slot_wants(slot), "cleared by another descriptor");
    ours.set_demand(slot, false);
    assert!(!theirs.slot_wants(slot));
    // A tenant locking the byte itself: the slot looks wanting (everyone contended), nothing worse.
    assert!(matches!(sys::try_lock(f.as_raw_fd(), at), Ok(true)));
    assert!(theirs.slot_wants(slot));
    drop(f);
    assert!(!theirs.slot_wants(slot));
    drop((ours, theirs));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The per-tenant counters' file: each tenant entry counts for the tenant that holds it (a recycled
/// entry starts from zero), a count saturates at a hostile word instead of wrapping, a readonly
/// reader sees what was counted, a ledger without the file counts nothing and says `None`, and a
/// file of the wrong size is repaired by its next joiner.
#[test]
fn per_tenant_counts_follow_their_tenant_and_saturate() {
    let _serial = slotfile::serial_test();
    let dir = scratch("tally");
    let path = dir.join(format!("{UUID}.dev"));
    let tally = super::device::tally_path_for(&path);
    let l = DeviceLedger::open(&path, UUID, true).unwrap();
    assert!(tally.is_file(), "created with the ledger");
    let slot = l.claim_slot(0).unwrap();
    let (a, b) = {
        let g = l.lock(slot);
        (
            l.find_or_add_tenant(&g, TenantId(1), "a", 50, 0, false)
                .unwrap(),
            l.find_or_add_tenant(&g, TenantId(2), "b", 50, 0, false)
                .unwrap(),
        )
    };
    l.count(a, false);
    l.count(a, false);
    l.count(b, true);
    let seen = |i| DeviceLedger::open_readonly(&path).unwrap().tenant_counts(i);
    assert_eq!(seen(a), Some((2, 0)));
    assert_eq!(seen(b), Some((0, 1)));
    // A hostile word: the count stays at the top instead of wrapping to zero.
    let at = std::mem::size_of::<slotfile::Prefix>() + a * std::mem::size_of::<TallyEntry>() + 16;
    std::os::unix::fs::FileExt::write_all_at(
        &std::fs::OpenOptions::new()
            .write(true)
            .open(&tally)
            .unwrap(),
        &u64::MAX.to_ne_bytes(),
        at as u64,
    )
    .unwrap();
    l.count(a, false);
    assert_eq!(seen(a), Some((u64::MAX, 0)));
    // Entry `a` recycled for another tenant: its counts start from zero.
    l.rewrite_tenant(a, TenantId(3), "c", &l.view(a));
    assert_eq!(seen(a), Some((0, 0)));
    l.count(a, true);
    assert_eq!(seen(a), Some((0, 1)));
    // Grown by somebody: the next joiner sets its size back (and counts on).
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&tally)
        .unwrap();
    f.set_len(std::mem::size_of::<Tally>() as u64 + 4096)
        .unwrap();
    drop(DeviceLedger::open(&path, UUID, false).unwrap());
    assert_eq!(
        std::fs::metadata(&tally).unwrap().len(),
        std::mem::size_of::<Tally>() as u64
    );
    assert_eq!(seen(a), Some((0, 1)));
    // Without the file (an older node, a container not given it): nothing counted, `None` read.
    drop(l);
    std::fs::remove_file(&tally).unwrap();
    let l = DeviceLedger::open(&path, UUID, false).unwrap();
    assert!(!tally.exists(), "a joiner that may not create does not");
    l.count(b, false);
    assert_eq!(l.tenant_counts(b), None);
    assert_eq!(seen(b), None);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A child process that takes POSIX locks over every slot byte of the ledger at `path` (OFD and
/// POSIX locks conflict), as `lockf` by a tenant does, and keeps them until killed; returns once
/// they are held (seen through `l`).
fn squat_every_slot_byte(path: &std::path::Path, l: &DeviceLedger) -> libc::pid_t {
    let start = Layout::lock_offset(0);
    // The child opens the file itself: a descriptor inherited across fork may be one the fork
    // guard swaps for /dev/null in the child (its number and file match a slot descriptor some
    // ledger of this test process registered), and the child would then lock nothing.
    let cpath = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: fork in a test that holds the serial guard; the child only calls prctl, open, fcntl,
    // usleep and pause (async-signal-safe).
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: prctl with constant arguments; an all-zero flock is valid; open of a
        // NUL-terminated path; F_SETLK on its fd.
        unsafe {
            // Dies with the test process even when the test fails before killing it: a leaked
            // child would hold the test's output pipe open and hang whoever reads it.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            let fd = libc::open(cpath.as_ptr(), libc::O_RDWR);
            let mut fl: libc::flock = std::mem::zeroed();
            fl.l_type = libc::F_WRLCK as libc::c_short;
            fl.l_whence = libc::SEEK_SET as libc::c_short;
            fl.l_start = start as libc::off_t;
            fl.l_len = MAX_SLOTS as libc::off_t;
            // Retried until it holds: a lock of the parent's met in passing fails one attempt
            // with EAGAIN; the parent waits for the lock, bounded.
            while fd >= 0 && libc::fcntl(fd, libc::F_SETLK, &fl) != 0 {
                libc::usleep(1000);
            }
            loop {
                libc::pause();
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(
        sys::is_locked(l.lock_fd_for_tests(), start + MAX_SLOTS as u64 - 1),
        Ok(true)
    ) {
        assert!(Instant::now() < deadline, "the child never locked");
        std::thread::sleep(Duration::from_millis(5));
    }
    pid
}
