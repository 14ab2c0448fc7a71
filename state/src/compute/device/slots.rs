//! Process slots no other tenant can keep a process out of.
//!
//! Every tenant of a GPU can open its device ledger, so every tenant can lock the ledger's slot
//! bytes (`lockf`, `F_SETLK`, read or write locks alike): a claim that needs one of those locks can
//! be refused by anybody. A process whose tenant has a memory ledger (every node tenant, and every
//! tenant configured with a quota) therefore claims its slot with a lock in *that* file instead, at
//! a byte reserved for this GPU and slot ([`TenantLocks::offset`]): the memory ledger is the
//! tenant's own (root:<its group> 0660 on a node, the user's 0600 otherwise), so no other tenant
//! can open it, let alone lock it. Exclusive use of the slot comes from the state word's
//! compare-and-swap (FREE to ACTIVE), as it always did; the tenant lock keeps the tenant's other
//! processes from judging it dead.
//!
//! The ledger's own slot byte is still taken when it is free (at the claim, and at every sweep
//! while it is not held): it is what the other tenants' processes judge the slot's liveness by,
//! since they cannot open the tenant's file. Held by a squatter, it makes the slot look alive to
//! them, also after its process died; the tenant's own processes see through it (their sweep frees
//! a slot of their tenant whose tenant lock nobody holds and whose heartbeat stopped).

use super::*;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;

/// First byte of the range of a memory ledger where device-ledger slots are locked: far past the
/// memory ledger's own data and slot locks (locks may lie past the end of a file).
const TENANT_LOCK_BASE: u64 = 1 << 40;
/// GPUs are told apart in that range by a 24-bit hash of their UUID. Two GPUs of one tenant that
/// hash alike only make a claim try another slot, or a sweep keep a dead slot longer.
const GPU_KEYS: u64 = 1 << 24;
/// A slot of our tenant whose tenant lock nobody holds is freed by our sweep only once its
/// heartbeat is older than this: a live process of an older library (which holds no tenant lock)
/// beats every few milliseconds.
const OWN_DEAD_BEAT_NS: u64 = 1_000_000_000;

/// The descriptor of our tenant's memory ledger on which our slot is locked.
pub(super) struct TenantLocks {
    fd: OwnedFd,
    base: u64,
    /// Our tenant: the slots labelled with it are told live or not by these locks ([`limit`]).
    id: TenantId,
    /// We hold our slot's byte in the device ledger too (false while somebody else holds it).
    pub(super) shared_held: AtomicBool,
}

impl TenantLocks {
    fn offset(&self, slot: usize) -> u64 {
        self.base + slot as u64
    }
}

/// The byte of a tenant's memory ledger locked by whoever of its processes holds slot `slot` of
/// GPU `uuid`'s device ledger (also read by the other tenants, [`super::attest`]).
pub(super) fn tenant_lock_byte(uuid: &str, slot: usize) -> u64 {
    TENANT_LOCK_BASE + gpu_key(uuid) * MAX_SLOTS as u64 + slot as u64
}

/// FNV-1a of the UUID, folded to [`GPU_KEYS`].
fn gpu_key(uuid: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in uuid.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h % GPU_KEYS
}

