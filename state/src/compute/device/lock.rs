//! The device ledger's arbitration lock and what is decided under it: charges, hand-overs, renewals,
//! history samples. The lock word and its time stamp are read from the file like everything else:
//! a holder that is dead, stopped, held too long, or named by a word that cannot be genuine loses it.

use super::{now_ns, DeviceLedger};
use crate::compute::arbiter::{self, Choice, Waiter};
use crate::compute::shm::*;
use crate::compute::Incident;
use std::sync::atomic::Ordering::*;
use std::time::Duration;

/// A held arbitration lock older than this is taken over when its holder is dead or stopped.
const LOCK_STALE_NS: u64 = 50_000_000;

/// Why a waiter takes the arbitration lock over from the word's holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TakeOver {
    /// The word names no slot, our own slot, or a slot whose process is dead.
    Bogus,
    /// Stamped ahead of the clock (no holder stamps so).
    Future,
    /// Stamped longer ago than [`LOCK_STALE_NS`].
    Stale,
    /// We have waited [`LOCK_HOLD_MAX_NS`] ourselves: the holder, alive or not, has had its turn.
    /// Neither the word nor its stamp can keep a waiter out longer (a tenant can write both).
    Overstayed,
}

/// Whether a waiter that has waited `waited_ns` (its own clock) takes over a lock word naming
/// `holder` (`None`: names no slot), stamped `stamp` (read before `now`); `alive`: whether the
/// named slot's process is alive (its OFD lock is held), asked only when it matters.
pub(crate) fn take_over(
    holder: Option<usize>,
    me: usize,
    stamp: u64,
    now: u64,
    waited_ns: u64,
    alive: impl FnOnce(usize) -> bool,
) -> Option<TakeOver> {
    if stamp > now {
        return Some(TakeOver::Future);
    }
    if waited_ns >= LOCK_HOLD_MAX_NS {
        return Some(TakeOver::Overstayed);
    }
    if now - stamp > LOCK_STALE_NS {
        return Some(TakeOver::Stale);
    }
    match holder {
        None => Some(TakeOver::Bogus),
        Some(h) if h == me || !alive(h) => Some(TakeOver::Bogus),
        Some(_) => None,
    }
}

impl DeviceLedger {
    /// Takes the arbitration lock (`me` = our slot), taking over a dead or stopped holder's, one
    /// held past its bound, and a lock word or time stamp that cannot be genuine (untrusted file).
    /// Never waits longer than [`LOCK_HOLD_MAX_NS`] (plus one sleep) for another holder, alive or
    /// not: the word is anybody's to write, so it cannot be trusted to keep anyone out for long.
    pub fn lock(&self, me: usize) -> LockGuard<'_> {
        // Another thread of this process holding the word holds `local` too: a word naming our slot
        // seen from here is then a dead process's whose slot we were given (or our own thread's,
        // re-entering), never a live holder's.
        let local = self.arbitration.lock();
        let h = &self.layout().header;
        let mine = Holder::of(me).word();
        let start = now_ns();
        let mut spins = 0u32;
        loop {
            let cur = h.lock.load(Acquire);
            if cur == 0 {
                if h.lock.compare_exchange(0, mine, AcqRel, Acquire).is_ok() {
                    h.lock_ns.store(now_ns(), Release);
                    return LockGuard {
                        l: self,
                        me,
                        _local: local,
                    };
                }
                continue;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
                continue;
            }
            let stamp = h.lock_ns.load(Acquire);
            let now = now_ns();
            let why = take_over(
                Holder::from_word(cur).slot(),
                me,
                stamp,
                now,
                now.saturating_sub(start),
                |holder| self.slot_alive(holder, Some(me)),
            );
            if let Some(why) = why {
                if h.lock.compare_exchange(cur, mine, AcqRel, Acquire).is_ok() {
                    h.lock_ns.store(now_ns(), Release);
                    if why != TakeOver::Stale {
                        if why == TakeOver::Overstayed {
                            h.lock_takeovers.fetch_add(1, Relaxed);
                        }
                        crate::compute::incident(
                            Incident::Lock,
                            format_args!(
                                "device ledger {}: arbitration lock word {cur:#x} stamped {stamp} (now {now}) taken over ({why:?}, after waiting {} µs)",
                                self.path().display(),
                                now.saturating_sub(start) / 1000
                            ),
                        );
                    }
                    return LockGuard {
                        l: self,
                        me,
                        _local: local,
                    };
                }
                // The word changed meanwhile: look again (the wait keeps counting).
                continue;
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

/// The held arbitration lock; every decision about ownership is taken under it.
pub struct LockGuard<'a> {
    pub(super) l: &'a DeviceLedger,
    pub(super) me: usize,
    /// This process's turn ([`DeviceLedger::lock`]), given up after the word (fields drop after
    /// `drop`).
    _local: parking_lot::ReentrantMutexGuard<'a, ()>,
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        let _ = self.l.layout().header.lock.compare_exchange(
            Holder::of(self.me).word(),
            0,
            AcqRel,
            Acquire,
        );
    }
}

impl LockGuard<'_> {
    /// Charges `ns` to tenant `t`.
    pub fn charge(&self, t: usize, ns: u64, now: u64) {
        if t >= MAX_TENANTS {
            return;
        }
        let mut v = self.l.view(t);
        arbiter::charge(&mut v, ns, now);
        self.l.store_view(t, &v);
        self.l.layout().tenants[t].charged_ns.fetch_add(ns, AcqRel);
    }

