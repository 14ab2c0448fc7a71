//! Unit tests of the shared state: each test uses its own state file under /dev/shm.

use super::*;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct TempState(PathBuf);
impl TempState {
    fn new(name: &str) -> TempState {
        static N: AtomicUsize = AtomicUsize::new(0);
        TempState(PathBuf::from(format!(
            "/dev/shm/simgpu-unit-{}-{}-{name}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )))
    }
    fn open(&self, cfg: &Config) -> Shared {
        Shared::open(&self.0, cfg).unwrap()
    }
}
impl Drop for TempState {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn cfg(memory: u64) -> Config {
    Config {
        memory,
        devices: 2,
        ..Config::default()
    }
}

/// Forks; the child runs `f` and `_exit`s with its result.
fn fork(f: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: the child only runs `f` (simgpu calls, which are fork-safe: no lock held across fork is
    // needed by them) and then `_exit`s without returning into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(101);
        // SAFETY: terminates the child immediately, without running the parent's atexit handlers.
        unsafe { libc::_exit(code) };
    }
    pid
}

fn wait(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    // SAFETY: `pid` is our child; `status` is a valid out-pointer.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    status
}

#[test]
fn reserve_never_exceeds_capacity_under_threads() {
    let t = TempState::new("reserve");
    let s = Arc::new(t.open(&cfg(1000)));
    let max_seen = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (s, max_seen) = (s.clone(), max_seen.clone());
            std::thread::spawn(move || {
                let mut held = 0;
                for i in 0..20_000u64 {
                    let n = 1 + i % 97;
                    if s.try_reserve(0, n) {
                        held += n;
                    }
                    let used = s.device_used(0);
                    assert!(used <= 1000, "used {used} > capacity");
                    max_seen.fetch_max(used as usize, Ordering::Relaxed);
                    if i % 3 == 0 && held > 0 {
                        s.release(0, held);
                        held = 0;
                    }
                }
                s.release(0, held);
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    assert_eq!(s.device_used(0), 0);
    assert!(max_seen.load(Ordering::Relaxed) <= 1000);
    // Exactly to capacity, and not one byte more.
    assert!(s.try_reserve(0, 999) && s.try_reserve(0, 1));
    assert!(!s.try_reserve(0, 1));
    s.release(0, 1000);
    let p = s.processes();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].pid, std::process::id());
    assert_eq!(p[0].used, vec![0, 0]);
    // Exact, and never above capacity (process figures rise after the device's, fall before it).
    assert_eq!(p[0].peak[0], 1000);
    // Device 1 is separate; device 2 does not exist.
    assert!(s.try_reserve(1, 1000));
    assert!(!s.try_reserve(1, 1));
    assert!(!s.try_reserve(2, 1));
    assert_eq!(s.device_capacity(2), 0);
}

#[test]
fn first_creator_decides_and_concurrent_openers_agree() {
    let t = TempState::new("create");
    let path = t.0.clone();
    let opened: Vec<_> = (0..8)
        .map(|i| {
            let path = path.clone();
            std::thread::spawn(move || {
                let c = Config {
                    memory: 1000 + i,
                    devices: 1 + (i as u32 % 3),
                    ..Config::default()
                };
                let s = Shared::open(&path, &c).unwrap();
                (s.device_count(), s.device_capacity(0))
            })
        })
        .collect();
    let results: Vec<_> = opened.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(results.windows(2).all(|w| w[0] == w[1]), "{results:?}");
    let later = Shared::open(&path, &cfg(5)).unwrap();
    assert_eq!((later.device_count(), later.device_capacity(0)), results[0]);
    // No temporary files left behind.
    let dir: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&*path.file_name().unwrap().to_string_lossy())
        })
        .collect();
    assert_eq!(dir.len(), 1);
}

#[test]
fn foreign_or_corrupt_file_is_an_error() {
    let t = TempState::new("corrupt");
    std::fs::write(&t.0, b"hello, not a state file").unwrap();
    let e = Shared::open(&t.0, &cfg(1)).err().unwrap();
    assert!(
        e.contains(&*t.0.to_string_lossy()) && e.contains("magic"),
        "{e}"
    );
    std::fs::write(&t.0, b"").unwrap();
    assert!(snapshot(&t.0).is_err());
    let mut bytes = MAGIC_FOR_TESTS.to_vec();
    bytes.extend_from_slice(&99u32.to_le_bytes());
    bytes.extend_from_slice(&1u32.to_le_bytes());
    std::fs::write(&t.0, &bytes).unwrap();
    let e = Shared::open(&t.0, &cfg(1)).err().unwrap();
    assert!(e.contains("layout version 99"), "{e}");
    assert!(Shared::open(std::path::Path::new("/nonexistent-dir/x"), &cfg(1)).is_err());
}

const MAGIC_FOR_TESTS: [u8; 8] = *b"SIMGPUst";

#[test]
fn dead_process_memory_is_reclaimed() {
    let t = TempState::new("reclaim");
    let s = t.open(&Config {
        group: "g1".into(),
        ..cfg(1 << 30)
    });
    s.register().unwrap();
    assert!(s.try_reserve(0, 100));
    let child = fork(|| {
        // Reserves most of the device and exits without releasing.
        if !s.try_reserve(0, 600 << 20) {
            return 1;
        }
        if s.processes().len() != 2 {
            return 2;
        }
        0
    });
    assert_eq!(wait(child), 0);
    // The child's 600 MiB are still counted until someone sweeps (a failing reservation does);
    // snapshots already leave them out.
    assert_eq!(s.device_used(0), 100 + (600 << 20));
    let snap = snapshot(&t.0).unwrap();
    assert_eq!(snap.processes.len(), 1, "dead child listed: {snap:?}");
    assert_eq!(snap.devices[0].used, 100);
    assert_eq!(snap.groups[0].used[0], 100);
    assert!(
        s.try_reserve(0, 900 << 20),
        "dead child's memory not reclaimed"
    );
    assert_eq!(s.device_used(0), 100 + (900 << 20));
    let snap = snapshot(&t.0).unwrap();
    assert_eq!(snap.groups.len(), 1);
    let g = &snap.groups[0];
    assert_eq!(g.name, "g1");
    assert_eq!(g.used[0], 100 + (900 << 20));
    // The group's peak saw parent and child together.
    assert_eq!(g.peak[0], 100 + (900 << 20));
    assert_eq!(snap.processes[0].peak[0], 100 + (900 << 20));
    assert_eq!(snap.processes[0].group, "g1");
}

#[test]
fn group_peak_includes_child_while_alive() {
    let t = TempState::new("peak");
    let s = t.open(&Config {
        group: "grp".into(),
        ..cfg(1 << 30)
    });
    s.register().unwrap();
    assert!(s.try_reserve(0, 1000));
    let child = fork(|| i32::from(!s.try_reserve(0, 5000)));
    assert_eq!(wait(child), 0);
    let snap = snapshot(&t.0).unwrap();
    assert_eq!(snap.groups[0].peak[0], 6000);
    assert_eq!(snap.processes[0].peak[0], 1000);
    s.sweep().unwrap();
    let snap = snapshot(&t.0).unwrap();
    assert_eq!(snap.groups[0].used[0], 1000);
    assert_eq!(snap.devices[0].used, 1000);
}

#[test]
fn kernels_of_different_contexts_never_overlap() {
    let t = TempState::new("ctxs");
    let s = Arc::new(t.open(&cfg(1 << 30)));
    let start = Instant::now();
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let s = s.clone();
            std::thread::spawn(move || {
                let ctx = s.new_context_tag();
                for _ in 0..50 {
                    s.run_kernel(&Submission::now(
                        0,
                        ctx,
                        Work::Timed(Duration::from_micros(300)),
                    ));
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    let wall = start.elapsed().as_nanos() as u64;
    assert_eq!(s.device_kernels(0), 150);
    // Busy time is the union of running intervals: had contexts overlapped it would be less than
    // the sum of the kernels' durations.
    let busy = s.device_busy_ns(0);
    assert!(busy >= 150 * 300_000, "busy {busy} ns < the kernels' total");
    assert!(busy <= wall, "busy {busy} ns > wall time {wall} ns");
    let p = s.processes();
    assert_eq!(p[0].kernels[0], 150);
    assert_eq!(p[0].busy_ns[0], busy);
    assert_eq!(s.serving(0), (0, 0), "an idle device serves nobody");
}

#[test]
fn kernels_of_one_context_overlap_and_are_charged_the_union() {
    let t = TempState::new("union");
    let s = t.open(&Config {
        concurrent_kernels: 4,
        ..cfg(1 << 30)
    });
    let wall = Instant::now();
    // Two kernels of this process's context at once (two streams).
    let a = s.acquire_device(0);
    let b = s.acquire_device(0);
    assert_eq!(s.serving(0).1, 2, "both kernels run");
    std::thread::sleep(Duration::from_millis(100));
    drop(a);
    drop(b);
    let wall = wall.elapsed().as_nanos() as u64;
    let busy = s.device_busy_ns(0);
    assert_eq!(s.device_kernels(0), 2);
    assert!(busy >= 100_000_000, "busy {busy}");
    assert!(busy <= wall, "busy {busy} ns > wall time {wall} ns");
    // Charged once, not twice (the sum of the two kernels would be 200 ms).
    assert!(
        busy < 150_000_000,
        "busy {busy} ns: overlapping kernels charged twice"
    );
    let p = s.processes();
    assert_eq!(p[0].busy_ns[0], busy);
    let snap = snapshot(&t.0).unwrap();
    assert_eq!(snap.groups[0].busy_ns[0], busy);
}

#[test]
fn devices_are_arbitrated_independently() {
    let t = TempState::new("devs");
    let s = t.open(&Config {
        timeslice_ns: 0,
        ..cfg(1 << 30)
    });
    let held = s.acquire_device(0);
    // Another context's kernel on device 1 runs while device 0 is held (no time-slicing here).
    let other = s.new_context_tag();
    let run = s.run_kernel(&Submission::now(
        1,
        other,
        Work::Timed(Duration::from_millis(5)),
    ));
    assert_eq!(run.preempted, 0);
    assert_eq!(s.device_kernels(1), 1);
    assert_eq!(s.device_kernels(0), 0);
    assert!(s.device_busy_ns(1) >= 5_000_000);
    let snap = snapshot(&t.0).unwrap();
    assert_eq!(snap.processes[0].kernels, vec![0, 1]);
    assert_eq!(snap.processes[0].busy_ns[1], s.device_busy_ns(1));
    drop(held);
    assert_eq!(s.device_kernels(0), 1);
}

/// Without time-slicing a context holding the device blocks every other context; with it, the
/// holder yields after a slice and the other's kernel runs.
#[test]
fn a_long_kernel_yields_to_another_context_after_a_time_slice() {
    for slice_us in [0u64, 2000] {
        let t = TempState::new("slice");
        let s = Arc::new(t.open(&Config {
            timeslice_ns: slice_us * 1000,
            ..cfg(1 << 30)
        }));
        let held = s.acquire_device(0);
        let (tx, rx) = std::sync::mpsc::channel();
        let s2 = s.clone();
        std::thread::spawn(move || {
            let ctx = s2.new_context_tag();
            let run = s2.run_kernel(&Submission::now(
                0,
                ctx,
                Work::Timed(Duration::from_millis(1)),
            ));
            let _ = tx.send(run);
        });
        if slice_us == 0 {
            assert!(
                rx.recv_timeout(Duration::from_millis(300)).is_err(),
                "another context's kernel ran while the device was held, without time-slicing"
            );
            drop(held);
            rx.recv_timeout(Duration::from_secs(30))
                .expect("the waiting kernel never ran after the holder ended");
        } else {
            let run = rx
                .recv_timeout(Duration::from_secs(30))
                .expect("the waiting context never got a time slice");
            assert_eq!(run.preempted, 0);
            let snap = snapshot(&t.0).unwrap();
            assert!(snap.devices[0].switches >= 1, "{snap:?}");
            // The held turn is back on the device (preempted, then resumed).
            assert_eq!(s.serving(0).1, 1);
            drop(held);
        }
        assert_eq!(s.device_kernels(0), 2);
    }
}

/// Two "ranks" per tenant, one per device, each spinning in a barrier kernel until its peer rank
/// has started: the hardware's time-slicing lets them meet (the deadlock a FIFO device would have).
#[test]
fn barriers_across_devices_meet_thanks_to_time_slicing() {
    for slice_us in [2000u64, 0] {
        let t = TempState::new("barrier");
        let s = Arc::new(t.open(&Config {
            timeslice_ns: slice_us * 1000,
            ..cfg(1 << 30)
        }));
        let launch = |device: u32, tag: u64| {
            let s = s.clone();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let ctx = s.new_context_tag();
                let run = s.run_kernel(&Submission::now(
                    device,
                    ctx,
                    Work::Barrier {
                        tag,
                        participants: 2,
                    },
                ));
                let _ = tx.send(run);
            });
            rx
        };
        let wait_serving = |device: u32| {
            let until = Instant::now() + Duration::from_secs(30);
            while s.serving(device).1 == 0 {
                assert!(Instant::now() < until, "device {device} never ran a kernel");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        // J's rank 0 holds device 0, K's rank 1 holds device 1; then the other ranks queue.
        let j0 = launch(0, 1);
        wait_serving(0);
        let k1 = launch(1, 2);
        wait_serving(1);
        let j1 = launch(1, 1);
        let k0 = launch(0, 2);
        let ranks = [
            ("J rank 0 (device 0)", j0),
            ("K rank 1 (device 1)", k1),
            ("J rank 1 (device 1)", j1),
            ("K rank 0 (device 0)", k0),
        ];
        if slice_us == 0 {
            std::thread::sleep(Duration::from_millis(300));
            for (name, r) in &ranks {
                assert!(
                    r.try_recv().is_err(),
                    "{name} completed on a device without time-slicing"
                );
            }
            // Deadlocked, as a FIFO device would be: its threads are left behind.
            continue;
        }
        let mut waiting = Vec::new();
        for (name, r) in &ranks {
            if r.recv_timeout(Duration::from_secs(60)).is_err() {
                waiting.push(*name);
            }
        }
        assert!(
            waiting.is_empty(),
            "still spinning in their barriers: {waiting:?}; device 0 serves {:?}, device 1 {:?}",
            s.serving(0),
            s.serving(1)
        );
        assert_eq!(s.device_kernels(0) + s.device_kernels(1), 4);
        let snap = snapshot(&t.0).unwrap();
        assert!(snap.devices.iter().map(|d| d.switches).sum::<u64>() >= 1);
        // Spinning counts as busy.
        assert!(s.device_busy_ns(0) > 0 && s.device_busy_ns(1) > 0);
    }
}

#[test]
fn barrier_rounds_meet_in_order() {
    let t = TempState::new("rounds");
    let s = Arc::new(t.open(&cfg(1 << 30)));
    let ranks: Vec<_> = (0..3u32)
        .map(|r| {
            let s = s.clone();
            std::thread::spawn(move || {
                let ctx = s.new_context_tag();
                for i in 0..20 {
                    s.run_kernel(
                        &Submission::now(
                            r % 2,
                            ctx,
                            Work::Timed(Duration::from_micros(100 * (r as u64 + 1))),
                        )
                        .followed(),
                    );
                    s.run_kernel(&Submission::now(
                        r % 2,
                        ctx,
                        Work::Barrier {
                            tag: 7,
                            participants: 3,
                        },
                    ));
                    let _ = i;
                }
            })
        })
        .collect();
    for r in ranks {
        r.join().unwrap();
    }
    assert_eq!(s.device_kernels(0) + s.device_kernels(1), 120);
}

#[test]
fn concurrent_kernels_allows_n_holders() {
    let t = TempState::new("conc");
    let s = t.open(&Config {
        concurrent_kernels: 2,
        ..cfg(1 << 30)
    });
    let a = s.acquire_device(0);
    let b = s.acquire_device(0);
    let start = Instant::now();
    std::thread::scope(|sc| {
        let h = sc.spawn(|| {
            let _c = s.acquire_device(0);
            start.elapsed()
        });
        std::thread::sleep(Duration::from_millis(50));
        drop(a);
        let waited = h.join().unwrap();
        assert!(
            waited >= Duration::from_millis(45),
            "third holder did not wait: {waited:?}"
        );
    });
    drop(b);
    assert_eq!(s.device_kernels(0), 3);
}

#[test]
fn killed_turn_holder_does_not_block() {
    let t = TempState::new("killed");
    let s = t.open(&cfg(1 << 30));
    s.register().unwrap();
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let child = fork(|| {
        let _turn = s.acquire_device(0);
        // SAFETY: writes one byte from a valid buffer to our pipe.
        unsafe { libc::write(fds[1], b"x".as_ptr().cast(), 1) };
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    let mut b = [0u8; 1];
    // SAFETY: reads one byte into a valid buffer from our pipe.
    assert_eq!(unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 1) }, 1);
    // Another waiter queued behind the child's turn, in a second child that is killed before its turn.
    let waiter = fork(|| {
        let _turn = s.acquire_device(0);
        0
    });
    std::thread::sleep(Duration::from_millis(50));
    // SAFETY: plain signals to our own children.
    unsafe {
        libc::kill(waiter, libc::SIGKILL);
        libc::kill(child, libc::SIGKILL);
    }
    wait(waiter);
    wait(child);
    let start = Instant::now();
    drop(s.acquire_device(0));
    let waited = start.elapsed();
    assert!(
        waited < Duration::from_millis(300),
        "waited {waited:?} for a dead holder"
    );
    // And the device keeps working normally afterwards.
    let start = Instant::now();
    for _ in 0..10 {
        drop(s.acquire_device(0));
    }
    assert!(start.elapsed() < Duration::from_millis(50));
    // SAFETY: closing our pipe's descriptors.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
}

#[test]
fn turns_alternate_between_processes() {
    let t = TempState::new("procs");
    let s = t.open(&cfg(1 << 30));
    s.register().unwrap();
    let run = |s: &Shared| {
        let until = Instant::now() + Duration::from_millis(400);
        while Instant::now() < until {
            let _turn = s.acquire_device(0);
            let end = Instant::now() + Duration::from_micros(500);
            while Instant::now() < end {}
        }
    };
    let child = fork(|| {
        run(&s);
        0
    });
    run(&s);
    assert_eq!(wait(child), 0);
    let snap = snapshot(&t.0).unwrap();
    let mine = snap
        .processes
        .iter()
        .find(|p| p.pid == std::process::id())
        .unwrap();
    let total = snap.devices[0].busy_ns as f64;
    let share = mine.busy_ns[0] as f64 / total;
    assert!((0.35..0.65).contains(&share), "share {share}");
    // The group (default "") kept the dead child's busy time.
    assert_eq!(snap.groups[0].busy_ns[0], snap.devices[0].busy_ns);
}

#[test]
fn utilization_over_the_last_second() {
    let t = TempState::new("util");
    let s = t.open(&cfg(1 << 30));
    assert_eq!(s.utilization(0), 0);
    // Busy half of the time for 1.2 s.
    let until = Instant::now() + Duration::from_millis(1200);
    while Instant::now() < until {
        {
            let _turn = s.acquire_device(0);
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let u = s.utilization(0);
    assert!((35..=65).contains(&u), "utilization {u}");
    let p = s.process_utilization(0, 0);
    assert_eq!(p.len(), 1);
    assert!((35..=65).contains(&p[0].1), "process utilization {:?}", p);
    // A long kernel in flight counts.
    let turn = s.acquire_device(0);
    std::thread::sleep(Duration::from_millis(1100));
    assert!(s.utilization(0) >= 95, "{}", s.utilization(0));
    drop(turn);
    std::thread::sleep(Duration::from_millis(1100));
    assert!(s.utilization(0) <= 5, "{}", s.utilization(0));
}

#[test]
fn snapshot_json_shape() {
    let t = TempState::new("json");
    let s = t.open(&Config {
        group: "a\"b".into(),
        ..cfg(1 << 20)
    });
    assert!(s.try_reserve(0, 42));
    let json = snapshot_json(&snapshot(&t.0).unwrap());
    assert!(
        json.starts_with("{\"devices\":[{\"capacity\":1048576,\"used\":42,"),
        "{json}"
    );
    assert!(json.contains("\"group\":\"a\\\"b\""), "{json}");
    assert!(
        json.contains(&format!("\"pid\":{},", std::process::id())),
        "{json}"
    );
}

#[test]
fn uuid_format() {
    let d = device_info(3, 1);
    assert_eq!(
        format_uuid(&d.uuid),
        "GPU-53494d47-5055-4000-8000-000000000003"
    );
}

#[test]
fn stopped_turn_holder_blocks_only_until_its_kernel_would_end() {
    let t = TempState::new("stopped");
    let s = t.open(&cfg(1 << 30));
    s.register().unwrap();
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let child = fork(|| {
        let turn = s.acquire_device(0);
        turn.set_duration(Duration::from_millis(10));
        // SAFETY: writes one byte from a valid buffer to our pipe.
        unsafe { libc::write(fds[1], b"x".as_ptr().cast(), 1) };
        // SAFETY: stops this process, holding the turn, as SIGSTOP does to a program mid-kernel.
        unsafe { libc::raise(libc::SIGSTOP) };
        drop(turn);
        0
    });
    let mut b = [0u8; 1];
    // SAFETY: reads one byte into a valid buffer from our pipe.
    assert_eq!(unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 1) }, 1);
    let start = Instant::now();
    drop(s.acquire_device(0));
    let waited = start.elapsed();
    // The waiter preempts the stopped process's kernel after a time slice (2 ms).
    assert!(
        waited < Duration::from_millis(100),
        "waited {waited:?} for a stopped holder"
    );
    // The waiter got the device by preempting the stopped process's kernel at slice end (or after
    // its end); the rest of that kernel then runs while its process is still stopped.
    std::thread::sleep(Duration::from_millis(30));
    // The stopped process's kernel counts as having run its 10 ms, once (not again when it resumes).
    // SAFETY: plain signals to our own child.
    unsafe { libc::kill(child, libc::SIGCONT) };
    wait(child);
    let device = s.device_busy_ns(0);
    assert!(
        (10_000_000..15_000_000).contains(&device),
        "device busy {device} ns"
    );
    // SAFETY: closing our pipe's descriptors.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
}

/// A context launching 50 us kernels and one launching 5 ms kernels, both with work always queued:
/// time slices (in device time) give each about half of the device, where running kernels to their
/// end in arrival order would give the short-kernel context about 1%.
#[test]
fn contexts_with_queued_work_share_the_device_by_time_slices() {
    let t = TempState::new("slices");
    let s = Arc::new(t.open(&cfg(1 << 30)));
    let stop = Instant::now() + Duration::from_millis(1500);
    let threads: Vec<_> = [50u64, 5000]
        .into_iter()
        .map(|us| {
            let s = s.clone();
            std::thread::spawn(move || {
                let ctx = s.new_context_tag();
                let mut n = 0u64;
                while Instant::now() < stop {
                    // `true`: the next kernel is queued behind this one, as with a full stream.
                    s.run_kernel(
                        &Submission::now(0, ctx, Work::Timed(Duration::from_micros(us))).followed(),
                    );
                    n += 1;
                }
                n * us
            })
        })
        .collect();
    let device_us: Vec<u64> = threads.into_iter().map(|h| h.join().unwrap()).collect();
    let short = device_us[0] as f64 / (device_us[0] + device_us[1]) as f64;
    let snap = snapshot(&t.0).unwrap();
    assert!(
        short > 0.2 && short < 0.8,
        "short-kernel context had {:.1}% of the device ({device_us:?} us); {snap:?}",
        short * 100.0
    );
    assert!(snap.devices[0].switches > 10, "{snap:?}");
}

/// The device does not wait for the host thread that hands it a kernel: a kernel ready 20 ms ago on
/// an idle device ran then (it is over when its late thread arrives), and one ready while another
/// context held the device started when that context's kernel ended.
#[test]
fn a_kernel_starts_when_it_was_ready_not_when_its_host_thread_arrives() {
    let t = TempState::new("ready");
    let s = t.open(&cfg(1 << 30));
    let ctx = s.new_context_tag();
    let ready = sys::realtime_ns() - 20_000_000;
    let run = s.run_kernel(
        &Submission::now(0, ctx, Work::Timed(Duration::from_millis(5))).ready_at(ready),
    );
    assert_eq!(run.end_ns, ready + 5_000_000, "{run:?}");
    assert_eq!(s.device_busy_ns(0), 5_000_000);

    // Context A runs 10 ms; B's kernel was ready before A's ended but its thread arrives 30 ms later.
    let a = s.new_context_tag();
    let a_run = s.run_kernel(&Submission::now(
        0,
        a,
        Work::Timed(Duration::from_millis(10)),
    ));
    let b = s.new_context_tag();
    std::thread::sleep(Duration::from_millis(30));
    let b_run = s.run_kernel(
        &Submission::now(0, b, Work::Timed(Duration::from_millis(2)))
            .ready_at(a_run.end_ns - 1_000_000),
    );
    assert_eq!(
        b_run.end_ns,
        a_run.end_ns + 2_000_000,
        "{a_run:?} {b_run:?}"
    );
    assert_eq!(s.device_busy_ns(0), 17_000_000);
}

/// One end of a socket pair, as the two processes of a test talk.
type End = std::os::unix::net::UnixStream;

fn send(mut end: &End, v: u64) {
    use std::io::Write;
    end.write_all(&v.to_le_bytes()).unwrap();
}

/// The other side's next word, waited for at most 30 s (a side that failed may never send it, and
/// a fork child holds both ends, so no end of file comes).
fn recv(mut end: &End) -> u64 {
    use std::io::Read;
    end.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut b = [0u8; 8];
    end.read_exact(&mut b).unwrap();
    u64::from_le_bytes(b)
}

/// The memory of `pid` on device 0, as the snapshot shows it.
fn used_by(path: &std::path::Path, pid: u32) -> u64 {
    snapshot(path)
        .unwrap()
        .processes
        .iter()
        .find(|p| p.pid == pid)
        .map_or(0, |p| p.used[0])
}

#[test]
fn ipc_memory_lives_until_its_last_mapping_and_counts_against_who_holds_it() {
    const MIB: u64 = 1 << 20;
    let t = TempState::new("ipc");
    let s = t.open(&cfg(1 << 30));
    s.register().unwrap();
    assert!(s.try_reserve(0, 64 * MIB));
    let key = s.ipc_export(0, 0x1000, 64 * MIB).unwrap();
    assert_eq!(
        s.ipc_export(0, 0x1000, 64 * MIB),
        Ok(key),
        "one handle per allocation"
    );
    assert_eq!(s.ipc_open(key), Err(ipc::IpcError::OwnProcess));
    let (parent, child_end) = End::pair().unwrap();
    let child = fork(|| {
        if s.ipc_open(key) != Ok((0, 64 * MIB)) {
            return 1;
        }
        send(&child_end, 1);
        recv(&child_end); // the exporter freed it
        s.ipc_close(key);
        0
    });
    let me = std::process::id();
    assert_eq!(recv(&parent), 1);
    // Mapped: still the exporter's.
    assert_eq!(
        (used_by(&t.0, me), used_by(&t.0, child as u32)),
        (64 * MIB, 0)
    );
    // Freed by the exporter: alive, the importer's.
    assert!(s.ipc_free(key));
    assert_eq!(
        (used_by(&t.0, me), used_by(&t.0, child as u32)),
        (0, 64 * MIB)
    );
    assert_eq!(s.device_used(0), 64 * MIB);
    assert_eq!(
        s.ipc_open(key),
        Err(ipc::IpcError::Unknown),
        "a freed export"
    );
    send(&parent, 1);
    assert_eq!(wait(child), 0);
    // The last mapping gone: so is the memory.
    assert_eq!(s.device_used(0), 0);
}

#[test]
fn ipc_memory_of_an_exporter_that_ended_lives_on_in_its_importer() {
    const MIB: u64 = 1 << 20;
    let t = TempState::new("ipc-exit");
    let s = t.open(&cfg(1 << 30));
    s.register().unwrap();
    let (parent, child_end) = End::pair().unwrap();
    let child = fork(|| {
        if !s.try_reserve(0, 32 * MIB) {
            return 1;
        }
        let Ok(key) = s.ipc_export(0, 0x2000, 32 * MIB) else {
            return 2;
        };
        send(&child_end, key);
        recv(&child_end); // mapped
        0 // ends without freeing (`_exit`: found dead by the next sweep)
    });
    let key = recv(&parent);
    assert_eq!(s.ipc_open(key), Ok((0, 32 * MIB)));
    send(&parent, 1);
    assert_eq!(wait(child), 0);
    s.sweep().unwrap();
    assert_eq!(used_by(&t.0, std::process::id()), 32 * MIB);
    assert_eq!(s.device_used(0), 32 * MIB);
    s.ipc_close(key);
    assert_eq!(
        (used_by(&t.0, std::process::id()), s.device_used(0)),
        (0, 0)
    );
}
