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
