//! The scheduler thread of one device in this process: it watches our ownership and ends it (slice
//! over, idle, or preempted by a high-priority tenant), drains our work (bounded), charges it and hands
//! the device over; it re-reads the ledger (contention, priorities, caps), repairs our own entries when
//! the file was damaged, and stops at exit after handing the device back.

use super::runtime;
use super::Sched;
use crate::log;
use crate::scheduling::arbiter::{IDLE_NS, SLICE_NS};
use crate::scheduling::cu::RelaxedCapture;
use crate::scheduling::device::{futex_wait, futex_wake, now_ns};
use crate::scheduling::shm;
use crate::scheduling::{turn, watch, Holder};
use std::sync::atomic::Ordering::*;
use std::time::Duration;

/// How often the scheduler thread re-reads the ledger (contention, settings, liveness).
const REFRESH_NS: u64 = 10_000_000;
const SWEEP_NS: u64 = 100_000_000;
/// The owner's scheduler thread checks for idleness at least this often.
const OWNER_POLL_NS: u64 = 250_000;

/// Why an ownership ended (the debug log says it).
#[derive(Clone, Copy, Debug)]
enum Why {
    SliceOver,
    Idle,
    /// Quiet, with work that completes nothing: it waits for something outside the process.
    Stalled,
    Preempted,
    /// Our bucket of device time is empty (`evidence`).
    Due,
    Uncontended,
    Exit,
}

impl Sched {
    pub(in crate::scheduling) fn start_thread(&'static self) {
        let spawned = std::thread::Builder::new()
            .name(format!("gpuslice-sched{}", self.ordinal))
            .spawn(move || self.run());
        if spawned.is_err() {
            self.done.store(true, Release);
        }
    }

    /// Exit: hand over and stop.
    pub(in crate::scheduling) fn stop(&self) {
        self.stop.store(true, Release);
        let h = &self.ledger.layout().header;
        futex_wake(&h.epoch);
        futex_wake(&h.preempt);
    }

    pub(in crate::scheduling) fn thread_done(&self) -> bool {
        self.done.load(Acquire)
    }

    /// Ends our ownership: stop submitting, drain (bounded) when `drain`, charge, hand over.
    /// With `drain` false (a high-priority tenant preempts us, or the process exits) the device is
    /// handed over as soon as we stop submitting: what we have in flight runs before the new owner's
    /// work in the device's order anyway, and it is charged to us when it completes.
    fn release(&self, drain: bool, why: Why) {
        let asked = now_ns();
        let epoch = self.owned.load(SeqCst);
        self.stopping.store(true, SeqCst);
        while self.launching.load(SeqCst) != 0 && !runtime::stopped() {
            std::thread::sleep(Duration::from_micros(20));
        }
        if drain {
            self.drain();
        }
        let h = &self.ledger.layout().header;
        let g = self.ledger.lock(self.slot);
        if h.owner.load(Acquire) == self.me().word() && h.epoch.load(Acquire) == epoch {
            let now = now_ns();
            let grant = h.grant_ns.load(Acquire);
            let charge = self.take_charge(now, grant);
            g.charge(self.tenant(), charge, now);
            // Still wanting after a drained release: a thread of ours blocked in a synchronisation
            // for the work just drained, or waiting in flow control, launches again at once.
            let wants_on = drain
                && (runtime::HOST_WAITS.load(Relaxed) > 0 || self.flow_waiting.load(SeqCst) > 0);
            let c = g.hand_over_weighing(now, wants_on.then_some((self.slot, asked)));
            // Time stamps on CLOCK_MONOTONIC, common to every process: the hand-overs of several
            // devices can be laid side by side (docs/BENCHMARKS.md, "Collectives").
            log::debug(format_args!(
                "compute: device {} released ({why:?}) at {} us, held {} us, drained {} us, charged {charge} ns, stall time {} us -> {c:?}",
                self.ordinal,
                asked / 1000,
                asked.saturating_sub(grant) / 1000,
                now.saturating_sub(asked) / 1000,
                self.stall_ns() / 1000
            ));
        }
        drop(g);
        futex_wake(&h.epoch);
        self.owned.store(0, SeqCst);
        self.stopping.store(false, SeqCst);
    }

