//! CUDA IPC memory handles (`cuIpcGetMemHandle`, `cuIpcOpenMemHandle`, `cuIpcCloseMemHandle`):
//! memory stays charged to some process of the tenant until its last mapping anywhere is gone
//! (docs/MEMORY.md, "IPC memory handles").
//!
//! An import allocates nothing: the memory is the exporter's allocation, charged to the exporter
//! since its `cuMemAlloc`, and the driver counts it against the exporter. A driver keeps the memory
//! alive while an importer maps it, even after the exporter's `cuMemFree` (cuda.h calls the order
//! undefined; vLLM's custom all-reduce and UCX rely on it), and counts it then against the importer.
//! So the charge follows it: an importer registers each handle it maps in the tenant's IPC
//! directory (`<ledger>.ipc/<handle>.<slot>.<claim>`, one empty file per importing process), and
//! the exporter's free of an allocation it exported hands its charge to a live importer's ledger
//! slot ([`Ledger::hand_over`](crate::ledger::Ledger::hand_over): the tenant's total does not move,
//! so it never passes the quota by it) and writes into that file what it handed; the importer's
//! last `cuIpcCloseMemHandle` of the handle returns that. A file is taken with an exclusive `flock`
//! (bounded wait) by whichever side acts on it, so a hand-over and a close never cross.
//!
//! Processes of other tenants (another ledger) find no file of each other: the exporter's free then
//! returns its charge, and the importer's tenant is charged what the driver counts against it by
//! reconciliation (docs/MEMORY.md). An exporter that exits with exports still mapped hands them over
//! the same way (an exit step); one killed cannot. Nothing here runs on an allocation or a launch; a free asks
//! [`any`] (one atomic load) before looking at its records.

use super::{Charge, Tenant};
use crate::log;
use gpuslice_api::CUresult;
use std::collections::HashMap;
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once this process exported an allocation: until then a free looks no further.
static ANY_EXPORTED: AtomicBool = AtomicBool::new(false);

/// Whether this process ever exported an allocation (the free path's one check).
#[inline(always)]
pub fn any() -> bool {
    ANY_EXPORTED.load(Ordering::Relaxed)
}

/// This process's IPC records.
#[derive(Default)]
pub(super) struct IpcRecords {
    /// Exported allocation (its device pointer) -> its handle's name.
    exported: HashMap<u64, String>,
    /// Mapped address -> (its registration file, references).
    mapped: HashMap<u64, (PathBuf, u32)>,
}

/// A handle's name: its 64 bytes in hex.
pub fn handle_name(handle: &[u8; 64]) -> String {
    handle.iter().map(|b| format!("{b:02x}")).collect()
}

/// How long a side waits for the other's `flock` on a registration file.
const LOCK_TRIES: u32 = 2000;

/// The file at `path`, opened without following a link and locked exclusively (at most ~2 s).
fn open_locked(path: &Path) -> Option<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    for _ in 0..LOCK_TRIES {
        // SAFETY: flock on a descriptor this function owns; LOCK_NB never blocks.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Some(file);
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    None
}

/// What an exporter wrote into a registration file: (ledger device, bytes).
fn read_handed(file: &mut std::fs::File) -> Option<(usize, u64)> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.take(64).read_to_string(&mut text).ok()?;
    let mut words = text.split_whitespace();
    let dev = words.next()?.parse().ok()?;
    let bytes = words.next()?.parse().ok()?;
    Some((dev, bytes))
}

impl Tenant {
    /// The tenant's IPC directory (beside its ledger).
    fn ipc_dir(&self) -> Option<PathBuf> {
        let ledger = self.ledger().ok()?;
        let mut name = ledger.path().as_os_str().to_owned();
        name.push(".ipc");
        Some(PathBuf::from(name))
    }

    /// `cuIpcGetMemHandle`: after the driver exported the allocation at `dptr` as `handle`,
    /// remembers it when this process charged it (a free then looks for its importers).
    pub fn ipc_exported(&self, dptr: u64, handle: &[u8; 64]) {
        if self.allocations.lock().get(dptr).is_some() {
            // (Not in unit tests: their tenants are not the process's.)
            if !ANY_EXPORTED.swap(true, Ordering::Relaxed) && !cfg!(test) {
                crate::process::on_exit(hand_over_at_exit);
            }
            self.records
                .lock()
                .ipc
                .exported
                .insert(dptr, handle_name(handle));
        }
    }

