//! Local memory grown at a launch: charged per context (each context keeps its own local memory,
//! sized by the largest frame launched in it), by the difference a larger frame adds, given back
//! with the context; a launch that grows nothing is not charged.

use super::{kit, Kit, MIB};
use crate::accounting::first_launch::pending;
use crate::accounting::overhead::Overhead;
use gpuslice_api::types::CUcontext;
use gpuslice_api::CUerror;
use std::cell::Cell;

const GIB: u64 = 1 << 30;
/// One byte per resident thread of the fake device (132 multiprocessors x 2048 threads) is 264 KiB:
/// 1 KiB per thread is 264 MiB.
const KIB_PER_THREAD: u64 = 264 * MIB;
/// The default stack (1 KiB), as the function's frame is noted against.
const DEFAULT: u64 = 1024;

/// A device of 132 multiprocessors of 2048 resident threads, whose driver answers the default
/// stack whatever a launch grew (only the process's own record of each context tells).
fn device(k: &Kit) {
    k.fake.with(|s| {
        s.attributes.insert(16, 132);
        s.attributes.insert(39, 2048);
        s.limits.insert(0, DEFAULT as usize);
    });
}

/// Makes `ctx` (on device 0) current.
fn enter(k: &Kit, ctx: usize) {
    k.fake.with(|s| {
        s.contexts.insert(ctx, 0);
        s.current = Some(ctx);
    });
}

/// Creates context `ctx` on device 0 (charged the fallback: nothing is measured) and makes it
/// current.
fn create(k: &Kit, ctx: usize) {
    enter(k, ctx);
    let d = k.t.device(0).unwrap();
    k.t.create_context(d, || Ok(ctx as CUcontext), |_| {})
        .unwrap();
}

/// Launches `f` in the current context, counting the launches the driver saw.
fn launch(k: &Kit, f: usize, ran: &Cell<u32>) -> Result<(), CUerror> {
    k.t.launch_growing_local(f, || {
        ran.set(ran.get() + 1);
        Ok(())
    })
}

#[test]
fn each_context_is_charged_the_growth_of_its_own_local_memory() {
    let k = kit("local-contexts", 8 * GIB);
    device(&k);
    let (small, large) = (0x7f10_0001_0040usize, 0x7f10_0001_0080usize);
    k.t.local_frame_seen(small, 2 * DEFAULT, DEFAULT);
    k.t.local_frame_seen(large, 4 * DEFAULT, DEFAULT);
    let ran = Cell::new(0);
    let (one, two) = (0x7f10_0001_1000usize, 0x7f10_0001_2000usize);
    enter(&k, one);
    launch(&k, small, &ran).unwrap();
    assert_eq!(
        k.used(0),
        KIB_PER_THREAD,
        "the first context grew by 1 KiB a thread"
    );
    launch(&k, small, &ran).unwrap();
    assert_eq!(
        k.used(0),
        KIB_PER_THREAD,
        "a second launch there grows nothing"
    );
    enter(&k, two);
    launch(&k, small, &ran).unwrap();
    assert_eq!(
        k.used(0),
        2 * KIB_PER_THREAD,
        "the same function in a second context grows that context's local memory"
    );
    launch(&k, large, &ran).unwrap();
    assert_eq!(
        k.used(0),
        4 * KIB_PER_THREAD,
        "a larger frame is charged what it adds to the second context (2 KiB a thread)"
    );
    launch(&k, small, &ran).unwrap();
    assert_eq!(
        k.used(0),
        4 * KIB_PER_THREAD,
        "a smaller frame grows nothing"
    );
    assert_eq!(k.t.overhead_of(Overhead::Limits, two), 3 * KIB_PER_THREAD);
    assert_eq!(ran.get(), 5, "every launch ran");
    // Destroyed: its local memory goes with it, the first context's stays.
    k.t.forget_context(two);
    assert_eq!(k.used(0), KIB_PER_THREAD);
    // A later context given the same handle starts with the default stack again.
    enter(&k, two);
    launch(&k, small, &ran).unwrap();
    assert_eq!(k.used(0), 2 * KIB_PER_THREAD);
    k.t.forget_context(two);
    k.t.forget_context(one);
    assert_eq!(k.used(0), 0);
}

