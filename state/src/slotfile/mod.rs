//! The slot file: one protocol for every file in shared memory that processes join and hold a slot
//! in (the tenant ledger, the device ledgers).
//!
//! * **Create → initialise → publish → link.** A new file is created under a short temporary name,
//!   given its whole size for real (`posix_fallocate`: a sparse file on a full tmpfs would kill the
//!   first process that stores into it), initialised, marked READY, then `link`ed into place, so
//!   nobody ever maps half a file. The temporary name is removed whatever happens.
//! * **Validated join.** Opening never follows a symlink and never blocks (`O_NONBLOCK`: a FIFO or a
//!   device node at the path answers at once); the type, owner (uid, or a sharing group), mode,
//!   magic, layout version and size are checked before anything is mapped, and a file still
//!   INITIALISING is waited for (1 s).
//! * **Two handle types.** [`Writable`] maps the file shared, read-write; [`ReadOnly`] never maps it:
//!   it reads a private copy with `pread` (a shrinking file cannot fault it, and nothing it holds
//!   can reach the file). Only `Writable` hands out the shared layout:
//!
//!   ```compile_fail
//!   fn store(r: &gpuslice_state::slotfile::ReadOnly<gpuslice_state::ledger::Layout>) {
//!       let _shared = r.shared(); // no such method: a read-only handle has no shared mapping
//!   }
//!   ```
//! * **Slots** are claimed under an OFD lock on one byte past the data ([`claim_slot`]), on a
//!   descriptor that a fork child gives up (`sys::guard_slot_fd`); a slot whose lock can be taken
//!   belongs to a dead process and is reclaimed by whoever took it ([`take_dead_slot`]).
//! * **Truncation** by another process cannot kill the mapper (`fault.rs`); slow paths compare the
//!   size with `fstat` ([`Writable::check_size`]) and repair before touching the mapping.
//!
//! Every atomic a layout uses comes from [`atomic`], the one facade over atomics for shared memory
//! (`clippy.toml` forbids the standard types elsewhere in the crate); its compare-and-swap loops are
//! what the loom model (`tests/loom.rs`) checks.
//!
//! Why this file is long (about 1000 lines): create, join, claim and reclaim are one protocol whose
//! orderings depend on each other, so they are read and reviewed together; the system calls
//! (`sys.rs`), the SIGBUS containment (`fault.rs`) and the tests are apart.

mod fault;
pub mod sys;
#[cfg(test)]
mod tests;

use std::fmt;
use std::io;
use std::mem::{align_of, size_of};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

pub mod atomic;
use atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

/// Header `state`: being filled in by its creator.
pub const STATE_INITIALISING: u32 = u32::from_le_bytes(*b"INIT");
/// Header `state`: complete and usable.
pub const STATE_READY: u32 = u32::from_le_bytes(*b"REDY");

/// Header `state`: truncated while in use and re-extended with zeros; refused until recreated.
pub const STATE_DAMAGED: u32 = u32::from_le_bytes(*b"DMGD");

/// How long an opener waits for a file another process is still initialising.
pub const READY_WAIT: Duration = Duration::from_secs(1);

/// The first 24 bytes of every slot file.
#[repr(C)]
pub struct Prefix {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    pub state: AtomicU32,
    pub total_size: AtomicU64,
}

const MAGIC_AT: usize = 0;
const VERSION_AT: usize = 8;
const STATE_AT: usize = 12;
const TOTAL_SIZE_AT: usize = 16;

/// A layout kept in a slot file.
///
/// # Safety
/// The implementing type is `#[repr(C)]`, made only of atomics (every bit pattern is a valid value
/// and shared mutation is allowed), starts with a [`Prefix`], and is aligned to at most 8 bytes.
pub unsafe trait SlotLayout: Sync + Send + Sized + 'static {
    const MAGIC: [u8; 8];
    const VERSION: u32;
    /// Bytes of the header read (with `pread`) and checked before the file is mapped.
    const HEADER_BYTES: usize;
    /// Further checks of the header bytes: `Err((what, found, expected))`.
    fn check_header(_header: &[u8]) -> Result<(), (&'static str, u64, u64)> {
        Ok(())
    }
    /// Further checks of the whole content once READY.
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
    /// A file of this layout found with the wrong size (shorter or longer than the layout), or
    /// marked DAMAGED, is repaired in place by the next process that joins it (size set back, an
    /// all-zero prefix written again, READY) instead of being refused: its content is soft state
    /// that every process writes again (the device ledgers). Not for files whose content must
    /// fail closed (the memory ledger).
    const REPAIRABLE: bool = false;
    /// Byte whose OFD lock holds slot `i` (past the data; locks may lie past the end of file).
    fn lock_offset(slot: usize) -> u64 {
        size_of::<Self>() as u64 + slot as u64
    }
}

