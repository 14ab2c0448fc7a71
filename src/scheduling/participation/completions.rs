//! What becomes of our measured batches once they are submitted (docs/COMPUTE.md, "Measuring device
//! time" and "Flow control"): a flow-control wait for one of them (bounded), their completions
//! accounted (device time, the launch-length estimate, the event overhead), a destroyed context's
//! events let go of, the charge of an ownership, and the drain at a hand-over (its pauses:
//! `drain.rs`).

use super::events::{query, State, Tracked};
use super::runtime;
use super::Sched;
use crate::scheduling::arbiter::DRAIN_LIMIT_NS;
use crate::scheduling::cu;
use crate::scheduling::device::now_ns;
use crate::scheduling::drain;
use crate::scheduling::flow::{self, Next, OwnedClock, StreamKey};
use crate::scheduling::meter::{self, Reading};
use crate::scheduling::turn::{self, Completion};
use gpuslice_api::types::CUevent;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::*;
use std::time::Duration;

/// How a flow-control wait ended.
pub(in crate::scheduling) enum Waited {
    /// The launch waited for completed (accounted).
    Completed,
    /// It completed nothing for the bound while we owned the device: the new launch goes through.
    Pass,
    /// We do not own the device (or it is no longer contended): the new launch goes back to the gate.
    Regrant,
}

impl Sched {
    /// Waits for a tracked launch `t` taken off the queue by flow control (when [`Sched::teardowns`]
    /// read `teardowns`), and accounts it when it completes. Bounded (`flow`): past
    /// [`flow::WaitBound::limit_ns`] of owned time without `t` completing, or as long without
    /// owning the device, `t` goes back to the queue's front and the wait ends without it.
    pub(in crate::scheduling) fn wait_bounded(
        &self,
        t: Tracked,
        teardowns: u64,
        behind: u32,
        mut relaxed: Option<&mut cu::RelaxedCapture>,
    ) -> Waited {
        let limit = self.wait_bound.lock().limit_ns();
        let mut clock = OwnedClock::start(now_ns());
        // Looked at once at once (the batch may have completed long ago: completions are only
        // looked at when needed), then after a part of its estimated work, doubling up to half
        // the work queued behind it (`behind` launches: a late look leaves the device busy).
        let launch_ns = self.launch_ns.load(Relaxed);
        let most = flow::poll_max_ns(behind, launch_ns);
        let mut pause = flow::first_poll_ns(t.launches, launch_ns).min(most);
        loop {
            let state = query(&t.end);
            if !matches!(state, State::Running) {
                if !t.calibration {
                    self.wait_bound.lock().completed_after(clock.owned_ns());
                    self.last_completion_ns.store(now_ns(), Release);
                }
                self.completed_launch(t, matches!(state, State::Gone), teardowns);
                return Waited::Completed;
            }
            let next = if !self.contended() || runtime::stopped() {
                Next::Regrant
            } else {
                // Paced launches go through without ownership: their time counts as owned.
                clock.step(now_ns(), self.may_launch() || self.evidence.paced(), limit)
            };
            if next != Next::Wait {
                if next == Next::Pass {
                    crate::log::debug(format_args!(
                        "compute: device {}: a launch passes flow control: the launch it waited for completed nothing in {} ms of ownership",
                        self.ordinal,
                        clock.owned_ns() / 1_000_000
                    ));
                }
                let mut f = self.inflight.lock();
                // Unless its context was let go of meanwhile (its events may be someone else's).
                if self.teardowns.load(Acquire) == teardowns {
                    f.push_front(t);
                }
                return if next == Next::Pass {
                    Waited::Pass
                } else {
                    Waited::Regrant
                };
            }
            let sleep = || std::thread::sleep(Duration::from_nanos(pause));
            // A capture beginning meanwhile does not wait for our sleep.
            match relaxed.as_deref_mut() {
                Some(r) => r.pause(sleep),
                None => sleep(),
            }
            pause = (pause * 2).min(most);
        }
    }

    /// Adds a completed launch's device time to what the next charge takes (or, for an empty pair,
    /// updates the event overhead), and recycles its events. Neither when they are gone, nor when
    /// a context was let go of since the launch was taken off the queue at `teardowns`: they may be
    /// that context's, their handles another event's (left to the driver, which frees a context's
    /// events with it).
    fn completed_launch(&self, t: Tracked, gone: bool, teardowns: u64) {
        if gone || self.teardowns.load(Acquire) != teardowns {
            return;
        }
        self.account(&t);
        let mut free = self.free_events.lock();
        if self.teardowns.load(Acquire) != teardowns {
            return;
        }
        free.extend(t.start);
        if !t.end_shared {
            free.push(t.end);
        }
    }

