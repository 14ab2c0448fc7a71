//! gpuslice's configuration: memory quotas, compute shares, the tenant and its ledger.
//!
//! # Sources and precedence
//!
//! 1. gpuslice's environment variables (`GPUSLICE_*`);
//! 2. aliases borrowed from HAMi and MPS (`CUDA_DEVICE_MEMORY_LIMIT[_<i>]`,
//!    `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, `CUDA_DEVICE_SM_LIMIT[_<i>]`,
//!    `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`), each reported by an info note;
//! 3. the quota file (`GPUSLICE_QUOTA_FILE`, default `/etc/gpuslice/quota.toml` when it exists).
//!
//! A node policy (`policy.rs`: `/run/gpuslice/tenant/policy.toml`, else `GPUSLICE_POLICY`) bounds all
//! three: they can only lower it. HAMi's `CUDA_DEVICE_MEMORY_SHARED_CACHE`, `CUDA_TASK_PRIORITY`,
//! `GPU_CORE_UTILIZATION_POLICY` and `LIBCUDA_LOG_LEVEL` are read too, each with an info note.
//!
//! Each setting comes whole from the first source that sets it: a memory limit from the
//! environment replaces the file's `memory_limit` *and* its `[devices]` table, and a tenant from
//! the environment replaces the file's `tenant` *and* its `ledger` (unless `GPUSLICE_LEDGER` is set).
//!
//! Every setting, its sources in precedence order and its scope: [`table::SETTINGS`] (the docs table
//! in docs/CONFIGURATION.md is generated from it). The quota file's syntax: docs/CONFIGURATION.md
//! and `quota_file.rs`.
//!
//! # Failing closed
//!
//! There is no setting that turns enforcement off. A bad value never means "unlimited": the
//! device(s) it concerns get [`Limit::Invalid`] (the shim denies every allocation there) and the
//! message lands in [`Config::errors`], with what it does ([`effect`]). A value that cannot be
//! attributed to a device (a syntax error in the quota file, a bad key, a bad ledger path or tenant,
//! a bad context reserve) makes every device's memory limit invalid.
//!
//! An unknown `GPUSLICE_*` variable is named once with the closest setting (`mistyped.rs`); a near
//! miss of a limit no source sets (memory limit, compute cap, quota file) is read as that limit with a
//! value that cannot be read, so a typo never leaves the program unlimited.

mod builder;
mod file;
mod load;
mod mistyped;
pub mod names;
pub mod paths;
mod per_device;
pub mod policy;
mod policy_apply;
mod quota_file;
mod readers;
pub mod size;
mod source;
pub mod table;

use std::collections::BTreeMap;
use std::path::PathBuf;

pub use load::{load, load_from, load_listed, load_with_policy, DEFAULT_DEVICE_DIR};
pub use mistyped::FAIL_CLOSED_WHEN_MISTYPED;
use per_device::per_device;
pub use per_device::{canonical_uuid, uuid_bytes, PerDevice};
pub use size::{format_bytes, parse_percent, parse_size, Units};

/// Bytes charged per CUDA context when `GPUSLICE_CONTEXT_RESERVE` is not set and what the driver spent
/// cannot be measured (no NVML, docs/MEMORY.md): about what a CUDA 12 context costs on a current
/// data-centre GPU.
pub const DEFAULT_CONTEXT_RESERVE: u64 = 512 << 20;

/// Default quota file, read when `GPUSLICE_QUOTA_FILE` is unset and the file exists.
pub const DEFAULT_QUOTA_FILE: &str = "/etc/gpuslice/quota.toml";
/// Directory of the default ledgers.
pub const DEFAULT_LEDGER_DIR: &str = "/dev/shm/gpuslice";
/// Tenant when none is named.
pub const DEFAULT_TENANT: &str = "default";
/// Highest `_<i>` suffix probed for the per-device HAMi aliases.
const MAX_ALIAS_INDEX: u32 = 64;
/// A quota file larger than this is refused (it is a dozen lines).
const MAX_QUOTA_FILE: u64 = 64 * 1024;

/// One device's memory limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Limit {
    /// At most this many bytes.
    Bytes(u64),
    /// Nothing configured for the device.
    Unlimited,
    /// The configuration for the device is wrong: deny every allocation there. The message says why.
    Invalid(String),
}