    /// The scheduler thread.
    fn run(&self) {
        // Hand-overs wait in short sleeps: keep the kernel's default 50 us timer slack off them.
        // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
        // Our event calls must never disturb the application's stream captures.
        let _relaxed = RelaxedCapture::enter();
        self.owner_loop();
        if self.owned.load(SeqCst) != 0 {
            self.release(false, Why::Exit);
        }
        let slot = &self.ledger.layout().slots[self.slot];
        slot.wants.store(0, Release);
        self.ledger.set_demand(self.slot, false);
        self.done.store(true, Release);
    }

    fn owner_loop(&self) {
        let h = &self.ledger.layout().header;
        let (mut last_refresh, mut last_sweep) = (0u64, 0u64);
        let beat = &self.ledger.layout().slots[self.slot].beat_ns;
        while !self.stop.load(Acquire) {
            let now = now_ns();
            beat.store(now, Release);
            self.weigh_step(now);
            if now.saturating_sub(last_refresh) >= REFRESH_NS {
                last_refresh = now;
                self.refresh(now);
                if now.saturating_sub(last_sweep) >= SWEEP_NS {
                    last_sweep = now;
                    self.ledger.sweep(Some(self.slot));
                    self.ledger.lock(self.slot).sample(now);
                }
            }
            let owned = self.owned.load(SeqCst);
            if owned == 0 {
                let e = h.epoch.load(Acquire);
                if h.owner.load(Acquire) == self.me().word()
                    && !self.stopping.load(SeqCst)
                    && self.evidence.may_own()
                {
                    // Granted while none of our threads waited: adopt it (idleness hands it on).
                    self.adopt(e, now);
                    continue;
                }
                // A batch left open by launches in our tenant's turn held by another process, or
                // passed to complete a collective: closed once that is over, so that a later
                // launch does not extend it across another tenant's ownership.
                let turn = self.tenant_turn();
                if self.launching.load(SeqCst) == 0 && !turn {
                    self.close_open();
                }
                if turn::membership_ends(
                    self.member.load(Relaxed),
                    turn,
                    self.launching.load(SeqCst) != 0,
                ) {
                    // Our launches in our tenant's turn that completed by now are the turn's
                    // (its lead's charge covered them); what still runs is carried to our next
                    // charge.
                    self.completed();
                    self.member.store(false, Relaxed);
                }
                // Work of ours still on the device (left running at a hand-over, or passed to
                // complete a collective): watched, so a wait of it is published.
                // A tenant whose ranks on other devices wait (it does collectives): work of ours
                // left running at a hand-over, or passed, is watched, so that a wait of it is
                // published too. (Not for other tenants: accounting completions here rather than
                // at our next ownership took a graph tenant of share 30 to 18-19% of the device.)
                // Threads of ours waiting for a grant sleep until the hand-over wakes them: an
                // owner that died, overran its slice and the grace, or is named by a damaged word
                // wakes nobody, so we look at it for them on each pass (`watch`).
                if watch::watches(self.waiting.load(SeqCst), false) {
                    let o = Holder::from_word(h.owner.load(Acquire));
                    if !o.is_none() && o != self.me() && self.revoke_lapsed(o, e) {
                        continue;
                    }
                }
                let timeout = if self.evidence.fallback() {
                    // Paced holds start and end on our steps.
                    OWNER_POLL_NS
                } else if !self.peer_recent(now) || self.inflight.lock().is_empty() {
                    REFRESH_NS / 2
                } else {
                    if now.saturating_sub(self.last_submit_ns.load(Acquire)) > IDLE_NS {
                        self.close_open();
                    }
                    self.watch_stall(now);
                    OWNER_POLL_NS
                };
                futex_wait(&h.epoch, e, timeout);
                continue;
            }
            if h.owner.load(Acquire) != self.me().word() || h.epoch.load(Acquire) != owned {
                if h.owner.load(Acquire) == self.me().word() {
                    // A new epoch naming us that we did not write: forged words, unless we were
                    // stalled or held long enough to be revoked and granted again honestly
                    // (`evidence::replaced_is_forged`).
                    self.evidence.replaced(now_ns());
                }
                // Revoked (we were stopped or too slow): queue like everyone else.
                self.owned.store(0, SeqCst);
                continue;
            }
            h.owner_beat_ns.store(now, Release);
            // Untrusted words: a grant in the future counts from now, a slice is at most `S`.
            let grant = h.grant_ns.load(Acquire).min(now);
            let end = grant.saturating_add(h.slice_ns.load(Acquire).min(SLICE_NS));
            let high = self.high.load(Relaxed);
            // Not quiet while a thread of ours waits at the gate: it was granted the device and is
            // about to launch (on a loaded machine it may take a while to be scheduled; handing
            // the device back to ourselves meanwhile would only leave it idle). Nor right after our
            // work completed: a program that synchronises after each long kernel submits its next
            // one only once it has seen the last complete, and that is not idleness.
            let quiet_since = |now: u64, last: u64| {
                now.saturating_sub(last.max(grant)) > IDLE_NS
                    && self.launching.load(SeqCst) == 0
                    && self.waiting.load(SeqCst) == 0
            };
            if quiet_since(now, self.last_submit_ns.load(Acquire)) {
                // The program stopped launching: a batch it left open is measured from now.
                self.close_open();
            }
            let quiet = |now: u64| {
                let last = self.last_submit_ns.load(Acquire);
                quiet_since(now, last.max(self.progress_ns.load(Acquire)))
            };
            // Looked at again after `completed()`: a completion it finds counts as progress now.
            // Not while a thread of ours waits in flow control (`turn::may_go_idle`): the batch it
            // waits for is off the list `completed()` looks at, but on the device.
            let idle = turn::may_go_idle(quiet(now), self.flow_waiting.load(SeqCst))
                && self.completed()
                && quiet(now);
            let preempted = !high && h.preempt.load(Acquire) != 0 && {
                let real = self
                    .ledger
                    .waiters(Some(self.slot))
                    .iter()
                    .any(|w| self.ledger.is_high(w.tenant));
                if !real {
                    h.preempt.store(0, Release);
                }
                real
            };
            // Past our due by our own clock (`evidence`): whatever the grant word says.
            let due = !self.evidence.may_own();
            if idle && !preempted && !due && self.contended() && self.hand_on(owned, grant) {
                continue;
            }
            if idle || preempted || due || !self.contended() {
                let why = if preempted {
                    Why::Preempted
                } else if due {
                    Why::Due
                } else if idle {
                    Why::Idle
                } else {
                    Why::Uncontended
                };
                self.release(!preempted, why);
                continue;
            }
            // Submitting nothing, not waiting to submit, and our work makes no progress (nothing
            // completed for several launches' time): it waits for something outside this process
            // (a collective's peer rank at another device's gate). The device moves on at once; the
            // hardware time-slices what we left running.
            let since_progress = now.saturating_sub(
                self.progress_ns
                    .load(Acquire)
                    .max(grant)
                    .max(self.last_submit_ns.load(Acquire)),
            );
            // Only a quiet owner can be stalled (watched at most every `OWNER_POLL_NS`); the wait
            // is published for the tenant's ranks on other devices (`watch_stall`).
            let stalled = quiet(now) && self.watch_stall(now);
            if stalled
                && since_progress > self.stall_ns()
                && self.flow_waiting.load(SeqCst) == 0
                && self
                    .ledger
                    .waiters(Some(self.slot))
                    .iter()
                    .any(|w| w.tenant != self.tenant())
            {
                self.release(false, Why::Stalled);
                continue;
            }
            if now >= end {
                if self.renew(high, now, grant) {
                    continue;
                }
                // A high-priority tenant waits (it may not have raised the preempt word yet):
                // handed over undrained, as when preempted (`turn::drains_at_slice_end`).
                let high_waits = !high
                    && self
                        .ledger
                        .waiters(Some(self.slot))
                        .iter()
                        .any(|w| self.ledger.is_high(w.tenant));
                if turn::drains_at_slice_end(high, high_waits) {
                    self.release(true, Why::SliceOver);
                } else {
                    self.release(false, Why::Preempted);
                }
                continue;
            }
            let wait = (end - now).clamp(20_000, OWNER_POLL_NS);
            if high {
                std::thread::sleep(Duration::from_nanos(wait));
            } else {
                futex_wait(&h.preempt, 0, wait);
            }
        }
    }

