//! Module code charged up front (`accounting::up_front`): with room and an agreeing last reading,
//! a load is charged its image's pages without a lock or a reading, every few operations are
//! verified by one reading, and near the quota every load is measured.

use super::{kit, Kit, MIB};
use crate::accounting::overhead::Overhead;
use crate::accounting::up_front::{MARGIN, VERIFY_EVERY};
use crate::driver::fake::{listed, Call};
use gpuslice_api::image::Code;
use gpuslice_api::types::CUcontext;
use gpuslice_api::CUerror;
use std::cell::Cell;

const GIB: u64 = 1 << 30;
const PAGE: u64 = 2 * MIB;
const CONTEXT: u64 = 300 * MIB;

fn readings(k: &Kit) -> usize {
    let calls = k.fake.calls();
    calls.iter().filter(|&c| *c == Call::MemorySample).count()
}

/// A tenant limited to `limit` whose context (300 MiB) was measured and reconciled: the ledger
/// agrees with the driver's figure.
fn agreed(tag: &str, limit: u64) -> Kit {
    let k = kit(tag, limit);
    k.fake.push_samples([listed(0, GIB), listed(CONTEXT, GIB)]);
    let d = k.t.device(0).unwrap();
    k.t.create_context(d, || Ok(0x200 as CUcontext), |_| {})
        .unwrap();
    assert_eq!(k.used(0), CONTEXT);
    k.fake.clear_calls();
    k
}

/// Loads module `handle`, one kernel of `bytes`, eagerly; `undone` notes an undo.
fn load(k: &Kit, handle: usize, bytes: u64, undone: &Cell<bool>) -> Result<(), CUerror> {
    let d = k.t.device(0).unwrap();
    let code = Code {
        data: 0,
        kernels: vec![(b"k".to_vec(), bytes)],
    };
    k.t.load_code_object(
        d,
        Overhead::Module,
        (bytes, code),
        || Ok(handle),
        |h| h,
        |_| undone.set(true),
    )
}

/// With room, loads are charged their pages without a reading; the `VERIFY_EVERY`-th reads the
/// process's figure once, and what the driver spent beyond the images is charged then; a reading
/// that finds less than was charged makes the next load measured again.
#[test]
fn module_code_is_charged_up_front_and_verified_every_few_operations() {
    let k = agreed("upfront-verify", 4 * GIB);
    let undone = Cell::new(false);
    let n = u64::from(VERIFY_EVERY);
    for i in 1..n {
        load(&k, 0x1000 + i as usize, MIB, &undone).unwrap();
    }
    assert_eq!(readings(&k), 0, "{:?}", k.fake.calls());
    assert_eq!(k.used(0), CONTEXT + (n - 1) * PAGE);
    // The driver spent 4 MiB beyond the images: the verifying reading charges it.
    k.fake
        .with(|s| s.samples = [listed(CONTEXT + n * PAGE + 4 * MIB, GIB)].into());
    load(&k, 0x1000, MIB, &undone).unwrap();
    assert_eq!(readings(&k), 1, "{:?}", k.fake.calls());
    assert_eq!(k.used(0), CONTEXT + n * PAGE + 4 * MIB);
    // It agrees again: the next load is charged up front.
    k.fake.clear_calls();
    load(&k, 0x2000, MIB, &undone).unwrap();
    assert_eq!(readings(&k), 0);
    assert_eq!(k.used(0), CONTEXT + (n + 1) * PAGE + 4 * MIB);
    // An unload returns the module's pages without a reading.
    k.t.unload_code_object(Overhead::Module, 0x2000);
    assert_eq!(readings(&k), 0);
    assert_eq!(k.used(0), CONTEXT + n * PAGE + 4 * MIB);
    // A reading finding less than charged (the images over-estimated): not agreeing, so the next
    // load is measured, read before and after, and charged what it cost.
    k.fake
        .with(|s| s.samples = [listed(CONTEXT + n * PAGE - 6 * MIB, GIB)].into());
    k.t.reconcile_device(k.t.device(0).unwrap());
    k.fake.with(|s| {
        s.calls.clear();
        s.samples = [
            listed(CONTEXT + n * PAGE - 6 * MIB, GIB),
            listed(CONTEXT + n * PAGE - 4 * MIB, GIB),
        ]
        .into();
    });
    load(&k, 0x3000, MIB, &undone).unwrap();
    assert_eq!(readings(&k), 2, "{:?}", k.fake.calls());
    assert_eq!(k.t.overhead_of(Overhead::Module, 0x3000), PAGE);
    // Unloaded while not agreeing: reconciled from a reading.
    k.fake.clear_calls();
    k.t.unload_code_object(Overhead::Module, 0x3000);
    assert_eq!(readings(&k), 1);
    assert!(!undone.get());
}

/// Near the quota (less than `MARGIN` left beyond the load) a load is measured: one reading after
/// it, and a driver spending beyond the room makes it undone and refused.
#[test]
fn near_the_quota_module_loads_are_measured() {
    let k = agreed("upfront-near", CONTEXT + MARGIN + MIB);
    let undone = Cell::new(false);
    k.fake
        .with(|s| s.samples = [listed(CONTEXT + PAGE, GIB)].into());
    load(&k, 0x1000, MIB, &undone).unwrap();
    assert_eq!(readings(&k), 1, "measured: {:?}", k.fake.calls());
    assert_eq!(k.used(0), CONTEXT + PAGE);
    // Spending far beyond the image with no room for it: undone and refused.
    k.fake.with(|s| {
        s.calls.clear();
        s.samples = [listed(CONTEXT + PAGE + 2 * MARGIN, GIB)].into();
    });
    assert!(load(&k, 0x2000, MIB, &undone).is_err());
    assert!(undone.get());
    assert_eq!(k.used(0), CONTEXT + PAGE);
}

/// A lazily loaded module loads nothing at its load: charged nothing, without a reading; its
/// kernel's lookup is charged the kernel's pages up front.
#[test]
fn a_lazy_load_and_its_lookup_are_charged_up_front() {
    let k = agreed("upfront-lazy", 4 * GIB);
    k.fake.with(|s| {
        s.lazy = true;
        s.current = Some(0x200);
        s.contexts.insert(0x200, 0);
    });
    let undone = Cell::new(false);
    load(&k, 0x1000, 3 * MIB, &undone).unwrap();
    assert_eq!(k.used(0), CONTEXT);
    k.t.load_lazy_code(Overhead::Module, 0x1000, b"k", || Ok(()))
        .unwrap();
    assert_eq!(readings(&k), 0, "{:?}", k.fake.calls());
    assert_eq!(k.used(0), CONTEXT + 2 * PAGE);
    assert_eq!(k.t.overhead_of(Overhead::Module, 0x1000), 2 * PAGE);
}
