//! Arbitration no tenant can take over by writing shared words (docs/COMPUTE.md, "Failure";
//! docs/SECURITY.md). Every tenant process maps its device ledger read-write, so the owner, grant,
//! heartbeat and epoch words prove nothing: a thread of a tenant's own process can write them
//! every few milliseconds, and every revocation a waiter makes is undone at its next write. What
//! this module decides rests only on what the process itself saw, by its own clock, and on the
//! node's policy:
//!
//! * **Nobody holds more than its due, whatever the words say** ([`Bucket`]): each process keeps a
//!   private bucket of device time that fills at its tenant's fair fraction of a contended device
//!   (its share over the shares of the tenants that want it, the node's policy deciding the shares
//!   by tenant id, plus [`SLACK_PCT`]) and empties by the wall time the process holds the device,
//!   or launches without holding it. Empty, the process neither adopts ownership nor launches as
//!   owner, whatever the owner word names: a forged grant buys its own process nothing past its
//!   share. (Honest arbitration never empties it: start-time fair queuing gives each tenant its
//!   fraction, and the bucket holds [`BUCKET_MAX_NS`], more than a slice and the longest drain.)
//! * **Victims see that they are starved and stop waiting** ([`Watch`]): each process measures, by
//!   its own clock, how much of the time it wanted the device (a thread of it waiting at the gate,
//!   or it owning) it did own it. Honest arbitration gives it at least its share of everything
//!   every tenant listed could want ([`fraction_floor`]); one owning less than half of that over
//!   the last [`JUDGE_NS`] or more is being kept out by someone whose words lie. It then launches
//!   **paced** ([`Evidence::paced`]): without waiting for ownership, in holds of about a slice
//!   while its bucket has [`PACE_ON_NS`], resting while it refills, so it takes its fair fraction
//!   and no more; the device's own time-slicing between contexts shares the moments two processes
//!   launch at once; what it launches in its tenant's window must end in it ([`fit`]), so its queue
//!   does not run on into the next tenant's window. It says so in an error line and counts the
//!   episode (`Header::forged_owner`).
//!   After [`FALLBACK_NS`] it waits for its turns again and judges afresh: a forger that stopped
//!   is forgotten, one that goes on is found again within [`JUDGE_NS`].
//!
//! Not a defence against a tenant that bypasses the library (calls the driver itself): then only
//! the victims' pacing stands, and the device's time-slicing decides the rest.

use super::Sched;
use crate::scheduling::arbiter::{DRAIN_LIMIT_NS, SLICE_NS};
use crate::scheduling::shm::{SLOT_ACTIVE, TENANT_READY};
use crate::scheduling::{TenantId, MAX_TENANTS};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

mod budget;
mod regrant;
pub use budget::{fit, fraction, fraction_floor, Bucket, Fit, Watch, Window, FIT_HOLD_MIN_NS};
pub use regrant::{replaced_is_forged, settled, Regrant};

/// Fractions are in parts per million.
pub const PPM: u64 = 1_000_000;
/// The most device time a bucket holds: three slices and the longest drain.
pub const BUCKET_MAX_NS: i64 = (3 * SLICE_NS + DRAIN_LIMIT_NS) as i64;
/// The bucket fills this much faster than the fair fraction (percent): honest arbitration is not
/// exact over short spans.
pub const SLACK_PCT: u64 = 10;
/// A hold (ownership adopted, or paced launches) starts only when the bucket has this much, and
/// lasts until it is empty: holds of about a slice, not a stutter of short ones each paying a
/// drain.
pub const PACE_ON_NS: i64 = SLICE_NS as i64;
/// A paced process waits for its turns again once it has seen the epoch word unchanged this long:
/// arbitration works again. A forger rewriting the owner word makes a new epoch every few
/// milliseconds (5 ms in the test); an honest grant lasts up to a slice.
pub const CLEAN_NS: u64 = 15_000_000;
/// The frame of paced launches: each tenant that wants the device launches paced in its window
/// of every frame (`Window`), whatever the shared words say.
pub const FRAME_NS: u64 = 400_000_000;
/// The observation window: past it, what was seen counts half.
pub const WINDOW_NS: u64 = 1_000_000_000;
/// Wanted time observed before a process judges whether it is starved.
pub const JUDGE_NS: u64 = 500_000_000;
/// A neighbour seen waiting this recently still waits.
pub const WAITED_NS: u64 = 50_000_000;
/// The longest step counted at once (a process the host did not run for a while).
pub const MAX_STEP_NS: u64 = 50_000_000;

