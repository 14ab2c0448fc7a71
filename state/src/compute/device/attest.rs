//! Which process slots count for the tenant entry they are labelled with.
//!
//! A slot's tenant word is anybody's to write: a tenant could label its own slots with another
//! tenant's entry and be scheduled as that tenant. On a node whose compute policy gives a tenant
//! an entry and names its memory ledger (`entry=`, `lock=`: [`super::super::policy`]), a slot
//! labelled with that entry counts for it only while the kernel says a process of that tenant
//! holds the slot: a write lock on the slot's byte in the tenant's memory ledger (the tenant lock
//! every claim takes, [`super::slots`]). Only the tenant's processes can open that file for
//! writing (root:<its group> 0660, mounted into its containers only), and the kernel lists every
//! open-file-description lock in `/proc/locks` by device and inode, whatever the PID namespace, so
//! every process can check every slot without opening anybody's file.
//!
//! The verdicts are kept per slot ([`Attest`]) and renewed by the scheduler thread (each sweep, and
//! at its 10 ms refresh when a slot under a protected label has none yet): the hand-over reads one
//! word per waiter; nothing is added to the launch path. A slot that does not count is left out of
//! the waiters (its process is never handed the device under that label). Where `/proc/locks`
//! cannot be read, labels are believed, as before (logged once).

use super::*;
use crate::slotfile::atomic::AtomicU64;
use std::sync::atomic::AtomicBool;

/// Renewals asked for by a missing verdict are at most this often (each reads `/proc/locks`).
const RESCAN_NS: u64 = 10_000_000;

/// A reading of `/proc/locks` younger than this serves every device ledger of the process: the
/// scheduler thread sweeps each GPU's ledger in one pass, and a process using eight GPUs read the
/// whole file eight times a pass (about 45 µs each with a few dozen locks, more on a busy node).
/// Well under [`RESCAN_NS`], so a renewal asked for by a missing verdict always reads afresh.
const SHARED_READING_NS: u64 = 5_000_000;

/// Slots this process has taken under a tenant lock ([`super::slots`]): a reading made before
/// the last of them does not list that lock, and its own slot would look unseen.
pub(super) static SLOTS_TAKEN: AtomicU64 = AtomicU64::new(0);

/// A shared reading: when (ns), [`SLOTS_TAKEN`] then, the write locks.
type Reading = Option<(u64, u64, std::sync::Arc<Vec<HeldLock>>)>;

/// The process's last reading of `/proc/locks`, shared by its device ledgers.
static LAST_READING: std::sync::Mutex<Reading> = std::sync::Mutex::new(None);

/// The write locks of `/proc/locks` as read at most [`SHARED_READING_NS`] before `now` with no
/// slot taken since (`taken`: [`SLOTS_TAKEN`]), or read now (by `read`).
fn write_locks_at(
    last: &std::sync::Mutex<Reading>,
    now: u64,
    taken: u64,
    read: impl FnOnce() -> std::io::Result<String>,
) -> std::io::Result<std::sync::Arc<Vec<HeldLock>>> {
    // Only scheduler threads (and tests) take it, never a hook. A poisoned lock still holds a
    // whole reading: it is replaced only after the read succeeded.
    let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((at, then, locks)) = last.as_ref() {
        if *then == taken && now >= *at && now - at < SHARED_READING_NS {
            return Ok(locks.clone());
        }
    }
    let locks = std::sync::Arc::new(write_locks(&read()?));
    *last = Some((now, taken, locks.clone()));
    Ok(locks)
}

/// The verdicts of one device ledger's slots.
pub(super) struct Attest {
    /// Per slot: 1 + the entry it was found to count for at the last reading; 0: none.
    verdicts: [AtomicU32; MAX_SLOTS],
    read_ns: AtomicU64,
    /// `/proc/locks` could not be read: labels are believed.
    blind: AtomicBool,
}

impl Attest {
    pub(super) fn new() -> Attest {
        Attest {
            verdicts: [const { AtomicU32::new(0) }; MAX_SLOTS],
            read_ns: AtomicU64::new(0),
            blind: AtomicBool::new(false),
        }
    }
}

/// A write lock of `/proc/locks`: the file (major, minor, inode) and the bytes, inclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldLock {
    pub major: u64,
    pub minor: u64,
    pub ino: u64,
    pub start: u64,
    pub end: u64,
}

