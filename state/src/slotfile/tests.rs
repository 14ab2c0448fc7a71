use super::*;
use std::sync::atomic::AtomicUsize;

/// A small layout: the prefix, a counter and 8 slots.
#[repr(C)]
struct Tiny {
    prefix: Prefix,
    counter: AtomicU64,
    slots: [AtomicU32; 8],
    pad: [AtomicU64; 1020],
}

// SAFETY: repr(C), only atomics, starts with a Prefix, 8-byte aligned.
unsafe impl SlotLayout for Tiny {
    const MAGIC: [u8; 8] = *b"TESTTINY";
    const VERSION: u32 = 7;
    const HEADER_BYTES: usize = 32;
}

fn dir(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "gpuslice-slotfile-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    d
}

const PRIVATE: CreateOptions = CreateOptions {
    mode: 0o600,
    gid: None,
    shared_dir: false,
};

fn open(path: &Path) -> Result<Writable<Tiny>, Error> {
    Writable::<Tiny>::open(path, Some(PRIVATE), |l| {
        l.counter.store(5, Ordering::Relaxed)
    })
}

#[test]
fn create_then_join_sees_the_initialised_file() {
    let _serial = crate::slotfile::serial_test();
    let path = dir("create").join("f");
    let a = open(&path).unwrap();
    assert!(a.created());
    let b = open(&path).unwrap();
    assert!(!b.created());
    assert_eq!(b.layout().counter.load(Ordering::Relaxed), 5);
    a.layout().counter.store(9, Ordering::Relaxed);
    assert_eq!(b.layout().counter.load(Ordering::Relaxed), 9);
    // Nothing but the file is left in the directory.
    let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("f")]);
}

#[test]
fn long_names_get_a_temporary_name_that_fits() {
    let _serial = crate::slotfile::serial_test();
    // 255 bytes: the longest file name; the temporary name must not be longer.
    let path = dir("long").join("x".repeat(255));
    assert!(open(&path).is_ok());
}

#[test]
fn read_only_handle_holds_a_private_copy() {
    let _serial = crate::slotfile::serial_test();
    let path = dir("ro").join("f");
    let w = open(&path).unwrap();
    let r = ReadOnly::<Tiny>::open(&path).unwrap();
    assert_eq!(r.layout().counter.load(Ordering::Relaxed), 5);
    // A store into the read-only handle's copy reaches nothing shared.
    r.layout().counter.store(77, Ordering::Relaxed);
    assert_eq!(w.layout().counter.load(Ordering::Relaxed), 5);
    assert_eq!(
        ReadOnly::<Tiny>::open(&path)
            .unwrap()
            .layout()
            .counter
            .load(Ordering::Relaxed),
        5
    );
}

#[test]
fn special_files_are_refused_without_blocking() {
    let _serial = crate::slotfile::serial_test();
    let d = dir("special");
    std::fs::create_dir_all(&d).unwrap();
    let fifo = d.join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for p in [fifo.as_path(), d.as_path(), Path::new("/dev/null")] {
        let e = ReadOnly::<Tiny>::open(p).err().unwrap();
        assert!(matches!(e, Error::Insecure { .. }), "{p:?}: {e}");
        let e = open(p).err().unwrap();
        assert!(
            matches!(e, Error::Insecure { .. } | Error::Io { .. }),
            "{p:?}: {e}"
        );
    }
    let e = ReadOnly::<Tiny>::open(&fifo).err().unwrap().to_string();
    assert!(e.contains("a FIFO, not a regular file"), "{e}");
}

#[test]
fn joiner_waits_for_initialisation_then_succeeds() {
    let _serial = crate::slotfile::serial_test();
    let path = dir("init").join("f");
    drop(open(&path).unwrap());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[STATE_AT..STATE_AT + 4].copy_from_slice(&STATE_INITIALISING.to_ne_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let p2 = path.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        // Published in place, as a creator does (never truncated: the joiner must not see a
        // short file).
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&p2).unwrap();
        f.write_all_at(&STATE_READY.to_ne_bytes(), STATE_AT as u64)
            .unwrap();
    });
    let start = Instant::now();
    let j = open(&path).unwrap();
    assert!(start.elapsed() >= Duration::from_millis(150));
    assert_eq!(j.layout().counter.load(Ordering::Relaxed), 5);
    t.join().unwrap();
}

/// Forks; the child runs `f` and exits with its result (0 = true).
fn in_child(f: impl FnOnce() -> bool) -> i32 {
    // SAFETY: the child only runs `f` and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(false);
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    status
}

