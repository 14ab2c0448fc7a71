//! The per-device measurement lock that measurements of different processes take around the
//! operation they measure (docs/MEMORY.md, "Method"): a `flock` on the GPU's lock file, shared for
//! a cost known beforehand and exclusive otherwise.

use super::overhead::warn_once;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
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
/// waits for all of them. A process's own shared measurements are serialised by [`OWN`].
pub(super) struct MeasureLock(Option<OwnedFd>);

/// Serialises this process's measurements made under a shared device lock (its threads'
/// operations would disturb its own figure).
pub(super) static OWN: parking_lot::Mutex<()> = parking_lot::const_mutex(());

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
        let path = crate::config::paths::measure_lock(dir, uuid);
        let fd: OwnedFd = match open_lock_file(dir, &path) {
            Ok(f) => f.into(),
            Err(e) => {
                warn_once(
                    &WARNED_LOCK,
                    format_args!(
                        "cannot open {} ({e}): driver memory is measured without the device lock",
                        path.display()
                    ),
                );
                return MeasureLock(None);
            }
        };
        let start = Instant::now();
        let mut backoff = FIRST_BACKOFF;
        loop {
            if lock_byte(&fd, kind) {
                return MeasureLock(Some(fd));
            }
            if start.elapsed() >= LOCK_WAIT {
                warn_once(
                    &WARNED_LOCK,
                    format_args!(
                        "{} stayed locked for {LOCK_WAIT:?}: driver memory is measured without it",
                        path.display()
                    ),
                );
                return MeasureLock(None);
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
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
        if let Some(fd) = &self.0 {
            lock_byte(fd, libc::LOCK_UN);
        }
    }
}

/// Takes (`LOCK_EX`) or drops (`LOCK_UN`) the file's lock, without waiting. `flock` locks belong to
/// the open file description: they die with the process, and work on a read-only descriptor.
fn lock_byte(fd: &OwnedFd, kind: libc::c_int) -> bool {
    // SAFETY: flock takes a descriptor and flags; LOCK_NB never blocks.
    unsafe { libc::flock(fd.as_raw_fd(), kind | libc::LOCK_NB) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_measurements_run_together_and_an_exclusive_one_waits_for_them() {
        let dir =
            std::env::temp_dir().join(format!("gpuslice-measure-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let uuid = "GPU-00000000-0000-4000-8000-0000000000bb";
        let one = MeasureLock::acquire_as(&dir, uuid, libc::LOCK_SH);
        let two = MeasureLock::acquire_as(&dir, uuid, libc::LOCK_SH);
        assert!(
            one.0.is_some() && two.0.is_some(),
            "two shared holders at once"
        );
        let path = crate::config::paths::measure_lock(&dir, uuid);
        let other: OwnedFd = open_lock_file(&dir, &path).unwrap().into();
        assert!(
            !lock_byte(&other, libc::LOCK_EX),
            "exclusive while shared ones hold it"
        );
        drop(one);
        assert!(
            !lock_byte(&other, libc::LOCK_EX),
            "exclusive while one shared holds it"
        );
        drop(two);
        assert!(
            lock_byte(&other, libc::LOCK_EX),
            "exclusive once they are gone"
        );
        let shared: OwnedFd = open_lock_file(&dir, &path).unwrap().into();
        assert!(
            !lock_byte(&shared, libc::LOCK_SH),
            "shared while an exclusive one holds it"
        );
        lock_byte(&other, libc::LOCK_UN);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