/// The write locks of `/proc/locks`' text (blocked requests, `->`, and read locks left out):
/// `1: OFDLCK ADVISORY  WRITE -1 00:19:1234 1099511627776 1099511627776`.
pub fn write_locks(text: &str) -> Vec<HeldLock> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_ascii_whitespace().collect();
            if f.len() < 8 || f[1] == "->" || f[3] != "WRITE" {
                return None;
            }
            let mut dev = f[5].split(':');
            let major = u64::from_str_radix(dev.next()?, 16).ok()?;
            let minor = u64::from_str_radix(dev.next()?, 16).ok()?;
            let ino = dev.next()?.parse().ok()?;
            let start = f[6].parse().ok()?;
            let end = if f[7] == "EOF" {
                u64::MAX
            } else {
                f[7].parse().ok()?
            };
            Some(HeldLock {
                major,
                minor,
                ino,
                start,
                end,
            })
        })
        .collect()
}

/// Whether a process holds byte `byte` of the file `(dev, ino)` (a `stat`'s `st_dev`, `st_ino`)
/// write-locked, by `locks`.
pub fn held(locks: &[HeldLock], (dev, ino): (u64, u64), byte: u64) -> bool {
    let (major, minor) = (u64::from(libc::major(dev)), u64::from(libc::minor(dev)));
    locks.iter().any(|l| {
        l.ino == ino && l.major == major && l.minor == minor && l.start <= byte && byte <= l.end
    })
}

/// Whether a slot labelled `label` counts for it: always when the policy gives that entry nobody
/// or names no file to attest by (`reserved`), or when nothing could be read (`blind`); otherwise
/// only with the verdict of the last reading (`verdict`: 1 + the entry it counted for).
pub fn counts(
    reserved: Option<(TenantId, Option<(u64, u64)>)>,
    blind: bool,
    verdict: u32,
    label: usize,
) -> bool {
    match reserved {
        None | Some((_, None)) => true,
        Some((_, Some(_))) => blind || verdict as usize == label + 1,
    }
}

impl DeviceLedger {
    /// Whether slot `slot`, labelled `label`, counts for that tenant entry ([`counts`]).
    pub(super) fn slot_counts(&self, slot: usize, label: usize) -> bool {
        let a = &self.attest;
        counts(
            self.policy.reserved(label),
            a.blind.load(Acquire),
            a.verdicts.get(slot).map_or(0, |v| v.load(Acquire)),
            label,
        )
    }

    /// Renews the verdicts from `/proc/locks`: always (`due`: the sweep), or when a live slot under
    /// a protected label has no verdict for it and the last reading is older than [`RESCAN_NS`].
    pub fn attest(&self, due: bool) {
        let l = self.layout();
        let labelled = |i: usize| -> Option<(usize, (u64, u64))> {
            let s = &l.slots[i];
            if s.state.load(Acquire) == SLOT_FREE {
                return None;
            }
            let label = s.tenant.load(Acquire) as usize;
            let (_, lock) = self.policy.reserved(label.min(MAX_TENANTS))?;
            Some((label, lock?))
        };
        let now = now_ns();
        let a = &self.attest;
        if !due {
            let missing = (0..MAX_SLOTS).any(|i| {
                labelled(i).is_some_and(|(e, _)| a.verdicts[i].load(Acquire) as usize != e + 1)
            });
            if !missing || now.saturating_sub(a.read_ns.load(Acquire)) < RESCAN_NS {
                return;
            }
        }
        a.read_ns.store(now, Release);
        if self.policy.listed().is_none() || !(0..MAX_SLOTS).any(|i| labelled(i).is_some()) {
            for v in &a.verdicts {
                v.store(0, Release);
            }
            return;
        }
        let taken = SLOTS_TAKEN.load(Acquire);
        let locks = match write_locks_at(&LAST_READING, now, taken, || {
            std::fs::read_to_string("/proc/locks")
        }) {
            Ok(locks) => locks,
            Err(e) => {
                if !a.blind.swap(true, AcqRel) {
                    crate::log::error(format_args!(
                        "/proc/locks: {e}; device ledger {}: process slots count for the tenant \
                         entry they are labelled with, unchecked",
                        self.path.display()
                    ));
                }
                return;
            }
        };
        let uuid = self.uuid();
        for i in 0..MAX_SLOTS {
            let v = labelled(i)
                .filter(|&(_, lock)| held(&locks, lock, slots::tenant_lock_byte(&uuid, i)))
                .map_or(0, |(e, _)| e as u32 + 1);
            a.verdicts[i].store(v, Release);
        }
        // Our own slot, whose lock we hold, must be found: if not, what this process reads is not
        // what the policy names (a procfs of another kernel's view, a file system whose `stat`
        // device differs from the locks' list). Then labels are believed rather than every slot
        // of the tenant left out.
        let blind = self.own_slot_unseen();
        if blind && !a.blind.load(Acquire) {
            crate::log::error(format_args!(
                "device ledger {}: /proc/locks does not list this process's own slot lock where \
                 the node's policy says; process slots count for the tenant entry they are \
                 labelled with, unchecked",
                self.path.display()
            ));
        }
        a.blind.store(blind, Release);
    }

