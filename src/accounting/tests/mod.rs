//! Unit tests of accounting's decisions against the fake driver (`driver::fake`): a tenant with a
//! private ledger and device directory, asking a driver whose figures each test sets.

use super::tenant::LedgerCell;
use super::Tenant;
use crate::config::Limit;
use crate::driver::fake::FakeDriver;
use crate::ledger::{Ledger, LedgerOptions};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

mod allocations;
mod local;
mod measure;
mod nvml;
mod pools;
mod reserve;
mod up_front;

pub const UUID: &str = "GPU-00000000-0000-4000-8000-0000000000a1";
pub const UUID_B: &str = "GPU-00000000-0000-4000-8000-0000000000b2";
pub const MIB: u64 = 1 << 20;

/// A tenant on the fake driver, its ledger and its private directory (removed when dropped).
pub struct Kit {
    pub t: Box<Tenant>,
    pub fake: &'static FakeDriver,
    dir: PathBuf,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Drop for Kit {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A tenant limited to `limit` bytes on each of `uuids`, with `extra` settings.
pub fn kit_with(tag: &str, limit: u64, uuids: &[&str], extra: &[(&str, &str)]) -> Kit {
    let serial = crate::slotfile::serial_test();
    let dir = std::env::temp_dir().join(format!("gpuslice-acct-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut vars: HashMap<String, String> = HashMap::new();
    vars.insert("GPUSLICE_TENANT".into(), "t".into());
    vars.insert(
        "GPUSLICE_LEDGER".into(),
        dir.join("t.ledger").display().to_string(),
    );
    vars.insert(
        "GPUSLICE_DEVICE_DIR".into(),
        dir.join("devices").display().to_string(),
    );
    vars.insert("GPUSLICE_MEMORY_LIMIT".into(), limit.to_string());
    for (k, v) in extra {
        vars.insert((*k).into(), (*v).into());
    }
    let config = crate::config::load_from(&|k| vars.get(k).cloned(), Path::new("/nonexistent"));
    assert!(config.errors.is_empty(), "{:?}", config.errors);
    let config = Box::leak(Box::new(config));
    let opts = LedgerOptions {
        tenant: "t".into(),
        default_limit: Limit::Bytes(limit),
        devices: uuids
            .iter()
            .map(|u| ((*u).to_owned(), Limit::Bytes(limit)))
            .collect(),
        group: None,
    };
    // The tenant's own ledger, unmapped with it: the process's table of mappings whose
    // truncation is contained (`slotfile::fault`) has room for a few dozen.
    let ledger = Ledger::open(&config.ledger_path, &opts).unwrap();
    let cell = OnceLock::new();
    let _ = cell.set(Ok(ledger));
    let fake = FakeDriver::leaked(uuids);
    let t = Box::new(Tenant::with_driver(config, LedgerCell::Own(cell), fake));
    Kit {
        t,
        fake,
        dir,
        _serial: serial,
    }
}

/// A tenant limited to `limit` bytes on one device.
pub fn kit(tag: &str, limit: u64) -> Kit {
    kit_with(tag, limit, &[UUID], &[])
}

impl Kit {
    pub fn ledger(&self) -> &Ledger {
        self.t.ledger().unwrap()
    }

    /// What the tenant has charged on ledger device `ordinal`'s slot.
    pub fn used(&self, ordinal: i32) -> u64 {
        let slot = self.t.device(ordinal).unwrap().slot.clone().unwrap();
        self.ledger().used(slot)
    }

    /// Refusals counted on device `ordinal`.
    pub fn denied(&self, ordinal: i32) -> u64 {
        let slot = self.t.device(ordinal).unwrap().slot.clone().unwrap();
        let snapshot = self.ledger().snapshot();
        snapshot
            .devices
            .iter()
            .find(|d| d.index == slot)
            .map_or(0, |d| d.denied)
    }
}
