//! Reserve, make room, refuse at the quota.

use super::{kit, MIB};
use std::cell::Cell;

#[test]
fn a_reservation_within_the_quota_is_charged_and_kept_once_committed() {
    let k = kit("reserve-commit", 8 * MIB);
    let d = k.t.device(0).unwrap();
    let r = k.t.reserve(d, 3 * MIB, "test").unwrap();
    assert_eq!(k.used(0), 3 * MIB);
    let charge = r.commit();
    assert_eq!(charge.bytes, 3 * MIB);
    assert_eq!(k.used(0), 3 * MIB, "a committed reservation stays charged");
    k.t.release(charge);
    assert_eq!(k.used(0), 0);
}

#[test]
fn a_dropped_reservation_is_given_back() {
    let k = kit("reserve-drop", 8 * MIB);
    let d = k.t.device(0).unwrap();
    drop(k.t.reserve(d, 5 * MIB, "test").unwrap());
    assert_eq!(k.used(0), 0);
}

#[test]
fn past_the_quota_a_reservation_is_refused_and_counted_once() {
    let k = kit("reserve-refuse", 8 * MIB);
    let d = k.t.device(0).unwrap();
    let held = k.t.reserve(d, 6 * MIB, "test").unwrap();
    assert!(k.t.reserve(d, 3 * MIB, "test").is_err());
    assert_eq!(k.used(0), 6 * MIB, "a refusal charges nothing");
    assert_eq!(k.denied(0), 1);
    // Exactly at the quota is allowed.
    let rest = k.t.reserve(d, 2 * MIB, "test").unwrap();
    assert_eq!(k.used(0), 8 * MIB);
    drop((held, rest));
}

#[test]
fn make_room_is_asked_once_and_a_refusal_counted_once() {
    let k = kit("reserve-room-once", 4 * MIB);
    let d = k.t.device(0).unwrap();
    let _held = k.t.reserve(d, 4 * MIB, "test").unwrap();
    let asked = Cell::new(0);
    let r = k.t.reserve_or_make_room(d, MIB, "test", || {
        asked.set(asked.get() + 1);
        true // says it made room, but gave nothing back
    });
    assert!(r.is_err());
    assert_eq!(
        asked.get(),
        1,
        "make_room runs once per call, never in a loop"
    );
    assert_eq!(k.denied(0), 1, "however many tries, one refused call");
}

#[test]
fn room_made_lets_the_reservation_through() {
    let k = kit("reserve-room-made", 4 * MIB);
    let d = k.t.device(0).unwrap();
    let held = k.t.reserve(d, 4 * MIB, "test").unwrap().commit();
    let r = k.t.reserve_or_make_room(d, MIB, "test", || {
        k.t.release(held);
        true
    });
    assert_eq!(r.unwrap().commit().bytes, MIB);
    assert_eq!(k.used(0), MIB);
    assert_eq!(k.denied(0), 0);
}

#[test]
fn make_room_that_says_it_failed_refuses() {
    let k = kit("reserve-room-fail", 4 * MIB);
    let d = k.t.device(0).unwrap();
    let held = k.t.reserve(d, 4 * MIB, "test").unwrap().commit();
    // It released memory but says it did not: not tried again.
    let r = k.t.reserve_or_make_room(d, MIB, "test", || {
        k.t.release(held);
        false
    });
    assert!(r.is_err());
}

#[test]
fn make_room_is_not_asked_while_there_is_room() {
    let k = kit("reserve-room-unneeded", 4 * MIB);
    let d = k.t.device(0).unwrap();
    let r =
        k.t.reserve_or_make_room(d, MIB, "test", || panic!("not at the quota"));
    assert!(r.is_ok());
}

#[test]
fn a_device_without_a_ledger_slot_is_refused_without_making_room() {
    let k = kit("reserve-no-slot", 4 * MIB);
    let mut d = k.t.device(0).unwrap().clone();
    d.slot = Err("no room for this device".into());
    let r = k.t.reserve_or_make_room(&d, MIB, "test", || {
        panic!("no slot: nothing to make room in")
    });
    assert!(r.is_err());
    assert_eq!(k.used(0), 0);
}

#[test]
fn a_node_ceiling_below_the_ledger_limit_refuses() {
    let k = kit("reserve-ceiling", 16 * MIB);
    let mut d = k.t.device(0).unwrap().clone();
    d.ceiling = Some(2 * MIB);
    assert!(k.t.reserve(&d, 3 * MIB, "test").is_err());
    assert_eq!(
        k.used(0),
        0,
        "the reservation past the ceiling is taken back"
    );
    assert_eq!(k.denied(0), 1);
    assert!(k.t.reserve(&d, 2 * MIB, "test").is_ok());
}

#[test]
fn charge_around_commits_only_what_the_driver_did() {
    let k = kit("reserve-around", 8 * MIB);
    let d = k.t.device(0).unwrap();
    let failed = k.t.charge_around(d, MIB, "test", || {
        Err::<(), _>(gpuslice_api::CUerror::INVALID_VALUE)
    });
    assert!(failed.is_err());
    assert_eq!(k.used(0), 0, "a failed call is rolled back");
    let ((), c) = k.t.charge_around(d, MIB, "test", || Ok(())).unwrap();
    assert_eq!((c.bytes, k.used(0)), (MIB, MIB));
}