    /// Adds a completed launch's device time to what the next charge takes (or, for an empty pair,
    /// updates the event overhead).
    fn account(&self, t: &Tracked) {
        self.progress_ns.store(now_ns(), Release);
        if let Some(start) = &t.start {
            let mut ms = 0f32;
            // SAFETY: two of our events, both completed.
            let measured = unsafe {
                cu::cuEventElapsedTime(&mut ms, start.event as CUevent, t.end.event as CUevent)
            }
            .is_ok()
            .then(|| (ms.max(0.0) as f64 * 1e6) as u64);
            if let Some(ns) = measured {
                if t.calibration {
                    // Low estimate: follow decreases at once, increases slowly (a busy host only adds).
                    let old = self.event_overhead_ns.load(Relaxed);
                    let new = if old == 0 || ns < old {
                        ns
                    } else {
                        old + (ns - old) / 16
                    };
                    self.event_overhead_ns.store(new, Relaxed);
                } else {
                    let ns = ns.saturating_sub(t.start_gap_ns).saturating_sub(
                        flow::steps(t.launches)
                            .saturating_mul(self.event_overhead_ns.load(Relaxed)),
                    );
                    if t.launches > 0 {
                        let old = self.launch_ns.load(Relaxed);
                        self.launch_ns
                            .store(flow::launch_estimate(old, ns, t.launches), Relaxed);
                        let low = self.launch_low_ns.load(Relaxed);
                        self.launch_low_ns.store(
                            drain::low_estimate(low, ns / u64::from(t.launches)),
                            Relaxed,
                        );
                    }
                    let owned = self.owned.load(SeqCst) != 0;
                    // A process that launched in its tenant's turn held by another sees its completions late
                    // (flow control and the scheduler thread reap them), mostly after the turn ended:
                    // every completion outside its own ownership is taken as the turn's, which its lead's
                    // intervals covered (`turn`).
                    let member = self.member.load(Relaxed) || self.tenant_turn();
                    let completion = turn::completion(owned, !owned && member);
                    if completion == Completion::Measured {
                        // Progress seen within our ownership: how long one launch may run.
                        let now = now_ns();
                        let grant = self.ledger.layout().header.grant_ns.load(Acquire);
                        if turn::tells_launch_length(ns, now.saturating_sub(grant.min(now))) {
                            let longest = self.longest_ns.load(Relaxed);
                            self.longest_ns
                                .store(turn::longest_after(longest, ns), Relaxed);
                        }
                    }
                    match completion {
                        Completion::Measured => {
                            self.measured_ns.fetch_add(ns, AcqRel);
                        }
                        // Work that outlived our ownership (or our tenant's turn) is charged at
                        // our next charge, in full; not work launched paced (a forged owner kept
                        // us out): our bucket and window bounded it by our own clock, and
                        // charged to our tenant's virtual time it would keep us out again once
                        // arbitration is honest (shares 10/30/30 gave 0/4/96 after such an
                        // attack, the named tenant being charged nothing).
                        Completion::Carried if self.evidence.fallback() => {}
                        Completion::Carried => {
                            self.carried_ns.fetch_add(ns, AcqRel);
                        }
                        // The lead's charge covered it.
                        Completion::InTurn => {}
                    }
                }
            }
        }
    }

    /// Lets go of every event of context `ctx`, which is being destroyed (`alive`: its events can
    /// still be asked about) or was: a driver hands a destroyed context's handles out again, so an
    /// event kept past its context may be a new one, perhaps the program's own. Tracked launches
    /// there that are known to have completed are accounted; no event of `ctx` is recorded, waited
    /// for, measured or recycled after this.
    pub(in crate::scheduling) fn forget_context(&self, ctx: usize, alive: bool) {
        let theirs = {
            let mut f = self.inflight.lock();
            self.teardowns.fetch_add(1, AcqRel);
            let (theirs, others): (VecDeque<Tracked>, VecDeque<Tracked>) = std::mem::take(&mut *f)
                .into_iter()
                .partition(|t| t.end.ctx == ctx);
            *f = others;
            theirs
        };
        self.free_events.lock().retain(|p| p.ctx != ctx);
        // Batches open there: their launches are never measured (their start may be that
        // context's event).
        self.open.lock().retain(|o| o.ctx != ctx);
        if alive && !theirs.is_empty() {
            // Called from the program's thread: our queries must not disturb a capture.
            let _relaxed = cu::RelaxedCapture::when_needed();
            for t in theirs
                .iter()
                .filter(|t| matches!(query(&t.end), State::Done))
            {
                self.account(t);
            }
        }
    }