/// Gives the file at `fd` its `size` bytes on disk now, so that a full filesystem is an error here
/// (naming `path`) and never a SIGBUS in a process that touches the mapping later.
fn allocate(path: &Path, fd: &OwnedFd, size: u64) -> Result<(), Error> {
    sys::fallocate(fd, size).map_err(|err| match err.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => Error::NoSpace {
            path: path.to_path_buf(),
            needed: size,
        },
        _ => io_err(path, "allocating its space")(err),
    })
}

fn prefix<L: SlotLayout>(l: &L) -> &Prefix {
    // SAFETY: `SlotLayout` guarantees the layout starts with a `Prefix`.
    unsafe { &*(l as *const L).cast::<Prefix>() }
}

/// Why a slot file could not be created or joined. Each message names the path; the caller fails
/// closed (memory) or does without (compute).
#[derive(Debug)]
pub enum Error {
    Io {
        path: PathBuf,
        what: &'static str,
        err: io::Error,
    },
    /// No room on the filesystem for the whole file.
    NoSpace {
        path: PathBuf,
        needed: u64,
    },
    /// The path is a symbolic link (refused: O_NOFOLLOW).
    Symlink {
        path: PathBuf,
    },
    /// Owned by another user and not group-shared, world-writable, or not a regular file.
    Insecure {
        path: PathBuf,
        why: String,
    },
    /// Shorter than the layout.
    Truncated {
        path: PathBuf,
        size: u64,
        expected: u64,
    },
    BadMagic {
        path: PathBuf,
    },
    WrongVersion {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    Corrupt {
        path: PathBuf,
        what: String,
    },
    /// Still INITIALISING after the wait (its creator probably died).
    NotReady {
        path: PathBuf,
        waited: Duration,
    },
    /// Every process slot is taken by a live process.
    Full {
        path: PathBuf,
        slots: usize,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { path, what, err } => {
                write!(f, "ledger {}: {what}: {err}", path.display())
            }
            Error::NoSpace { path, needed } => write!(
                f,
                "ledger {}: no space left on the filesystem to create it ({needed} bytes needed; is the filesystem of {} full?)",
                path.display(),
                path.parent().unwrap_or(Path::new("/")).display()
            ),
            Error::Symlink { path } => write!(
                f,
                "ledger {}: is a symbolic link (refused; point GPUSLICE_LEDGER at the file itself)",
                path.display()
            ),
            Error::Insecure { path, why } => {
                write!(f, "ledger {}: refused: {why}", path.display())
            }
            Error::Truncated {
                path,
                size,
                expected,
            } => write!(
                f,
                "ledger {}: truncated ({size} bytes, a ledger has {expected})",
                path.display()
            ),
            Error::BadMagic { path } => write!(
                f,
                "ledger {}: not a gpuslice ledger (bad magic)",
                path.display()
            ),
            Error::WrongVersion {
                path,
                found,
                expected,
            } => write!(
                f,
                "ledger {}: layout version {found}, this gpuslice uses {expected} (all processes sharing it must run the same gpuslice)",
                path.display()
            ),
            Error::Corrupt { path, what } => {
                write!(f, "ledger {}: corrupt: {what}", path.display())
            }
            Error::NotReady { path, waited } => write!(
                f,
                "ledger {}: still being initialised after {} ms (its creator probably died; remove the file)",
                path.display(),
                waited.as_millis()
            ),
            Error::Full { path, slots } => write!(
                f,
                "ledger {}: all {slots} process slots are in use",
                path.display()
            ),
        }
    }
}

impl std::error::Error for Error {}

/// The error of a failed system call on `path`; ELOOP (O_NOFOLLOW met a link) is `Symlink`.
pub fn io_err<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(io::Error) -> Error + 'a {
    move |err| {
        if err.raw_os_error() == Some(libc::ELOOP) {
            Error::Symlink {
                path: path.to_path_buf(),
            }
        } else {
            Error::Io {
                path: path.to_path_buf(),
                what,
                err,
            }
        }
    }
}

/// How a new file is created.
#[derive(Clone, Copy, Debug)]
pub struct CreateOptions {
    /// File mode (0600, or 0660 when shared with a group).
    pub mode: u32,
    /// Group to give the file (and a directory this call creates).
    pub gid: Option<u32>,
    /// A missing directory of the file is created for every user (mode 1777, sticky, as /tmp is:
    /// files every tenant of every user shares, such as the device ledgers) instead of private
    /// (0700, or 0770 for `gid`). Missing directories above it are created mode 1777 either way.
    pub shared_dir: bool,
}