    /// Whether our slot is labelled with our tenant's protected entry and held with our tenant
    /// lock, yet found to count for nothing by the last reading.
    fn own_slot_unseen(&self) -> bool {
        let (slot, entry) = {
            let own = self.own.lock();
            match (own.slot, own.tenant.as_ref()) {
                (Some(slot), Some(t)) => (slot, t.0),
                _ => return false,
            }
        };
        let l = self.layout();
        let Some(s) = l.slots.get(slot) else {
            return false;
        };
        self.tenant_locks.get().is_some()
            && !self.forked()
            && s.tenant.load(Acquire) as usize == entry
            && matches!(self.policy.reserved(entry), Some((_, Some(_))))
            && self.attest.verdicts[slot].load(Acquire) as usize != entry + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The device ledgers of one process share a reading made within [`SHARED_READING_NS`], but
    /// never one made before the process took a slot, nor an older one; a failed read keeps
    /// nothing.
    #[test]
    fn a_reading_is_shared_only_while_fresh_and_no_slot_was_taken_since() {
        let last = std::sync::Mutex::new(None);
        let reads = std::cell::Cell::new(0);
        let text = "1: OFDLCK ADVISORY  WRITE -1 00:19:1234 7 7\n";
        let read = |t: u64, taken: u64| {
            write_locks_at(&last, t, taken, || {
                reads.set(reads.get() + 1);
                Ok(text.to_owned())
            })
            .unwrap()
            .len()
        };
        assert_eq!(read(1_000, 0), 1);
        assert_eq!(read(1_000 + SHARED_READING_NS - 1, 0), 1);
        assert_eq!(reads.get(), 1, "a fresh reading is shared");
        read(1_000 + SHARED_READING_NS, 0);
        assert_eq!(reads.get(), 2, "an old reading is read again");
        read(1_000 + SHARED_READING_NS + 1, 1);
        assert_eq!(reads.get(), 3, "a slot taken since: read again");
        read(500, 1);
        assert_eq!(reads.get(), 4, "a clock that went back: read again");
        let later = 500 + SHARED_READING_NS;
        let failed = write_locks_at(&last, later, 1, || Err(std::io::ErrorKind::NotFound.into()));
        assert!(failed.is_err());
        read(later, 1);
        assert_eq!(reads.get(), 5, "a failed read is not shared");
    }

    #[test]
    fn write_locks_are_read_from_proc_locks_text() {
        let text = "1: OFDLCK ADVISORY  WRITE -1 00:19:1234 1099511627776 1099511627779\n\
                    1: -> OFDLCK ADVISORY  WRITE -1 00:19:1234 5 5\n\
                    2: OFDLCK ADVISORY  READ  -1 00:19:1234 7 7\n\
                    3: POSIX  ADVISORY  WRITE 30173 fe:01:99 0 EOF\n\
                    4: garbage\n";
        let locks = write_locks(text);
        assert_eq!(locks.len(), 2, "{locks:?}");
        let file = (libc::makedev(0, 0x19), 1234);
        assert!(held(&locks, file, 1_099_511_627_776));
        assert!(held(&locks, file, 1_099_511_627_779));
        assert!(!held(&locks, file, 1_099_511_627_780));
        assert!(!held(&locks, file, 5), "a blocked request holds nothing");
        assert!(
            !held(&locks, file, 7),
            "a read lock (anybody's) attests nothing"
        );
        assert!(!held(&locks, (file.0, 1235), 1_099_511_627_776));
        assert!(held(&locks, (libc::makedev(0xfe, 1), 99), 1 << 50));
    }

    #[test]
    fn a_slot_counts_for_a_protected_entry_only_with_its_verdict() {
        let t = TenantId(7);
        // Unprotected entries (nobody's, or a record without a file): the label decides.
        assert!(counts(None, false, 0, 3));
        assert!(counts(Some((t, None)), false, 0, 3));
        let protected = Some((t, Some((1, 2))));
        assert!(counts(protected, false, 4, 3));
        assert!(!counts(protected, false, 0, 3), "no verdict");
        assert!(
            !counts(protected, false, 5, 3),
            "a verdict for another entry (the slot was relabelled since)"
        );
        assert!(counts(protected, true, 0, 3), "blind: labels believed");
    }

    /// On a node whose policy gives tenant 1 entry 5 and tenant 2 entry 6 (each with its memory
    /// ledger): each joins at its entry; an entry's share is the policy's for its index whatever
    /// its identity words say; a tenant not listed is never added at either; a slot labelled 6
    /// counts only while tenant 2's lock on it is held (the kernel's `/proc/locks`), so tenant 1's
    /// slot relabelled 6 drops out of the waiters, and counts again under its own entry.
    #[test]
    fn entries_follow_the_policy_and_slots_count_with_their_tenants_lock() {
        use crate::compute::policy::Record;
        use std::os::unix::fs::MetadataExt;
        const UUID: &str = "GPU-00000000-0000-0000-0000-0000000000a7";
        let _serial = slotfile::serial_test();
        let dir = crate::compute::scratch("attest");
        let path = dir.join(format!("{UUID}.dev"));
        let own = |t: u128| {
            let p = dir.join(format!("t{t}.ledger"));
            std::fs::write(&p, b"").unwrap();
            let m = std::fs::metadata(&p).unwrap();
            (p, (m.dev(), m.ino()))
        };
        let ((own1, lock1), (own2, lock2)) = (own(1), own(2));
        let record = |id: u128, share: u32, entry: usize, lock: (u64, u64)| Record {
            id: TenantId(id),
            share,
            cap: 0,
            high: false,
            label: format!("t{id}"),
            entry: Some(entry),
            lock: Some(lock),
        };
        let records = [record(1, 10, 5, lock1), record(2, 30, 6, lock2)];
        let open = |own: Option<(&Path, u128)>| {
            let h = DeviceLedger::open(&path, UUID, true).unwrap();
            h.policy.store(Some(&records));
            if let Some((file, id)) = own {
                h.use_tenant_locks(file, TenantId(id)).unwrap();
            }
            h
        };
        let (judge, h1, h2) = (open(None), open(Some((&own1, 1))), open(Some((&own2, 2))));
        let join = |h: &DeviceLedger, id: u128| {
            let slot = h.claim_slot(usize::MAX >> 1).unwrap();
            let t = {
                let g = h.lock(slot);
                h.find_or_add_tenant(&g, TenantId(id), &format!("t{id}"), 10_000, 0, true)
                    .unwrap()
            };
            let s = &h.layout().slots[slot];
            s.tenant.store(t as u32, Release);
            s.wants.store(1, Release);
            s.wait_since.store(now_ns(), Release);
            (slot, t)
        };
        let ((a, e1), (b, e2)) = (join(&h1, 1), join(&h2, 2));
        assert_eq!(
            (e1, e2),
            (5, 6),
            "each tenant joins at the entry the policy gives it"
        );
        let unlisted = judge.with_admin_lock(|g| {
            judge
                .find_or_add_tenant(g, TenantId(9), "t9", 10_000, 0, true)
                .unwrap()
        });
        assert!(
            unlisted != 5 && unlisted != 6,
            "an unlisted tenant at {unlisted}"
        );
        // Settings by index: share 10000 and the high class asked at join count for nothing.
        let l = judge.layout();
        TenantId(0x5a5a).store(&l.tenants[6].id);
        TenantId(2).store(&l.tenants[5].id);
        assert_eq!((judge.view(5).share, judge.view(5).high), (10, false));
        assert_eq!(
            judge.view(6).share,
            30,
            "entry 6 is tenant 2's whatever its words say"
        );
        assert_eq!(judge.view(unlisted).share, 1);
        assert!(judge.entry_moved(unlisted, TenantId(1)));
        assert!(!judge.entry_moved(6, TenantId(2)));
        let beat = |slot: usize| l.slots[slot].beat_ns.store(now_ns(), Release);
        let waiting = || {
            beat(a);
            beat(b);
            judge.attest(true);
            let mut w: Vec<(usize, usize)> = judge
                .waiters(None)
                .iter()
                .map(|w| (w.slot, w.tenant))
                .collect();
            w.sort();
            w
        };
        let mut both = vec![(a, 5), (b, 6)];
        both.sort();
        assert_eq!(waiting(), both);
        // Tenant 1's slot labelled with tenant 2's entry: its lock is in tenant 1's file.
        l.slots[a].tenant.store(6, Release);
        assert_eq!(waiting(), vec![(b, 6)], "a slot posing as tenant 2 counted");
        l.slots[a].tenant.store(5, Release);
        assert_eq!(waiting(), both);
        // Tenant 1's own process finds its own lock: it checks like the others.
        h1.attest(true);
        assert!(!h1.attest.blind.load(Acquire));
        // A policy naming a file whose locks this process cannot see as its own (another inode):
        // it does not find its own slot's lock, and believes labels rather than leave its
        // tenant's slots out.
        let wrong = [
            record(1, 10, 5, (lock1.0, lock1.1 ^ 1)),
            record(2, 30, 6, lock2),
        ];
        h1.policy.store(Some(&wrong));
        h1.attest(true);
        assert!(
            h1.attest.blind.load(Acquire),
            "own slot unseen: labels believed"
        );
        l.slots[a].tenant.store(6, Release);
        beat(a);
        beat(b);
        assert_eq!(h1.waiters(None).len(), 2);
        l.slots[a].tenant.store(5, Release);
        drop((judge, h1, h2));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
