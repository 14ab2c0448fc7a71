//! The scheduler thread's look at the device ledger (docs/COMPUTE.md, "Contention"): whether
//! another tenant wants the device, whether a high-priority tenant is active, whether this process
//! wants the device (`demand`), our own entries repaired when the file was damaged; and whether our
//! work waits without completing (a stall, published for the tenant's other devices).

use super::runtime;
use super::Sched;
use crate::log;
use crate::scheduling::demand;
use crate::scheduling::device::now_ns;
use crate::scheduling::shm::{self, TENANT_READY};
use crate::scheduling::{incident, priority, turn, Holder, Incident, TenantId, MAX_TENANTS};
use std::sync::atomic::Ordering::*;

/// A high-priority tenant that wanted the device within this interval is active: normal tenants
/// beside it keep one launch in flight. One that is merely present costs them nothing.
const HIGH_ACTIVE_NS: u64 = 200_000_000;

impl Sched {
    /// Re-reads the ledger: contention, priorities, caps; repairs our own slot and tenant entry.
    pub(in crate::scheduling) fn refresh(&self, now: u64) {
        self.repair_own();
        // A slot under a protected label without a verdict yet (a process that just joined).
        self.ledger.attest(false);
        let l = self.ledger.layout();
        let mine = self.tenant();
        self.note_demand(now);
        let mut present = [false; MAX_TENANTS];
        let mut wanting = [false; MAX_TENANTS];
        // Another tenant *wants* the device (its process holds its demand lock, `demand`): one
        // that merely holds a slot costs us nothing.
        let mut demanding = [false; MAX_TENANTS];
        for (i, s) in l.slots.iter().enumerate() {
            if s.state.load(Acquire) == shm::SLOT_ACTIVE {
                let t = s.tenant.load(Acquire) as usize;
                if t < MAX_TENANTS {
                    present[t] = true;
                    wanting[t] |= s.wants.load(Acquire) > 0;
                    if t != mine && !demanding[t] {
                        demanding[t] = self.ledger.slot_wants(i);
                    }
                }
            }
        }
        let others = demanding.iter().any(|&d| d);
        if others {
            let until = now.saturating_add(demand::CONTENTION_HOLD_NS);
            self.contended_until.fetch_max(until, Relaxed);
        }
        let owner_tenant = Holder::from_word(l.header.owner.load(Acquire))
            .slot()
            .map(|s| l.slots[s].tenant.load(Acquire) as usize);
        // Active: it waits for the device, owns it, wants it (its demand lock: a high-priority
        // tenant launching on the fast path, before anyone arbitrates, says so from its first
        // request, `demand::DEMAND_MIN_HIGH`), or was arbitrated for recently.
        let beside_high = (0..MAX_TENANTS).any(|t| {
            present[t]
                && t != mine
                && self.ledger.is_high(t)
                && (wanting[t]
                    || demanding[t]
                    || owner_tenant == Some(t)
                    || now.saturating_sub(self.ledger.view(t).last_active_ns) < HIGH_ACTIVE_NS)
        });
        let view = self.ledger.view(mine);
        self.high.store(view.high, Relaxed);
        self.beside_high.store(beside_high, Relaxed);
        self.weigh();
        let contended = demand::contended(now, self.contended_until.load(Relaxed), view.cap != 0);
        if self.contended.swap(contended, Relaxed) != contended {
            runtime::update_pass();
            if !contended && self.waiting.load(SeqCst) > 0 {
                // Our waiters sleep until a hand-over (`watch`): no longer contended, they go.
                crate::scheduling::device::futex_wake(&l.header.epoch);
            }
        }
    }

    /// Notes whether this process was active since the previous refresh (it launched, a thread of
    /// it waits at the gate or for its own queued work, or it owns the device), and says with its demand lock whether it
    /// wants the device (`demand`).
    fn note_demand(&self, now: u64) {
        // The launch note is the process's (the fast path does not know the device): whichever
        // device's thread takes it stamps when, and each device counts a stamp after its own look.
        if runtime::LAUNCHED.0.swap(false, Relaxed) {
            runtime::LAUNCH_NOTED_NS.fetch_max(now, Relaxed);
        }
        let mut seen = self.demand.lock();
        let launched = runtime::LAUNCH_NOTED_NS.load(Relaxed) > seen.looked_ns;
        seen.looked_ns = now;
        let active = launched
            || runtime::HOST_WAITS.load(Relaxed) > 0
            || self.waiting.load(SeqCst) > 0
            || self.owned.load(SeqCst) != 0;
        let window = demand::window_of(now);
        seen.history.observe(window, active);
        let wants = seen.history.wants_as(window, self.high.load(Relaxed));
        if wants != seen.said {
            seen.said = wants;
            self.ledger.set_demand(self.slot, wants);
        }
    }

