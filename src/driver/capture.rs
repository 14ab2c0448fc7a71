//! Stream capture as the shim's own driver calls must respect it: no event of ours recorded into a
//! capturing stream, no query of ours counted as an "unsafe call" against another thread's
//! global-mode capture. Both checks cost driver calls (`cuStreamIsCapturing`, two
//! `cuThreadExchangeStreamCaptureMode`), so they are made only once the process has begun a capture.
//!
//! Every capture-begin entry point of the API table is hooked (`hooks::capture`) to call
//! [`capture_begins`] before the real begin; a capture begun through a `cuGetProcAddress` pointer
//! reaches the same hooks (the table answers with them). Until then no stream of the process can be
//! capturing (a stream joins a capture only by waiting on work of a stream already capturing), so
//! [`capturing`] answers without a call, and [`RelaxedCapture::when_needed`] leaves the thread's mode
//! as it is.
//!
//! The race with a capture begun in another thread while one of our queries runs: a section of our
//! calls that did not relax the mode counts itself in `BARE` before it looks at the flag, and the
//! first begin sets the flag before it waits (bounded) for those sections to end. So either the
//! section sees the flag and relaxes the mode before its next call, or the capture begins after the
//! section's call returned (sequentially consistent accesses on both sides: Dekker's pattern).
//! Sections that sleep leave the count while they sleep (`RelaxedCapture::pause`), so the begin
//! waits for driver calls, never for a sleep. A fork child starts with no section (the fork step
//! [`fork_child`]); the flag it keeps only costs it the checks.

use super::real;
use gpuslice_api::types::CUstream;
use std::ffi::c_uint;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::time::{Duration, Instant};

/// `CU_STREAM_CAPTURE_MODE_RELAXED` (cuda.h).
const CAPTURE_MODE_RELAXED: c_uint = 2;

/// How long the first capture-begin waits at most for our sections to end (each is a few driver
/// calls; the bound only matters if a thread was stopped inside one).
const BEGIN_WAIT_MAX: Duration = Duration::from_millis(5);

/// Set (never cleared) before the process's first stream capture begins.
static BEGUN: AtomicBool = AtomicBool::new(false);

/// Sections of our driver calls running without the relaxed capture mode.
static BARE: AtomicUsize = AtomicUsize::new(0);

/// Whether this process has begun a stream capture (or may have: the flag is set before the real
/// begin). One relaxed load.
#[inline]
pub fn begun() -> bool {
    BEGUN.load(Relaxed)
}

/// Called by every capture-begin hook before the real begin: from now on our calls check for
/// capture. The first one waits (at most [`BEGIN_WAIT_MAX`]) until no section of ours runs
/// calls without the relaxed mode.
pub fn capture_begins() {
    if BEGUN.swap(true, SeqCst) {
        return;
    }
    let deadline = Instant::now() + BEGIN_WAIT_MAX;
    while BARE.load(SeqCst) != 0 && Instant::now() < deadline {
        std::thread::yield_now();
    }
}

/// The fork child's step: no thread of the parent's runs on in the child, nor its sections.
pub fn fork_child() {
    BARE.store(0, Relaxed);
}

/// Whether `stream` is being captured into a graph (work on it is recorded, not run): no driver
/// call before the process began a capture.
// The stream handle is opaque to us, only passed to the driver, which validates it.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn capturing(stream: CUstream, per_thread: bool) -> bool {
    if !begun() {
        return false;
    }
    let mut status: c_uint = 0;
    // SAFETY: `status` is a valid out-parameter; the stream is the caller's.
    let r = unsafe {
        if per_thread {
            real::cuStreamIsCapturing_ptsz(stream, &mut status)
        } else {
            real::cuStreamIsCapturing(stream, &mut status)
        }
    };
    r.is_ok() && status != 0
}

/// While alive, the calling thread's stream-capture interaction mode is RELAXED: event queries and
/// synchronisation we make from an application thread are not "potentially unsafe API calls" that
/// would invalidate another thread's `CU_STREAM_CAPTURE_MODE_GLOBAL` capture (cuda.h, documentation of
/// `cuThreadExchangeStreamCaptureMode`). The thread's own mode is restored on drop.
pub struct RelaxedCapture(Mode);

