use super::*;

const MS: u64 = 1_000_000;

#[test]
fn a_bucket_holds_a_holder_to_its_fraction() {
    // Holding whenever it may, at a fair fraction of 1/7: held ~1/7 (+ slack) of 10 s.
    let mut b = Bucket::default();
    let f = PPM / 7;
    let (mut held, step) = (0u64, MS);
    for _ in 0..10_000 {
        let h = b.tokens > 0;
        // (The hysteresis of `Evidence` aside: here a holder holds whenever it can.)
        b.tick(step, f, h);
        held += u64::from(h) * step;
    }
    let pct = held as f64 * 100.0 / 10_000.0 / MS as f64;
    assert!((14.5..17.0).contains(&pct), "held {pct}%");
    // Never held: full, and no more.
    let mut b = Bucket::default();
    b.tick(10_000 * MS, f, false);
    assert_eq!(b.tokens, BUCKET_MAX_NS);
    // A holder that never stops owes at most the bucket.
    let mut b = Bucket::default();
    for _ in 0..1000 {
        b.tick(10 * MS, 0, true);
    }
    assert_eq!(b.tokens, -BUCKET_MAX_NS);
}

#[test]
fn honest_turns_never_empty_the_bucket() {
    // Turns as start-time fair queuing gives them, each hold a slice and a drain of 5 ms
    // (charged), each wait what the others' holds take at their shares, give or take a few
    // milliseconds: share 10 beside 90, 50 beside 50, 90 beside 10, 1/7 beside 3/7 and 3/7.
    for (f, hold, rest) in [
        (PPM / 10, 25, 220),
        (PPM / 2, 25, 22),
        (PPM * 9 / 10, 225, 22),
        (PPM / 7, 25, 147),
        (PPM * 3 / 7, 25, 31),
    ] {
        let mut b = Bucket::default();
        for _ in 0..500 {
            for _ in 0..hold {
                b.tick(MS, f, true);
                assert!(b.tokens > 0, "f {f}: emptied");
            }
            for _ in 0..rest {
                b.tick(MS, f, false);
            }
        }
    }
}

#[test]
fn a_starved_waiter_is_told_apart_from_a_patient_one() {
    let floor = fraction_floor(30, 80, 0, 1);
    assert_eq!(floor, 375_000);
    // Owned 5 ms in every 140 ms it wanted: starved once half a second was seen.
    let mut w = Watch::default();
    let mut first = None;
    for i in 0..300u64 {
        w.tick(5 * MS, true, i % 28 == 0);
        if first.is_none() && w.starved(floor) {
            first = Some(i * 5);
        }
    }
    assert!(
        first.is_some_and(|ms| (495..=600).contains(&ms)),
        "{first:?}"
    );
    // Honest turns at its fraction 3/7 (30 ms owned, 40 ms waiting): never starved.
    let mut w = Watch::default();
    for i in 0..2000u64 {
        w.tick(MS, true, i % 70 < 30);
        assert!(!w.starved(floor));
    }
    assert!(w.recovered(floor));
    // A capped tenant waiting for its tokens, share 10 of 100 with cap 5: not starved.
    let floor = fraction_floor(10, 100, 5, 1);
    let mut w = Watch::default();
    for i in 0..2000u64 {
        w.tick(MS, true, i % 100 < 5);
        assert!(!w.starved(floor));
    }
    assert_eq!(fraction_floor(30, 60, 0, 3), 166_666);
    assert_eq!(fraction(50, 0), PPM);
}