/// What the scheduler thread tells [`Evidence::tick`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Seen {
    pub now: u64,
    /// Another tenant wants the device (kernel evidence: its demand lock), and ours is contended.
    pub others_want: bool,
    /// A live process of another tenant waited at its gate within [`WAITED_NS`]: only then is a
    /// holder's time owed to anyone (a stopped or idle neighbour's demand lock costs nothing).
    pub others_wait: bool,
    /// No live process of another tenant waited at its gate for half a [`FRAME_NS`].
    pub others_gone: bool,
    /// A high-priority tenant is ours or beside us: the class decides, not the shares.
    pub exempt: bool,
    /// We own the device (by our own adoption).
    pub owned: bool,
    /// The epoch word as read now.
    pub epoch: u64,
    /// A thread of ours waits at the gate.
    pub waiting: bool,
    /// Our fair fraction among the tenants that want the device now (ppm).
    pub fair_ppm: u64,
    /// The least fraction honest arbitration gives us ([`fraction_floor`], ppm).
    pub floor_ppm: u64,
    /// Our tenant's window of the paced frame.
    pub window: Window,
    /// Our ownership's epoch was replaced by another naming us again: nobody honest does that
    /// (only we renew our own), so a forger writes the words on our behalf.
    pub forged: bool,
}

/// What changed at a tick, for the caller to report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    Same,
    /// We found ourselves starved: paced from now on (with what we owned, ppm).
    Starved {
        owned_ppm: u64,
        /// Found by a new epoch naming us while we owned the device (else by the watch).
        forged: bool,
    },
    /// Arbitration gives us our due again: waiting from now on.
    Recovered,
}

#[derive(Default)]
struct State {
    last_ns: u64,
    /// The epoch we last owned and since when (for [`CLEAN_NS`]).
    epoch: u64,
    epoch_since: u64,
    /// Epochs in a row, before the current one, that lasted [`CLEAN_NS`] or more.
    long_epochs: u32,
    held_before: bool,
    bucket: Bucket,
    watch: Watch,
}

/// One device's evidence in this process: written by its scheduler thread, read by the gate.
pub struct Evidence {
    state: Mutex<State>,
    may_own: AtomicBool,
    fallback: AtomicBool,
    paced: AtomicBool,
    /// The scheduler thread's last weighing ([`Sched::weigh`]): another tenant wants the device,
    /// our fair fraction, our floor (ppm).
    others_want: AtomicBool,
    /// When a live process of another tenant was last seen waiting (monotonic ns).
    waited_ns: AtomicU64,
    fair_ppm: AtomicU64,
    floor_ppm: AtomicU64,
    window_start: AtomicU64,
    window_len: AtomicU64,
    /// No live process of another tenant waited for half a frame (the last step's view).
    others_gone: AtomicBool,
    forged: AtomicBool,
    /// Whether a replaced epoch naming us can be an honest re-grant (`regrant`).
    pub regrant: Regrant,
}

impl Default for Evidence {
    fn default() -> Evidence {
        Evidence {
            state: Mutex::new(State::default()),
            may_own: AtomicBool::new(true),
            fallback: AtomicBool::new(false),
            paced: AtomicBool::new(false),
            others_want: AtomicBool::new(false),
            waited_ns: AtomicU64::new(0),
            fair_ppm: AtomicU64::new(PPM),
            floor_ppm: AtomicU64::new(0),
            window_start: AtomicU64::new(0),
            window_len: AtomicU64::new(PPM),
            others_gone: AtomicBool::new(false),
            forged: AtomicBool::new(false),
            regrant: Regrant::default(),
        }
    }
}

