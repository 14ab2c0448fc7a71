//! The node's compute policy of one GPU (`<device dir>/<GPU-UUID>.policy`): root writes it (`gpuslice
//! tenant create/set/delete`, the device plugin) beside the device ledger, which every tenant of the
//! GPU can write. For the tenants it lists (by [`TenantId`]), the arbitration takes share, cap and
//! class from this file, whatever the ledger's words say; a tenant it does not list gets share 1 and
//! the normal class. Without the file (no node) the ledger's words decide, as they always did.
//!
//! The file is honoured only when it is a regular file owned by root that nobody else can write;
//! its content is untrusted all the same (bounded, size-limited). Format, one record a line:
//!
//! ```text
//! gpuslice-device-policy 1
//! <tenant id: 32 hex digits> <share 1..=10000> <cap 0..=100> <normal|high> <label> [entry=<n>] [lock=<dev>:<ino>]
//! ```
//!
//! The two optional fields (older libraries ignore what follows the label) bind a tenant to the
//! device ledger by what its words cannot change: `entry=` is the tenant entry the node gives it
//! (its processes join there; the entry's share, cap and class are this record's whatever the
//! entry's identity words say), and `lock=` is its memory ledger's device and inode (a file only
//! its tenant can open): a process slot labelled with the entry counts for it only while a process
//! holds the slot's lock in that file ([`super::device`]'s attestation).

use super::shm::{TenantId, MAX_TENANTS};
use crate::slotfile::atomic::{AtomicU32, AtomicU64};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering::*};

/// First line of the file.
pub const HEADER: &str = "gpuslice-device-policy 1";
/// Records kept (twice the tenants a device ledger holds).
pub const MAX_RECORDS: usize = 2 * MAX_TENANTS;
/// A longer file is refused.
const MAX_BYTES: u64 = 64 * 1024;
/// Bounds of the values (those of the ledger's words).
const MAX_SHARE: u32 = super::arbiter::MAX_SHARE;

/// One tenant's compute policy on the GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub id: TenantId,
    pub share: u32,
    /// Percent, 0 = none.
    pub cap: u32,
    pub high: bool,
    /// For people reading the file; not used by the arbitration.
    pub label: String,
    /// The tenant entry of the device ledger the node gives this tenant (`< MAX_TENANTS`).
    pub entry: Option<usize>,
    /// Its memory ledger's `st_dev` and `st_ino`: the file whose slot locks attest its processes.
    pub lock: Option<(u64, u64)>,
}

/// Tenants 1..=`n`, each of share 10, labelled `t<id>`: the policy of the slot-limit tests.
#[cfg(test)]
pub(crate) fn equal_shares(n: u128) -> Vec<Record> {
    (1..=n)
        .map(|i| Record {
            id: TenantId(i),
            share: 10,
            cap: 0,
            high: false,
            label: format!("t{i}"),
            entry: None,
            lock: None,
        })
        .collect()
}

/// The policy file of the device ledger at `ledger` (`<dir>/<uuid>.dev` -> `<dir>/<uuid>.policy`).
pub fn path_for_ledger(ledger: &Path) -> PathBuf {
    ledger.with_extension("policy")
}

/// The file's text for these records.
pub fn render(records: &[Record]) -> String {
    let mut s = format!("{HEADER}\n");
    for r in records {
        let label: String = r
            .label
            .chars()
            .map(|c| {
                if c.is_whitespace() || c.is_control() {
                    '_'
                } else {
                    c
                }
            })
            .collect();
        s.push_str(&format!(
            "{:032x} {} {} {} {}",
            r.id.0,
            r.share,
            r.cap,
            if r.high { "high" } else { "normal" },
            if label.is_empty() { "-" } else { &label }
        ));
        if let Some(e) = r.entry.filter(|&e| e < MAX_TENANTS) {
            s.push_str(&format!(" entry={e}"));
        }
        if let Some((dev, ino)) = r.lock {
            s.push_str(&format!(" lock={dev}:{ino}"));
        }
        s.push('\n');
    }
    s
}