    /// Our slot and tenant entry as we wrote them: a damaged file (another program, a bit flip) must
    /// not take us out of scheduling or make us count as someone else.
    fn repair_own(&self) {
        let l = self.ledger.layout();
        let slot = &l.slots[self.slot];
        if !self.waiting_published(slot) {
            // Zeroed (a waiter would never be granted) or stale (a grant nobody uses).
            self.publish_waiting();
        }
        let mut t = self.tenant();
        let entry = &l.tenants[t % MAX_TENANTS];
        let slot_ok =
            slot.state.load(Acquire) == shm::SLOT_ACTIVE && slot.tenant.load(Acquire) as usize == t;
        let entry_ok =
            entry.state.load(Acquire) == TENANT_READY && TenantId::load(&entry.id) == self.id;
        // The node's policy gives our tenant another entry, or ours to another tenant.
        let moved = self.ledger.entry_moved(t, self.id);
        if slot_ok && entry_ok && !moved {
            return;
        }
        let g = self.ledger.lock(self.slot);
        let label = shm::unpack(&entry.name);
        let view = self.ledger.view(t);
        if moved {
            let (id, (share, cap, high)) = (self.id, (view.share, view.cap, view.high));
            if let Some(n) = self
                .ledger
                .find_or_add_tenant(&g, id, &label, share, cap, high)
            {
                t = n;
                self.tenant.store(n, Relaxed);
                log::info(format_args!(
                    "device ledger {}: tenant entry {n} from now on (the node's policy)",
                    self.ledger.path().display()
                ));
            }
        } else if !entry_ok {
            self.ledger.restore_identity(t, self.id, &label, &view);
        }
        slot.tenant.store(t as u32, Release);
        slot.state.store(shm::SLOT_ACTIVE, Release);
        drop(g);
        if moved && slot_ok && entry_ok {
            return;
        }
        incident(
            Incident::OwnEntry,
            format_args!(
                "device ledger {}: our slot {} or tenant entry {t} was overwritten",
                self.ledger.path().display(),
                self.slot
            ),
        );
    }

    /// How long our work may complete nothing before it counts as waiting for something outside
    /// this process (`turn::stall_ns`): from its progress, three launches' time or twice the
    /// longest launch seen to complete, at least 1 ms.
    /// While the tenant's work on another device waits (a collective), the longest launch is not
    /// counted: a collective's kernel is long because it waits, and its peer ranks need the
    /// device to move on quickly (docs/COMPUTE.md, "Ownership, slices, draining").
    /// A high-priority owner waits longer (`priority::stall_ns`): first for what ran before it.
    pub(in crate::scheduling) fn stall_ns(&self) -> u64 {
        let peer_recent = self.peer_recent(now_ns());
        let longest = if peer_recent {
            0
        } else {
            self.longest_ns.load(Relaxed)
        };
        let launch_ns = self.launch_ns.load(Relaxed);
        let grant = self.ledger.layout().header.grant_ns.load(Acquire);
        priority::stall_ns(
            self.high.load(Relaxed),
            peer_recent,
            self.progress_ns.load(Acquire) > grant,
            turn::stall_ns(launch_ns, longest),
            launch_ns,
        )
    }

    /// Whether our work on this device waits without completing (work in flight, nothing of it
    /// completed and nothing submitted for the stall time); while it does, it is published in the
    /// tenant's memory ledger, where the tenant's processes on other devices find it: their
    /// launches then pass their gates for one round (`Sched::peer_pass`), since what ours waits
    /// for may be their part of a collective.
    pub(in crate::scheduling) fn watch_stall(&self, now: u64) -> bool {
        let done = self.completed();
        self.watch_stall_after(now, done)
    }

    /// [`Sched::watch_stall`] after a look that found our work `done` (or not).
    pub(in crate::scheduling) fn watch_stall_after(&self, now: u64, done: bool) -> bool {
        let last = self
            .progress_ns
            .load(Acquire)
            .max(self.last_submit_ns.load(Acquire));
        if done || now.saturating_sub(last) <= self.stall_ns() {
            self.stall_since.store(0, Relaxed);
            return false;
        }
        let since = match self.stall_since.load(Relaxed) {
            0 => {
                let s = last.max(1);
                self.stall_since.store(s, Relaxed);
                s
            }
            s => s,
        };
        if let Some(ledger) = runtime::tenant_ledger() {
            ledger.publish_stall(self.device_key, since, now);
        }
        true
    }
}