/// A forged owner word keeps a victim waiting: it turns paced, holds about its fraction while
/// every grant it gets is taken back within 5 ms, and turns back once three grants in a row kept
/// [`CLEAN_NS`].
#[test]
fn a_starved_process_paces_itself_and_comes_back() {
    let e = Evidence::default();
    let seen = |now: u64, epoch: u64, owned: bool, waiting: bool| Seen {
        now,
        others_want: true,
        others_wait: true,
        others_gone: false,
        exempt: false,
        owned,
        epoch,
        waiting,
        fair_ppm: PPM * 3 / 7,
        floor_ppm: PPM * 3 / 8,
        window: Window {
            start_ppm: PPM / 7,
            len_ppm: PPM * 3 / 7,
        },
        forged: false,
    };
    let mut now = 1;
    let mut starved_at = None;
    let mut paced_ms = 0;
    for i in 0..4000u64 {
        now += MS;
        // Kept out: a new epoch every 5 ms (the forger's); at times granted for 4 ms.
        let turn = e.tick(seen(now, 1 + i / 5, i % 50 < 4, !e.paced_at(now)));
        if let Turn::Starved { owned_ppm, .. } = turn {
            assert!(owned_ppm < PPM / 10, "{owned_ppm}");
            starved_at = starved_at.or(Some(i));
        }
        if starved_at.is_some() {
            assert!(
                e.fallback(),
                "waiting again at {i} ms, every grant taken back"
            );
        }
        if i >= 1000 {
            paced_ms += u64::from(e.paced_at(now));
        }
    }
    assert!(starved_at.is_some_and(|i| i < 600), "{starved_at:?}");
    let pct = paced_ms as f64 / 30.0;
    // 3/7 and the slack: the episode goes on as long as the forger does.
    assert!((40.0..50.0).contains(&pct), "paced {pct}% of the time");
    // Honest turns again (20 ms slices, each its own epoch, 3 in 7 of the time owned): the
    // third epoch in a row that stays ends the episode, and it stays waiting.
    let mut back = None;
    for i in 0..6000u64 {
        now += MS;
        if let Turn::Recovered = e.tick(seen(now, 1_000_000 + i / 20, i % 47 < 20, true)) {
            back = Some(i);
        }
        if back.is_some() {
            assert!(!e.fallback() && !e.paced_at(now), "paced again at {i} ms");
        }
    }
    assert!(back.is_some_and(|i| i < 100), "never recovered: {back:?}");
}

#[test]
fn alone_or_beside_high_priority_nothing_is_owed() {
    let e = Evidence::default();
    for i in 1..2000u64 {
        let t = e.tick(Seen {
            now: i * MS,
            others_want: i % 2 == 0,
            others_wait: true,
            others_gone: false,
            exempt: true,
            owned: true,
            epoch: 1,
            waiting: true,
            fair_ppm: 0,
            floor_ppm: PPM,
            window: Window::default(),
            forged: i == 5,
        });
        assert_eq!(t, Turn::Same);
        assert!(e.may_own() && !e.paced_at(i * MS));
    }
}

/// A forger thread the host leaves unscheduled for 20 ms now and then leaves one epoch that
/// stays past [`CLEAN_NS`] between its 5 ms rewrites: the victim's episode goes on (ending it
/// there cost the victims 0.5 s of starvation each time before they paced again).
#[test]
fn a_stalled_forger_does_not_end_the_episode() {
    let e = Evidence::default();
    let mut epoch = 1u64;
    for i in 0..3000u64 {
        // Every 200 ms the forger stalls for 20 ms; otherwise a new epoch every 5 ms.
        if i % 200 >= 20 && i % 5 == 0 {
            epoch += 1;
        }
        e.tick(Seen {
            now: 1 + i * MS,
            others_want: true,
            others_wait: true,
            others_gone: false,
            exempt: false,
            owned: false,
            epoch,
            waiting: true,
            fair_ppm: PPM * 3 / 7,
            floor_ppm: PPM * 3 / 8,
            window: Window {
                start_ppm: 0,
                len_ppm: PPM * 3 / 7,
            },
            forged: i == 0,
        });
        assert!(e.fallback(), "the episode ended at {i} ms");
    }
}