/// Packs text into NUL-padded words (`None` if empty, longer than `8 * N` bytes, or with a NUL).
/// Native byte order: the bytes in the file are the text.
pub fn pack_text<const N: usize>(text: &str) -> Option<[u64; N]> {
    let b = text.as_bytes();
    if b.is_empty() || b.len() > 8 * N || b.contains(&0) {
        return None;
    }
    let mut out = [0u64; N];
    for (i, chunk) in b.chunks(8).enumerate() {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        out[i] = u64::from_ne_bytes(w);
    }
    Some(out)
}

/// The text of NUL-padded words (lossy: the file may hold anything).
pub fn unpack_text(words: &[AtomicU64]) -> String {
    let bytes: Vec<u8> = words
        .iter()
        .flat_map(|w| w.load(Ordering::Acquire).to_ne_bytes())
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn unique_suffix() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ (sys::getpid() as u64) << 40
}

/// The refusal of a file owned by another uid and not shared with one of our groups.
fn foreign_owner(path: &Path, uid: u32, gid: u32, mode: u32) -> Option<Error> {
    let group_shared = mode & 0o060 == 0o060 && sys::in_group(gid);
    (uid != sys::geteuid() && !group_shared).then(|| Error::Insecure {
        path: path.to_path_buf(),
        why: format!(
            "owned by uid {uid} (not us, {}) and not shared with one of our groups (mode 0660 via GPUSLICE_LEDGER_GROUP): another user's file, not used",
            sys::geteuid()
        ),
    })
}

/// An open refused with EACCES: another user's file is reported as such.
fn open_refused(path: &Path, err: io::Error) -> Error {
    use std::os::unix::fs::MetadataExt;
    if err.kind() == io::ErrorKind::PermissionDenied {
        if let Ok(m) = std::fs::symlink_metadata(path) {
            if let Some(e) = foreign_owner(path, m.uid(), m.gid(), m.mode()) {
                return e;
            }
        }
    }
    io_err(path, "open")(err)
}