#[test]
fn truncation_while_mapped_does_not_kill_the_mapper() {
    let _serial = crate::slotfile::serial_test();
    for cut in [0u64, size_of::<Tiny>() as u64 / 2, 100] {
        let path = dir("cut").join("f");
        let w = open(&path).unwrap();
        let far = &w.layout().pad[1000];
        far.store(3, Ordering::Relaxed);
        // Another process (here, another description) shrinks the file.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(cut)
            .unwrap();
        // Run the accesses in a child: if they faulted fatally, the child dies of SIGBUS and the
        // status says so (the test process itself would die otherwise).
        // A page that still begins inside the file does not fault.
        let page = (far as *const AtomicU64 as usize - w.layout() as *const Tiny as usize) & !4095;
        let faults = page as u64 >= cut;
        let status = in_child(|| {
            far.store(4, Ordering::Relaxed);
            w.layout().counter.fetch_add(1, Ordering::Relaxed);
            far.load(Ordering::Relaxed) == 4 && w.damaged() == faults
        });
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "cut to {cut}: child status {status:#x}"
        );
        if !faults {
            continue;
        }
        // The child gave the file its size back.
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            size_of::<Tiny>() as u64
        );
        // Cut again: a slow path notices with fstat and repairs before touching anything.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(cut)
            .unwrap();
        assert!(!w.check_size());
        far.store(5, Ordering::Relaxed);
        assert!(w.damaged());
    }
}

/// What a hot path sees without a system call (`looks_sound`): a cut that spares the pages in use
/// (the read of the last page faults, and is repaired), and a header another process marked
/// DAMAGED with the file's size intact.
#[test]
fn looks_sound_sees_a_cut_sparing_the_pages_in_use_and_a_header_marked_damaged() {
    use std::os::unix::fs::FileExt;
    let _serial = crate::slotfile::serial_test();
    let path = dir("sound").join("f");
    let w = open(&path).unwrap();
    assert!(w.looks_sound());
    // Cut to the first page: the header and the counter are still in the file, the last page not.
    let cut = 4096u64;
    assert!((size_of::<Tiny>() as u64 - 1) & !4095 >= cut);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(cut)
        .unwrap();
    w.layout().counter.store(6, Ordering::Relaxed);
    // In a child, as a fatal fault would kill the process that reads.
    let status = in_child(|| !w.looks_sound() && w.damaged());
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status:#x}"
    );
    // The child's repair gave the file its size back and marked it: seen here in the header.
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        size_of::<Tiny>() as u64
    );
    assert!(!w.damaged() && !w.looks_sound());

    // The header alone marked, by another process (here, a write through another description).
    let path = dir("marked").join("f");
    let w = open(&path).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .write_all_at(&STATE_DAMAGED.to_ne_bytes(), STATE_AT as u64)
        .unwrap();
    assert!(!w.damaged() && !w.looks_sound());
}

#[test]
fn claimed_slot_is_not_held_by_a_fork_child() {
    let _serial = crate::slotfile::serial_test();
    let path = dir("fork").join("f");
    let w = open(&path).unwrap();
    let fd = w.lock_fd().unwrap();
    let l = w.layout();
    let claim = |fd: RawFd| {
        claim_slot::<Tiny>(
            fd,
            8,
            |i| l.slots[i].load(Ordering::Acquire) == 0,
            |i| {
                l.slots[i]
                    .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            },
        )
    };
    let other = w.lock_fd().unwrap();
    // The grandchild says when it runs: the fork handler has run by then (glibc runs it before
    // fork returns in the child), and until then the child's copy of the descriptor still exists.
    let mut ready = [0; 2];
    // SAFETY: `ready` has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe(ready.as_mut_ptr()) }, 0);
    // A process claims a slot, forks a child that outlives it, and dies: its slot must be dead.
    let status = in_child(|| {
        let mine = w.lock_fd().unwrap();
        let Some(slot) = claim(mine.as_raw_fd()) else {
            return false;
        };
        // SAFETY: the grandchild only writes a byte, sleeps, then _exits.
        if unsafe { libc::fork() } == 0 {
            // SAFETY: writes one byte from a valid buffer to the pipe.
            unsafe { libc::write(ready[1], [1u8].as_ptr().cast(), 1) };
            std::thread::sleep(Duration::from_secs(3));
            // SAFETY: ends the grandchild.
            unsafe { libc::_exit(0) };
        }
        slot == 0
    });
    assert_eq!(status, 0);
    let mut b = [0u8];
    // SAFETY: reads one byte into a valid buffer, then closes the pipe we created.
    unsafe {
        assert_eq!(libc::read(ready[0], b.as_mut_ptr().cast(), 1), 1);
        libc::close(ready[0]);
        libc::close(ready[1]);
    }
    // The grandchild is still alive, yet the slot's lock is free (its copy of the descriptor was
    // pointed at /dev/null at fork).
    assert!(!slot_alive::<Tiny>(other.as_raw_fd(), 0));
    assert_eq!(
        take_dead_slot::<Tiny, _>(other.as_raw_fd(), 0, || l.slots[0]
            .store(0, Ordering::Release)),
        Some(())
    );
    // Our own claim holds.
    let mine = claim(fd.as_raw_fd()).unwrap();
    assert!(slot_alive::<Tiny>(other.as_raw_fd(), mine));
}