#[test]
fn a_launch_goes_only_when_it_ends_in_the_window() {
    let len = 57 * MS;
    // Room for the queue and the launch: through.
    assert_eq!(fit(20 * MS, len, 14 * MS, 2 * MS), Fit::Go);
    assert_eq!(fit(16 * MS, len, 14 * MS, 2 * MS), Fit::Go);
    // The queue would run past the end: the launch waits for the excess to run.
    assert_eq!(fit(15 * MS, len, 14 * MS, 2 * MS), Fit::Hold(MS));
    // Never for less than a look is worth.
    assert_eq!(
        fit(16 * MS - 1, len, 14 * MS, 2 * MS),
        Fit::Hold(FIT_HOLD_MIN_NS)
    );
    // The launch alone does not fit: it waits for the window to end (and the next one).
    assert_eq!(fit(MS, len, 0, 2 * MS), Fit::Hold(MS));
    assert_eq!(fit(MS, len, 4 * MS, 2 * MS), Fit::Hold(MS));
    // A launch longer than half the window goes alone in its first half, never later or behind
    // other work (else it would never run).
    assert_eq!(fit(len, len, 0, 100 * MS), Fit::Go);
    assert_eq!(fit(len / 2, len, 0, 100 * MS), Fit::Go);
    assert_eq!(fit(len / 2 - 1, len, 0, 100 * MS), Fit::Hold(len / 2 - 1));
    assert_eq!(fit(len, len, MS, 100 * MS), Fit::Hold(len));
    // No estimate yet, nothing queued: through.
    assert_eq!(fit(MS, len, 0, 0), Fit::Go);
    // Saturating: a huge backlog holds, bounded by the window.
    assert_eq!(fit(10 * MS, len, u64::MAX, 2 * MS), Fit::Hold(10 * MS));
    // Windows: how much is left of one, 0 outside it.
    let w = Window {
        start_ppm: PPM / 4,
        len_ppm: PPM / 4,
    };
    assert_eq!(w.len_ns(), FRAME_NS / 4);
    assert_eq!(w.left(FRAME_NS / 4), FRAME_NS / 4);
    assert_eq!(w.left(3 * FRAME_NS + FRAME_NS / 2 - 1), 1);
    assert_eq!(w.left(FRAME_NS / 2), 0);
    assert_eq!(w.left(FRAME_NS / 4 - 1), 0);
    assert!(w.holds(FRAME_NS / 4) && !w.holds(FRAME_NS / 2));
}