/// Reads the records of `text` (from `path`, for messages). A wrong header refuses the file; a bad
/// record is left out (its tenant is then unlisted: share 1). Errors are returned with the records.
pub fn parse(path: &Path, text: &str) -> Result<(Vec<Record>, Vec<String>), String> {
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        return Err(format!(
            "{}: not a device policy (first line is not {HEADER:?})",
            path.display()
        ));
    }
    let mut records = Vec::new();
    let mut errors = Vec::new();
    for (n, line) in lines.enumerate() {
        let at = format!("{}:{}", path.display(), n + 2);
        if line.trim().is_empty() {
            continue;
        }
        match parse_record(line) {
            Ok(r) if records.len() < MAX_RECORDS => records.push(r),
            Ok(_) => errors.push(format!("{at}: more than {MAX_RECORDS} tenants; left out")),
            Err(e) => errors.push(format!("{at}: {e} in {line:?}; left out")),
        }
    }
    Ok((records, errors))
}

fn parse_record(line: &str) -> Result<Record, String> {
    let mut f = line.split_ascii_whitespace();
    let mut next = |what: &str| f.next().ok_or_else(|| format!("no {what}"));
    let id = next("tenant id")?;
    let id = (id.len() == 32)
        .then(|| u128::from_str_radix(id, 16).ok())
        .flatten()
        .filter(|&v| v != 0)
        .ok_or_else(|| format!("tenant id {id:?}: expected 32 hex digits, not all zero"))?;
    let share = next("share")?;
    let share = share
        .parse::<u32>()
        .ok()
        .filter(|v| (1..=MAX_SHARE).contains(v))
        .ok_or_else(|| format!("share {share:?}: expected 1..={MAX_SHARE}"))?;
    let cap = next("cap")?;
    let cap = cap
        .parse::<u32>()
        .ok()
        .filter(|&v| v <= 100)
        .ok_or_else(|| format!("cap {cap:?}: expected 0..=100"))?;
    let high = match next("class")? {
        "high" => true,
        "normal" => false,
        v => return Err(format!("class {v:?}: expected normal or high")),
    };
    let label = next("label").unwrap_or_default().to_string();
    let (mut entry, mut lock) = (None, None);
    for extra in f {
        if let Some(v) = extra.strip_prefix("entry=") {
            entry = Some(
                v.parse::<usize>()
                    .ok()
                    .filter(|&e| e < MAX_TENANTS)
                    .ok_or_else(|| format!("entry {v:?}: expected 0..{MAX_TENANTS}"))?,
            );
        } else if let Some(v) = extra.strip_prefix("lock=") {
            let parsed = v
                .split_once(':')
                .and_then(|(d, i)| Some((d.parse::<u64>().ok()?, i.parse::<u64>().ok()?)));
            lock = Some(parsed.ok_or_else(|| format!("lock {v:?}: expected <dev>:<ino>"))?);
        }
    }
    Ok(Record {
        id: TenantId(id),
        share,
        // 100% is no cap, as in the ledger.
        cap: cap % 100,
        high,
        label,
        entry,
        lock,
    })
}

/// What the policy says about one tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// No policy file: the ledger's words decide.
    NoPolicy,
    /// Listed: these values, whatever the ledger says.
    Listed { share: u32, cap: u32, high: bool },
    /// A policy is in effect and does not list the tenant.
    Unlisted,
}

/// Identity of the file last read (a new file is renamed into place: a new inode).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    mtime_ns: i64,
    ctime_ns: i64,
    size: u64,
}

/// The records in effect, readable from any thread without a lock (a sequence counter: odd while
/// the one writer, the reloader, changes them; readers retry).
pub struct Overlay {
    path: PathBuf,
    seq: AtomicU32,
    /// 0: no policy in effect; else 1 + the number of records.
    len: AtomicUsize,
    ids: [[AtomicU64; 2]; MAX_RECORDS],
    /// share | cap << 16 | high << 24.
    values: [AtomicU64; MAX_RECORDS],
    /// 1 + the record's tenant entry; 0: none given.
    entries: [AtomicU64; MAX_RECORDS],
    /// The record's memory ledger (`st_dev`, `st_ino`); (0, 0): none given.
    locks: [[AtomicU64; 2]; MAX_RECORDS],
    /// The reloader's own state (never taken by readers).
    last: parking_lot::Mutex<Option<Option<Stamp>>>,
}