impl Evidence {
    /// Whether this process may adopt or use ownership now: its bucket holds a slice's worth, or
    /// it holds already and its bucket is not empty.
    pub fn may_own(&self) -> bool {
        self.may_own.load(Relaxed)
    }

    /// Whether launches go through without ownership now (starved, in our tenant's window): read
    /// against the clock at each launch, not at the scheduler thread's last step, so that a
    /// window starts and ends on time whenever that thread runs.
    pub fn paced(&self) -> bool {
        self.paced_at(crate::scheduling::device::now_ns())
    }

    /// [`paced`](Self::paced) at `now`.
    pub fn paced_at(&self, now: u64) -> bool {
        self.fallback.load(Relaxed) && (self.others_gone.load(Relaxed) || self.window().holds(now))
    }

    /// How long until our tenant's window starts (0 inside it; `u64::MAX` when not paced): a
    /// paced process's waiting threads wake for its start, not a poll later.
    pub fn until_window(&self, now: u64) -> u64 {
        if !self.fallback.load(Relaxed) {
            return u64::MAX;
        }
        self.window().until(now)
    }

    /// While paced in our tenant's window (not while every other tenant is gone): how long until
    /// it ends and how long it is (ns). What is launched then must also end in it ([`fit`]).
    pub fn bounded_window(&self, now: u64) -> Option<(u64, u64)> {
        if !self.fallback.load(Relaxed) || self.others_gone.load(Relaxed) {
            return None;
        }
        let w = self.window();
        match w.left(now) {
            0 => None,
            left => Some((left, w.len_ns())),
        }
    }

    fn window(&self) -> Window {
        Window {
            start_ppm: self.window_start.load(Relaxed),
            len_ppm: self.window_len.load(Relaxed),
        }
    }

    /// Whether this process found itself starved and paces itself.
    pub fn fallback(&self) -> bool {
        self.fallback.load(Relaxed)
    }

    /// Our ownership's epoch was replaced at `now` by another naming us (the scheduler thread, or
    /// a launch waiting for its grant, saw it): forged unless an honest re-grant may explain it
    /// ([`replaced_is_forged`]). True when counted as forged.
    pub fn replaced(&self, now: u64) -> bool {
        let forged = self.regrant.forged(now);
        if forged {
            self.forged.store(true, Relaxed);
        }
        forged
    }

