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
//! # Variables
//!
//! | variable | value |
//! |---|---|
//! | `GPUSLICE_MEMORY_LIMIT` | a size (`4GiB`, `4096MiB`, `4G`, `512M`, `1.5GiB`, `1TiB`, `64K`, `4294967296`), for every device; or a list `0=4GiB,1=2GiB` keyed by the device index in the process's visible order, or `GPU-<uuid>=4GiB` (a UUID key beats an index key); a bare value in the list applies to the devices not listed |
//! | `GPUSLICE_QUOTA_FILE` | path of the quota file |
//! | `GPUSLICE_TENANT` | tenant name (`A-Za-z0-9._-`, at most 64), default `default` |
//! | `GPUSLICE_LEDGER` | absolute path of the shared ledger, default `/dev/shm/gpuslice/<tenant>.ledger` |
//! | `GPUSLICE_LEDGER_DIR` | absolute directory of the default ledgers (default `/dev/shm/gpuslice`); the device ledgers default to its `devices/` |
//! | `GPUSLICE_DEVICE_DIR` | absolute directory of the per-GPU device ledgers (compute shares), default `<ledger dir>/devices` |
//! | `GPUSLICE_LEDGER_GROUP` | group (name or gid) allowed to share the ledger (mode 0660) |
//! | `GPUSLICE_LOG` | `off`, `error`, `warn` (default), `info`, `debug`, `trace` |
//! | `GPUSLICE_CONTEXT_RESERVE` | bytes charged per CUDA context instead of what the driver is measured to spend (`0`: contexts are not charged); unset: measured, 512 MiB when nothing can be measured |
//! | `GPUSLICE_COMPUTE_SHARE`, `GPUSLICE_COMPUTE_LIMIT` | percent 1..=100, per-device lists like the memory limit |
//! | `GPUSLICE_PRIORITY` | `high` or `normal` |
//!
//! # Quota file
//!
//! ```toml
//! # gpuslice quota
//! tenant = "team-a"                            # optional; names the ledger
//! ledger = "/dev/shm/gpuslice/team-a.ledger"   # optional
//! ledger_group = "gpu"                         # optional
//! memory_limit = "4GiB"                        # all devices (same syntax as the variable)
//! compute_share = 50                           # optional, percent (or "0=50,1=25")
//! compute_limit = "80"                         # optional, percent
//! priority = "normal"                          # optional, high | normal
//! [devices]                                    # optional per-device memory limits
//! "0" = "2GiB"
//! "GPU-1b2c3d4e-0000-1111-2222-333344445555" = "8GiB"
//! ```
//!
//! # Failing closed
//!
//! There is no setting that turns enforcement off. A bad value never means "unlimited": the
//! device(s) it concerns get [`Limit::Invalid`] (the shim denies every allocation there) and the
//! message lands in [`Config::errors`]. A value that cannot be attributed to a device (a syntax
//! error in the quota file, a bad key, a bad ledger path or tenant, a bad context reserve) makes
//! every device's memory limit invalid.

mod file;
pub mod policy;
pub mod size;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Setting<T> {
    Value(T),
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

/// `GPUSLICE_LOG` levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Off,
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

/// A setting that may differ per device. Lookup order: poison, UUID key, index key, `all`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PerDevice<T> {
    /// Applies to every device not listed.
    pub all: Option<Result<T, String>>,
    pub by_index: BTreeMap<u32, Result<T, String>>,
    pub by_uuid: BTreeMap<String, Result<T, String>>,
    /// An error that concerns every device (overrides everything else).
    pub poison: Option<String>,
}

impl<T> Default for PerDevice<T> {
    fn default() -> Self {
        PerDevice {
            all: None,
            by_index: BTreeMap::new(),
            by_uuid: BTreeMap::new(),
            poison: None,
        }
    }
}

impl<T: Clone> PerDevice<T> {
    /// Whether anything (even an invalid value) is set.
    pub fn is_set(&self) -> bool {
        self.all.is_some()
            || !self.by_index.is_empty()
            || !self.by_uuid.is_empty()
            || self.poison.is_some()
    }

