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
//! <tenant id: 32 hex digits> <share 1..=10000> <cap 0..=100> <normal|high> <label>
//! ```

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
            "{:032x} {} {} {} {}\n",
            r.id.0,
            r.share,
            r.cap,
            if r.high { "high" } else { "normal" },
            if label.is_empty() { "-" } else { &label }
        ));
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
    Ok(Record {
        id: TenantId(id),
        share,
        // 100% is no cap, as in the ledger.
        cap: cap % 100,
        high,
        label,
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

    fn store(&self, records: Option<&[Record]>) {
        self.seq.fetch_add(1, AcqRel); // odd: readers retry
        let records = records.map(|r| &r[..r.len().min(MAX_RECORDS)]);
        for (i, r) in records.unwrap_or_default().iter().enumerate() {
            r.id.store(&self.ids[i]);
            let v = u64::from(r.share) | u64::from(r.cap) << 16 | u64::from(r.high) << 24;
            self.values[i].store(v, Release);
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
            let found = match self.len.load(Acquire) {
                0 => Lookup::NoPolicy,
                n => (0..(n - 1).min(MAX_RECORDS))
                    .find(|&i| TenantId::load(&self.ids[i]) == id)
                    .map_or(Lookup::Unlisted, |i| {
                        let v = self.values[i].load(Acquire);
                        Lookup::Listed {
                            share: ((v & 0xffff) as u32).clamp(1, MAX_SHARE),
                            cap: ((v >> 16) & 0xff) as u32 % 100,
                            high: (v >> 24) & 1 == 1,
                        }
                    }),
            };
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
mod tests {
    use super::*;

    fn rec(id: u128, share: u32, cap: u32, high: bool) -> Record {
        Record {
            id: TenantId(id),
            share,
            cap,
            high,
            label: "t 1".into(),
        }
    }

    #[test]
    fn what_the_node_renders_reads_back_and_bad_records_are_left_out() {
        let p = Path::new("x.policy");
        let records = vec![rec(0xabc, 30, 0, false), rec(u128::MAX, 10_000, 99, true)];
        let (back, errors) = parse(p, &render(&records)).unwrap();
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(back.len(), 2);
        assert_eq!(
            (back[1].share, back[1].cap, back[1].high),
            (10_000, 99, true)
        );
        assert_eq!(back[0].label, "t_1");
        assert!(parse(p, "gpuslice-device-policy 2\n").is_err());
        let text = format!(
            "{HEADER}\n{:032x} 0 0 normal a\n{:032x} 10001 0 normal b\n{:032x} 5 101 normal c\n\
             {:032x} 5 0 urgent d\n{} 5 0 normal e\n{:032x} 5 100 high f\n",
            1, 2, 3, 4, "12", 5
        );
        let (back, errors) = parse(p, &text).unwrap();
        assert_eq!(errors.len(), 5, "{errors:?}");
        assert!(errors[0].contains("x.policy:2") && errors[0].contains("share"));
        assert_eq!(
            back,
            vec![Record {
                cap: 0,
                label: "f".into(),
                ..rec(5, 5, 0, true)
            }]
        );
    }

    #[test]
    fn lookup_lists_what_the_file_says() {
        let dir = std::env::temp_dir().join(format!("gpuslice-policy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ledger = dir.join("GPU-x.dev");
        let o = Overlay::new(&ledger);
        assert_eq!(o.lookup(TenantId(7)), Lookup::NoPolicy);
        o.store(Some(&[rec(7, 30, 20, true)]));
        assert_eq!(
            o.lookup(TenantId(7)),
            Lookup::Listed {
                share: 30,
                cap: 20,
                high: true
            }
        );
        assert_eq!(o.lookup(TenantId(8)), Lookup::Unlisted);
        o.store(None);
        assert_eq!(o.lookup(TenantId(7)), Lookup::NoPolicy);
        // A file that is not root's (unit tests may run as anyone) or is group-writable is refused.
        let path = path_for_ledger(&ledger);
        std::fs::write(&path, render(&[rec(7, 30, 0, false)])).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o664)).unwrap();
        o.reload();
        assert_eq!(o.lookup(TenantId(7)), Lookup::NoPolicy);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        o.reload();
        // SAFETY: no arguments; cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            assert_eq!(
                o.lookup(TenantId(7)),
                Lookup::Listed {
                    share: 30,
                    cap: 0,
                    high: false
                }
            );
            // Removed (only root can, in the node's directory): the ledger decides again.
            std::fs::remove_file(&path).unwrap();
            o.reload();
            assert_eq!(o.lookup(TenantId(7)), Lookup::NoPolicy);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
