//! `SIMGPU_LAUNCH_STATS=1`: what simgpu's own code costs the launching thread in a launch, and how
//! often a launch finds its stream's worker thread asleep (and so wakes it with a futex), printed
//! to stderr at exit. A diagnostic for benchmarks of host time per launch (docs/BENCHMARKS.md): a
//! GPU's launch writes a command into a ring buffer and rings a doorbell, whether or not the device
//! is idle; simgpu's wakes a host thread when it sleeps, which a launch's figure must not hide.
//! The CPU time counted is the body's only, not the spin that makes a call take its host cost
//! (`cost.rs`).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

static LAUNCHES: AtomicU64 = AtomicU64::new(0);
static WOKE: AtomicU64 = AtomicU64::new(0);
static BODY_NS: AtomicU64 = AtomicU64::new(0);
static BODY_WOKE_NS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The launch under way on this thread found its stream's worker asleep.
    static WOKE_WORKER: Cell<bool> = const { Cell::new(false) };
}

fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let on = std::env::var("SIMGPU_LAUNCH_STATS").is_ok_and(|v| v == "1");
        if on {
            // SAFETY: registers a plain function that only reads atomics and writes to stderr.
            unsafe { libc::atexit(report) };
        }
        on
    })
}

fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    (t.tv_sec as u64).saturating_mul(1_000_000_000) + t.tv_nsec as u64
}

/// A call's body under way: counted by [`Timing::end`] when it is a kernel launch and the
/// statistics are on.
pub(crate) struct Timing(Option<u64>);

#[inline]
pub(crate) fn start(name: &str) -> Timing {
    if !name.starts_with("cuLaunchKernel") || !enabled() {
        return Timing(None);
    }
    WOKE_WORKER.with(|w| w.set(false));
    Timing(Some(thread_cpu_ns()))
}

impl Timing {
    #[inline]
    pub(crate) fn end(self) {
        let Some(t0) = self.0 else {
            return;
        };
        let ns = thread_cpu_ns().saturating_sub(t0);
        LAUNCHES.fetch_add(1, Relaxed);
        BODY_NS.fetch_add(ns, Relaxed);
        if WOKE_WORKER.with(|w| w.get()) {
            WOKE.fetch_add(1, Relaxed);
            BODY_WOKE_NS.fetch_add(ns, Relaxed);
        }
    }
}

/// A submission on this thread found its stream's worker asleep (it is woken).
pub(crate) fn worker_woken() {
    if enabled() {
        WOKE_WORKER.with(|w| w.set(true));
    }
}

extern "C" fn report() {
    eprintln!(
        "{}",
        summary(
            LAUNCHES.load(Relaxed),
            WOKE.load(Relaxed),
            BODY_NS.load(Relaxed),
            BODY_WOKE_NS.load(Relaxed)
        )
    );
}

/// The line printed at exit: launches, those that woke their stream's worker, and the mean CPU
/// time of a launch's body: all, those that woke the worker, the others.
fn summary(n: u64, woke: u64, body: u64, body_woke: u64) -> String {
    let woke = woke.min(n);
    let body_woke = body_woke.min(body);
    format!(
        "simgpu: launch stats: launches={n} woke_worker={woke} body_cpu_ns={} \
         body_cpu_ns_woke={} body_cpu_ns_not_woke={}",
        body / n.max(1),
        body_woke / woke.max(1),
        (body - body_woke) / (n - woke).max(1)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_splits_launches_by_whether_they_woke_the_worker() {
        assert_eq!(
            summary(4, 1, 10_000, 4_000),
            "simgpu: launch stats: launches=4 woke_worker=1 body_cpu_ns=2500 \
             body_cpu_ns_woke=4000 body_cpu_ns_not_woke=2000"
        );
        assert_eq!(
            summary(0, 0, 0, 0),
            "simgpu: launch stats: launches=0 woke_worker=0 body_cpu_ns=0 \
             body_cpu_ns_woke=0 body_cpu_ns_not_woke=0"
        );
    }

    #[test]
    fn only_launches_are_timed() {
        assert!(start("cuEventRecord").0.is_none());
    }
}
