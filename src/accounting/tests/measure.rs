//! Driver overhead: contexts and modules charged what the driver spent, measured around the
//! operation, bounded by what it can cost.

use super::{kit, kit_with, Kit, MIB, UUID};
use crate::accounting::measurement::{Expected, Measurement};
use crate::accounting::overhead::Overhead;
use crate::config::DEFAULT_CONTEXT_RESERVE as FALLBACK;
use crate::driver::fake::{device_only, listed, Call};
use crate::driver::measure::ProcessFigure;
use crate::driver::seam::MemorySample;
use gpuslice_api::types::CUcontext;
use gpuslice_api::CUerror;
use std::cell::Cell;

const GIB: u64 = 1 << 30;

fn ctx(n: usize) -> CUcontext {
    n as CUcontext
}

/// Creates context `n` on device 0; `undone` notes an undo.
fn create(k: &Kit, n: usize, undone: &Cell<bool>) -> Result<(), CUerror> {
    let d = k.t.device(0).unwrap();
    k.t.create_context(d, || Ok(ctx(n)), |_| undone.set(true))
}

#[test]
fn a_context_is_charged_what_the_driver_lists_this_process_as_spending() {
    let k = kit("measure-process", 4 * GIB);
    k.fake
        .push_samples([listed(0, GIB), listed(300 * MIB, GIB + 900 * MIB)]);
    create(&k, 0x200, &Cell::new(false)).unwrap();
    // The process figure is exact: the device's (which moved with others) is not used.
    assert_eq!(k.used(0), 300 * MIB);
}

/// Before this process's first context on a device (nothing charged there, the driver's PID
/// namespace) NVML's process list is not read: it does not list the process. After it, one reading
/// serves both the measurement and the reconciliation. A second context reads the list before too.
#[test]
fn the_first_context_reads_the_process_list_once() {
    let k = kit("measure-first-once", 4 * GIB);
    k.fake
        .push_samples([listed(0, GIB), listed(300 * MIB, GIB + 300 * MIB)]);
    create(&k, 0x200, &Cell::new(false)).unwrap();
    assert_eq!(k.used(0), 300 * MIB);
    let calls = k.fake.calls();
    let count = |c: Call| calls.iter().filter(|&x| *x == c).count();
    assert_eq!(
        (count(Call::DeviceUsed), count(Call::MemorySample)),
        (1, 1),
        "{calls:?}"
    );
    k.fake.with(|s| {
        s.calls.clear();
        s.samples = [listed(300 * MIB, GIB), listed(600 * MIB, GIB)].into();
    });
    create(&k, 0x201, &Cell::new(false)).unwrap();
    assert_eq!(k.used(0), 600 * MIB);
    let calls = k.fake.calls();
    let count = |c: Call| calls.iter().filter(|&x| *x == c).count();
    assert_eq!(
        (count(Call::DeviceUsed), count(Call::MemorySample)),
        (0, 2),
        "{calls:?}"
    );
}

/// In another PID namespace the process list is read before the first context too: it finds the
/// PID the driver lists this process under.
#[test]
fn in_another_pid_namespace_the_first_context_reads_the_list_before() {
    let k = kit("measure-first-ns", 4 * GIB);
    k.fake.with(|s| s.pid_unknown = true);
    create(&k, 0x200, &Cell::new(false)).unwrap();
    assert!(!k.fake.calls().contains(&Call::DeviceUsed));
}

#[test]
fn a_context_measured_from_the_device_is_bounded_by_what_it_can_cost() {
    let k = kit("measure-neighbour", 4 * GIB);
    k.fake
        .push_samples([device_only(GIB), device_only(GIB + 3 * FALLBACK)]);
    create(&k, 0x200, &Cell::new(false)).unwrap();
    assert_eq!(
        k.used(0),
        FALLBACK,
        "a neighbour's allocation is not charged"
    );
}

#[test]
fn a_context_measured_from_the_device_within_bounds_is_charged_the_change() {
    let k = kit("measure-device", 4 * GIB);
    k.fake
        .push_samples([device_only(GIB), device_only(GIB + 200 * MIB)]);
    create(&k, 0x200, &Cell::new(false)).unwrap();
    assert_eq!(k.used(0), 200 * MIB);
}

#[test]
fn a_new_context_that_measures_negative_is_charged_the_estimate() {
    let k = kit("measure-negative", 4 * GIB);
    k.fake
        .push_samples([device_only(2 * GIB), device_only(GIB)]);
    create(&k, 0x200, &Cell::new(false)).unwrap();
    assert_eq!(k.used(0), FALLBACK);
}

#[test]
fn a_context_nothing_can_measure_is_charged_the_estimate() {
    let k = kit("measure-nothing", 4 * GIB);
    create(&k, 0x200, &Cell::new(false)).unwrap();
    assert_eq!(k.used(0), FALLBACK);
}