impl DeviceLedger {
    /// Claims slots from now on with a lock in `file`, the tenant's memory ledger (opened again:
    /// a description of our own, never mapped, which fork children give up). Only a regular file
    /// we can write is used; otherwise claims stay as they were (the ledger's own slot bytes) and
    /// the reason is returned. `id` is the tenant's identity: on a node, its slots are bounded
    /// ([`limit`]).
    pub fn use_tenant_locks(&self, file: &Path, id: TenantId) -> Result<(), String> {
        if !self.writable() {
            return Err("opened read-only".into());
        }
        let fd =
            sys::open(file, libc::O_RDWR, 0).map_err(|e| format!("{}: {e}", file.display()))?;
        match sys::fstat(&fd) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG => {}
            Ok(_) => return Err(format!("{}: not a regular file", file.display())),
            Err(e) => return Err(format!("{}: {e}", file.display())),
        }
        let base = tenant_lock_byte(&self.uuid(), 0);
        self.tenant_locks
            .set(TenantLocks {
                fd,
                base,
                id,
                shared_held: AtomicBool::new(false),
            })
            .map_err(|_| "already set".to_string())
    }

    /// The claim with a tenant lock ([`use_tenant_locks`](Self::use_tenant_locks)): a free slot
    /// whose tenant lock we get, its ledger byte too when nobody holds it, then the state word. On
    /// a node (a policy in effect) our tenant holds at most its [`limit::slot_limit`] of slots,
    /// and a full ledger gives back a slot of a tenant over its limit ([`limit::decide`]).
    /// `None` when this ledger claims the old way.
    pub(super) fn claim_with_tenant_lock(
        &self,
        take: impl Fn(usize) -> bool,
    ) -> Option<Option<usize>> {
        let t = self.tenant_locks.get()?;
        let limit = self.policy.listed().map(limit::slot_limit);
        if let Some(limit) = limit {
            if limit::decide(&self.seen_slots(t), limit, 0) == limit::Claim::AtLimit {
                self.log_at_limit(limit);
                return Some(None);
            }
        }
        let l = self.layout();
        let own = t.fd.as_raw_fd();
        for i in 0..MAX_SLOTS {
            if l.slots[i].state.load(Acquire) != SLOT_FREE
                || !matches!(sys::try_lock(own, t.offset(i)), Ok(true))
            {
                continue;
            }
            if let Some(got) = self.take_locked(t, i, &take) {
                return Some(Some(got));
            }
        }
        let Some(limit) = limit else {
            return Some(None);
        };
        // At random among the group's slots: processes that start together would all pick the
        // same one (`limit`).
        Some(self.take_back(t, limit, &take, random_pick))
    }

    /// Full: a slot of whoever holds more than its `limit` ([`limit::decide`], the `pick()`-th of
    /// the group's slots), a few tries: claims race. Claimers of different tenants hold different
    /// tenant-lock files, so nothing of those excludes two that picked the same slot: each would
    /// take it back (the second's compare-and-swap succeeds on the state the first wrote again)
    /// and both run on it. So a claimer first takes the slot's **claim byte** in the device
    /// ledger ([`claim_offset`]) and, holding it, looks at the slot again: one that picked the
    /// slot while another claimed it finds the byte held, or, once it gets it, the slot under
    /// the other's label; either way it picks again. A tenant that holds every claim byte only
    /// brings back the shared slot: the last try goes without the byte.
    pub(super) fn take_back(
        &self,
        t: &TenantLocks,
        limit: usize,
        take: &impl Fn(usize) -> bool,
        mut pick: impl FnMut() -> usize,
    ) -> Option<usize> {
        let l = self.layout();
        let own = t.fd.as_raw_fd();
        for attempt in 0..RECLAIM_TRIES {
            let seen = self.seen_slots(t);
            let limit::Claim::Reclaim(i) = limit::decide(&seen, limit, pick()) else {
                return None;
            };
            let claim = ClaimByte::take(self.raw_fd(), i);
            if claim.is_none() && attempt + 1 < RECLAIM_TRIES {
                continue;
            }
            if claim.is_some() && self.seen_slot(t, i) != seen[i] {
                continue;
            }
            let s = &l.slots[i];
            let was = s.state.load(Acquire);
            if was == SLOT_FREE || !matches!(sys::try_lock(own, t.offset(i)), Ok(true)) {
                continue;
            }
            if s.state
                .compare_exchange(was, SLOT_FREE, AcqRel, Acquire)
                .is_err()
            {
                sys::unlock(own, t.offset(i));
                continue;
            }
            let label = s.tenant.load(Acquire) as usize;
            if let Some(got) = self.take_locked(t, i, take) {
                l.header.slot_reclaims.fetch_add(1, AcqRel);
                crate::log::warn(format_args!(
                    "device ledger {}: every process slot is in use; slot {i} (labelled tenant \
                     entry {label}, whose group holds more than its limit of {limit} slots) \
                     taken back for this process",
                    self.path.display()
                ));
                return Some(got);
            }
        }
        None
    }

    /// The end of a claim of slot `i`, whose tenant lock we hold: the ledger byte when free, then
    /// the state word (`take`). The slot, or `None` with the locks let go.
    ///
    /// The byte taken is what the other tenants' processes judge the slot alive by (their sweep
    /// frees a slot whose byte nobody holds; a waiter revokes an owner whose byte nobody holds).
    /// Two processes that start together claim the same free slot at once: each takes its own
    /// tenant lock, the loser may hold the ledger byte at the instant the winner tries it, and
    /// lets it go only after its compare-and-swap fails. So a winner that found the byte held
    /// tries again for up to [`BYTE_RETRY_NS`]: the loser lets go within microseconds, a squatter
    /// never (the slot is kept without the byte, taken at a later sweep).
    fn take_locked(
        &self,
        t: &TenantLocks,
        i: usize,
        take: &impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let (shared, own) = (self.raw_fd(), t.fd.as_raw_fd());
        let at = <Layout as slotfile::SlotLayout>::lock_offset(i);
        let try_byte = || matches!(sys::try_lock(shared, at), Ok(true));
        let mut held = try_byte();
        if take(i) {
            let start = now_ns();
            while !held && now_ns().saturating_sub(start) < BYTE_RETRY_NS {
                std::thread::sleep(std::time::Duration::from_nanos(BYTE_RETRY_STEP_NS));
                held = try_byte();
            }
            sys::guard_slot_fd(own);
            sys::guard_slot_fd(shared);
            t.shared_held.store(held, Release);
            attest::SLOTS_TAKEN.fetch_add(1, AcqRel);
            return Some(i);
        }
        if held {
            sys::unlock(shared, at);
        }
        sys::unlock(own, t.offset(i));
        None
    }

    /// What a claim sees of every slot ([`limit::Seen`]): free; labelled with our tenant, live
    /// when a process of it holds its tenant lock (an error counts as live); or whoever else the
    /// words name, grouped by the policy (a tenant it lists, or everybody else).
    fn seen_slots(&self, t: &TenantLocks) -> Vec<limit::Seen> {
        (0..MAX_SLOTS).map(|i| self.seen_slot(t, i)).collect()
    }

    /// What a claim sees of slot `i` ([`seen_slots`](Self::seen_slots)).
    fn seen_slot(&self, t: &TenantLocks, i: usize) -> limit::Seen {
        let l = self.layout();
        let s = &l.slots[i];
        if s.state.load(Acquire) == SLOT_FREE {
            return limit::Seen::Free;
        }
        let label = s.tenant.load(Acquire) as usize;
        let id = l
            .tenants
            .get(label)
            .filter(|e| e.state.load(Acquire) == TENANT_READY)
            .map(|e| TenantId::load(&e.id));
        match id {
            Some(id) if id == t.id => limit::Seen::Ours {
                live: sys::is_locked(t.fd.as_raw_fd(), t.offset(i)).unwrap_or(true),
            },
            Some(id) if matches!(self.policy.lookup(id), Lookup::Listed { .. }) => {
                limit::Seen::Theirs(Some(id))
            }
            _ => limit::Seen::Theirs(None),
        }
    }

    /// Says once per process that its tenant holds its limit of slots.
    fn log_at_limit(&self, limit: usize) {
        static LOGGED: AtomicBool = AtomicBool::new(false);
        if !LOGGED.swap(true, Relaxed) {
            crate::log::error(format_args!(
                "device ledger {}: this process's tenant holds its limit of {limit} process slots \
                 (the slots shared equally among the tenants the node's policy lists)",
                self.path.display()
            ));
        }
    }

    /// Our slot `me`'s byte in the device ledger, taken when whoever held it at the claim let it
    /// go: from then on the other tenants judge our liveness right again.
    pub(super) fn retake_shared_lock(&self, me: usize) {
        let Some(t) = self.tenant_locks.get() else {
            return;
        };
        if !t.shared_held.load(Acquire)
            && matches!(
                sys::try_lock(
                    self.raw_fd(),
                    <Layout as slotfile::SlotLayout>::lock_offset(me)
                ),
                Ok(true)
            )
        {
            t.shared_held.store(true, Release);
        }
    }

    /// Whether we hold our slot's byte in the device ledger (always, for a ledger claiming the
    /// old way).
    pub fn holds_shared_slot_lock(&self) -> bool {
        self.tenant_locks
            .get()
            .map_or(true, |t| t.shared_held.load(Acquire))
    }

    /// A slot of our own tenant (`tenant`) that looks alive to everyone (its ledger byte is held)
    /// but whose tenant lock nobody holds and whose heartbeat stopped: its process died while a
    /// squatter held the byte. Freed here, holding its tenant lock meanwhile.
    pub(super) fn free_own_dead_slot(&self, i: usize, tenant: usize, now: u64) -> bool {
        let Some(t) = self.tenant_locks.get() else {
            return false;
        };
        let s = &self.layout().slots[i];
        if s.tenant.load(Acquire) as usize != tenant
            || now.saturating_sub(s.beat_ns.load(Acquire)) < OWN_DEAD_BEAT_NS
            || !matches!(sys::try_lock(t.fd.as_raw_fd(), t.offset(i)), Ok(true))
        {
            return false;
        }
        s.wants.store(0, Release);
        s.wait_since.store(0, Release);
        s.state.store(SLOT_FREE, Release);
        sys::unlock(t.fd.as_raw_fd(), t.offset(i));
        true
    }

    /// The tenant-lock descriptor, for the fork guard's bookkeeping.
    pub(super) fn tenant_lock_fd(&self) -> Option<RawFd> {
        self.tenant_locks.get().map(|t| t.fd.as_raw_fd())
    }
}