#[test]
fn a_primary_context_gives_its_local_memory_back_at_its_reset_and_last_release() {
    let k = kit("local-primary", 8 * GIB);
    device(&k);
    let f = 0x7f10_0002_0040usize;
    k.t.local_frame_seen(f, 2 * DEFAULT, DEFAULT);
    let primary = 0x7f10_0002_1000usize;
    enter(&k, primary);
    let retain = |k: &Kit| {
        let d = k.t.device(0).unwrap();
        k.t.primary_retain(d, || Ok(primary as CUcontext), |_| {})
            .unwrap();
    };
    let ran = Cell::new(0);
    retain(&k);
    let context = k.used(0);
    launch(&k, f, &ran).unwrap();
    assert_eq!(k.used(0), context + KIB_PER_THREAD);
    k.t.primary_release(0, true);
    assert_eq!(k.used(0), 0, "a reset destroys it with its local memory");
    assert_eq!(k.t.overhead_of(Overhead::Limits, primary), 0);
    retain(&k);
    launch(&k, f, &ran).unwrap();
    assert_eq!(
        k.used(0),
        context + KIB_PER_THREAD,
        "the primary context made again grows its local memory again"
    );
    k.t.primary_release(0, false);
    k.t.primary_release(0, false);
    assert_eq!(
        k.used(0),
        0,
        "its last release destroys it with its local memory"
    );
}

#[test]
fn a_launch_that_grows_nothing_is_not_charged() {
    let k = kit("local-nothing", 8 * GIB);
    device(&k);
    let (f, small) = (0x7f10_0003_0040usize, 0x7f10_0003_0080usize);
    k.t.local_frame_seen(f, 2 * DEFAULT, DEFAULT);
    k.t.local_frame_seen(small, DEFAULT / 2, DEFAULT);
    let ran = Cell::new(0);
    let (one, two) = (0x7f10_0003_1000usize, 0x7f10_0003_2000usize);
    // A frame within the default stack grows nothing.
    enter(&k, one);
    launch(&k, small, &ran).unwrap();
    assert_eq!(k.used(0), 0);
    // A context whose stack the program set at least as large as the frame (what `cuCtxSetLimit`
    // was charged for) grows nothing either.
    k.t.local_memory_holds(one, 4 * DEFAULT, true);
    launch(&k, f, &ran).unwrap();
    assert_eq!(k.used(0), 0);
    // Nor one whose stack the driver answers at least as large.
    enter(&k, two);
    k.fake.with(|s| s.limits.insert(0, 2 * DEFAULT as usize));
    launch(&k, f, &ran).unwrap();
    assert_eq!(k.used(0), 0);
    // The first context's stack lowered again: the frame grows it again.
    k.fake.with(|s| s.limits.insert(0, DEFAULT as usize));
    enter(&k, one);
    k.t.local_memory_holds(one, DEFAULT, true);
    launch(&k, f, &ran).unwrap();
    assert_eq!(k.used(0), KIB_PER_THREAD);
    assert_eq!(ran.get(), 4);
    k.t.forget_context(one);
    k.t.forget_context(two);
}

#[test]
fn a_growth_without_room_runs_nothing_and_the_next_launch_tries_again() {
    let k = kit("local-room", 600 * MIB);
    device(&k);
    let f = 0x7f10_0004_0040usize;
    k.t.local_frame_seen(f, 2 * DEFAULT, DEFAULT);
    let ctx = 0x7f10_0004_1000usize;
    enter(&k, ctx);
    let d = k.t.device(0).unwrap();
    let filler = k.t.reserve(d, 400 * MIB, "filler").unwrap().commit();
    let ran = Cell::new(0);
    assert_eq!(launch(&k, f, &ran), Err(CUerror::OUT_OF_MEMORY));
    assert_eq!(ran.get(), 0, "refused before the driver grew anything");
    assert_eq!(k.used(0), 400 * MIB);
    k.t.release(filler);
    launch(&k, f, &ran).unwrap();
    assert_eq!(ran.get(), 1);
    assert_eq!(k.used(0), KIB_PER_THREAD);
    k.t.forget_context(ctx);
}

/// The launch fast path (`first_launch::pending`) follows each context: a function is pending in
/// a context whose local memory does not hold its frame, and not in one that does.
#[test]
fn the_fast_path_is_taken_only_where_the_local_memory_holds_the_frame() {
    let k = kit("local-pending", 8 * GIB);
    device(&k);
    let (one, two) = (0x7f10_0005_1000usize, 0x7f10_0005_2000usize);
    create(&k, one);
    create(&k, two);
    let f = 0x7f10_0005_0040usize;
    k.t.local_frame_seen(f, 2 * DEFAULT, DEFAULT);
    assert!(pending(f, || one) && pending(f, || two));
    let ran = Cell::new(0);
    enter(&k, one);
    launch(&k, f, &ran).unwrap();
    assert!(!pending(f, || one), "grown in the first context");
    assert!(pending(f, || two), "not grown in the second");
    enter(&k, two);
    launch(&k, f, &ran).unwrap();
    assert!(!pending(f, || one) && !pending(f, || two));
    // A third context appears: pending there.
    let three = 0x7f10_0005_3000usize;
    create(&k, three);
    assert!(pending(f, || three) && !pending(f, || one));
    for c in [one, two, three] {
        k.t.forget_context(c);
    }
}