#[test]
fn an_explicit_context_reserve_is_charged_and_never_measured() {
    let k = kit_with(
        "measure-explicit",
        4 * GIB,
        &[UUID],
        &[("GPUSLICE_CONTEXT_RESERVE", "64MiB")],
    );
    k.fake
        .push_samples([listed(0, GIB), listed(300 * MIB, GIB + 300 * MIB)]);
    create(&k, 0x200, &Cell::new(false)).unwrap();
    assert_eq!(k.used(0), 64 * MIB);
    assert!(!k.fake.calls().contains(&Call::MemorySample));
}

#[test]
fn a_context_the_quota_has_no_room_for_is_undone_and_refused() {
    let k = kit("measure-undo", 200 * MIB);
    k.fake
        .push_samples([listed(0, GIB), listed(300 * MIB, GIB + 300 * MIB)]);
    let undone = Cell::new(false);
    assert_eq!(create(&k, 0x200, &undone), Err(CUerror::OUT_OF_MEMORY));
    assert!(undone.get());
    assert_eq!(k.used(0), 0);
}

#[test]
fn a_second_context_reserves_what_the_first_cost_before_the_driver_is_asked() {
    let k = kit("measure-expected", 500 * MIB);
    k.fake
        .push_samples([listed(0, GIB), listed(300 * MIB, GIB)]);
    create(&k, 0x200, &Cell::new(false)).unwrap();
    assert_eq!(k.used(0), 300 * MIB);
    // 200 MiB left: a context expected to cost 300 MiB is refused before the driver is asked.
    let asked = Cell::new(false);
    let d = k.t.device(0).unwrap();
    let r = k.t.create_context(
        d,
        || {
            asked.set(true);
            Ok(ctx(0x201))
        },
        |_| {},
    );
    assert_eq!(r, Err(CUerror::OUT_OF_MEMORY));
    assert!(!asked.get(), "refused before the driver spent anything");
    assert_eq!(k.used(0), 300 * MIB);
}

#[test]
fn a_destroyed_context_returns_its_charge_and_its_modules() {
    let k = kit("measure-forget", 4 * GIB);
    k.fake
        .push_samples([listed(0, GIB), listed(300 * MIB, GIB)]);
    create(&k, 0x200, &Cell::new(false)).unwrap();
    let module =
        k.t.reserve(k.t.device(0).unwrap(), 8 * MIB, "module")
            .unwrap();
    k.t.record_overhead(Overhead::Module, 0x300, 0x200, module.commit());
    assert_eq!(k.used(0), 308 * MIB);
    k.fake.with(|s| s.samples = [listed(0, GIB)].into());
    k.t.forget_context(0x200);
    assert_eq!(k.used(0), 0);
    assert_eq!(k.t.overhead_of(Overhead::Module, 0x300), 0);
}

#[test]
fn an_operation_that_cannot_be_undone_keeps_what_was_reserved() {
    let k = kit("measure-no-undo", 20 * MIB);
    k.fake.push_samples([listed(0, GIB), listed(50 * MIB, GIB)]);
    let d = k.t.device(0).unwrap();
    let m = Measurement::new("kernel load", 10 * MIB, Expected::Known(10 * MIB));
    let ((), charge) =
        k.t.charge_measured(d, &m, || Ok(()), None::<fn(())>)
            .unwrap();
    assert_eq!(charge.bytes, 10 * MIB);
    assert_eq!(k.used(0), 10 * MIB);
}

#[test]
fn a_documented_floor_is_charged_even_when_nothing_is_measured() {
    let k = kit("measure-floor", 4 * GIB);
    k.fake.push_samples([listed(0, GIB), listed(0, GIB)]);
    let d = k.t.device(0).unwrap();
    let m = Measurement {
        floor: Some(8 * i128::from(MIB)),
        ..Measurement::new("cuCtxSetLimit", 8 * MIB, Expected::Known(0))
    };
    let ((), charge) =
        k.t.charge_measured(d, &m, || Ok(()), Some(|()| {}))
            .unwrap();
    assert_eq!(charge.bytes, 8 * MIB);
    assert_eq!(k.used(0), 8 * MIB);
}

#[test]
fn a_limit_lowered_again_gives_its_charge_back() {
    let k = kit("measure-lowered", 4 * GIB);
    let d = k.t.device(0).unwrap();
    let raised = k.t.reserve(d, 8 * MIB, "limit").unwrap().commit();
    k.t.record_overhead(Overhead::Limits, 0x100, 0x100, raised);
    k.fake
        .push_samples([listed(8 * MIB, GIB), listed(0, GIB - 8 * MIB)]);
    let m = Measurement {
        floor: Some(-8 * i128::from(MIB)),
        current: raised.bytes,
        ..Measurement::new("cuCtxSetLimit", 0, Expected::Known(0))
    };
    let ((), charge) =
        k.t.charge_measured(d, &m, || Ok(()), Some(|()| {}))
            .unwrap();
    assert_eq!(charge.bytes, 0);
    assert_eq!(k.used(0), 0);
}