/// How long a claim that won a slot whose ledger byte another claimer held tries the byte again
/// ([`DeviceLedger::take_locked`]), and how often: a loser holds it for microseconds (longer only
/// when the host does not run it); a squatter costs a joining process this much, once.
pub(super) const BYTE_RETRY_NS: u64 = 5_000_000;
const BYTE_RETRY_STEP_NS: u64 = 50_000;

/// Tries at taking a slot back ([`DeviceLedger::take_back`]).
const RECLAIM_TRIES: usize = 4;

/// Byte of slot `slot`'s claim lock in the device ledger: past the slot and demand locks.
pub fn claim_offset(slot: usize) -> u64 {
    <Layout as slotfile::SlotLayout>::lock_offset(2 * MAX_SLOTS + slot)
}

/// A slot's claim byte, held while a claim takes the slot back; let go when dropped.
struct ClaimByte {
    fd: RawFd,
    at: u64,
}

impl ClaimByte {
    /// The claim byte of `slot` on the device ledger's descriptor `fd`, unless another open file
    /// description holds it.
    fn take(fd: RawFd, slot: usize) -> Option<ClaimByte> {
        let at = claim_offset(slot);
        matches!(sys::try_lock(fd, at), Ok(true)).then_some(ClaimByte { fd, at })
    }
}