    /// `cuIpcOpenMemHandle`: nothing is charged (the memory is the exporter's); this process's first
    /// mapping of the handle registers it in the tenant's IPC directory, for the exporter's free.
    pub fn ipc_opened(
        &self,
        handle: &[u8; 64],
        call: impl FnOnce() -> Result<u64, gpuslice_api::CUerror>,
    ) -> CUresult {
        let at = call()?;
        if let Some((_, refs)) = self.records.lock().ipc.mapped.get_mut(&at) {
            *refs += 1;
            return Ok(());
        }
        let (Some(dir), Some((slot, claim))) = (
            self.ipc_dir(),
            self.ledger().ok().and_then(|l| l.my_claim()),
        ) else {
            return Ok(());
        };
        let path = dir.join(format!("{}.{slot}.{claim}", handle_name(handle)));
        let made = std::fs::DirBuilder::new()
            .mode(0o770)
            .create(&dir)
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => Ok(()),
                _ => Err(e),
            })
            .and_then(|()| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o660)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(&path)
            });
        match made {
            Ok(_) => {
                self.records.lock().ipc.mapped.insert(at, (path, 1));
            }
            Err(e) => log::warn(format_args!(
                "IPC mapping: cannot register it in {} ({e}): its memory is charged to this \
                 tenant only by reconciliation once the exporter frees it",
                dir.display()
            )),
        }
        Ok(())
    }

    /// `cuIpcCloseMemHandle`: the last close of a mapping returns what an exporter handed this
    /// process for it, once the driver has unmapped it.
    pub fn ipc_closed(&self, dptr: u64, call: impl FnOnce() -> CUresult) -> CUresult {
        let path = {
            let mut r = self.records.lock();
            match r.ipc.mapped.get_mut(&dptr) {
                Some((_, refs)) if *refs > 1 => {
                    drop(r);
                    call()?;
                    if let Some((_, refs)) = self.records.lock().ipc.mapped.get_mut(&dptr) {
                        *refs -= 1;
                    }
                    return Ok(());
                }
                Some((path, _)) => path.clone(),
                None => {
                    drop(r);
                    return call();
                }
            }
        };
        // Held across the driver's unmap, so that an exporter's hand-over comes before (and is
        // returned here) or finds the file gone (and returns the charge itself).
        let file = open_locked(&path);
        call()?;
        self.records.lock().ipc.mapped.remove(&dptr);
        let _ = std::fs::remove_file(&path);
        if let Some((dev, bytes)) = file.and_then(|mut f| read_handed(&mut f)) {
            self.release(Charge { device: dev, bytes });
        }
        Ok(())
    }

    /// The exporter's free of `key` (charged `charge`) went through: hands the charge to a live
    /// importer of the tenant that maps it (true), or leaves it to the caller to release (false).
    pub(super) fn exported_freed(&self, key: u64, charge: Charge) -> bool {
        let Some(name) = self.records.lock().ipc.exported.remove(&key) else {
            return false;
        };
        let (Some(dir), Ok(ledger)) = (self.ipc_dir(), self.ledger()) else {
            return false;
        };
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return false;
        };
        let prefix = format!("{name}.");
        for entry in entries.flatten() {
            let file_name = entry.file_name();
            let Some(rest) = file_name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
                continue;
            };
            let Some((slot, claim)) = rest
                .split_once('.')
                .and_then(|(s, c)| Some((s.parse().ok()?, c.parse().ok()?)))
            else {
                continue;
            };
            let Some(mut file) = open_locked(&entry.path()) else {
                continue;
            };
            // A file its importer already closed (unlinked) is no longer a mapping.
            if file.metadata().map_or(true, |m| m.nlink() == 0) {
                continue;
            }
            if ledger.hand_over(charge.device, slot, claim, charge.bytes) {
                let _ = file.write_all(format!("{} {}\n", charge.device, charge.bytes).as_bytes());
                return true;
            }
        }
        false
    }
}

/// At exit: the exports this process never freed outlive it in their importers, as the driver keeps
/// them alive there ([`Tenant::exports_at_exit`]).
extern "C" fn hand_over_at_exit() {
    // Nothing may unwind into the C runtime's exit.
    let _ = std::panic::catch_unwind(|| {
        if let super::Mode::Enforcing(t) = super::mode() {
            t.exports_at_exit();
        }
    });
}

impl Tenant {
    /// The process ends: each allocation it exported and never freed is handed to a live importer
    /// of the tenant that maps it, as a free would (its own slot's charges are returned as it ends).
    pub(super) fn exports_at_exit(&self) {
        let keys: Vec<u64> = self.records.lock().ipc.exported.keys().copied().collect();
        for key in keys {
            let Some(charge) = self.allocations.lock().get(key) else {
                continue;
            };
            if self.exported_freed(key, charge) {
                self.allocations.lock().remove(key);
            }
        }
    }
}

#[cfg(test)]
mod tests;