/// Every order in which two processes can interleave the claim protocol's steps (lock, check,
/// mark) and a third one's reclaim of a dead holder: no slot ever ends up with two holders, and a
/// reclaimed slot is free. The steps are run for real (OFD locks on a real file) in each order.
#[test]
fn claim_and_reclaim_interleavings() {
    let _serial = crate::slotfile::serial_test();
    #[derive(Clone, Copy, Debug)]
    enum Step {
        Lock,
        Mark,
    }
    let path = dir("interleave").join("f");
    let w = open(&path).unwrap();
    let l = w.layout();
    let steps = [Step::Lock, Step::Mark];
    // All interleavings of two 2-step sequences (6), each followed by a reclaim attempt.
    let orders: Vec<Vec<usize>> = vec![
        vec![0, 0, 1, 1],
        vec![0, 1, 0, 1],
        vec![0, 1, 1, 0],
        vec![1, 0, 0, 1],
        vec![1, 0, 1, 0],
        vec![1, 1, 0, 0],
    ];
    for order in orders {
        l.slots[0].store(0, Ordering::Release);
        let fds = [w.lock_fd().unwrap(), w.lock_fd().unwrap()];
        let mut pc = [0usize; 2];
        let mut locked = [false; 2];
        let mut holder = [false; 2];
        for &who in &order {
            let fd = fds[who].as_raw_fd();
            match steps[pc[who]] {
                Step::Lock => {
                    locked[who] = l.slots[0].load(Ordering::Acquire) == 0
                        && matches!(sys::try_lock(fd, Tiny::lock_offset(0)), Ok(true));
                }
                Step::Mark => {
                    holder[who] = locked[who]
                        && l.slots[0]
                            .compare_exchange(
                                0,
                                1 + who as u32,
                                Ordering::AcqRel,
                                Ordering::Acquire,
                            )
                            .is_ok();
                    if locked[who] && !holder[who] {
                        sys::unlock(fd, Tiny::lock_offset(0));
                    }
                }
            }
            pc[who] += 1;
        }
        assert!(!(holder[0] && holder[1]), "{order:?}: two holders");
        assert!(
            holder[0] || holder[1],
            "{order:?}: nobody got the free slot"
        );
        // A third party cannot reclaim a live holder's slot ...
        let cleaner = w.lock_fd().unwrap();
        assert_eq!(
            take_dead_slot::<Tiny, _>(cleaner.as_raw_fd(), 0, || ()),
            None
        );
        // ... and can once the holder is gone (its description closed), exactly once.
        let [a, b] = fds;
        drop(a);
        drop(b);
        assert_eq!(
            take_dead_slot::<Tiny, _>(cleaner.as_raw_fd(), 0, || l.slots[0]
                .store(0, Ordering::Release)),
            Some(())
        );
        assert_eq!(l.slots[0].load(Ordering::Acquire), 0);
    }
}

/// A full filesystem at creation: a clear "no space" error naming the path, nothing left behind,
/// no signal. Needs root (mounts a 1 MiB tmpfs); skipped otherwise.
#[test]
fn full_filesystem_at_creation_is_a_clear_error() {
    let _serial = crate::slotfile::serial_test();
    // SAFETY: no arguments.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to mount a tmpfs");
        return;
    }
    let d = dir("full");
    std::fs::create_dir_all(&d).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&d)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("skipped: mount -t tmpfs failed");
        return;
    }
    // Fill it.
    let _ = std::fs::write(d.join("filler"), vec![1u8; 64 * 1024]);
    let path = d.join("f");
    let e = open(&path).err().unwrap();
    let leftovers: Vec<_> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let _ = std::process::Command::new("umount").arg(&d).status();
    assert!(matches!(e, Error::NoSpace { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&path.display().to_string()) && msg.contains("no space"),
        "{msg}"
    );
    assert_eq!(leftovers, vec![std::ffi::OsString::from("filler")]);
}

#[test]
fn the_coarse_clock_counts_milliseconds_from_boot_and_never_goes_back() {
    let first = sys::coarse_ms();
    // Counted from boot, not from this process's start (the first size check of a ledger is then
    // not put off for SIZE_CHECK_MS): a machine that built this test has been up for minutes.
    assert!(first > 10_000, "{first} ms: not counted from boot");
    let mut last = first;
    for _ in 0..1000 {
        let now = sys::coarse_ms();
        assert!(now >= last, "went back from {last} to {now}");
        last = now;
    }
    std::thread::sleep(std::time::Duration::from_millis(30));
    assert!(sys::coarse_ms() > first, "a 30 ms sleep did not advance it");
}