    /// Going idle: hands the rest of our tenant's turn (the grant and slice kept) to another process
    /// of the tenant that wants the device, once per grant (`turn::may_hand_on`), charging what we
    /// used; its launches go on in the turn instead of waiting for the tenant's next one. False
    /// when there is none (or the turn is no longer ours): the caller hands over as usual.
    fn hand_on(&self, epoch: u32, grant: u64) -> bool {
        let l = self.ledger.layout();
        let h = &l.header;
        let mine = self.tenant();
        if !turn::may_hand_on(true, h.slice_ns.load(Acquire)) {
            return false;
        }
        let Some(next) = (0..l.slots.len()).find(|&i| {
            let s = &l.slots[i];
            i != self.slot
                && s.state.load(Acquire) == shm::SLOT_ACTIVE
                && s.tenant.load(Acquire) as usize == mine
                && self.ledger.slot_wants(i)
        }) else {
            return false;
        };
        self.stopping.store(true, SeqCst);
        while self.launching.load(SeqCst) != 0 && !runtime::stopped() {
            std::thread::sleep(Duration::from_micros(20));
        }
        let g = self.ledger.lock(self.slot);
        let handed = h.owner.load(Acquire) == self.me().word()
            && h.epoch.load(Acquire) == epoch
            && self.ledger.slot_alive(next, Some(self.slot));
        if handed {
            let now = now_ns();
            let charge = self.take_charge(now, grant);
            g.charge(mine, charge, now);
            // The turn goes on: the grant and the slice's end stay (the next owner's charge is
            // at most the wall time since the grant, its own completions); marked as handed on.
            // One nanosecond less, never more: a slice past `S` reads as forged (`overdue`).
            let slice = h.slice_ns.load(Acquire).min(SLICE_NS);
            h.slice_ns
                .store(slice.saturating_sub(1) | turn::HANDED_ON, Release);
            h.owner_beat_ns.store(now, Release);
            h.owner.store(Holder::of(next).word(), Release);
            let mut e = epoch.wrapping_add(1);
            if e == 0 {
                e = 1;
            }
            h.epoch.store(e, Release);
            log::debug(format_args!(
                "compute: device {}: the turn handed on to slot {next} of our tenant, charged {charge} ns",
                self.ordinal
            ));
        }
        drop(g);
        if handed {
            futex_wake(&h.epoch);
            self.owned.store(0, SeqCst);
        }
        self.stopping.store(false, SeqCst);
        handed
    }

    /// At the end of a slice with nobody (of our class, for a high-priority owner) waiting: charge
    /// what the slice used and start another. False when we must hand over instead.
    fn renew(&self, high: bool, now: u64, grant: u64) -> bool {
        let g = self.ledger.lock(self.slot);
        let mine = self.tenant();
        let rivals = self
            .ledger
            .waiters(Some(self.slot))
            .into_iter()
            .any(|w| turn::rival(w.tenant, self.ledger.is_high(w.tenant), mine, high));
        if rivals {
            return false;
        }
        let charge = self.take_charge(now, grant);
        log::debug(format_args!("compute: renewed after {charge} ns"));
        g.charge(self.tenant(), charge, now);
        let renewed = g.renew(self.tenant(), now);
        if renewed {
            self.evidence.regrant.adopted(now);
        }
        renewed
    }
}