/// Checks an open file before it is read: type, mode, owner (when it is to be written), then its
/// header (waiting for READY) and size.
fn validate<L: SlotLayout>(path: &Path, fd: &OwnedFd, writable: bool) -> Result<(), Error> {
    let p = || path.to_path_buf();
    let st = sys::fstat(fd).map_err(io_err(path, "fstat"))?;
    let kind = st.st_mode & libc::S_IFMT;
    if kind != libc::S_IFREG {
        let what = match kind {
            libc::S_IFIFO => "a FIFO",
            libc::S_IFDIR => "a directory",
            libc::S_IFCHR | libc::S_IFBLK => "a device node",
            libc::S_IFSOCK => "a socket",
            _ => "not a file",
        };
        return Err(Error::Insecure {
            path: p(),
            why: format!("{what}, not a regular file"),
        });
    }
    if st.st_mode & 0o002 != 0 {
        return Err(Error::Insecure {
            path: p(),
            why: "world-writable".into(),
        });
    }
    // Anyone may look (read-only); only the owner or a sharing group may take part.
    if writable {
        if let Some(e) = foreign_owner(path, st.st_uid, st.st_gid, st.st_mode) {
            return Err(e);
        }
    }
    let total = size_of::<L>() as u64;
    let start = Instant::now();
    loop {
        let size = sys::fstat(fd).map_err(io_err(path, "fstat"))?.st_size as u64;
        let mut h = vec![0u8; L::HEADER_BYTES.max(24)];
        let n = sys::pread(fd, &mut h, 0).map_err(io_err(path, "read"))?;
        if n < h.len() {
            return Err(Error::Truncated {
                path: p(),
                size,
                expected: total,
            });
        }
        let u32_at = |at: usize| u32::from_ne_bytes(h[at..at + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |at: usize| u64::from_ne_bytes(h[at..at + 8].try_into().unwrap_or([0; 8]));
        if h[MAGIC_AT..MAGIC_AT + 8] != L::MAGIC {
            return Err(Error::BadMagic { path: p() });
        }
        let version = u32_at(VERSION_AT);
        if version != L::VERSION {
            return Err(Error::WrongVersion {
                path: p(),
                found: version,
                expected: L::VERSION,
            });
        }
        match u32_at(STATE_AT) {
            STATE_READY => {}
            STATE_INITIALISING if start.elapsed() < READY_WAIT => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            STATE_DAMAGED => {
                return Err(Error::Corrupt {
                    path: p(),
                    what:
                        "it was truncated while in use (remove it; the next program recreates it)"
                            .into(),
                })
            }
            STATE_INITIALISING => {
                return Err(Error::NotReady {
                    path: p(),
                    waited: start.elapsed(),
                })
            }
            s => {
                return Err(Error::Corrupt {
                    path: p(),
                    what: format!("state word {s:#010x}"),
                })
            }
        }
        let declared = u64_at(TOTAL_SIZE_AT);
        let size_check = if declared == total {
            Ok(())
        } else {
            Err(("declared size", declared, total))
        };
        let checked = L::check_header(&h).and(size_check);
        if let Err((what, found, want)) = checked {
            return Err(Error::Corrupt {
                path: p(),
                what: format!("{what} is {found}, expected {want}"),
            });
        }
        if size < total {
            return Err(Error::Truncated {
                path: p(),
                size,
                expected: total,
            });
        }
        if size != total {
            return Err(Error::Corrupt {
                path: p(),
                what: format!("file is {size} bytes, its header declares {total}"),
            });
        }
        return Ok(());
    }
}

/// Before a [`SlotLayout::REPAIRABLE`] file is validated: a wrong size (shorter or longer than
/// the layout) is set right, an all-zero prefix (a file truncated and grown again) is written
/// again, a DAMAGED state is made READY. A file with another magic or version is left alone (the
/// validation refuses it). Every step is idempotent, so joiners repairing at once agree. Returns
/// what was repaired, for the caller's log line.
fn repair_in_place<L: SlotLayout>(path: &Path, fd: &OwnedFd) -> Result<Option<String>, Error> {
    let st = sys::fstat(fd).map_err(io_err(path, "fstat"))?;
    // Only a file we would join: a regular file, not world-writable, ours or our group's
    // (anything else is refused by the validation, untouched).
    if st.st_mode & libc::S_IFMT != libc::S_IFREG
        || st.st_mode & 0o002 != 0
        || foreign_owner(path, st.st_uid, st.st_gid, st.st_mode).is_some()
    {
        return Ok(None);
    }
    let size = st.st_size as u64;
    let total = size_of::<L>() as u64;
    let mut h = [0u8; 24];
    let n = sys::pread(fd, &mut h, 0).map_err(io_err(path, "read"))?;
    let u32_at = |at: usize| u32::from_ne_bytes(h[at..at + 4].try_into().unwrap_or([0; 4]));
    let magic_ok = h[MAGIC_AT..MAGIC_AT + 8] == L::MAGIC && u32_at(VERSION_AT) == L::VERSION;
    let zero = h[..n].iter().all(|&b| b == 0);
    if !magic_ok && !zero {
        return Ok(None); // another kind of file: refused by the validation
    }
    let damaged = magic_ok && u32_at(STATE_AT) == STATE_DAMAGED;
    if size == total && !zero && !damaged {
        return Ok(None);
    }
    let mut what = Vec::new();
    if size != total {
        sys::ftruncate(fd, total).map_err(io_err(path, "setting its size back"))?;
        what.push(format!("{size} bytes instead of {total}"));
    }
    if zero {
        let mut p = [0u8; 24];
        p[MAGIC_AT..MAGIC_AT + 8].copy_from_slice(&L::MAGIC);
        p[VERSION_AT..VERSION_AT + 4].copy_from_slice(&L::VERSION.to_ne_bytes());
        p[STATE_AT..STATE_AT + 4].copy_from_slice(&STATE_READY.to_ne_bytes());
        p[TOTAL_SIZE_AT..TOTAL_SIZE_AT + 8].copy_from_slice(&total.to_ne_bytes());
        sys::pwrite(fd, &p, 0).map_err(io_err(path, "writing its header again"))?;
        what.push("its header zeroed".to_string());
    } else {
        // The declared size and the state, whatever they say now.
        sys::pwrite(fd, &total.to_ne_bytes(), TOTAL_SIZE_AT as u64)
            .map_err(io_err(path, "writing its size"))?;
        sys::pwrite(fd, &STATE_READY.to_ne_bytes(), STATE_AT as u64)
            .map_err(io_err(path, "writing its state"))?;
        if damaged {
            what.push("marked damaged".to_string());
        }
    }
    Ok(Some(what.join(", ")))
}

/// A slot file mapped shared and read-write: the only handle through which its layout is shared.
pub struct Writable<L: SlotLayout> {
    path: PathBuf,
    ptr: NonNull<L>,
    /// The descriptor the mapping was made from (the fault handler re-extends through it).
    fd: OwnedFd,
    /// The file's (device, inode) when mapped: `fd` is trusted only while it still names it.
    identity: (u64, u64),
    /// `fd` was found closed, or naming another file: the program closed a descriptor it did not
    /// open (and may have reused its number). Nothing goes through it any more.
    lost: std::sync::atomic::AtomicBool,
    created: bool,
    /// What [`repair_in_place`] found and repaired when this handle joined the file.
    repaired: Option<String>,
    guard: Option<fault::Registration>,
}

// SAFETY: the mapping is shared memory made only of atomics; any thread may access it.
unsafe impl<L: SlotLayout> Send for Writable<L> {}
// SAFETY: as above: every access goes through atomics.
unsafe impl<L: SlotLayout> Sync for Writable<L> {}

impl<L: SlotLayout> Writable<L> {
    /// Joins the file at `path`; creates it with `create` (then `init` fills it in before it is
    /// published) when it does not exist and `create` is given.
    pub fn open(
        path: &Path,
        create: Option<CreateOptions>,
        init: impl FnOnce(&L),
    ) -> Result<Writable<L>, Error> {
        match sys::open(path, libc::O_RDWR, 0) {
            Ok(fd) => Self::join(path, fd),
            Err(e) if e.kind() == io::ErrorKind::NotFound => match create {
                Some(opts) => Self::create(path, opts, init),
                None => Err(io_err(path, "open")(e)),
            },
            Err(e) => Err(open_refused(path, e)),
        }
    }

    fn join(path: &Path, fd: OwnedFd) -> Result<Writable<L>, Error> {
        let repaired = if L::REPAIRABLE {
            repair_in_place::<L>(path, &fd)?
        } else {
            None
        };
        validate::<L>(path, &fd, true)?;
        let mut w = Self::map(path, fd, false)?;
        w.repaired = repaired;
        w.layout().check().map_err(|what| Error::Corrupt {
            path: path.to_path_buf(),
            what,
        })?;
        Ok(w)
    }

    fn map(path: &Path, fd: OwnedFd, created: bool) -> Result<Writable<L>, Error> {
        const { assert!(align_of::<L>() <= 8) };
        let st = sys::fstat(&fd).map_err(io_err(path, "fstat"))?;
        let identity = (st.st_dev, st.st_ino);
        let ptr = sys::map_shared(&fd, size_of::<L>()).map_err(io_err(path, "mmap"))?;
        let guard = fault::register(
            ptr.as_ptr() as usize,
            size_of::<L>(),
            fd.as_raw_fd(),
            identity,
        );
        Ok(Writable {
            path: path.to_path_buf(),
            ptr: ptr.cast(),
            fd,
            identity,
            lost: std::sync::atomic::AtomicBool::new(false),
            created,
            repaired: None,
            guard,
        })
    }

    fn create(
        path: &Path,
        opts: CreateOptions,
        init: impl FnOnce(&L),
    ) -> Result<Writable<L>, Error> {
        let dir = path.parent().unwrap_or(Path::new("/"));
        if !dir.exists() {
            let made = if opts.shared_dir {
                make_shared_dir(dir)
            } else {
                make_dir(dir, opts.gid)
            };
            made.map_err(io_err(path, "creating its directory"))?;
        }
        // Short, whatever the final name's length: a name that fits fits its temporary too.
        let tmp = dir.join(format!(".gs{:x}.tmp", unique_suffix()));
        let fd = sys::open(&tmp, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, opts.mode)
            .map_err(io_err(path, "creating a temporary file beside it"))?;
        let mut fd = Some(fd);
        // Everything else happens under the temporary name; remove it whatever the outcome.
        let result = (|| {
            let Some(f) = fd.as_ref() else {
                return Ok(None);
            };
            sys::fchmod(f, opts.mode).map_err(io_err(path, "chmod"))?;
            if let Some(g) = opts.gid {
                sys::fchown_group(f, g).map_err(io_err(path, "chown to GPUSLICE_LEDGER_GROUP"))?;
            }
            let size = size_of::<L>() as u64;
            allocate(path, f, size)?;
            let fd = fd
                .take()
                .ok_or_else(|| io_err(path, "open")(io::ErrorKind::Other.into()))?;
            let w = Self::map(path, fd, true)?;
            w.stamp(size, init);
            match sys::publish(&tmp, path) {
                Ok(()) => Ok(Some(w)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(None),
                Err(e) => Err(io_err(path, "publishing (link)")(e)),
            }
        })();
        let _ = std::fs::remove_file(&tmp);
        match result? {
            Some(w) => Ok(w),
            // Someone else created it first: theirs is the file, with their settings.
            None => {
                let fd = sys::open(path, libc::O_RDWR, 0).map_err(io_err(path, "open"))?;
                Self::join(path, fd)
            }
        }
    }

    /// A file of its own, in memory only (`memfd_create`): nobody else can open it. `path` names it
    /// in messages. For a process that must arbitrate alone (no slot in the shared file).
    pub fn anonymous(path: &Path, init: impl FnOnce(&L)) -> Result<Writable<L>, Error> {
        let fd = sys::memfd(c"gpuslice-private").map_err(io_err(path, "memfd_create"))?;
        let size = size_of::<L>() as u64;
        sys::ftruncate(&fd, size).map_err(io_err(path, "sizing"))?;
        allocate(path, &fd, size)?;
        let w = Self::map(path, fd, true)?;
        w.stamp(size, init);
        Ok(w)
    }

    /// Writes a new file's prefix and contents: INITIALISING while `init` runs, READY after.
    fn stamp(&self, size: u64, init: impl FnOnce(&L)) {
        let pre = prefix(self.layout());
        pre.magic
            .store(u64::from_ne_bytes(L::MAGIC), Ordering::Relaxed);
        pre.version.store(L::VERSION, Ordering::Relaxed);
        pre.total_size.store(size, Ordering::Relaxed);
        pre.state.store(STATE_INITIALISING, Ordering::Relaxed);
        init(self.layout());
        // Release: a joiner that sees READY sees everything written before.
        pre.state.store(STATE_READY, Ordering::Release);
    }

    /// What was found wrong with the file and repaired in place when this handle joined it
    /// ([`SlotLayout::REPAIRABLE`]).
    pub fn repaired_at_join(&self) -> Option<&str> {
        self.repaired.as_deref()
    }

    /// A [`SlotLayout::REPAIRABLE`] file grown past its layout (by anyone who can write it) is cut
    /// back to its size, so that joiners, which check the size, keep accepting it. Returns the size
    /// found when it cut.
    pub fn trim_excess(&self) -> Option<u64> {
        if !L::REPAIRABLE || self.descriptor_lost() {
            return None;
        }
        let st = sys::fstat(&self.fd).ok()?;
        let total = size_of::<L>() as u64;
        if (st.st_dev, st.st_ino) != self.identity || (st.st_size as u64) <= total {
            return None;
        }
        sys::ftruncate(&self.fd, total).ok()?;
        Some(st.st_size as u64)
    }

    /// The shared layout.
    pub fn layout(&self) -> &L {
        // SAFETY: the mapping is size_of::<L>() bytes, page-aligned (alignment asserted <= 8) and
        // lives as long as `self`; `SlotLayout` guarantees every bit pattern is valid and shared
        // mutation allowed. A truncation cannot fault it fatally (`fault.rs`).
        unsafe { self.ptr.as_ref() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this handle created the file.
    pub fn created(&self) -> bool {
        self.created
    }

    /// The descriptor the mapping was made from.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// A new open file description for slot locks (never mapped, so a fork child can give it up).
    pub fn lock_fd(&self) -> io::Result<OwnedFd> {
        let fd = sys::reopen(&self.fd, true)?;
        match sys::fstat(&fd) {
            Ok(st) if (st.st_dev, st.st_ino) == self.identity => Ok(fd),
            _ => {
                self.lost.store(true, Ordering::Release);
                Err(io::Error::other(
                    "the descriptor of the mapped file was closed by the program",
                ))
            }
        }
    }

    /// The descriptor the mapping was made from was closed, or names another file now (the
    /// program closed a descriptor it did not open): sizes cannot be checked, nothing is repaired.
    pub fn descriptor_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Whether the file still has its size (`fstat`, for slow paths). A short file is repaired at
    /// once (re-extended with zeros, or replaced by private zeros when there is no room), so no
    /// access through the mapping can fault: the zeros then fail closed.
    pub fn check_size(&self) -> bool {
        if self.descriptor_lost() {
            return false;
        }
        match sys::fstat(&self.fd) {
            // Closed, or another file under our number: nothing is repaired or marked through it
            // (that would write to the program's file, or mark a sound ledger DAMAGED for every
            // process); this process alone fails closed.
            Ok(st) if (st.st_dev, st.st_ino) != self.identity => {
                self.lost.store(true, Ordering::Release);
                false
            }
            Err(_) => {
                self.lost.store(true, Ordering::Release);
                false
            }
            Ok(st) if st.st_size as u64 >= size_of::<L>() as u64 => {
                // Re-extended by another process's repair, or scribbled: the header says so.
                let pre = prefix(self.layout());
                !self.damaged()
                    && pre.magic.load(Ordering::Acquire) == u64::from_ne_bytes(L::MAGIC)
                    && pre.state.load(Ordering::Acquire) == STATE_READY
            }
            _ => {
                if let Some(g) = &self.guard {
                    g.repair();
                }
                self.mark_damaged();
                false
            }
        }
    }

    /// Marks the file DAMAGED (every process using it then fails closed; joiners are refused).
    fn mark_damaged(&self) {
        if !self.detached() {
            prefix(self.layout())
                .state
                .store(STATE_DAMAGED, Ordering::Release);
        }
    }

    /// Whether a truncation has been repaired in this mapping since it was opened (its content is
    /// no longer what its creator wrote) or the mapping no longer shows the file.
    #[inline(always)]
    pub fn damaged(&self) -> bool {
        self.guard.as_ref().is_some_and(|g| g.faults() > 0)
    }

    /// Soundness as a hot path can see it without a system call: the mapping's last page still
    /// holds file data (read first: after a cut anywhere below it the read faults, and the fault
    /// handler repairs the file, marks it DAMAGED and counts the fault), no fault was contained in
    /// this mapping, and the header still carries the magic and READY (another process that
    /// caught a truncation marks it DAMAGED). What it cannot see is left to
    /// [`Writable::check_size`]: a cut inside the last page, and a descriptor the program closed.
    #[inline(always)]
    pub fn looks_sound(&self) -> bool {
        let size = size_of::<L>();
        // SAFETY: `size - 1` is inside the mapping of `size` bytes (`layout`'s invariant), a byte
        // has no alignment, and every bit pattern of the layout is valid and shared mutation is
        // allowed (`SlotLayout`), so an atomic byte read there is sound; a fault on it is
        // contained (`fault.rs`).
        let last = unsafe { &*self.ptr.as_ptr().cast::<AtomicU8>().add(size - 1) };
        std::hint::black_box(last.load(Ordering::Relaxed));
        let pre = prefix(self.layout());
        !self.damaged()
            && pre.magic.load(Ordering::Relaxed) == u64::from_ne_bytes(L::MAGIC)
            && pre.state.load(Ordering::Relaxed) == STATE_READY
    }

    /// The mapping shows private zeros instead of the file (it could not be re-extended).
    pub fn detached(&self) -> bool {
        self.guard.as_ref().is_some_and(|g| g.detached())
    }

    /// Whether the file at the path is still the one mapped (not removed or replaced).
    pub fn still_at_path(&self) -> bool {
        match (sys::fstat(&self.fd), std::fs::symlink_metadata(&self.path)) {
            (Ok(a), Ok(b)) => {
                use std::os::unix::fs::MetadataExt;
                a.st_ino == b.ino() && a.st_dev == b.dev()
            }
            _ => false,
        }
    }
}

impl<L: SlotLayout> Drop for Writable<L> {
    fn drop(&mut self) {
        drop(self.guard.take());
        // SAFETY: unmaps exactly what `map` mapped; no reference into it outlives `self`.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), size_of::<L>());
        }
    }
}

/// A slot file opened read-only: a private copy read with `pread` (a store into it cannot reach the
/// file, and a file shrunk meanwhile cannot fault it), and a descriptor to test slot locks.
pub struct ReadOnly<L: SlotLayout> {
    path: PathBuf,
    fd: OwnedFd,
    copy: Box<L>,
}

impl<L: SlotLayout> ReadOnly<L> {
    pub fn open(path: &Path) -> Result<ReadOnly<L>, Error> {
        let fd = sys::open(path, libc::O_RDONLY, 0).map_err(io_err(path, "open"))?;
        validate::<L>(path, &fd, false)?;
        let copy = read_copy::<L>(path, &fd)?;
        copy.check().map_err(|what| Error::Corrupt {
            path: path.to_path_buf(),
            what,
        })?;
        Ok(ReadOnly {
            path: path.to_path_buf(),
            fd,
            copy,
        })
    }

    /// The copy read when the file was opened (or last refreshed).
    pub fn layout(&self) -> &L {
        &self.copy
    }

    /// Reads the file again.
    pub fn refresh(&mut self) -> Result<(), Error> {
        self.copy = read_copy::<L>(&self.path, &self.fd)?;
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

fn read_copy<L: SlotLayout>(path: &Path, fd: &OwnedFd) -> Result<Box<L>, Error> {
    let layout = std::alloc::Layout::new::<L>();
    // SAFETY: L has a non-zero size (it starts with a Prefix); an all-zero L is valid
    // (`SlotLayout`: made only of atomics), so the zeroed allocation is a valid Box<L>.
    let copy: Box<L> = unsafe {
        let p = std::alloc::alloc_zeroed(layout).cast::<L>();
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Box::from_raw(p)
    };
    // SAFETY: the box owns size_of::<L>() initialised bytes, and any bytes are a valid L; nothing
    // else references the box while this slice lives.
    let bytes = unsafe {
        std::slice::from_raw_parts_mut((&*copy as *const L).cast::<u8>().cast_mut(), size_of::<L>())
    };
    let n = sys::pread(fd, bytes, 0).map_err(io_err(path, "read"))?;
    if n < size_of::<L>() {
        return Err(Error::Truncated {
            path: path.to_path_buf(),
            size: n as u64,
            expected: size_of::<L>() as u64,
        });
    }
    Ok(copy)
}

/// Creates a file's private directory: 0700 (0770 and the group when shared), and its missing
/// parents sticky and world-writable, as /tmp is, so every user can have a directory in them
/// (the default layout: `/dev/shm/gpuslice/` 1777 holding `uid-<uid>/` 0700, `config::paths`).
fn make_dir(dir: &Path, gid: Option<u32>) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(parent) = dir.parent() {
        if !parent.exists() && parent.parent().is_some() {
            make_shared_dir(parent)?;
        }
    }
    match std::fs::DirBuilder::new()
        .mode(if gid.is_some() { 0o770 } else { 0o700 })
        .create(dir)
    {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(e),
    }
    if let Some(g) = gid {
        let dir_fd = sys::open(dir, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        // umask may have removed group bits; the group must be able to create the file too.
        sys::fchown_group(&dir_fd, g)?;
        sys::fchmod(&dir_fd, 0o770)?;
    }
    Ok(())
}

/// Creates `dir` (and its missing parents) as a directory every user can create entries in:
/// mode 1777, sticky (nobody removes or renames another user's entries). For the default layout,
/// whose per-user and shared directories live under it.
pub fn make_shared_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        if !parent.exists() {
            make_shared_dir(parent)?;
        }
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {
            let fd = sys::open(dir, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
            sys::fchmod(&fd, 0o1777)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Claims a free slot among `count`: takes its lock on `fd` first (so no cleaner can mistake it for
/// dead), then `take(i)` marks it in the layout. The descriptor is given up by fork children.
pub fn claim_slot<L: SlotLayout>(
    fd: RawFd,
    count: usize,
    is_free: impl Fn(usize) -> bool,
    take: impl Fn(usize) -> bool,
) -> Option<usize> {
    for i in 0..count {
        if !is_free(i) || !matches!(sys::try_lock(fd, L::lock_offset(i)), Ok(true)) {
            continue;
        }
        if take(i) {
            sys::guard_slot_fd(fd);
            return Some(i);
        }
        sys::unlock(fd, L::lock_offset(i));
    }
    None
}

/// Whether the process holding slot `i` is alive (another open file description holds its lock;
/// an error counts as alive).
pub fn slot_alive<L: SlotLayout>(fd: RawFd, i: usize) -> bool {
    sys::is_locked(fd, L::lock_offset(i)).unwrap_or(true)
}

/// If slot `i`'s holder is dead, runs `reclaim` holding its lock (so exactly one cleaner does) and
/// returns what it returned.
pub fn take_dead_slot<L: SlotLayout, T>(
    fd: RawFd,
    i: usize,
    reclaim: impl FnOnce() -> T,
) -> Option<T> {
    if !matches!(sys::try_lock(fd, L::lock_offset(i)), Ok(true)) {
        return None;
    }
    let r = reclaim();
    sys::unlock(fd, L::lock_offset(i));
    Some(r)
}

/// Gives up our own slot's lock.
pub fn release_slot<L: SlotLayout>(fd: RawFd, i: usize) {
    sys::unlock(fd, L::lock_offset(i));
}

/// Unit tests that take slot locks or fork run one at a time: a fork from one test's thread copies
/// every descriptor of the process, so another test's OFD locks would stay held by that child
/// until it exits, and a "dead slot" would look alive. Public for the preloaded library's unit
/// tests, which take slot locks of these files too (one lock for a test binary, whichever crate).
#[doc(hidden)]
pub fn serial_test() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
