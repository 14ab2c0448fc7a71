//! The loader: the quota file first (it is itself a source), then every row of [`table::SETTINGS`]
//! in order — the first tier of its sources that is set, handed to the row's reader — then the
//! defaults that depend on several settings (the default ledger), the collected errors and the
//! node policy.

use super::quota_file::FileSettings;
use super::table::{self, Source, Spec, DEVICES_TABLE};
use super::{
    effect, paths, policy, Config, PerDevice, Setting, DEFAULT_LEDGER_DIR, DEFAULT_TENANT,
    MAX_ALIAS_INDEX,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
    fn new() -> Builder {
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

/// Reads the configuration from the real environment and `/etc/gpuslice/quota.toml`.
pub fn load() -> Config {
    // One pass over the environment: the aliases are probed under many names (`..._LIMIT_<i>`), and
    // each getenv would scan the whole environment again. A handful of variables at most: a linear
    // search beats hashing 130 probes.
    let relevant: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| {
            let k = k.into_string().ok()?;
            (k.starts_with("GPUSLICE_")
                || k.starts_with("CUDA_")
                || k == "GPU_CORE_UTILIZATION_POLICY"
                || k == "LIBCUDA_LOG_LEVEL")
                .then(|| (k, v.to_string_lossy().into_owned()))
        })
        .collect();
    let mut cfg = load_from(
        &|name| {
            relevant
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        },
        Path::new(super::DEFAULT_QUOTA_FILE),
    );
    cfg.place_default_ledger();
    cfg
}

/// Reads the configuration from `env` and the quota file (`GPUSLICE_QUOTA_FILE`, or
/// `default_quota_file` when that exists).
pub fn load_from(env: &dyn Fn(&str) -> Option<String>, default_quota_file: &Path) -> Config {
    load_with_policy(env, default_quota_file, Path::new(policy::POLICY_FILE))
}

/// [`load_from`] with the node policy looked for at `policy_file` (tests) instead of
/// [`policy::POLICY_FILE`].
pub fn load_with_policy(
    env: &dyn Fn(&str) -> Option<String>,
    default_quota_file: &Path,
    policy_file: &Path,
) -> Config {
    let mut b = Builder::new();
    b.file = b.read_quota_file(env, default_quota_file);
    for spec in table::SETTINGS {
        if let Some(read) = spec.read() {
            apply(&mut b, env, spec, read);
        }
    }
    finish(b, env, policy_file)
}

/// Hands `spec`'s first set tier of sources to `read`; a tier the reader declines (a HAMi cap that
/// `GPU_CORE_UTILIZATION_POLICY=disable` switches off, a file's ledger that belongs to another
/// tenant) gives way to the next. Variables of lower tiers that are set too are noted as ignored.
fn apply(
    b: &mut Builder,
    env: &dyn Fn(&str) -> Option<String>,
    spec: &Spec,
    read: super::readers::Read,
) {
    let tiers = tiers(spec, env, &b.file);
    let Some(taken) = tiers.iter().position(|found| read(b, &Tier { found, env })) else {
        return;
    };
    let ignored: Vec<String> = tiers[taken + 1..]
        .iter()
        .flatten()
        .filter_map(|f| f.source.variable().map(|v| v.replace("_<i>", "_*")))
        .fold(Vec::new(), |mut names, v| {
            if !names.contains(&v) {
                names.push(v);
            }
            names
        });
    if let (false, Some(winner)) = (ignored.is_empty(), tiers[taken][0].source.variable()) {
        b.note(format!(
            "{} is set: ignoring {}",
            winner.replace("_<i>", "_*"),
            ignored.join(", ")
        ));
    }
}

/// `spec`'s sources that are set, grouped in tiers (gpuslice's, HAMi's, MPS's, the file's), in
/// precedence order; tiers with nothing set are left out.
fn tiers(
    spec: &Spec,
    env: &dyn Fn(&str) -> Option<String>,
    file: &FileSettings,
) -> Vec<Vec<Found>> {
    let mut out: Vec<Vec<Found>> = Vec::new();
    let mut last_kind = None;
    for &source in spec.sources {
        let kind = std::mem::discriminant(&source);
        if last_kind != Some(kind) {
            out.push(Vec::new());
            last_kind = Some(kind);
        }
        let Some(tier) = out.last_mut() else {
            continue;
        };
        match source {
            Source::File(DEVICES_TABLE) => {
                if let Some(path) = file.path.as_ref().filter(|_| file.has_devices_table) {
                    tier.push(Found {
                        source,
                        index: None,
                        value: String::new(),
                        label: format!("{} [devices]", path.display()),
                    });
                }
            }
            Source::File(key) => {
                if let Some((value, label)) = file.top.get(key) {
                    tier.push(Found {
                        source,
                        index: None,
                        value: value.clone(),
                        label: label.clone(),
                    });
                }
            }
            _ => {
                let var = source.variable().unwrap_or_default();
                match var.strip_suffix("<i>") {
                    Some(prefix) => {
                        for (i, value) in indexed_variables(env, prefix) {
                            let label = format!("{prefix}{i}={value:?}");
                            tier.push(Found {
                                source,
                                index: Some(i),
                                value,
                                label,
                            });
                        }
                    }
                    None => {
                        if let Some(value) = env(var) {
                            tier.push(Found {
                                source,
                                index: None,
                                label: quoted(var, &value),
                                value,
                            });
                        }
                    }
                }
            }
        }
    }
    out.retain(|tier| !tier.is_empty());
    out
}

/// The values of `<prefix>0` .. `<prefix>63` that are set. Names are built without `format!`: this
/// runs in every process at start-up.
fn indexed_variables(env: &dyn Fn(&str) -> Option<String>, prefix: &str) -> Vec<(u32, String)> {
    let mut name = String::with_capacity(prefix.len() + 2);
    (0..MAX_ALIAS_INDEX)
        .filter_map(|i| {
            name.clear();
            name.push_str(prefix);
            if i >= 10 {
                name.push(char::from(b'0' + (i / 10) as u8));
            }
            name.push(char::from(b'0' + (i % 10) as u8));
            env(&name).map(|v| (i, v))
        })
        .collect()
}

/// `NAME="value"`: how a variable is named in messages.
pub(super) fn quoted(var: &str, value: &str) -> String {
    format!("{var}={value:?}")
}

/// What depends on several settings (the default ledger, the device-ledger directory), the errors
/// collected per device, and the node policy over all of it.
fn finish(b: Builder, env: &dyn Fn(&str) -> Option<String>, policy_file: &Path) -> Config {
    let mut cfg = b.cfg;
    cfg.tenant = b.tenant.unwrap_or(cfg.tenant);
    cfg.quota_file = b.file.path;
    let ledger_dir_set = b.ledger_dir.is_some();
    let ledger_dir = b
        .ledger_dir
        .unwrap_or_else(|| PathBuf::from(DEFAULT_LEDGER_DIR));
    let default_ledger = paths::first_candidate(
        &ledger_dir,
        cfg.ledger_group.as_deref(),
        crate::slotfile::sys::geteuid(),
    )
    .join(format!("{}.ledger", cfg.tenant));
    cfg.ledger_path = b.ledger.unwrap_or_else(|| default_ledger.clone());
    // A node-created tenant joins the node's device ledgers, whatever its environment says.
    cfg.device_dir = match policy::locate(env, policy_file) {
        Some((path, fixed)) => policy::device_dir_for(&path, fixed),
        None => b
            .device_dir
            .or_else(|| ledger_dir_set.then(|| ledger_dir.join("devices")))
            .unwrap_or(cfg.device_dir),
    };
    cfg.ledger_dir = (cfg.ledger_path == default_ledger).then_some(ledger_dir);
    // Collect the per-value errors too, so the caller can log every one of them once.
    for map in [&cfg.compute_share, &cfg.compute_limit] {
        collect_errors(map, &mut cfg.errors, &mut cfg.effects, effect::COMPUTE);
    }
    collect_errors(
        &cfg.memory,
        &mut cfg.errors,
        &mut cfg.effects,
        effect::MEMORY,
    );
    if let Setting::Invalid(e) = &cfg.priority {
        cfg.errors.push(e.clone());
        cfg.effects.entry(e.clone()).or_insert(effect::PRIORITY);
    }
    for msg in b.poison_all {
        cfg.memory.poison_with(&msg);
        cfg.compute_share.poison_with(&msg);
        cfg.compute_limit.poison_with(&msg);
    }
    super::policy_apply::apply(&mut cfg, env, policy_file);
    cfg.errors.dedup();
    cfg
}

fn collect_errors<T>(
    map: &PerDevice<T>,
    errors: &mut Vec<String>,
    effects: &mut BTreeMap<String, &'static str>,
    effect: &'static str,
) {
    let all = map.all.iter();
    let values = all.chain(map.by_index.values()).chain(map.by_uuid.values());
    let found = values.filter_map(|r| r.as_ref().err()).chain(&map.poison);
    for e in found {
        if !errors.contains(e) {
            errors.push(e.clone());
        }
        effects.entry(e.clone()).or_insert(effect);
    }
}
