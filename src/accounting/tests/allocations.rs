//! Allocation and free bookkeeping: what is charged, what a free returns, what a destroyed
//! context takes with it.

use super::{kit, MIB};
use gpuslice_api::CUerror;

#[test]
fn an_allocation_is_charged_until_freed() {
    let k = kit("alloc-round-trip", 64 * MIB);
    let d = k.t.device(0).unwrap();
    k.t.charged(d, 3 * MIB, "test", || Ok(0x1000)).unwrap();
    assert_eq!(k.used(0), 3 * MIB);
    k.t.uncharge(0x1000, || Ok(())).unwrap();
    assert_eq!(k.used(0), 0);
}

#[test]
fn a_failed_allocation_is_not_charged() {
    let k = kit("alloc-failed", 64 * MIB);
    let d = k.t.device(0).unwrap();
    let r =
        k.t.charged(d, 3 * MIB, "test", || Err(CUerror::OUT_OF_MEMORY));
    assert!(r.is_err());
    assert_eq!(k.used(0), 0);
}

#[test]
fn a_failed_free_keeps_the_charge() {
    let k = kit("alloc-failed-free", 64 * MIB);
    let d = k.t.device(0).unwrap();
    k.t.charged(d, 3 * MIB, "test", || Ok(0x1000)).unwrap();
    assert!(k
        .t
        .uncharge(0x1000, || Err(CUerror::INVALID_VALUE))
        .is_err());
    assert_eq!(k.used(0), 3 * MIB);
    // And the record is still there for the free that works.
    k.t.uncharge(0x1000, || Ok(())).unwrap();
    assert_eq!(k.used(0), 0);
}

#[test]
fn a_free_of_memory_never_charged_leaves_the_ledger_alone() {
    let k = kit("alloc-unknown-free", 64 * MIB);
    let d = k.t.device(0).unwrap();
    k.t.charged(d, 3 * MIB, "test", || Ok(0x1000)).unwrap();
    k.t.uncharge(0x2000, || Ok(())).unwrap();
    assert_eq!(k.used(0), 3 * MIB);
}

#[test]
fn an_address_handed_out_again_returns_the_stale_charge() {
    let k = kit("alloc-stale", 64 * MIB);
    let d = k.t.device(0).unwrap();
    k.t.charged(d, 3 * MIB, "test", || Ok(0x1000)).unwrap();
    // Freed without a free call (its context went), then given to a new allocation.
    k.t.charged(d, 2 * MIB, "test", || Ok(0x1000)).unwrap();
    assert_eq!(k.used(0), 2 * MIB);
}

#[test]
fn a_recharge_settles_on_the_real_size_or_refuses() {
    let k = kit("alloc-recharge", 8 * MIB);
    let d = k.t.device(0).unwrap();
    k.t.charged(d, 2 * MIB, "test", || Ok(0x1000)).unwrap();
    k.t.recharge(0x1000, d, 3 * MIB, "test").unwrap();
    assert_eq!(k.used(0), 3 * MIB);
    k.t.recharge(0x1000, d, MIB, "test").unwrap();
    assert_eq!(k.used(0), MIB);
    assert!(k.t.recharge(0x1000, d, 16 * MIB, "test").is_err());
    assert_eq!(k.used(0), MIB, "a refused recharge keeps the old charge");
}

#[test]
fn a_destroyed_context_returns_what_the_driver_freed_with_it() {
    let k = kit_explicit("alloc-context-gone");
    let d = k.t.device(0).unwrap();
    k.t.charged(d, 2 * MIB, "test", || Ok(0x1000)).unwrap();
    k.t.charged(d, 3 * MIB, "test", || Ok(0x2000)).unwrap();
    let array = k.t.reserve(d, 4 * MIB, "array").unwrap().commit();
    k.t.record_array(0xa1, array, 0x100);
    // The driver freed the first allocation with the context; the second is another context's.
    k.fake.with(|s| s.unknown_pointers.push(0x1000));
    k.t.forget_context(0x100);
    assert_eq!(
        k.used(0),
        3 * MIB,
        "the freed allocation and the context's array went"
    );
}

#[test]
fn physical_memory_is_charged_until_released_and_unmapped() {
    let k = kit("alloc-vmm", 64 * MIB);
    let d = k.t.device(0).unwrap();
    let charge = k.t.reserve(d, 4 * MIB, "cuMemCreate").unwrap().commit();
    k.t.record_physical(0x77, charge);
    k.t.mapped(0x10_0000, 4 * MIB, 0x77);
    k.t.mapped(0x90_0000, 4 * MIB, 0x77);
    k.t.physical_released(0x77);
    assert_eq!(k.used(0), 4 * MIB, "still mapped twice");
    k.t.unmapped(0x10_0000, 4 * MIB);
    assert_eq!(k.used(0), 4 * MIB, "still mapped once");
    k.t.unmapped(0x90_0000, 4 * MIB);
    assert_eq!(k.used(0), 0);
}

/// A kit whose contexts are charged a fixed 0 bytes (no measurement in the way).
fn kit_explicit(tag: &str) -> super::Kit {
    super::kit_with(
        tag,
        64 * MIB,
        &[super::UUID],
        &[("GPUSLICE_CONTEXT_RESERVE", "0")],
    )
}

#[test]
fn a_pitched_allocation_settles_on_pitch_times_height() {
    let k = kit("alloc-pitch", 64 * MIB);
    let d = k.t.device(0).unwrap();
    let request = crate::accounting::sizes::Pitch {
        width: 1000,
        height: 1024,
        element: 4,
    };
    // Estimated at 1024 bytes a row; the driver chose a 2048-byte pitch.
    k.t.alloc_pitch(d, request, || Ok((0x1000, Some(2048))), |_| Ok(()))
        .unwrap();
    assert_eq!(k.used(0), 2 * MIB);
}

#[test]
fn a_pitched_allocation_over_the_quota_once_its_pitch_is_known_is_undone() {
    let k = kit("alloc-pitch-over", 3 * MIB);
    let d = k.t.device(0).unwrap();
    let request = crate::accounting::sizes::Pitch {
        width: 1024,
        height: 1024,
        element: 4,
    };
    let freed = std::cell::Cell::new(false);
    let r = k.t.alloc_pitch(
        d,
        request,
        || Ok((0x1000, Some(4096))),
        |_| {
            freed.set(true);
            Ok(())
        },
    );
    assert_eq!(r, Err(CUerror::OUT_OF_MEMORY));
    assert!(freed.get());
    assert_eq!(k.used(0), 0);
}