    /// The setting for a device, `uuid` as reported by the driver (`GPU-...`).
    pub fn get(&self, index: u32, uuid: &str) -> Setting<T> {
        if let Some(p) = &self.poison {
            return Setting::Invalid(p.clone());
        }
        let found = self
            .by_uuid
            .get(&canonical_uuid(uuid).unwrap_or_else(|| uuid.to_string()))
            .or_else(|| self.by_index.get(&index))
            .or(self.all.as_ref());
        Self::to_setting(found)
    }

    /// The setting for a device listed neither by index nor by UUID.
    pub fn get_default(&self) -> Setting<T> {
        if let Some(p) = &self.poison {
            return Setting::Invalid(p.clone());
        }
        Self::to_setting(self.all.as_ref())
    }

    fn to_setting(found: Option<&Result<T, String>>) -> Setting<T> {
        match found {
            Some(Ok(v)) => Setting::Value(v.clone()),
            Some(Err(e)) => Setting::Invalid(e.clone()),
            None => Setting::Unset,
        }
    }

    fn poison_with(&mut self, msg: &str) {
        if self.poison.is_none() {
            self.poison = Some(msg.to_string());
        }
    }
}

/// Canonical form of a GPU (or MIG) UUID: `GPU-` + lower-case 8-4-4-4-12 hex. `None` if `s` is not one.
pub fn canonical_uuid(s: &str) -> Option<String> {
    let s = s.trim();
    let prefix = s.get(..4)?;
    let prefix = match prefix.to_ascii_uppercase().as_str() {
        "GPU-" => "GPU-",
        "MIG-" => "MIG-",
        _ => return None,
    };
    let hex: String = s[4..].chars().filter(|&c| c != '-').collect();
    if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let h = hex.to_ascii_lowercase();
    Some(format!(
        "{prefix}{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    ))
}

/// Parses a UUID string into its 16 bytes (`None` if it is not a `GPU-`/`MIG-` UUID).
pub fn uuid_bytes(s: &str) -> Option<[u8; 16]> {
    let c = canonical_uuid(s)?;
    let hex: Vec<u8> = c[4..].bytes().filter(|&b| b != b'-').collect();
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

/// The parsed configuration of this process.
#[derive(Clone, Debug)]
pub struct Config {
    /// Tenant name (names the default ledger).
    pub tenant: String,
    /// Path of the ledger shared by the tenant's processes.
    pub ledger_path: PathBuf,
    /// Group allowed to share the ledger (`GPUSLICE_LEDGER_GROUP` / file `ledger_group`).
    pub ledger_group: Option<String>,
    /// Quota file that was read, if any.
    pub quota_file: Option<PathBuf>,
    /// Per-device memory limits in bytes.
    pub memory: PerDevice<u64>,
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
    /// Info-level lines (how aliases were read) for the caller to log.
    pub notes: Vec<String>,
    /// Warn-level lines: settings ignored because a node policy forbids them (`policy.rs`).
    pub warnings: Vec<String>,
    /// Every configuration error, each naming its variable or `file:line`, the value and what was expected.
    pub errors: Vec<String>,
    /// The node's policy for this tenant (`policy.rs`): authoritative, only ever lowered.
    pub policy: Option<policy::NodePolicy>,
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

/// The values of `<prefix>0` .. `<prefix>63` that are set. Names are built without `format!`: this
/// runs in every process at start-up.
fn indexed_aliases(env: &dyn Fn(&str) -> Option<String>, prefix: &str) -> Vec<(u32, String)> {
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

fn to_limit(s: Setting<u64>) -> Limit {
    match s {
        Setting::Value(b) => Limit::Bytes(b),
        Setting::Unset => Limit::Unlimited,
        Setting::Invalid(e) => Limit::Invalid(e),
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
    load_from(
        &|name| {
            relevant
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        },
        Path::new(DEFAULT_QUOTA_FILE),
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
    let mut b = Builder {
        notes: Vec::new(),
        errors: Vec::new(),
        poison_all: Vec::new(),
    };
    let file = b.read_quota_file(env, default_quota_file);
    let fv = |key: &str| file.top.get(key).cloned();

    // Memory: GPUSLICE_MEMORY_LIMIT > HAMi > MPS > file.
    let memory = b
        .memory_from_env(env)
        .unwrap_or_else(|| file.memory.clone());

    let compute_share = match env("GPUSLICE_COMPUTE_SHARE") {
        Some(v) => per_device(&quoted("GPUSLICE_COMPUTE_SHARE", &v), &v, parse_percent),
        None => match fv("compute_share") {
            Some((v, src)) => per_device(&src, &v, parse_percent),
            None => PerDevice::default(),
        },
    };
    let compute_limit = b.compute_limit(env, fv("compute_limit"));

    let priority = match env("GPUSLICE_PRIORITY")
        .map(|v| (quoted("GPUSLICE_PRIORITY", &v), v))
        .or_else(|| b.hami_priority(env))
        .or_else(|| fv("priority").map(|(v, src)| (src, v)))
    {
        None => Setting::Unset,
        Some((src, v)) => match v.trim() {
            "high" => Setting::Value(Priority::High),
            "normal" => Setting::Value(Priority::Normal),
            _ => Setting::Invalid(format!("{src}: unknown priority (expected high or normal)")),
        },
    };

    let log_level = match env("GPUSLICE_LOG").or_else(|| b.hami_log_level(env)) {
        None => LogLevel::Warn,
        Some(v) => match v.trim().to_ascii_lowercase().as_str() {
            "" | "warn" => LogLevel::Warn,
            "off" => LogLevel::Off,
            "error" => LogLevel::Error,
            "info" => LogLevel::Info,
            "debug" => LogLevel::Debug,
            "trace" => LogLevel::Trace,
            _ => {
                b.errors.push(format!(
                    "{}: unknown log level (expected off, error, warn, info, debug, trace)",
                    quoted("GPUSLICE_LOG", &v)
                ));
                LogLevel::Warn
            }
        },
    };

    let context_reserve = match env("GPUSLICE_CONTEXT_RESERVE") {
        None => None,
        Some(v) => match parse_size(&v, Units::Gpuslice) {
            Ok(n) => Some(n),
            Err(e) => {
                b.fail_all(format!("{}: {e}", quoted("GPUSLICE_CONTEXT_RESERVE", &v)));
                None
            }
        },
    };

    let tenant = match env("GPUSLICE_TENANT")
        .map(|v| (quoted("GPUSLICE_TENANT", &v), v))
        .or_else(|| fv("tenant").map(|(v, src)| (src, v)))
    {
        None => DEFAULT_TENANT.to_string(),
        Some((src, v)) => match check_tenant(&v) {
            Ok(()) => v,
            Err(e) => {
                b.fail_all(format!("{src}: {e}"));
                DEFAULT_TENANT.to_string()
            }
        },
    };

    let ledger_dir = match env("GPUSLICE_LEDGER_DIR") {
        None => PathBuf::from(DEFAULT_LEDGER_DIR),
        Some(d) if d.starts_with('/') => PathBuf::from(d),
        Some(d) => {
            b.fail_all(format!(
                "{}: not an absolute directory (expected e.g. /dev/shm/gpuslice)",
                quoted("GPUSLICE_LEDGER_DIR", &d)
            ));
            PathBuf::from(DEFAULT_LEDGER_DIR)
        }
    };
    let default_ledger = ledger_dir.join(format!("{tenant}.ledger"));
    // The file's `ledger` belongs to the file's tenant: a tenant named in the environment uses its
    // own default ledger unless GPUSLICE_LEDGER names one.
    let tenant_from_env = env("GPUSLICE_TENANT").is_some();
    let ledger_path = match env("GPUSLICE_LEDGER")
        .map(|v| (quoted("GPUSLICE_LEDGER", &v), v))
        .or_else(|| b.hami_ledger(env))
        .or_else(|| {
            fv("ledger")
                .filter(|_| !tenant_from_env)
                .map(|(v, src)| (src, v))
        }) {
        None => default_ledger,
        Some((src, v)) => {
            let p = PathBuf::from(&v);
            if v.is_empty() || !p.is_absolute() || v.ends_with('/') {
                b.fail_all(format!(
                    "{src}: not an absolute file path (expected e.g. /dev/shm/gpuslice/team-a.ledger)"
                ));
                default_ledger
            } else {
                p
            }
        }
    };

    let ledger_group = env("GPUSLICE_LEDGER_GROUP")
        .or_else(|| fv("ledger_group").map(|(v, _)| v))
        .filter(|g| !g.trim().is_empty());

    let mut cfg = Config {
        tenant,
        ledger_path,
        ledger_group,
        quota_file: file.path,
        memory,
        log_level,
        context_reserve,
        compute_share,
        compute_limit,
        priority,
        notes: b.notes,
        warnings: Vec::new(),
        errors: b.errors,
        policy: None,
    };
    // Collect the per-value errors too, so the caller can log every one of them once.
    for map in [&cfg.compute_share, &cfg.compute_limit] {
        collect_errors(map, &mut cfg.errors);
    }
    collect_errors(&cfg.memory, &mut cfg.errors);
    if let Setting::Invalid(e) = &cfg.priority {
        cfg.errors.push(e.clone());
    }
    for msg in b.poison_all {
        cfg.memory.poison_with(&msg);
        cfg.compute_share.poison_with(&msg);
        cfg.compute_limit.poison_with(&msg);
    }
    policy::apply(&mut cfg, env, policy_file);
    cfg.errors.dedup();
    cfg
}

fn collect_errors<T>(map: &PerDevice<T>, errors: &mut Vec<String>) {
    let all = map.all.iter();
    for r in all.chain(map.by_index.values()).chain(map.by_uuid.values()) {
        if let Err(e) = r {
            if !errors.contains(e) {
                errors.push(e.clone());
            }
        }
    }
    if let Some(p) = &map.poison {
        if !errors.contains(p) {
            errors.push(p.clone());
        }
    }
}

fn quoted(var: &str, value: &str) -> String {
    format!("{var}={value:?}")
}

fn check_tenant(t: &str) -> Result<(), String> {
    let ok = !t.is_empty()
        && t.len() <= 64
        && !t.starts_with('.')
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err("bad tenant name (expected 1 to 64 of A-Z a-z 0-9 . _ -, not starting with .)".into())
    }
}

/// Parses `4GiB`, `0=4GiB,1=2GiB`, `GPU-<uuid>=4GiB,2GiB`. `src` names the origin in messages.
fn per_device<T: Clone>(
    src: &str,
    text: &str,
    parse: impl Fn(&str) -> Result<T, String>,
) -> PerDevice<T> {
    let mut out = PerDevice::default();
    if text.contains(',') && text.split(',').all(|item| item.trim().is_empty()) {
        // `,` or `,,`: a list of nothing must not read as "no limit".
        out.poison_with(&format!(
            "{src}: no value in the list (expected a size such as 4GiB or a list such as 0=4GiB,1=2GiB)"
        ));
        return out;
    }
    for item in text.split(',').map(str::trim) {
        if item.is_empty() && text.contains(',') {
            continue; // tolerate `0=1G,` and `0=1G,,1=2G`
        }
        match item.split_once('=') {
            None => {
                if out.all.is_some() {
                    out.poison_with(&format!("{src}: more than one value for all devices"));
                }
                out.all = Some(parse(item).map_err(|e| format!("{src}: {e}")));
            }
            Some((key, value)) => {
                let key = key.trim();
                let parsed = |what: &str| parse(value).map_err(|e| format!("{src}: {what}: {e}"));
                if !key.is_empty() && key.chars().all(|c| c.is_ascii_digit()) {
                    let Ok(i) = key.parse::<u32>() else {
                        out.poison_with(&format!("{src}: device index {key} out of range"));
                        continue;
                    };
                    let v = parsed(&format!("device {i}"));
                    if out.by_index.insert(i, v).is_some() {
                        out.poison_with(&format!("{src}: device {i} listed twice"));
                    }
                } else if let Some(u) = canonical_uuid(key) {
                    let v = parsed(&format!("device {u}"));
                    if out.by_uuid.insert(u.clone(), v).is_some() {
                        out.poison_with(&format!("{src}: device {u} listed twice"));
                    }
                } else {
                    out.poison_with(&format!(
                        "{src}: bad device key \"{key}\" (expected an index such as 0 or a UUID such as GPU-1b2c3d4e-0000-1111-2222-333344445555)"
                    ));
                }
            }
        }
    }
    out
}

#[derive(Default)]
struct FileSettings {
    path: Option<PathBuf>,
    /// Top-level keys: value text and its `file:line` source label.
    top: BTreeMap<String, (String, String)>,
    memory: PerDevice<u64>,
}

struct Builder {
    notes: Vec<String>,
    errors: Vec<String>,
    /// Errors that concern every device.
    poison_all: Vec<String>,
}

impl Builder {
    fn fail_all(&mut self, msg: String) {
        self.errors.push(msg.clone());
        self.poison_all.push(msg);
    }

    fn read_quota_file(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
        default: &Path,
    ) -> FileSettings {
        let (path, explicit) = match env("GPUSLICE_QUOTA_FILE") {
            Some(p) if p.trim().is_empty() => {
                self.fail_all(format!(
                    "{}: empty path (expected the path of a quota file)",
                    quoted("GPUSLICE_QUOTA_FILE", &p)
                ));
                return FileSettings::default();
            }
            Some(p) => (PathBuf::from(p), true),
            None => (default.to_path_buf(), false),
        };
        let meta = match std::fs::metadata(&path) {
            Err(e) if !explicit && e.kind() == std::io::ErrorKind::NotFound => {
                return FileSettings::default()
            }
            Err(e) => {
                self.fail_all(format!("quota file {}: {e}", path.display()));
                return FileSettings::default();
            }
            Ok(m) => m,
        };
        if !meta.is_file() || meta.len() > MAX_QUOTA_FILE {
            self.fail_all(format!(
                "quota file {}: not a regular file of at most {MAX_QUOTA_FILE} bytes",
                path.display()
            ));
            return FileSettings::default();
        }
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                self.fail_all(format!("quota file {}: {e}", path.display()));
                return FileSettings::default();
            }
        };
        let (entries, syntax) = file::parse(&path, &text);
        for e in syntax {
            self.fail_all(e);
        }
        let mut out = FileSettings {
            path: Some(path.clone()),
            ..FileSettings::default()
        };
        for e in entries {
            let value = e.value.as_text();
            let src = format!("{}:{}: {}={value:?}", path.display(), e.line, e.key);
            match (e.table.as_str(), e.key.as_str()) {
                (
                    "",
                    "tenant" | "ledger" | "ledger_group" | "memory_limit" | "compute_share"
                    | "compute_limit" | "priority",
                ) => {
                    out.top.insert(e.key.clone(), (value, src));
                }
                ("devices", key) => {
                    let item = format!("{key}={value}");
                    let one = per_device(&src, &item, |v| parse_size(v, Units::Gpuslice));
                    if let Some(p) = one.poison {
                        self.fail_all(p);
                    }
                    out.memory.by_index.extend(one.by_index);
                    out.memory.by_uuid.extend(one.by_uuid);
                }
                ("", key) => self.fail_all(format!(
                    "{}:{}: unknown key \"{key}\" (expected tenant, ledger, ledger_group, memory_limit, compute_share, compute_limit, priority or a [devices] table)",
                    path.display(),
                    e.line
                )),
                (table, _) => self.fail_all(format!(
                    "{}:{}: unknown table [{table}] (expected [devices])",
                    path.display(),
                    e.line
                )),
            }
        }
        if let Some((v, src)) = out.top.get("memory_limit") {
            let all = per_device(src, v, |v| parse_size(v, Units::Gpuslice));
            out.memory.all = all.all;
            out.memory.poison = all.poison;
            // `memory_limit = "0=2GiB"` also works; the [devices] table wins over it per device.
            for (k, v) in all.by_index {
                out.memory.by_index.entry(k).or_insert(v);
            }
            for (k, v) in all.by_uuid {
                out.memory.by_uuid.entry(k).or_insert(v);
            }
        }
        out
    }

    /// Memory limit from `GPUSLICE_MEMORY_LIMIT` or its aliases; `None` if the environment sets none.
    fn memory_from_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Option<PerDevice<u64>> {
        let hami_all = env("CUDA_DEVICE_MEMORY_LIMIT");
        let hami_each = indexed_aliases(env, "CUDA_DEVICE_MEMORY_LIMIT_");
        let mps = env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
        let hami_set = hami_all.is_some() || !hami_each.is_empty();

        if let Some(v) = env("GPUSLICE_MEMORY_LIMIT") {
            if hami_set || mps.is_some() {
                self.notes.push(
                    "GPUSLICE_MEMORY_LIMIT is set: ignoring CUDA_DEVICE_MEMORY_LIMIT* and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(),
                );
            }
            let src = quoted("GPUSLICE_MEMORY_LIMIT", &v);
            return Some(per_device(&src, &v, |s| parse_size(s, Units::Gpuslice)));
        }
        if hami_set {
            if mps.is_some() {
                self.notes.push(
                    "CUDA_DEVICE_MEMORY_LIMIT is set: ignoring CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
                        .into(),
                );
            }
            let mut out = PerDevice::default();
            if let Some(v) = hami_all {
                let src = quoted("CUDA_DEVICE_MEMORY_LIMIT", &v);
                out = per_device(&src, &v, |s| parse_size(s, Units::Hami));
                self.notes.push(format!(
                    "{src} read as the memory limit {} (HAMi alias of GPUSLICE_MEMORY_LIMIT; lower-case k/m/g mean KiB/MiB/GiB)",
                    describe(&out)
                ));
            }
            for (i, v) in hami_each {
                let src = quoted(&format!("CUDA_DEVICE_MEMORY_LIMIT_{i}"), &v);
                let r = parse_size(&v, Units::Hami).map_err(|e| format!("{src}: {e}"));
                if let Ok(n) = &r {
                    self.notes.push(format!(
                        "{src} read as the memory limit {} for device {i} (HAMi alias; lower-case k/m/g mean KiB/MiB/GiB)",
                        format_bytes(*n)
                    ));
                }
                out.by_index.insert(i, r);
            }
            return Some(out);
        }
        if let Some(v) = mps {
            let src = quoted("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", &v);
            let out = per_device(&src, &v, |s| parse_size(s, Units::Mps));
            self.notes.push(format!(
                "{src} read as the memory limit {} (MPS alias of GPUSLICE_MEMORY_LIMIT; MPS's MB/GB mean MiB/GiB)",
                describe(&out)
            ));
            return Some(out);
        }
        None
    }

    fn compute_limit(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
        file: Option<(String, String)>,
    ) -> PerDevice<u8> {
        let hami_all = env("CUDA_DEVICE_SM_LIMIT");
        let hami_each = indexed_aliases(env, "CUDA_DEVICE_SM_LIMIT_");
        let mps = env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
        let alias_set = hami_all.is_some() || !hami_each.is_empty() || mps.is_some();
        let hami_set = hami_all.is_some() || !hami_each.is_empty();
        let (hami_all, hami_each) = if hami_set && !self.hami_core_policy_applies(env) {
            (None, Vec::new())
        } else {
            (hami_all, hami_each)
        };
        if let Some(v) = env("GPUSLICE_COMPUTE_LIMIT") {
            if alias_set {
                self.notes.push("GPUSLICE_COMPUTE_LIMIT is set: ignoring CUDA_DEVICE_SM_LIMIT* and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into());
            }
            let src = quoted("GPUSLICE_COMPUTE_LIMIT", &v);
            return per_device(&src, &v, parse_percent);
        }
        // HAMi treats 0 (and 100) as "no limit".
        let hami = |me: &mut Self, name: &str, v: &str, what: &str| -> Option<Result<u8, String>> {
            let src = quoted(name, v);
            if v.trim() == "0" {
                me.notes.push(format!(
                    "{src} read as no compute cap for {what} (HAMi alias; 0 means unlimited)"
                ));
                return None;
            }
            let r = parse_percent(v).map_err(|e| format!("{src}: {e}"));
            if let Ok(p) = &r {
                me.notes.push(format!(
                    "{src} read as a compute cap of {p}% for {what} (HAMi alias of GPUSLICE_COMPUTE_LIMIT)"
                ));
            }
            Some(r)
        };
        if hami_all.is_some() || !hami_each.is_empty() {
            let mut out = PerDevice::default();
            if let Some(v) = hami_all {
                out.all = hami(self, "CUDA_DEVICE_SM_LIMIT", &v, "every device");
            }
            for (i, v) in hami_each {
                let name = format!("CUDA_DEVICE_SM_LIMIT_{i}");
                if let Some(r) = hami(self, &name, &v, &format!("device {i}")) {
                    out.by_index.insert(i, r);
                }
            }
            return out;
        }
        if let Some(v) = mps {
            let src = quoted("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", &v);
            let r = parse_percent(&v).map_err(|e| format!("{src}: {e}"));
            if let Ok(p) = &r {
                self.notes.push(format!(
                    "{src} read as a compute cap of {p}% for every device (MPS alias of GPUSLICE_COMPUTE_LIMIT)"
                ));
            }
            return PerDevice {
                all: Some(r),
                ..PerDevice::default()
            };
        }
        match file {
            Some((v, src)) => per_device(&src, &v, parse_percent),
            None => PerDevice::default(),
        }
    }
}

/// HAMi's other variables, each read with an info note (`GPUSLICE_*` wins over every one of them).
impl Builder {
    /// `CUDA_TASK_PRIORITY`: HAMi's 0 is high priority, 1 (its default) normal.
    fn hami_priority(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Option<(String, String)> {
        let v = env("CUDA_TASK_PRIORITY")?;
        let src = quoted("CUDA_TASK_PRIORITY", &v);
        let ours = match v.trim() {
            "0" => "high",
            "1" => "normal",
            _ => "(invalid)",
        };
        if ours != "(invalid)" {
            self.notes.push(format!(
                "{src} read as priority {ours} (HAMi alias of GPUSLICE_PRIORITY; 0 is high, 1 normal)"
            ));
        }
        // An invalid value reaches the priority parser, which names it.
        Some((format!("{src} (HAMi: 0 or 1)"), ours.to_string()))
    }

    /// `LIBCUDA_LOG_LEVEL`: HAMi's 0 errors only, 1 and 2 warnings, 3 info, 4 debug.
    fn hami_log_level(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
        let v = env("LIBCUDA_LOG_LEVEL")?;
        let ours = match v.trim() {
            "0" => "error",
            "1" | "2" => "warn",
            "3" => "info",
            "4" => "debug",
            _ => {
                self.errors.push(format!(
                    "{}: unknown HAMi log level (expected 0 to 4)",
                    quoted("LIBCUDA_LOG_LEVEL", &v)
                ));
                return None;
            }
        };
        self.notes.push(format!(
            "{} read as log level {ours} (HAMi alias of GPUSLICE_LOG)",
            quoted("LIBCUDA_LOG_LEVEL", &v)
        ));
        Some(ours.to_string())
    }

    /// `CUDA_DEVICE_MEMORY_SHARED_CACHE`: where HAMi keeps its shared region; our ledger goes there.
    fn hami_ledger(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Option<(String, String)> {
        let v = env("CUDA_DEVICE_MEMORY_SHARED_CACHE")?;
        let src = quoted("CUDA_DEVICE_MEMORY_SHARED_CACHE", &v);
        self.notes.push(format!(
            "{src} read as the ledger path (HAMi alias of GPUSLICE_LEDGER)"
        ));
        Some((src, v))
    }

    /// `GPU_CORE_UTILIZATION_POLICY`: `disable` ignores HAMi's `CUDA_DEVICE_SM_LIMIT*`; `default` and
    /// `force` keep it (a gpuslice cap is always enforced, which is HAMi's `force`).
    fn hami_core_policy_applies(&mut self, env: &dyn Fn(&str) -> Option<String>) -> bool {
        let Some(v) = env("GPU_CORE_UTILIZATION_POLICY") else {
            return true;
        };
        let src = quoted("GPU_CORE_UTILIZATION_POLICY", &v);
        match v.trim().to_ascii_lowercase().as_str() {
            "disable" => {
                self.notes.push(format!(
                    "{src}: CUDA_DEVICE_SM_LIMIT* ignored (HAMi's switch; GPUSLICE_COMPUTE_LIMIT still applies)"
                ));
                false
            }
            "force" | "default" | "" => {
                self.notes.push(format!(
                    "{src} read as: CUDA_DEVICE_SM_LIMIT* is a compute cap enforced whenever the tenant runs (HAMi's force)"
                ));
                true
            }
            _ => {
                self.notes.push(format!(
                    "{src}: unknown value read as default (expected default, force or disable)"
                ));
                true
            }
        }
    }
}

/// Short description of a memory setting for notes: `4 GiB for every device`, `1 GiB for device 0, ...`.
fn describe(p: &PerDevice<u64>) -> String {
    let show = |r: &Result<u64, String>| match r {
        Ok(n) => format_bytes(*n),
        Err(_) => "(invalid)".into(),
    };
    let mut parts = Vec::new();
    if let Some(a) = &p.all {
        parts.push(format!("{} for every device", show(a)));
    }
    for (i, r) in &p.by_index {
        parts.push(format!("{} for device {i}", show(r)));
    }
    for (u, r) in &p.by_uuid {
        parts.push(format!("{} for {u}", show(r)));
    }
    if p.poison.is_some() {
        parts.push("(invalid)".into());
    }
    parts.join(", ")
}

#[cfg(test)]
mod node_tests;
#[cfg(test)]
mod tests;