impl Overlay {
    /// The overlay of the device ledger at `ledger`, read once now.
    pub fn new(ledger: &Path) -> Overlay {
        let o = Overlay {
            path: path_for_ledger(ledger),
            seq: AtomicU32::new(0),
            len: AtomicUsize::new(0),
            ids: [const { [AtomicU64::new(0), AtomicU64::new(0)] }; MAX_RECORDS],
            values: [const { AtomicU64::new(0) }; MAX_RECORDS],
            entries: [const { AtomicU64::new(0) }; MAX_RECORDS],
            locks: [const { [AtomicU64::new(0), AtomicU64::new(0)] }; MAX_RECORDS],
            last: parking_lot::Mutex::new(None),
        };
        o.reload();
        o
    }

    /// No policy, ever (a private ledger: its words are this process's own).
    pub fn none() -> Overlay {
        Overlay {
            path: PathBuf::new(),
            seq: AtomicU32::new(0),
            len: AtomicUsize::new(0),
            ids: [const { [AtomicU64::new(0), AtomicU64::new(0)] }; MAX_RECORDS],
            values: [const { AtomicU64::new(0) }; MAX_RECORDS],
            entries: [const { AtomicU64::new(0) }; MAX_RECORDS],
            locks: [const { [AtomicU64::new(0), AtomicU64::new(0)] }; MAX_RECORDS],
            last: parking_lot::Mutex::new(None),
        }
    }

    /// Reads the file again if it changed (a `stat` otherwise): the scheduler thread's sweep.
    pub fn reload(&self) {
        if self.path.as_os_str().is_empty() {
            return;
        }
        let mut last = self.last.lock();
        let stamp = std::fs::symlink_metadata(&self.path).ok().map(|m| Stamp {
            dev: m.dev(),
            ino: m.ino(),
            mtime_ns: m.mtime().saturating_mul(1_000_000_000) + m.mtime_nsec(),
            ctime_ns: m.ctime().saturating_mul(1_000_000_000) + m.ctime_nsec(),
            size: m.size(),
        });
        if *last == Some(stamp) {
            return;
        }
        let first = last.is_none();
        *last = Some(stamp);
        let records = match stamp {
            None => None,
            Some(_) => match read(&self.path) {
                Ok((records, errors)) => {
                    for e in errors {
                        crate::log::error(format_args!("compute policy {e}"));
                    }
                    Some(records)
                }
                Err(e) => {
                    crate::log::error(format_args!(
                        "compute policy {e}; the device ledger's settings are used"
                    ));
                    None
                }
            },
        };
        if !first || records.is_some() {
            crate::log::info(format_args!(
                "compute policy {}: {}",
                self.path.display(),
                records.as_ref().map_or("none in effect".to_string(), |r| {
                    format!("{} tenant(s) listed", r.len())
                })
            ));
        }
        self.store(records.as_deref());
    }

    pub(crate) fn store(&self, records: Option<&[Record]>) {
        self.seq.fetch_add(1, AcqRel); // odd: readers retry
        let records = records.map(|r| &r[..r.len().min(MAX_RECORDS)]);
        for (i, r) in records.unwrap_or_default().iter().enumerate() {
            r.id.store(&self.ids[i]);
            let v = u64::from(r.share) | u64::from(r.cap) << 16 | u64::from(r.high) << 24;
            self.values[i].store(v, Release);
            let e = r
                .entry
                .filter(|&e| e < MAX_TENANTS)
                .map_or(0, |e| e as u64 + 1);
            self.entries[i].store(e, Release);
            let (dev, ino) = r.lock.unwrap_or((0, 0));
            self.locks[i][0].store(dev, Release);
            self.locks[i][1].store(ino, Release);
        }
        self.len.store(records.map_or(0, |r| r.len() + 1), Release);
        self.seq.fetch_add(1, AcqRel);
    }

    /// How many tenants the policy lists (`None`: no policy in effect).
    pub fn listed(&self) -> Option<usize> {
        self.len
            .load(Acquire)
            .checked_sub(1)
            .map(|n| n.min(MAX_RECORDS))
    }

    /// What the policy says about tenant `id`.
    pub fn lookup(&self, id: TenantId) -> Lookup {
        self.consistent(
            |n| match self.find(n, |i| TenantId::load(&self.ids[i]) == id) {
                None if n == 0 => Lookup::NoPolicy,
                None => Lookup::Unlisted,
                Some(i) => self.listed_at(i),
            },
        )
    }

