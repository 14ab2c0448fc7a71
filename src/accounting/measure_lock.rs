//! The per-device measurement lock that measurements of different processes take around the
//! operation they measure (docs/MEMORY.md, "Method"): a `flock` on the GPU's lock file, shared for
//! a cost known beforehand and exclusive otherwise.

use super::overhead::warn_once;
use crate::slotfile;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

/// How long a measurement waits for another process's measurement on the same device.
const LOCK_WAIT: Duration = Duration::from_secs(2);

static WARNED_LOCK: AtomicBool = AtomicBool::new(false);

/// The per-device measurement lock: a `flock` on the GPU's lock file in the effective device
/// directory (`config::paths::measure_lock`), released when dropped (or when the process dies). A
/// lock that cannot be had in [`LOCK_WAIT`] (a stopped holder) or a file that cannot be opened
/// leaves the measurement unlocked (logged once).
///
/// Exclusive (`LOCK_EX`) for a measurement that other processes' operations would disturb (one
/// read from the device's used memory) or that the next one depends on (a context's, whose
/// expected cost is the previous context's charge); shared (`LOCK_SH`) for one read from this
/// process's own figure with its cost known beforehand (code of an image), which no other process
/// disturbs: such measurements of different processes run at once, and an exclusive one still
/// waits for all of them.
///
/// The process keeps each lock file open (one descriptor per device, opened at its first
/// measurement there, reopened in a forked child): no `open`/`close` per measurement. A `flock`
/// belongs to the open file description, which the process's threads share, so the process's
/// measurements are serialised among its threads by [`FILES`]'s mutex, held with the `flock`
/// (its threads' operations would disturb its own figure anyway); a thread waits for another's
/// measurement at most [`LOCK_WAIT`], then measures unlocked (logged once), as it would for a
/// stopped holder in another process.
pub(super) struct MeasureLock(Option<Held>);

/// A held measurement lock: this process's files (held, so that no other thread of it measures meanwhile)
/// and the descriptor whose `flock` is held (`None`: the file could not be opened or locked).
struct Held {
    _files: parking_lot::MutexGuard<'static, Files>,
    fd: Option<RawFd>,
}

/// This process's open lock files: (device directory, device UUID, descriptor), and the fork
/// count ([`slotfile::sys::forks_seen`]) they were opened at. A forked child shares its parent's
/// open file descriptions, and so its parent's `flock`s (unlocking one would unlock the parent's):
/// it closes them and opens its own.
struct Files {
    forks: u32,
    open: Vec<(PathBuf, String, OwnedFd)>,
}

static FILES: parking_lot::Mutex<Files> = parking_lot::const_mutex(Files {
    forks: 0,
    open: Vec::new(),
});

/// Waits between tries of a held lock: from [`FIRST_BACKOFF`], doubling, at most [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_micros(20);
const MAX_BACKOFF: Duration = Duration::from_millis(1);

impl MeasureLock {
    /// The exclusive lock of device `uuid` in the device directory `dir`.
    pub(super) fn acquire(dir: &Path, uuid: &str) -> MeasureLock {
        Self::acquire_as(dir, uuid, libc::LOCK_EX)
    }