    /// The scheduler thread's step (at least every few milliseconds).
    pub fn tick(&self, seen: Seen) -> Turn {
        let mut s = self.state.lock();
        let dt = if s.last_ns == 0 {
            0
        } else {
            seen.now.saturating_sub(s.last_ns)
        };
        s.last_ns = seen.now;
        if !seen.others_want || seen.exempt {
            // Nobody to be fair to (or the class decides): nothing owed, nothing to judge.
            s.bucket.full();
            s.watch = Watch::default();
            s.held_before = false;
            self.may_own.store(true, Relaxed);
            self.paced.store(false, Relaxed);
            return if self.fallback.swap(false, Relaxed) {
                Turn::Recovered
            } else {
                Turn::Same
            };
        }
        let paced = self.paced.load(Relaxed);
        let held = seen.owned || paced;
        // Held at either end of the step counts the whole step: the holder pays.
        let held_step = held || s.held_before;
        s.held_before = held;
        if seen.others_wait || self.fallback.load(Relaxed) {
            s.bucket
                .tick(dt, seen.fair_ppm.max(seen.floor_ppm), held_step);
        } else {
            // Nobody waits for what we hold: nothing is owed (work-conserving).
            s.bucket.full();
        }
        s.watch.tick(dt, seen.waiting, seen.owned);
        let mut turn = Turn::Same;
        if seen.epoch != s.epoch {
            s.long_epochs = if seen.now.saturating_sub(s.epoch_since) >= CLEAN_NS {
                s.long_epochs.saturating_add(1)
            } else {
                0
            };
            s.epoch = seen.epoch;
            s.epoch_since = seen.now;
        }
        let fallback = if self.fallback.load(Relaxed) {
            // Honest grants again: three epochs in a row that each stay `CLEAN_NS` (honest
            // slices), or one that stays three times that (one owner, nobody waiting). One long
            // epoch alone is not enough: a forger thread the host did not run for 15 ms leaves
            // one behind.
            let age = seen.now.saturating_sub(s.epoch_since);
            let clean = age >= 3 * CLEAN_NS || (s.long_epochs >= 2 && age >= CLEAN_NS);
            if clean {
                turn = Turn::Recovered;
                s.watch = Watch::default();
            }
            !clean
        } else {
            let starved = seen.forged || s.watch.starved(seen.floor_ppm);
            if starved {
                s.long_epochs = 0;
                turn = Turn::Starved {
                    owned_ppm: s.watch.owned_ppm(),
                    forged: seen.forged,
                };
            }
            starved
        };
        self.fallback.store(fallback, Relaxed);
        let tokens = s.bucket.tokens;
        let on = |was: bool| {
            if was {
                tokens > 0
            } else {
                tokens >= PACE_ON_NS
            }
        };
        // Paced: in our tenant's window of the frame, and only then (ownership included: the
        // words may name us at any time), unless no live process of another tenant waited for
        // half a frame: then the device is ours (a stopped neighbour owes us its windows).
        let window = fallback && (seen.window.holds(seen.now) || seen.others_gone);
        self.others_gone.store(seen.others_gone, Relaxed);
        self.window_start.store(seen.window.start_ppm, Relaxed);
        self.window_len.store(seen.window.len_ppm, Relaxed);
        self.paced.store(window, Relaxed);
        self.may_own.store(
            if fallback {
                window
            } else {
                on(self.may_own.load(Relaxed))
            },
            Relaxed,
        );
        turn
    }
}

impl Sched {
    /// Weighs what this process is owed (the scheduler thread's refresh): which tenants want the
    /// device (a demand lock held on an active slot: the kernel's evidence that a process wants
    /// it; the tenant it names is a word, but every process rewrites its own at each refresh),
    /// their shares by the node's policy, and the shares of every tenant the ledger lists, each id
    /// counted once (a tenant the policy does not list counts 1: planted entries barely move it).
    pub(in crate::scheduling) fn weigh(&self) {
        let l = self.ledger.layout();
        let mine = self.tenant();
        let mut wanting = [false; MAX_TENANTS];
        let mut processes = 1u32;
        for (i, s) in l.slots.iter().enumerate() {
            if i == self.slot || s.state.load(Acquire) != SLOT_ACTIVE {
                continue;
            }
            let t = s.tenant.load(Acquire) as usize;
            if t < MAX_TENANTS && self.ledger.slot_wants(i) {
                if t == mine {
                    processes = processes.saturating_add(1);
                } else {
                    wanting[t] = true;
                }
            }
        }
        let share = |t: usize| u64::from(self.ledger.view(t).share);
        let me = share(mine);
        let mut ids: Vec<TenantId> = Vec::with_capacity(MAX_TENANTS);
        let mut frame: Vec<(TenantId, u64)> = vec![(self.id, me)];
        let mut listed = 0u64;
        let mut others = 0u64;
        for (t, e) in l.tenants.iter().enumerate() {
            let id = if t == mine {
                self.id
            } else if e.state.load(Acquire) == TENANT_READY {
                TenantId::load(&e.id)
            } else {
                continue;
            };
            if ids.contains(&id) {
                continue;
            }
            ids.push(id);
            let s = share(t);
            listed = listed.saturating_add(s);
            if t != mine && id != self.id && wanting[t] {
                others = others.saturating_add(s);
                frame.push((id, s));
            }
        }
        let cap = self.ledger.view(mine).cap;
        let e = &self.evidence;
        e.others_want.store(others != 0, Relaxed);
        e.fair_ppm
            .store(fraction(me, me.saturating_add(others)), Relaxed);
        e.floor_ppm
            .store(fraction_floor(me, listed, cap, processes), Relaxed);
        let w = Window::of(self.id, &frame);
        e.window_start.store(w.start_ppm, Relaxed);
        e.window_len.store(w.len_ppm, Relaxed);
    }