/// Three paced tenants of shares 10/30/30 (the forged-ownership attack's victims and the forger's
/// own library), each a program that keeps 8 kernels of 2 ms queued, on a device that time-slices
/// contexts every 2 ms (as simgpu and NVIDIA's GPUs do). Launches only in the tenant's window and
/// only when they end in it ([`fit`]): nothing of a tenant runs outside its window, and the
/// device time follows the shares. Launching whenever in the window let each tenant's queue run
/// 8 ms into the next tenant's window, shared with it.
#[test]
fn paced_tenants_keep_their_work_in_their_windows() {
    let (kernel, step, depth, frames) = (2 * MS, 50_000u64, 8usize, 10u64);
    let shares = [10u64, 30, 30];
    let ids: Vec<(TenantId, u64)> = shares
        .iter()
        .enumerate()
        .map(|(i, &s)| (TenantId(i as u128 + 1), s))
        .collect();
    let windows: Vec<Window> = ids.iter().map(|&(id, _)| Window::of(id, &ids)).collect();
    let mut queues: Vec<std::collections::VecDeque<u64>> = vec![Default::default(); 3];
    let mut waited_since = [0u64; 3];
    let (mut serving, mut in_slice) = (None::<usize>, 0u64);
    let (mut device, mut outside) = ([0u64; 3], [0u64; 3]);
    // Start mid-frame, as a real episode does.
    let t0 = FRAME_NS / 3;
    let mut t = t0;
    while t < t0 + frames * FRAME_NS {
        for (i, q) in queues.iter_mut().enumerate() {
            let left = windows[i].left(t);
            let backlog = q.iter().sum::<u64>().max(q.len() as u64 * kernel);
            if left != 0
                && q.len() < depth
                && fit(left, windows[i].len_ns(), backlog, kernel) == Fit::Go
            {
                if q.is_empty() && serving != Some(i) {
                    waited_since[i] = t;
                }
                q.push_back(kernel);
            }
        }
        // The device: the serving context keeps it for a slice while another waits, then the
        // one that waited longest gets it.
        let others = (0..3).filter(|&j| Some(j) != serving && !queues[j].is_empty());
        let next = others.min_by_key(|&j| waited_since[j]);
        let idle = serving.map_or(true, |s| queues[s].is_empty());
        if let Some(j) = next {
            if idle || in_slice >= kernel {
                if let Some(s) = serving.filter(|&s| !queues[s].is_empty()) {
                    waited_since[s] = t;
                }
                serving = Some(j);
                in_slice = 0;
            }
        }
        if let Some(s) = serving.filter(|&s| !queues[s].is_empty()) {
            let front = queues[s].front_mut().unwrap();
            *front -= step.min(*front);
            if *front == 0 {
                queues[s].pop_front();
            }
            device[s] += step;
            in_slice += step;
            if !windows[s].holds(t) {
                outside[s] += step;
            }
        }
        t += step;
    }
    let total: u64 = device.iter().sum();
    for i in 0..3 {
        assert_eq!(
            outside[i],
            0,
            "tenant {i}: {} ms of its work ran outside its window (device {device:?})",
            outside[i] / MS
        );
        let got = device[i] as f64 * 100.0 / total as f64;
        let want = shares[i] as f64 * 100.0 / 70.0;
        assert!(
            (got - want).abs() < 1.0,
            "tenant {i}: {got:.1}% of the device, policy {want:.1}% ({device:?})"
        );
    }
}

#[test]
fn a_replaced_epoch_is_forged_only_when_no_honest_regrant_explains_it() {
    let now = 10_000 * MS;
    // Adopted 5 ms ago, our scheduler thread passing every millisecond: nobody honest can have
    // revoked us (120 ms at the least), so a new epoch naming us is forged.
    assert!(replaced_is_forged(now, now - 5 * MS, now - MS, 0));
    assert!(replaced_is_forged(
        now,
        now - 100 * MS,
        now - MS,
        now - 500 * MS
    ));
    // Held past the slice and the grace: an honest waiter may have revoked us and granted us again.
    assert!(!replaced_is_forged(now, now - 130 * MS, now - MS, 0));
    // Our scheduler thread is not running now, or stalled lately (our heartbeat went stale):
    // ambiguous.
    assert!(!replaced_is_forged(now, now - 5 * MS, now - 15 * MS, 0));
    assert!(!replaced_is_forged(
        now,
        now - 5 * MS,
        now - MS,
        now - 50 * MS
    ));
    // Never adopted: nothing of ours was replaced.
    assert!(!replaced_is_forged(now, 0, now - MS, 0));
}