    /// Chooses among the waiters and installs the result as the new ownership (bumping the epoch).
    /// Returns the choice; the caller wakes the waiters.
    pub fn hand_over(&self, now: u64) -> Choice {
        self.hand_over_weighing(now, None)
    }

    /// As [`LockGuard::hand_over`], with slot `also` (the releasing owner's) weighed as a waiter
    /// since `since` when it is not one already: a thread of its process is blocked in a
    /// synchronisation for its own work, which the drain just completed. It launches again the
    /// moment it returns; skipping it would hand the device to any waiter whatever its virtual time
    /// (a program queuing deep batches and then waiting lost one turn in eight that way).
    pub fn hand_over_weighing(&self, now: u64, also: Option<(usize, u64)>) -> Choice {
        let l = self.l.layout();
        let mut waiters = self.l.waiters(None);
        if let Some((slot, since)) = also.filter(|(slot, _)| *slot < MAX_SLOTS) {
            let tenant = l.slots[slot].tenant.load(Acquire) as usize;
            if tenant < MAX_TENANTS
                && self.l.slot_counts(slot, tenant)
                && !waiters.iter().any(|w| w.slot == slot)
            {
                waiters.push(Waiter {
                    slot,
                    tenant,
                    since: since.min(now),
                });
            }
        }
        let mut views = self.l.views();
        let choice = arbiter::choose(&mut views, &waiters, now);
        for w in &waiters {
            self.l.store_view(w.tenant, &views[w.tenant]);
        }
        let h = &l.header;
        match choice {
            Choice::Grant { slot, slice_ns } => {
                h.grant_ns.store(now, Release);
                h.owner_beat_ns.store(now, Release);
                h.slice_ns.store(slice_ns, Release);
                h.owner.store(Holder::of(slot).word(), Release);
                let t = l.slots[slot].tenant.load(Acquire) as usize;
                if t < MAX_TENANTS && views[t].high {
                    h.preempt.store(0, Release);
                }
                self.l.count(t, false);
            }
            _ => h.owner.store(Holder::NONE.word(), Release),
        }
        let mut e = h.epoch.load(Acquire).wrapping_add(1);
        if e == 0 {
            e = 1;
        }
        h.epoch.store(e, Release);
        h.hand_overs.fetch_add(1, Relaxed);
        choice
    }

    /// Renews the owner's slice in place (nobody else waits). Returns false when its tenant is out of
    /// tokens (it must hand over instead).
    pub fn renew(&self, tenant: usize, now: u64) -> bool {
        let mut v = self.l.view(tenant);
        arbiter::refill(&mut v, now);
        self.l.store_view(tenant, &v);
        let h = &self.l.layout().header;
        if !arbiter::eligible(&v) {
            // Charged up to now already: the release that follows charges only what comes after.
            h.grant_ns.store(now, Release);
            return false;
        }
        h.grant_ns.store(now, Release);
        h.slice_ns.store(arbiter::slice_for(&v), Release);
        true
    }

    /// Takes a history sample when one is due.
    pub fn sample(&self, now: u64) {
        let l = self.l.layout();
        let seq = l.header.sample_seq.load(Acquire);
        let k = (seq % HISTORY as u64) as usize;
        let last = l.header.sample_ns[(k + HISTORY - 1) % HISTORY].load(Acquire);
        if seq != 0 && last <= now && now - last < SAMPLE_NS {
            return;
        }
        for t in &l.tenants {
            t.samples[k].store(t.charged_ns.load(Acquire), Release);
        }
        l.header.sample_ns[k].store(now, Release);
        l.header.sample_seq.store(seq.wrapping_add(1), Release);
    }
}
