//! The loader: the quota file first (it is itself a source), then every row of [`table::SETTINGS`]
//! in order — the first tier of its sources that is set, handed to the row's reader — then the
//! defaults that depend on several settings (the default ledger), the collected errors and the
//! node policy.

pub use super::builder::DEFAULT_DEVICE_DIR;
use super::builder::{quoted, Builder, FileSettings, Found, Tier};
use super::names;
use super::table::{self, Source, Spec, DEVICES_TABLE};
use super::{
    effect, paths, policy, Config, PerDevice, Setting, DEFAULT_LEDGER_DIR, MAX_ALIAS_INDEX,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Reads the configuration from the real environment and `/etc/gpuslice/quota.toml`.
pub fn load() -> Config {
    // One pass over the environment: the aliases are probed under many names (`..._LIMIT_<i>`), and
    // each getenv would scan the whole environment again. A handful of variables at most: a linear
    // search beats hashing 130 probes. `gpuslice_*` in any case is kept too: a near miss to name.
    let relevant: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| {
            let k = k.into_string().ok()?;
            (names::is_gpuslice(&k)
                || k.starts_with("CUDA_")
                || k == "GPU_CORE_UTILIZATION_POLICY"
                || k == "LIBCUDA_LOG_LEVEL")
                .then(|| (k, v.to_string_lossy().into_owned()))
        })
        .collect();
    let mut cfg = load_listed(
        &relevant,
        Path::new(super::DEFAULT_QUOTA_FILE),
        Path::new(policy::POLICY_FILE),
    );
    cfg.place_default_ledger();
    cfg
}

/// [`load_with_policy`] from the list of variables `vars` (what [`load`] found in the environment),
/// naming each `GPUSLICE_*` variable of the list that gpuslice does not know (`mistyped.rs`).
pub fn load_listed(
    vars: &[(String, String)],
    default_quota_file: &Path,
    policy_file: &Path,
) -> Config {
    // Nothing is allocated when every name is known, as in every process started right.
    let unknown: Vec<(&str, &str)> = vars
        .iter()
        .filter(|(k, _)| !names::is_known(k) && names::is_gpuslice(k))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    load_probing(
        &|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()),
        // The 64 names of an indexed alias are probed only when a variable has their prefix.
        &|prefix| vars.iter().any(|(k, _)| k.starts_with(prefix)),
        &unknown,
        default_quota_file,
        policy_file,
    )
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
    load_probing(env, &|_| true, &[], default_quota_file, policy_file)
}

/// [`load_with_policy`], with `maybe_prefixed(prefix)` false when no variable starts with `prefix`,
/// and `unknown` the `GPUSLICE_*` variables (name, value) that gpuslice does not know.
fn load_probing(
    env: &dyn Fn(&str) -> Option<String>,
    maybe_prefixed: &dyn Fn(&str) -> bool,
    unknown: &[(&str, &str)],
    default_quota_file: &Path,
    policy_file: &Path,
) -> Config {
    let mut b = Builder::new();
    b.file = b.read_quota_file(env, default_quota_file);
    for spec in table::SETTINGS {
        if let Some(read) = spec.read() {
            let found = found(spec, env, maybe_prefixed, &b.file);
            apply(&mut b, env, &found, read);
        }
    }
    b.mistyped(env, unknown);
    finish(b, env, policy_file)
}

/// Hands the first tier of a setting's sources `found` set to `read`; a tier the reader declines (a HAMi cap that
/// `GPU_CORE_UTILIZATION_POLICY=disable` switches off, a file's ledger that belongs to another
/// tenant) gives way to the next. Variables of lower tiers that are set too are noted as ignored.
fn apply(
    b: &mut Builder,
    env: &dyn Fn(&str) -> Option<String>,
    found: &[Found],
    read: super::readers::Read,
) {
    let same_kind = |a: &Found, b: &Found| {
        std::mem::discriminant(&a.source) == std::mem::discriminant(&b.source)
    };
    let mut tiers = found.chunk_by(same_kind);
    let Some(taken) = tiers.find(|found| read(b, &Tier { found, env })) else {
        return;
    };
    let mut ignored: Vec<String> = Vec::new();
    for v in tiers.flatten().filter_map(|f| f.source.variable()) {
        let v = v.replace("_<i>", "_*");
        if !ignored.contains(&v) {
            ignored.push(v);
        }
    }
    if let (false, Some(winner)) = (ignored.is_empty(), taken[0].source.variable()) {
        b.note(format!(
            "{} is set: ignoring {}",
            winner.replace("_<i>", "_*"),
            ignored.join(", ")
        ));
    }
}

/// `spec`'s sources that are set, in precedence order (a tier is a run of one kind: gpuslice's,
/// HAMi's, MPS's, the file's). Nothing is allocated when none is set, as for most settings.
fn found(
    spec: &Spec,
    env: &dyn Fn(&str) -> Option<String>,
    maybe_prefixed: &dyn Fn(&str) -> bool,
    file: &FileSettings,
) -> Vec<Found> {
    let mut out = Vec::new();
    for &source in spec.sources {
        match source {
            Source::File(DEVICES_TABLE) => {
                if let Some(path) = file.path.as_ref().filter(|_| file.has_devices_table) {
                    out.push(Found {
                        source,
                        index: None,
                        value: String::new(),
                        label: format!("{} [devices]", path.display()),
                    });
                }
            }
            Source::File(key) => {
                if let Some((value, label)) = file.top.get(key) {
                    out.push(Found {
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
                    Some(prefix) if !maybe_prefixed(prefix) => {}
                    Some(prefix) => {
                        for (i, value) in indexed_variables(env, prefix) {
                            let label = format!("{prefix}{i}={value:?}");
                            out.push(Found {
                                source,
                                index: Some(i),
                                value,
                                label,
                            });
                        }
                    }
                    None => {
                        if let Some(value) = env(var) {
                            out.push(Found {
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
    let policy = policy::locate(env, policy_file);
    cfg.device_dir = match &policy {
        Some((path, fixed)) => policy::device_dir_for(path, *fixed),
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
    super::policy_apply::apply(&mut cfg, env, policy);
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