enum Mode {
    /// The mode we replaced (put back on drop); `None` when the exchange failed.
    Relaxed(Option<c_uint>),
    /// No capture had begun: counted in `BARE`, the mode untouched.
    Bare,
    /// Counted nowhere (a paused bare section), the mode untouched.
    Paused,
}

impl RelaxedCapture {
    /// Relaxes the mode now (two driver calls): for a thread of ours that lives long.
    pub fn enter() -> RelaxedCapture {
        RelaxedCapture(Mode::Relaxed(exchange()))
    }

    /// Relaxes the mode only if the process has begun a capture (otherwise no driver call): for a
    /// short section of calls on an application thread.
    pub fn when_needed() -> RelaxedCapture {
        let mut r = RelaxedCapture(Mode::Paused);
        r.resume();
        r
    }

    /// Runs `idle` (a sleep, no driver call of ours) outside the section, so that a capture
    /// beginning meanwhile does not wait for it; relaxes the mode after it if a capture began.
    pub fn pause<R>(&mut self, idle: impl FnOnce() -> R) -> R {
        if !matches!(self.0, Mode::Bare) {
            return idle();
        }
        BARE.fetch_sub(1, SeqCst);
        self.0 = Mode::Paused;
        let r = idle();
        self.resume();
        r
    }

    fn resume(&mut self) {
        if begun() {
            self.0 = Mode::Relaxed(exchange());
            return;
        }
        BARE.fetch_add(1, SeqCst);
        if BEGUN.load(SeqCst) {
            BARE.fetch_sub(1, SeqCst);
            self.0 = Mode::Relaxed(exchange());
        } else {
            self.0 = Mode::Bare;
        }
    }
}

/// Sets the thread's mode to RELAXED; the mode it replaced, if the driver answered.
fn exchange() -> Option<c_uint> {
    let mut mode = CAPTURE_MODE_RELAXED;
    // SAFETY: valid in/out parameter; only the calling thread's mode changes.
    let ok = unsafe { real::cuThreadExchangeStreamCaptureMode(&mut mode) }.is_ok();
    ok.then_some(mode)
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        match self.0 {
            Mode::Relaxed(Some(mut mode)) => {
                // SAFETY: as in `exchange`; puts back the mode we replaced.
                let _ = unsafe { real::cuThreadExchangeStreamCaptureMode(&mut mode) };
            }
            Mode::Bare => {
                BARE.fetch_sub(1, SeqCst);
            }
            Mode::Relaxed(None) | Mode::Paused => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the flag is process-wide and never cleared.
    #[test]
    fn checks_cost_nothing_until_a_capture_begins_and_a_begin_sees_every_bare_section() {
        assert!(!begun());
        // No capture: not capturing, without asking the driver.
        assert!(!capturing(std::ptr::null_mut(), false));
        let mut section = RelaxedCapture::when_needed();
        assert!(matches!(section.0, Mode::Bare));
        assert_eq!(BARE.load(SeqCst), 1);
        // A sleep leaves the count, and comes back to it.
        section.pause(|| assert_eq!(BARE.load(SeqCst), 0));
        assert_eq!(BARE.load(SeqCst), 1);
        // A begin meanwhile waits for the section (here: up to its bound, the section being ours).
        let t = Instant::now();
        capture_begins();
        assert!(begun());
        assert!(t.elapsed() >= BEGIN_WAIT_MAX);
        // After a begin the section relaxes the mode at its next resume, and new ones at once.
        section.pause(|| ());
        assert!(matches!(section.0, Mode::Relaxed(_)));
        drop(section);
        assert_eq!(BARE.load(SeqCst), 0);
        assert!(matches!(RelaxedCapture::when_needed().0, Mode::Relaxed(_)));
        // A second begin never waits, even with a section counted (one left by a thread that
        // forked: the child's step clears it).
        BARE.fetch_add(1, SeqCst);
        let t = Instant::now();
        capture_begins();
        assert!(t.elapsed() < BEGIN_WAIT_MAX);
        fork_child();
        assert_eq!(BARE.load(SeqCst), 0);
    }
}