    /// The lock of device `uuid` in the device directory `dir`, `LOCK_EX` or `LOCK_SH`.
    pub(super) fn acquire_as(dir: &Path, uuid: &str, kind: libc::c_int) -> MeasureLock {
        let start = Instant::now();
        let Some(mut files) = FILES.try_lock_for(LOCK_WAIT) else {
            warn_once(
                &WARNED_LOCK,
                format_args!(
                    "another thread's driver memory measurement on {uuid} took more than \
                     {LOCK_WAIT:?}: measured without the device lock"
                ),
            );
            return MeasureLock(None);
        };
        let fd = match files.descriptor(dir, uuid) {
            Ok(fd) => fd,
            Err((path, e)) => {
                warn_once(
                    &WARNED_LOCK,
                    format_args!(
                        "cannot open {} ({e}): driver memory is measured without the device lock",
                        path.display()
                    ),
                );
                return MeasureLock(Some(Held {
                    _files: files,
                    fd: None,
                }));
            }
        };
        let mut backoff = FIRST_BACKOFF;
        loop {
            if lock_byte(fd, kind) {
                return MeasureLock(Some(Held {
                    _files: files,
                    fd: Some(fd),
                }));
            }
            if start.elapsed() >= LOCK_WAIT {
                warn_once(
                    &WARNED_LOCK,
                    format_args!(
                        "{} stayed locked for {LOCK_WAIT:?}: driver memory is measured without it",
                        crate::config::paths::measure_lock(dir, uuid).display()
                    ),
                );
                return MeasureLock(Some(Held {
                    _files: files,
                    fd: None,
                }));
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

impl Files {
    /// This process's descriptor of device `uuid`'s lock file in `dir`, opened at the first ask
    /// (and again in a forked child). An error names the file.
    fn descriptor(&mut self, dir: &Path, uuid: &str) -> Result<RawFd, (PathBuf, std::io::Error)> {
        let forks = slotfile::sys::forks_seen();
        if self.forks != forks {
            // Inherited descriptors: closing them leaves the parent's locks alone (a `flock` is
            // released when the last descriptor of its open file description is closed).
            self.open.clear();
            self.forks = forks;
        }
        let known = self.open.iter().find(|(d, u, _)| {
            u == uuid && d.as_os_str().as_encoded_bytes() == dir.as_os_str().as_encoded_bytes()
        });
        if let Some((_, _, fd)) = known {
            return Ok(fd.as_raw_fd());
        }
        slotfile::sys::count_forks();
        // A fork between the count read above and the registration would go uncounted.
        self.forks = slotfile::sys::forks_seen();
        let path = crate::config::paths::measure_lock(dir, uuid);
        let fd: OwnedFd = open_lock_file(dir, &path).map_err(|e| (path, e))?.into();
        let raw = fd.as_raw_fd();
        self.open.push((dir.to_owned(), uuid.to_owned(), fd));
        Ok(raw)
    }
}

/// Opens the lock file `path` in the device directory `dir`. An existing file is opened read-only,
/// which is enough for `flock`: a node's device directory is root's and its lock files are made by
/// `tenant create` (root, readable by the device group), and a tenant cannot create files there.
/// A missing one is created, writable for everyone (a tenant of another uid measures on the same
/// GPU), in a directory created as the device ledgers' is (sticky, world-writable). Never through
/// a symbolic link: in a shared directory another user could plant one.
fn open_lock_file(dir: &Path, path: &Path) -> std::io::Result<std::fs::File> {
    let existing = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path);
    match existing {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        other => return other,
    }
    crate::slotfile::make_shared_dir(dir)?;
    std::fs::OpenOptions::new()
        .mode(0o666)
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

impl Drop for MeasureLock {
    fn drop(&mut self) {
        if let Some(Held { fd: Some(fd), .. }) = &self.0 {
            lock_byte(*fd, libc::LOCK_UN);
        }
    }
}

/// Takes (`LOCK_EX`) or drops (`LOCK_UN`) the file's lock, without waiting. `flock` locks belong to
/// the open file description: they die with the process, and work on a read-only descriptor.
fn lock_byte(fd: RawFd, kind: libc::c_int) -> bool {
    // SAFETY: flock takes a descriptor and flags; LOCK_NB never blocks.
    unsafe { libc::flock(fd, kind | libc::LOCK_NB) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process's measurements share [`FILES`]: these tests take turns, so that one's 2 s wait
    /// for a lock does not run out another's.
    static ONE_AT_A_TIME: parking_lot::Mutex<()> = parking_lot::const_mutex(());

    fn private_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "gpuslice-measure-lock-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// Another process's open file description of the lock file.
    fn other(dir: &Path, uuid: &str) -> OwnedFd {
        let path = crate::config::paths::measure_lock(dir, uuid);
        open_lock_file(dir, &path).unwrap().into()
    }

    #[test]
    fn shared_measurements_run_together_and_an_exclusive_one_waits_for_them() {
        let _turn = ONE_AT_A_TIME.lock();
        let dir = private_dir("kinds");
        let uuid = "GPU-00000000-0000-4000-8000-0000000000bb";
        let mine = MeasureLock::acquire_as(&dir, uuid, libc::LOCK_SH);
        assert!(matches!(mine.0, Some(Held { fd: Some(_), .. })));
        let theirs = other(&dir, uuid);
        assert!(
            lock_byte(theirs.as_raw_fd(), libc::LOCK_SH),
            "another process's shared measurement runs beside this one's"
        );
        let exclusive = other(&dir, uuid);
        assert!(
            !lock_byte(exclusive.as_raw_fd(), libc::LOCK_EX),
            "exclusive while shared ones hold it"
        );
        drop(mine);
        assert!(
            !lock_byte(exclusive.as_raw_fd(), libc::LOCK_EX),
            "exclusive while one shared holds it"
        );
        lock_byte(theirs.as_raw_fd(), libc::LOCK_UN);
        assert!(
            lock_byte(exclusive.as_raw_fd(), libc::LOCK_EX),
            "exclusive once they are gone"
        );
        let mine = MeasureLock::acquire_as(&dir, uuid, libc::LOCK_SH);
        assert!(
            matches!(mine.0, Some(Held { fd: None, .. })),
            "shared while an exclusive one holds it"
        );
        drop(mine);
        lock_byte(exclusive.as_raw_fd(), libc::LOCK_UN);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_lock_file_stays_open_and_threads_measure_one_at_a_time() {
        let _turn = ONE_AT_A_TIME.lock();
        let dir = private_dir("threads");
        let uuid = "GPU-00000000-0000-4000-8000-0000000000bc";
        let fd_of = |l: &MeasureLock| match &l.0 {
            Some(Held { fd: Some(fd), .. }) => *fd,
            _ => panic!("not locked"),
        };
        let first = MeasureLock::acquire(&dir, uuid);
        let fd = fd_of(&first);
        drop(first);
        let again = MeasureLock::acquire_as(&dir, uuid, libc::LOCK_SH);
        assert_eq!(fd_of(&again), fd, "the same descriptor, not reopened");
        // Another thread of the process waits for this measurement (they share the open file
        // description, so the `flock` cannot keep them apart).
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = {
            let dir = dir.clone();
            std::thread::spawn(move || {
                let l = MeasureLock::acquire(&dir, uuid);
                tx.send(matches!(l.0, Some(Held { fd: Some(_), .. })))
                    .unwrap();
            })
        };
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "a second thread measured while the first held the lock"
        );
        drop(again);
        assert_eq!(rx.recv_timeout(Duration::from_secs(30)), Ok(true));
        thread.join().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_forked_child_locks_through_its_own_open_file() {
        let _turn = ONE_AT_A_TIME.lock();
        let dir = private_dir("fork");
        let uuid = "GPU-00000000-0000-4000-8000-0000000000bd";
        drop(MeasureLock::acquire(&dir, uuid));
        let inherited = {
            let files = FILES.lock();
            let (_, _, fd) = files.open.iter().find(|(_, u, _)| u == uuid).unwrap();
            fd.as_raw_fd()
        };
        let mut ready = [0 as libc::c_int; 2];
        let mut done = [0 as libc::c_int; 2];
        // SAFETY: two valid two-descriptor arrays.
        assert_eq!(unsafe { libc::pipe(ready.as_mut_ptr()) }, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { libc::pipe(done.as_mut_ptr()) }, 0);
        // SAFETY: the child measures, writes to and reads from pipes, and leaves with `_exit`.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            // SAFETY: the child's copies of the ends it does not use: the parent's exit (a failed
            // assertion) then ends the child's wait.
            unsafe {
                libc::close(done[1]);
                libc::close(ready[0]);
            }
            let held = MeasureLock::acquire(&dir, uuid);
            let byte = [u8::from(matches!(held.0, Some(Held { fd: Some(_), .. })))];
            let mut wait = [0u8];
            // SAFETY: valid one-byte buffers and pipe ends; `_exit` skips the harness's teardown.
            unsafe {
                libc::write(ready[1], byte.as_ptr().cast(), 1);
                libc::read(done[0], wait.as_mut_ptr().cast(), 1);
                libc::_exit(0);
            }
        }
        let mut byte = [0u8];
        // SAFETY: a valid one-byte buffer and pipe end.
        let got = unsafe { libc::read(ready[0], byte.as_mut_ptr().cast(), 1) };
        assert_eq!(got, 1);
        assert_eq!(byte[0], 1, "the child holds the lock");
        // Through the descriptor the child inherited, a lock would be the child's too (one open
        // file description): this process's shared lock must wait for the child's exclusive one.
        assert!(
            !lock_byte(inherited, libc::LOCK_SH),
            "the child locked through its parent's open file description"
        );
        // SAFETY: valid pipe end and buffer; then the child is reaped.
        unsafe {
            libc::write(done[1], byte.as_ptr().cast(), 1);
            let mut status = 0;
            libc::waitpid(child, &mut status, 0);
            for fd in ready.into_iter().chain(done) {
                libc::close(fd);
            }
        }
        assert!(
            lock_byte(inherited, libc::LOCK_SH),
            "free once the child left"
        );
        lock_byte(inherited, libc::LOCK_UN);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
