//! The configuration being built while the loader walks the settings table: what a reader is
//! handed (a setting's first set tier of sources) and what it writes into. Below the readers, the
//! quota file's reader and the loader, which all work on it.

use super::source::Source;
use super::{effect, Config, PerDevice, DEFAULT_TENANT};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Default directory of the device ledgers (compute shares).
pub const DEFAULT_DEVICE_DIR: &str = "/dev/shm/gpuslice/devices";

/// One source found set, as the loader hands it to a setting's reader.
pub(super) struct Found {
    pub source: Source,
    /// The `_<i>` of an indexed variable.
    pub index: Option<u32>,
    pub value: String,
    /// How messages name it: `NAME="value"`, or `file:line: key="value"`.
    pub label: String,
}

/// A setting's first set tier of sources (all of one kind), and the environment for a reader that
/// looks at a companion variable.
pub(super) struct Tier<'a> {
    pub found: &'a [Found],
    pub env: &'a dyn Fn(&str) -> Option<String>,
}

impl Tier<'_> {
    pub fn first(&self) -> Option<&Found> {
        self.found.first()
    }
}

/// The configuration being built: `cfg` holds the settings as their readers leave them (and what
/// they reported); the fields below hold what the defaults are derived from in [`finish`].
pub(super) struct Builder {
    pub file: FileSettings,
    pub cfg: Config,
    /// A tenant named explicitly.
    pub tenant: Option<String>,
    /// A ledger named explicitly (checked by its reader).
    pub ledger: Option<PathBuf>,
    pub ledger_dir: Option<PathBuf>,
    pub device_dir: Option<PathBuf>,
    /// Errors that concern every device.
    pub poison_all: Vec<String>,
}

impl Builder {
    pub(super) fn new() -> Builder {
        Builder {
            file: FileSettings::default(),
            cfg: Config {
                tenant: DEFAULT_TENANT.to_string(),
                device_dir: PathBuf::from(DEFAULT_DEVICE_DIR),
                ..Config::default()
            },
            tenant: None,
            ledger: None,
            ledger_dir: None,
            device_dir: None,
            poison_all: Vec::new(),
        }
    }

    /// An info line for the log (how an alias was read, what was ignored).
    pub fn note(&mut self, line: String) {
        self.cfg.notes.push(line);
    }

    /// An error that concerns every device (tenant, ledger, quota file, context reserve).
    pub fn fail_all(&mut self, msg: String) {
        self.fail(msg.clone(), effect::EVERYTHING);
        self.poison_all.push(msg);
    }

    /// An error whose effect is `effect` (it poisons nothing by itself).
    pub fn fail(&mut self, msg: String, effect: &'static str) {
        self.cfg.effects.insert(msg.clone(), effect);
        self.cfg.errors.push(msg);
    }
}

#[derive(Default)]
pub(super) struct FileSettings {
    pub(super) path: Option<PathBuf>,
    /// Top-level keys: value text and its `file:line` source label.
    pub(super) top: BTreeMap<String, (String, String)>,
    /// `memory_limit` and the `[devices]` table together (the table wins per device).
    pub(super) memory: PerDevice<u64>,
    /// The file has a `[devices]` table with at least one entry.
    pub(super) has_devices_table: bool,
}

/// `NAME="value"`: how a variable is named in messages.
pub(super) fn quoted(var: &str, value: &str) -> String {
    format!("{var}={value:?}")
}
