//! Compute shares (docs/COMPUTE.md): the tenants of one GPU time-slice its kernel launches through a
//! device ledger, without a daemon.
//!
//! * [`arbiter`]: the pure logic (virtual time, token bucket, choice of the next owner), unit-tested;
//!   [`demand`]: who wants the device (contention from demand, not presence), unit-tested;
//!   [`meter`]: what an ownership is charged (work still running included), unit-tested;
//!   [`evidence`]: what a process owes and is owed by its own clock, whatever the shared words
//!   say (a forged owner word), unit-tested.
//! * [`device`]: the shared file (layout and encodings in [`shm`]), its arbitration lock, tenants,
//!   slots, liveness; with [`arbiter`] and [`policy`], in the shared-state crate
//!   (`gpuslice_state::compute`), re-exported here. Every word read from it is untrusted.
//! * The process's side: [`runtime`] (the devices the process may take part on, one participation
//!   per device it launches on, its fork and exit steps; configuration and identity come from the
//!   process runtime, `crate::process`), `gate` (a launch waits for its device's
//!   ownership; `watch`: how long a waiter sleeps, the scheduler thread looking at the owner for
//!   it; `liveness`: a waiter's published words and a stopped owner revoked; `peers`:
//!   launches passed for a collective), `owner` (the scheduler thread that ends slices and hands the device over; `refresh`: its
//!   look at the ledger and at stalls), `events`
//!   (device time measured with events, a batch of launches at a time), `completions` (what
//!   becomes of measured batches: flow-control waits, accounting, the charge, the drain; its
//!   pauses in `drain`, unit-tested; `priority`: what a launch keeps in flight and one event
//!   measures by priority class, a high-priority owner's stall time, unit-tested). `cu`: the
//!   driver calls, through the driver layer.

mod batch;
mod cu;
pub mod demand;
mod drain;
mod flow;
pub mod meter;
mod participation;
mod priority;
pub mod turn;
mod watch;

pub use participation::{evidence, runtime};

// The device ledger, its layout, arbitration lock and policy overlay live in the shared-state crate
// (the tools use them too); they are named here as before.
pub use gpuslice_state::compute::{
    arbiter, device, device_dir, incident, policy, shm, Holder, Incident, PriorityClass, TenantId,
    MAX_SLOTS, MAX_TENANTS,
};

use gpuslice_api::types::{CUcontext, CUdevice, CUstream};
use gpuslice_api::CUresult;
use std::sync::atomic::Ordering::*;

pub use crate::config::DEFAULT_DEVICE_DIR;

/// Whether a launch may go straight to the driver: nothing this process launches on is contended
/// (or it takes no part in compute sharing). The launch hooks' fast path: one atomic load, and the
/// launch noted for the scheduler threads (what tells neighbours that this process wants the
/// device, `demand`): a load of a line that stays shared, and a store only on the first launch
/// after a scheduler thread's refresh took the note.
#[inline(always)]
pub fn launch_passes() -> bool {
    let launched = &runtime::LAUNCHED.0;
    if !launched.load(Relaxed) {
        launched.store(true, Relaxed);
    }
    runtime::PASS.load(Relaxed)
}

/// Runs `wait`, a host call that blocks until this process's own queued work has run (stream or
/// context synchronisation). While a thread is in one, the process counts as active at its scheduler
/// threads' refreshes (`demand`): a program that queues deep and then waits (every training loop
/// that reads a loss) launches in few demand windows, yet its queue keeps the device busy
/// throughout, and a neighbour must see it want the device. Two relaxed atomic adds; not on the
/// launch path.
pub fn host_wait<R>(wait: impl FnOnce() -> R) -> R {
    struct Waiting;
    impl Drop for Waiting {
        fn drop(&mut self) {
            runtime::HOST_WAITS.fetch_sub(1, Relaxed);
        }
    }
    runtime::HOST_WAITS.fetch_add(1, Relaxed);
    let _waiting = Waiting;
    wait()
}

/// Gates a launch on `streams` (`per_thread`: the `_ptsz` variant) by the device of the first
/// stream's context: on a contended device only its owner's launches reach the driver.
pub fn gate(streams: &[CUstream], per_thread: bool, launch: impl FnOnce() -> CUresult) -> CUresult {
    match runtime::participation(streams.first().copied().unwrap_or(std::ptr::null_mut())) {
        Some((sched, ctx)) => sched.gate(streams, ctx, per_thread, launch),
        None => launch(),
    }
}

/// The program retained device `dev`'s primary context: its handle, for [`primary_resetting`] and
/// [`primary_released`].
pub fn primary_retained(dev: CUdevice, ctx: CUcontext) {
    runtime::primary_retained(dev, ctx);
}

/// Context `ctx` is about to be destroyed (`cuCtxDestroy`): the scheduler lets go of its events
/// there. A driver hands a destroyed context's handles out again, to the next context or event
/// created: an event of ours kept past its context could be a new one of the program's, whose
/// timestamps our records would then move.
pub fn context_ending(ctx: CUcontext) {
    runtime::each_sched(|s| s.forget_context(ctx as usize, true));
}

/// Device `dev`'s primary context is about to be reset (`cuDevicePrimaryCtxReset`): as
/// [`context_ending`].
pub fn primary_resetting(dev: CUdevice) {
    if let Some(ctx) = runtime::primary_of(dev) {
        runtime::each_sched(|s| s.forget_context(ctx, true));
    }
}

/// A reference to device `dev`'s primary context was released: when it was the last, the context
/// is gone, and the scheduler lets go of its events (as [`context_ending`], after the fact).
pub fn primary_released(dev: CUdevice) {
    let Some(ctx) = runtime::primary_of(dev) else {
        return;
    };
    if !runtime::participating() {
        return;
    }
    if cu::primary_context_active(dev) == Some(false) {
        runtime::each_sched(|s| s.forget_context(ctx, false));
    }
}

#[test]
fn a_process_without_a_slot_is_held_to_its_share() {
    assert_eq!(runtime::throttle_cap(10, 0), Some(10));
    assert_eq!(runtime::throttle_cap(30, 20), Some(20));
    assert_eq!(runtime::throttle_cap(30, 50), Some(30));
    assert_eq!(runtime::throttle_cap(0, 0), Some(1));
    assert_eq!(runtime::throttle_cap(100, 0), None);
    assert_eq!(runtime::throttle_cap(100, 40), Some(40));
}