    /// What the policy says about tenant entry `entry`, whose identity words say `id` (anybody's
    /// to write): the settings of the tenant the policy gives that entry, whatever the words say;
    /// for an entry it gives nobody, those of `id` when the policy lists it without an entry of
    /// its own (a record of an older node), and otherwise share 1 (unlisted): a tenant that writes
    /// another's identity into its own entry gets nothing of the other's settings.
    pub fn lookup_entry(&self, entry: usize, id: TenantId) -> Lookup {
        self.consistent(|n| {
            if n == 0 {
                return Lookup::NoPolicy;
            }
            if let Some(i) = self.find(n, |i| self.entry_of_record(i) == Some(entry)) {
                return self.listed_at(i);
            }
            match self.find(n, |i| TenantId::load(&self.ids[i]) == id) {
                Some(i) if self.entry_of_record(i).is_none() => self.listed_at(i),
                _ => Lookup::Unlisted,
            }
        })
    }

    /// The tenant entry the policy gives tenant `id`, if any.
    pub fn entry_of(&self, id: TenantId) -> Option<usize> {
        self.consistent(|n| {
            self.find(n, |i| TenantId::load(&self.ids[i]) == id)
                .and_then(|i| self.entry_of_record(i))
        })
    }

    /// The tenant the policy gives entry `entry` and the memory ledger that attests its processes
    /// (`None`: the policy gives the entry nobody; a lock of `None`: no file to attest by).
    pub fn reserved(&self, entry: usize) -> Option<(TenantId, Option<(u64, u64)>)> {
        self.consistent(|n| {
            self.find(n, |i| self.entry_of_record(i) == Some(entry))
                .map(|i| {
                    let lock = (
                        self.locks[i][0].load(Acquire),
                        self.locks[i][1].load(Acquire),
                    );
                    (
                        TenantId::load(&self.ids[i]),
                        (lock != (0, 0)).then_some(lock),
                    )
                })
        })
    }

    fn entry_of_record(&self, i: usize) -> Option<usize> {
        (self.entries[i].load(Acquire) as usize)
            .checked_sub(1)
            .filter(|&e| e < MAX_TENANTS)
    }

    fn listed_at(&self, i: usize) -> Lookup {
        let v = self.values[i].load(Acquire);
        Lookup::Listed {
            share: ((v & 0xffff) as u32).clamp(1, MAX_SHARE),
            cap: ((v >> 16) & 0xff) as u32 % 100,
            high: (v >> 24) & 1 == 1,
        }
    }

    /// The first of the `n - 1` records (`n`: the length word) for which `hit` holds.
    fn find(&self, n: usize, hit: impl Fn(usize) -> bool) -> Option<usize> {
        (0..n.saturating_sub(1).min(MAX_RECORDS)).find(|&i| hit(i))
    }

    /// `read` of the records (given the length word) as one writer left them.
    fn consistent<T>(&self, read: impl Fn(usize) -> T) -> T {
        // A writer that never finishes (a fork child of a process forked mid-reload) must not
        // hang readers: after enough tries the last read is used as it is.
        let mut tries = 0u32;
        loop {
            tries += 1;
            let s = self.seq.load(Acquire);
            if s % 2 == 1 && tries < 100_000 {
                std::hint::spin_loop();
                continue;
            }
            let found = read(self.len.load(Acquire));
            std::sync::atomic::fence(Acquire);
            if self.seq.load(Relaxed) == s || tries >= 100_000 {
                return found;
            }
        }
    }
}

/// Reads the file: a regular file (not followed if a link), root's, writable by nobody else, small.
fn read(path: &Path) -> Result<(Vec<Record>, Vec<String>), String> {
    use std::io::Read;
    let at = |e: std::io::Error| format!("{}: {e}", path.display());
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(at)?;
    let m = f.metadata().map_err(at)?;
    if !m.file_type().is_file() {
        return Err(format!("{}: not a regular file", path.display()));
    }
    if m.uid() != 0 || m.mode() & 0o022 != 0 {
        return Err(format!(
            "{}: owned by uid {} with mode {:o}: only a file of root's that nobody else can write is obeyed",
            path.display(),
            m.uid(),
            m.mode() & 0o7777
        ));
    }
    if m.len() > MAX_BYTES {
        return Err(format!(
            "{}: {} bytes, more than {MAX_BYTES}",
            path.display(),
            m.len()
        ));
    }
    let mut text = String::new();
    f.take(MAX_BYTES).read_to_string(&mut text).map_err(at)?;
    parse(path, &text)
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