#[test]
fn in_another_pid_namespace_the_one_newcomer_is_this_process() {
    let k = kit("measure-newcomer", 4 * GIB);
    k.fake.with(|s| s.pid_unknown = true);
    let sample = |list: Vec<(u32, u64)>| MemorySample {
        process: ProcessFigure::Unavailable,
        device: Some(GIB),
        listed: Some(list),
    };
    k.fake.push_samples([
        sample(vec![(10, 5 * MIB)]),
        sample(vec![(10, 5 * MIB), (77, 300 * MIB)]),
    ]);
    create(&k, 0x200, &Cell::new(false)).unwrap();
    assert_eq!(k.fake.with(|s| s.identified_pid), Some(77));
    assert_eq!(k.used(0), 300 * MIB);
}

#[test]
fn several_newcomers_bound_what_the_device_figure_may_charge() {
    let k = kit("measure-newcomers", 4 * GIB);
    k.fake.with(|s| s.pid_unknown = true);
    let sample = |device: u64, list: Vec<(u32, u64)>| MemorySample {
        process: ProcessFigure::Unavailable,
        device: Some(device),
        listed: Some(list),
    };
    k.fake.push_samples([
        sample(GIB, vec![]),
        sample(GIB + 400 * MIB, vec![(77, 100 * MIB), (78, 50 * MIB)]),
    ]);
    create(&k, 0x200, &Cell::new(false)).unwrap();
    assert_eq!(k.fake.with(|s| s.identified_pid), None);
    assert_eq!(
        k.used(0),
        100 * MIB,
        "no more than the largest newcomer holds"
    );
}

#[test]
fn reconciliation_charges_what_the_driver_holds_beyond_the_records() {
    let k = kit("measure-reconcile", 4 * GIB);
    k.fake
        .push_samples([listed(0, GIB), listed(300 * MIB, GIB)]);
    create(&k, 0x200, &Cell::new(false)).unwrap();
    // Later the driver lists 40 MiB more (code loaded at a first launch, say).
    k.fake.with(|s| s.samples = [listed(340 * MIB, GIB)].into());
    k.t.reconcile_device(k.t.device(0).unwrap());
    assert_eq!(k.used(0), 340 * MIB);
    // And gives it back when the driver holds less again (never below the records).
    k.fake.with(|s| s.samples = [listed(100 * MIB, GIB)].into());
    k.t.reconcile_device(k.t.device(0).unwrap());
    assert_eq!(k.used(0), 300 * MIB);
}

/// Once a reconciliation left the ledger agreeing with the driver's figure, a new object of known
/// cost is measured from one reading after it: the figure before is what the process has charged.
/// A surplus (the records charge more than the driver holds) makes the next one read both again.
#[test]
fn a_known_cost_after_an_agreeing_reconciliation_is_measured_from_one_reading() {
    let k = kit("measure-settled", 4 * GIB);
    k.fake
        .push_samples([listed(0, GIB), listed(300 * MIB, GIB)]);
    create(&k, 0x200, &Cell::new(false)).unwrap();
    assert_eq!(k.used(0), 300 * MIB);
    let d = k.t.device(0).unwrap();
    let count = || {
        let calls = k.fake.calls();
        calls.iter().filter(|&x| *x == Call::MemorySample).count()
    };
    let load = |expected: u64| {
        let m = Measurement::new("module load", expected, Expected::Known(expected));
        k.t.charge_measured(d, &m, || Ok(()), Some(|()| {}))
            .unwrap()
            .1
    };
    // The driver spends 6 MiB where 4 MiB were expected: charged what it spent.
    k.fake.with(|s| {
        s.calls.clear();
        s.samples = [listed(306 * MIB, GIB)].into();
    });
    assert_eq!(load(4 * MIB).bytes, 6 * MIB);
    assert_eq!(count(), 1, "one reading, after the load");
    assert_eq!(k.used(0), 306 * MIB);
    // A surplus: the driver holds 10 MiB less than charged. Reconciled, it does not agree...
    k.fake.with(|s| s.samples = [listed(296 * MIB, GIB)].into());
    k.t.reconcile_device(d);
    // ...so the next load reads the figure before it again.
    k.fake.with(|s| {
        s.calls.clear();
        s.samples = [listed(296 * MIB, GIB), listed(298 * MIB, GIB)].into();
    });
    assert_eq!(load(2 * MIB).bytes, 2 * MIB);
    assert_eq!(count(), 2, "read before and after");
}