/// A non-memory per-device or global setting.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Setting<T> {
    Value(T),
    #[default]
    Unset,
    /// Wrong configuration (message); the caller applies its strictest behaviour.
    Invalid(String),
}

/// Scheduling priority for the compute-share work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    High,
    Normal,
}

/// `GPUSLICE_LOG` levels: the logger's own type (one type, one parser: [`crate::log::Level`]).
pub use crate::log::Level as LogLevel;

/// The parsed configuration of this process ([`load`]; `Default` is the loader's starting point).
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// Tenant name (names the default ledger).
    pub tenant: String,
    /// Path of the ledger shared by the tenant's processes.
    pub ledger_path: PathBuf,
    /// The ledger directory when `ledger_path` is a default one (`<dir>/uid-<uid>/<tenant>.ledger`,
    /// see [`paths`]); `None` when `GPUSLICE_LEDGER` or the quota file names the ledger.
    pub ledger_dir: Option<PathBuf>,
    /// Group allowed to share the ledger (`GPUSLICE_LEDGER_GROUP` / file `ledger_group`).
    pub ledger_group: Option<String>,
    /// Quota file that was read, if any.
    pub quota_file: Option<PathBuf>,
    /// Per-device memory limits in bytes.
    pub memory: PerDevice<u64>,
    /// Where the memory limits came from (`GPUSLICE_MEMORY_LIMIT="..."`, `file:line`), for errors
    /// found later (a list naming no visible device); empty when none is set.
    pub memory_source: String,
    pub log_level: LogLevel,
    /// Bytes charged to the quota per CUDA context (`GPUSLICE_CONTEXT_RESERVE`), never measured;
    /// `None` = measured (docs/MEMORY.md), [`DEFAULT_CONTEXT_RESERVE`] when nothing can be measured;
    /// `Some(0)` = contexts are not charged.
    pub context_reserve: Option<u64>,
    /// Guaranteed compute share, percent.
    pub compute_share: PerDevice<u8>,
    /// Compute cap, percent.
    pub compute_limit: PerDevice<u8>,
    pub priority: Setting<Priority>,
    /// Directory of the device ledgers (compute shares): the node policy's, else
    /// `GPUSLICE_DEVICE_DIR`, else `devices/` in `GPUSLICE_LEDGER_DIR`, else [`DEFAULT_DEVICE_DIR`].
    pub device_dir: PathBuf,
    /// Info-level lines (how aliases were read) for the caller to log.
    pub notes: Vec<String>,
    /// Warn-level lines: settings ignored because a node policy forbids them (`policy.rs`), and
    /// the lines of `unknown`.
    pub warnings: Vec<String>,
    /// One line per `GPUSLICE_*` variable gpuslice does not know that is ignored (also in
    /// `warnings`); one that fails closed as a limit's near miss is in `errors` instead
    /// (`mistyped.rs`).
    pub unknown: Vec<String>,
    /// Every configuration error, each naming its variable or `file:line`, the value and what was expected.
    pub errors: Vec<String>,
    /// What each error in `errors` does to the process ([`Config::effect_of`]).
    effects: BTreeMap<String, &'static str>,
    /// The node's policy for this tenant (`policy.rs`): authoritative, only ever lowered.
    pub policy: Option<policy::NodePolicy>,
}

/// What a bad value does, said after it in the log.
pub mod effect {
    /// A memory limit: fails closed on the devices it concerns.
    pub const MEMORY: &str = "allocations on the devices it concerns are refused";
    /// A compute share or cap: the strictest setting (share and cap), applied.
    pub const COMPUTE: &str =
        "compute share 1% and cap 1% on the devices it concerns (strictest); allocations are not affected";
    /// A value that cannot be attributed to one device (tenant, ledger, quota file, context reserve).
    pub const EVERYTHING: &str =
        "allocations on every device are refused, and compute runs at share 1% and cap 1% (strictest)";
    pub const PRIORITY: &str = "compute priority normal; allocations are not affected";
    pub const LOG: &str = "logging at warn; allocations are not affected";
}