    /// What this ownership is charged at `now` for the time since `since` (the grant or last
    /// renewal), by [`meter::Meter::charge`]: its measured device time less what was charged for it while
    /// it ran, at most the wall time (overlapping streams count once), plus what our unfinished
    /// work ran since `since`, plus what completed after an earlier ownership; for a high-priority
    /// tenant the wall time since `since`.
    pub(in crate::scheduling) fn take_charge(&self, now: u64, since: u64) -> u64 {
        let wall = now.saturating_sub(since.min(now));
        if self.high.load(Relaxed) {
            self.measured_ns.swap(0, AcqRel);
            self.carried_ns.swap(0, AcqRel);
            return wall;
        }
        // Completions seen now are measured now, not run as if still running.
        let pending = !self.completed() || self.flow_waiting.load(SeqCst) > 0;
        let running = meter::running_ns(
            pending,
            now,
            since,
            self.pending_since_ns.load(Acquire),
            self.progress_ns.load(Acquire),
        );
        self.meter.lock().charge(Reading {
            measured_ns: self.measured_ns.swap(0, AcqRel),
            carried_ns: self.carried_ns.swap(0, AcqRel),
            running_ns: running,
            wall_ns: wall,
        })
    }

    /// Whether every tracked launch has completed (completed ones are accounted and recycled), and
    /// none is in an open batch. One query per batch found complete, and one for the oldest still
    /// running.
    pub(in crate::scheduling) fn completed(&self) -> bool {
        self.reap().0
    }

    /// Our launches still queued on the device: those of tracked batches not seen complete (after
    /// a look at the oldest ones, which accounts those that are) and of batches still open. The
    /// oldest counts whole though it may have run in part.
    pub(in crate::scheduling) fn queued_launches(&self) -> u64 {
        let tracked: u64 = {
            // Our queries must not break another thread's global-mode capture.
            let _relaxed = cu::RelaxedCapture::when_needed();
            self.reap();
            self.inflight
                .lock()
                .iter()
                .filter(|t| !t.calibration)
                .map(|t| u64::from(t.launches.max(1)))
                .sum()
        };
        tracked.saturating_add(self.open_launches())
    }

    /// [`Sched::completed`], and the flow key of the last batch it found complete, if any.
    fn reap(&self) -> (bool, Option<(StreamKey, usize)>) {
        let mut done = Vec::new();
        let (all, teardowns) = {
            let mut f = self.inflight.lock();
            // In order per stream: stop at the first one still running.
            while let Some(p) = f.front() {
                let gone = match query(&p.end) {
                    State::Running => break,
                    State::Done => false,
                    State::Gone => true,
                };
                done.extend(f.pop_front().map(|p| (p, gone)));
            }
            (f.is_empty(), self.teardowns.load(Acquire))
        };
        let last = done
            .iter()
            .rev()
            .find(|(t, _)| !t.calibration)
            .map(|(t, _)| t.flow_key());
        for (p, gone) in done {
            self.completed_launch(p, gone, teardowns);
        }
        // Launches in a batch still open have no event to tell (`close_open`).
        (all && self.open.lock().is_empty(), last)
    }

    /// Waits for every tracked launch, at most [`DRAIN_LIMIT_NS`]: work that waits for something
    /// outside this process (a collective whose peer waits at another device's gate) must not keep the
    /// device; what is still running then is accounted when it completes. Between two looks it
    /// sleeps for what is known to be left (`drain::pause_ns`): a look is a driver call.
    pub(in crate::scheduling) fn drain(&self) {
        let h = &self.ledger.layout().header;
        let deadline = now_ns().saturating_add(DRAIN_LIMIT_NS);
        // Launching has stopped: what is still open is measured too.
        self.close_open();
        // The previous look, and since when the oldest batch runs at the soonest: the previous look
        // when this one found the batch before it on its stream complete.
        let mut last_look: Option<u64> = None;
        let mut front_since: Option<u64> = None;
        loop {
            let look = now_ns();
            let (done, popped) = self.reap();
            if done {
                break;
            }
            let now = now_ns();
            if now >= deadline {
                break;
            }
            let launch_ns = self.launch_low_ns.load(Relaxed);
            let pause = {
                let f = self.inflight.lock();
                if popped.is_some() {
                    front_since = last_look.filter(|_| f.front().map(|t| t.flow_key()) == popped);
                }
                let batches = f.iter().map(|t| {
                    let launches = if t.calibration { 0 } else { t.launches };
                    (t.flow_key(), launches)
                });
                drain::pause_ns(
                    batches,
                    launch_ns,
                    front_since.map(|s| now.saturating_sub(s)),
                )
            };
            last_look = Some(look);
            // A heartbeat, so waiters can tell a long drain from a stopped owner.
            h.owner_beat_ns.store(now, Release);
            self.evidence.regrant.step(now);
            // A drain that waits for a collective's peer rank, stopped at another device's gate:
            // published, so the peer passes its gate for the round (`Sched::peer_pass`).
            self.watch_stall_after(now, false);
            std::thread::sleep(Duration::from_nanos(
                pause.max(drain::POLL_NS).min(deadline.saturating_sub(now)),
            ));
        }
        self.last_completion_ns.store(0, Release);
    }
}