impl Drop for ClaimByte {
    fn drop(&mut self) {
        sys::unlock(self.fd, self.at);
    }
}

/// A pick for [`limit::decide`] that differs between processes and between tries: the clock's
/// nanoseconds, the process id and a stack address (each process's own, with address-space
/// randomisation; in containers every process may be pid 1), mixed (Fibonacci hashing). Not for
/// secrecy: a squatter gains nothing by guessing which of its slots goes.
fn random_pick() -> usize {
    let here = 0u8;
    let seed = now_ns() ^ (u64::from(sys::getpid()) << 32) ^ (&here as *const u8 as u64);
    (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::device::claim_tests::taker;
    use crate::compute::device::limit::slot_limit;
    use crate::compute::policy::{equal_shares, path_for_ledger, render};
    use std::os::fd::AsRawFd;

    const UUID: &str = "GPU-00000000-0000-0000-0000-0000000000c1";

    /// Two claimers of different tenants take back a slot of a squatting group at once: the second
    /// looked at the slots, then the first claimed the very slot the second picks, from start to
    /// end. The second must not take it too (it would share it with the first); it takes the
    /// group's next one. A claim byte held by a claimer still at work sends a claim to another
    /// pick; held everywhere (a tenant locking every claim byte), the claim still gets a slot.
    #[test]
    fn two_claimers_that_pick_the_same_slot_take_back_different_ones() {
        let _serial = slotfile::serial_test();
        let dir = crate::compute::scratch("claim");
        let path = dir.join(format!("{UUID}.dev"));
        std::fs::write(path_for_ledger(&path), render(&equal_shares(3))).unwrap();
        let l = DeviceLedger::open(&path, UUID, true).unwrap();
        let add = |id: u128| {
            l.with_admin_lock(|g| {
                l.find_or_add_tenant(g, TenantId(id), &format!("t{id}"), 10, 0, false)
                    .unwrap()
            })
        };
        let (squatter, a, b) = (add(1), add(2), add(3));
        for s in &l.layout().slots {
            s.tenant.store(squatter as u32, Release);
            s.state.store(SLOT_ACTIVE, Release);
        }
        let join = |id: u128| {
            let own = dir.join(format!("t{id}.ledger"));
            if !own.exists() {
                std::fs::write(&own, b"").unwrap();
            }
            let h = DeviceLedger::open(&path, UUID, false).unwrap();
            h.use_tenant_locks(&own, TenantId(id)).unwrap();
            h
        };
        let limit = slot_limit(3);
        let (first, second) = (join(2), join(3));
        fn locks(h: &DeviceLedger) -> &TenantLocks {
            h.tenant_locks.get().unwrap()
        }
        let (ta, tb) = (locks(&first), locks(&second));
        let mut got_first = None;
        let got_second = second.take_back(tb, limit, &taker(&second, b), || {
            if got_first.is_none() {
                got_first = first.take_back(ta, limit, &taker(&first, a), || 0);
            }
            0
        });
        let (x, y) = (got_first.unwrap(), got_second.unwrap());
        assert_eq!(x, MAX_SLOTS - 1, "the first takes the group's highest slot");
        assert_ne!(x, y, "both claimers took back slot {x}");
        assert_eq!(y, MAX_SLOTS - 2);
        assert_eq!(l.layout().slots[x].tenant.load(Acquire) as usize, a);
        assert_eq!(l.layout().slots[y].tenant.load(Acquire) as usize, b);
        // Another claimer holds the claim byte of the group's highest slot: the claim picks again.
        let other = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let held = MAX_SLOTS - 3;
        assert!(matches!(
            sys::try_lock(other.as_raw_fd(), claim_offset(held)),
            Ok(true)
        ));
        let third = join(2);
        let t3 = locks(&third);
        let mut picks = [0, 1].into_iter();
        let got = third.take_back(t3, limit, &taker(&third, a), || picks.next().unwrap_or(0));
        assert_eq!(got, Some(held - 1));
        // Every claim byte held: the last try goes without it.
        for i in 0..MAX_SLOTS {
            let _ = sys::try_lock(other.as_raw_fd(), claim_offset(i));
        }
        let fourth = join(3);
        let t4 = locks(&fourth);
        assert_eq!(
            fourth.take_back(t4, limit, &taker(&fourth, b), || 0),
            Some(held),
            "a tenant holding every claim byte kept a claimer out"
        );
        drop((first, second, third, fourth, l));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn gpu_keys_stay_in_their_range() {
        for u in [
            "GPU-0",
            "GPU-1",
            "",
            "GPU-ffffffff-ffff-ffff-ffff-ffffffffffff",
        ] {
            assert!(gpu_key(u) < GPU_KEYS);
        }
        assert_ne!(gpu_key("GPU-0"), gpu_key("GPU-1"));
    }
}