impl Config {
    /// Memory limit for the device at `index` (visible order) with `uuid`; a UUID key wins.
    pub fn memory_limit_for(&self, index: u32, uuid: &str) -> Limit {
        to_limit(self.memory.get(index, uuid))
    }

    /// Memory limit for devices no key names (what a ledger's creator records for devices it has not seen).
    pub fn default_memory_limit(&self) -> Limit {
        to_limit(self.memory.get_default())
    }

    pub fn compute_share_for(&self, index: u32, uuid: &str) -> Setting<u8> {
        self.compute_share.get(index, uuid)
    }

    pub fn compute_limit_for(&self, index: u32, uuid: &str) -> Setting<u8> {
        self.compute_limit.get(index, uuid)
    }

    /// What `error` (one of [`Config::errors`]) does to the process: [`effect`].
    pub fn effect_of(&self, error: &str) -> &'static str {
        self.effects
            .get(error)
            .copied()
            .unwrap_or(effect::EVERYTHING)
    }

    /// Each error followed by what it does, as the library logs it.
    pub fn error_lines(&self) -> Vec<String> {
        self.errors
            .iter()
            .map(|e| format!("{e}; {}", self.effect_of(e)))
            .collect()
    }

    /// For tools (`gpuslice doctor`): the error lines, then each unknown `GPUSLICE_*` variable
    /// that is ignored (a setting meant is not applied as spelt, even when it only warns here).
    pub fn problem_lines(&self) -> Vec<String> {
        let mut lines = self.error_lines();
        lines.extend(self.unknown.iter().cloned());
        lines
    }

    /// For tools: the warnings that [`Config::problem_lines`] does not list.
    pub fn note_lines(&self) -> Vec<String> {
        let known = self.warnings.iter().filter(|w| !self.unknown.contains(w));
        known.cloned().collect()
    }

    /// Whether any limit or quota is present anywhere (including invalid ones, which must be enforced).
    pub fn is_configured(&self) -> bool {
        self.memory.is_set()
            || self.compute_share.is_set()
            || self.compute_limit.is_set()
            || self.priority != Setting::Unset
            || self.context_reserve.is_some()
            || self.quota_file.is_some()
            || !self.errors.is_empty()
            || self.policy.is_some()
    }

    /// The most the node's policy allows on a device, lowered by this process's own memory setting;
    /// `None` without a policy. The ledger's limit applies too: the least of them rules.
    pub fn memory_ceiling(&self, index: u32, uuid: &str) -> Option<u64> {
        let policy = self.policy.as_ref()?;
        let own = match self.memory_limit_for(index, uuid) {
            Limit::Bytes(b) => b,
            Limit::Unlimited => u64::MAX,
            Limit::Invalid(_) => 0,
        };
        Some(policy.memory_on(uuid).min(own))
    }
}

impl Config {
    /// Moves a default ledger to this user's usable directory (another user may have taken the
    /// first name, [`paths`]); when none is left, every memory limit fails closed saying why.
    pub fn place_default_ledger(&mut self) {
        let Some(base) = &self.ledger_dir else {
            return;
        };
        let group = self.ledger_group.as_deref();
        let who = paths::Owner {
            uid: crate::slotfile::sys::geteuid(),
            group: group.and_then(|g| crate::slotfile::sys::group_id(g).ok()),
        };
        let file = self.ledger_path.file_name().map(PathBuf::from);
        match paths::user_dir(base, group, who, &crate::slotfile::sys::in_group) {
            Ok(dir) => {
                if let Some(f) = file {
                    self.ledger_path = dir.join(f);
                }
            }
            // Nothing configured: this process only joins a ledger that exists, and none can here.
            Err(_) if !self.is_configured() => {}
            Err(e) => {
                let msg = format!("ledger of tenant {}: {e}", self.tenant);
                self.errors.push(msg.clone());
                self.effects.insert(msg.clone(), effect::MEMORY);
                self.memory.poison_with(&msg);
            }
        }
    }
}

fn to_limit(s: Setting<u64>) -> Limit {
    match s {
        Setting::Value(b) => Limit::Bytes(b),
        Setting::Unset => Limit::Unlimited,
        Setting::Invalid(e) => Limit::Invalid(e),
    }
}

#[cfg(test)]
mod node_tests;
#[cfg(test)]
mod tests;