/// The two stories behind a new epoch naming an owner: an honest waiter revoking it after its
/// scheduler thread stalled (the host did not run it) and granting it again, and a forger
/// replacing its epochs every 5 ms while it runs. Only the second is forged.
#[test]
fn an_honest_regrant_after_a_stall_is_not_taken_for_a_forger() {
    // Honest: adopted at 1 s, passes every ms until 1.010 s, then nothing for 150 ms (the host ran
    // other work); a waiter revoked it at 1.140 s (past slice + grace, heartbeat stale) and the
    // hand-over chose it again. Its next pass, at 1.160 s, sees the new epoch.
    let r = Regrant::default();
    r.adopted(1_000 * MS);
    for t in 1_000..=1_010 {
        r.step(t * MS);
    }
    r.step(1_160 * MS);
    assert!(!r.forged(1_160 * MS), "an honest re-grant after a stall");
    // A waiting launch of the same process that saw it first (the scheduler thread still
    // stalled): ambiguous too.
    let r = Regrant::default();
    r.adopted(1_000 * MS);
    for t in 1_000..=1_010 {
        r.step(t * MS);
    }
    assert!(!r.forged(1_150 * MS));
    // Forger: adopted at 2 s, passes every ms, the epoch replaced 5 ms later.
    let r = Regrant::default();
    r.step(1_999 * MS);
    r.adopted(2_000 * MS);
    for t in 2_000..=2_005 {
        r.step(t * MS);
    }
    assert!(
        r.forged(2_005 * MS),
        "a replacement 5 ms after our adoption"
    );
    // The same forger just after a stall of ours: not concluded, then found once the stall is
    // behind us (every re-adoption restarts the hold).
    r.step(2_030 * MS);
    r.adopted(2_030 * MS);
    assert!(!r.forged(2_035 * MS));
    let mut t = 2_031;
    while t <= 2_200 {
        r.step(t * MS);
        t += 1;
    }
    r.adopted(2_195 * MS);
    assert!(r.forged(2_200 * MS));
    // The evidence counts only a forged replacement.
    let e = Evidence::default();
    e.regrant.step(3_000 * MS);
    e.regrant.adopted(3_000 * MS);
    e.regrant.step(3_001 * MS);
    assert!(e.replaced(3_002 * MS));
    e.regrant.adopted(3_002 * MS);
    assert!(!e.replaced(3_200 * MS));
}

/// An honest hand-over to us that an adopter sees half-way (docs/COMPUTE.md, "Forged ownership
/// evidence"): another process holds the arbitration lock and has written the owner word naming
/// us, not yet the new epoch; our adopter reads the old epoch, then the owner word, and adopts the
/// old epoch. The new epoch that the same hand-over writes next is not a forger's replacement. A
/// forger writing a new epoch naming us, without the lock, after an adoption of settled words,
/// still is.
#[test]
fn a_hand_over_seen_half_way_is_not_taken_for_a_forger() {
    use crate::scheduling::device::DeviceLedger;
    use crate::scheduling::Holder;
    use std::sync::atomic::Ordering::{Acquire, Release};
    let _serial = crate::slotfile::serial_test();
    let dir = std::env::temp_dir().join(format!("gpuslice-halfway-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let uuid = "GPU-00000000-0000-0000-0000-0000000000d7";
    let l = DeviceLedger::open(&dir.join(format!("{uuid}.dev")), uuid, true).unwrap();
    let (us, them) = (l.claim_slot(0).unwrap(), l.claim_slot(1).unwrap());
    let h = &l.layout().header;
    let bump = || {
        h.epoch
            .store(h.epoch.load(Acquire).wrapping_add(1), Release)
    };
    h.owner.store(Holder::of(them).word(), Release);
    bump();
    let e = Evidence::default();
    let mut now = 10_000 * MS;
    for _ in 0..20 {
        now += MS;
        e.regrant.step(now);
    }
    // The other process hands over to us: the owner word first, under the lock.
    let g = l.lock(them);
    h.owner.store(Holder::of(us).word(), Release);
    // Our adopter: the epoch (still the old one), then the owner word (ours).
    let old = h.epoch.load(Acquire);
    assert_eq!(h.owner.load(Acquire), Holder::of(us).word());
    e.regrant.adopt(h, old, now);
    // The hand-over ends: the new epoch, the lock let go.
    bump();
    drop(g);
    now += 50_000;
    e.regrant.step(now);
    assert!(
        !e.replaced(now),
        "the epoch of an honest hand-over seen half-way counted as forged"
    );
    // Adopted again, on settled words; a forger writes a new epoch naming us 5 ms later.
    let settled_epoch = h.epoch.load(Acquire);
    e.regrant.adopt(h, settled_epoch, now);
    for _ in 0..5 {
        now += MS;
        e.regrant.step(now);
    }
    bump();
    assert!(e.replaced(now), "a forger's replacement went unnoticed");
    drop(l);
    let _ = std::fs::remove_dir_all(&dir);
}