    /// The scheduler thread's step: the evidence as seen now; a process that finds itself starved
    /// (or its due again) says so.
    pub(in crate::scheduling) fn weigh_step(&self, now: u64) {
        let e = &self.evidence;
        e.regrant.step(now);
        let mine = self.tenant();
        if self
            .ledger
            .waiters(Some(self.slot))
            .iter()
            .any(|w| w.tenant != mine)
        {
            e.waited_ns.store(now, Relaxed);
        }
        let turn = e.tick(Seen {
            now,
            others_want: e.others_want.load(Relaxed) && self.contended(),
            others_wait: now.saturating_sub(e.waited_ns.load(Relaxed)) < WAITED_NS,
            others_gone: now.saturating_sub(e.waited_ns.load(Relaxed)) >= FRAME_NS / 2,
            exempt: self.high.load(Relaxed) || self.beside_high.load(Relaxed),
            owned: self.owned.load(SeqCst) != 0,
            epoch: u64::from(self.ledger.layout().header.epoch.load(Acquire)),
            waiting: self.waiting.load(SeqCst) != 0,
            fair_ppm: e.fair_ppm.load(Relaxed),
            floor_ppm: e.floor_ppm.load(Relaxed),
            window: Window {
                start_ppm: e.window_start.load(Relaxed),
                len_ppm: e.window_len.load(Relaxed),
            },
            forged: e.forged.swap(false, Relaxed),
        });
        let l = self.ledger.layout();
        match turn {
            Turn::Same => {}
            Turn::Starved { owned_ppm, forged } => {
                l.header.forged_owner.fetch_add(1, Relaxed);
                let named = crate::scheduling::Holder::from_word(l.header.owner.load(Acquire))
                    .slot()
                    .map(|s| {
                        let slot = &l.slots[s];
                        let t = slot.tenant.load(Acquire) as usize;
                        let label = l
                            .tenants
                            .get(t)
                            .map(|e| crate::scheduling::shm::unpack(&e.name))
                            .unwrap_or_default();
                        format!(
                            "slot {s} (pid {}, tenant entry {t} {:?}, by its words)",
                            slot.pid.load(Acquire),
                            label.escape_debug().to_string()
                        )
                    })
                    .unwrap_or_else(|| "nobody".to_string());
                static LOGGED: AtomicBool = AtomicBool::new(false);
                let log = if LOGGED.swap(true, Relaxed) {
                    crate::log::warn
                } else {
                    crate::log::error
                };
                let why = if forged {
                    "a new epoch naming this process was written while it owned the device: \
                     the ledger's ownership words are forged"
                        .to_string()
                } else {
                    format!(
                        "owned {:.1}% of the time it waited, less than half of its due \
                         ({:.1}%): an owner whose ledger words cannot be trusted keeps it out",
                        owned_ppm as f64 / 1e4,
                        e.floor_ppm.load(Relaxed) as f64 / 1e4,
                    )
                };
                log(format_args!(
                    "compute: device {}: {why} (the owner word names {named}); this process \
                     launches paced, in its tenant's window of every {} ms by its share, until \
                     three epochs in a row stay {} ms",
                    self.ordinal,
                    FRAME_NS / 1_000_000,
                    CLEAN_NS / 1_000_000,
                ));
            }
            Turn::Recovered => crate::log::warn(format_args!(
                "compute: device {}: epochs stayed {} ms again: the paced episode is over; this process \
                 waits for its turns again",
                self.ordinal,
                CLEAN_NS / 1_000_000
            )),
        }
    }
}

#[cfg(test)]
mod tests;
