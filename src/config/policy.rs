//! The node's policy for a tenant it created (`gpuslice tenant create`, the device plugin): limits
//! the tenant cannot raise.
//!
//! The node writes `<state>/tenants/<NAME>/policy.toml` (root-owned, read-only to the tenant) beside
//! the tenant's ledger, and a container of the tenant gets that directory mounted read-only at
//! [`POLICY_DIR`] (CDI spec). When [`POLICY_FILE`] exists, it is the policy, whatever the
//! environment says; `GPUSLICE_POLICY` (a path) is read only when it does not exist (a tenant run
//! on the node itself, and tests), so no variable can replace or hide a policy that is present.
//!
//! With a policy, the tenant, its ledger (`<policy dir>/<NAME>.ledger`) and the device-ledger
//! directory come from the policy's location; `GPUSLICE_TENANT`, `GPUSLICE_LEDGER*`,
//! `GPUSLICE_DEVICE_DIR` are ignored (a warning says so). The memory limit a process obeys is
//! the least of the policy's, the ledger's and what its own environment or quota file asks: other
//! settings can only lower it. A policy that cannot be read or parsed refuses every allocation.

use super::{canonical_uuid, file, Config, PerDevice, Priority, Setting, DEFAULT_CONTEXT_RESERVE};
use std::path::{Path, PathBuf};

/// Where a container of a node-created tenant finds its directory (mounted read-only by CDI).
pub const POLICY_DIR: &str = "/run/gpuslice/tenant";
/// The policy inside [`POLICY_DIR`].
pub const POLICY_FILE: &str = "/run/gpuslice/tenant/policy.toml";
/// Where a container finds the node's device ledgers (mounted by CDI).
pub const CONTAINER_DEVICE_DIR: &str = "/run/gpuslice/devices";
/// A policy is a dozen lines.
const MAX_POLICY_FILE: u64 = 64 * 1024;

/// A node-created tenant's policy, as the library reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePolicy {
    /// The policy file that was read.
    pub path: PathBuf,
    pub name: String,
    /// Bytes on each listed GPU.
    pub memory: u64,
    pub share: u8,
    /// Compute cap, percent; 0 = none.
    pub limit: u8,
    pub priority: Priority,
    /// Canonical UUIDs; empty = every GPU.
    pub gpus: Vec<String>,
    /// Directory of the device ledgers the tenant's processes join.
    pub device_dir: PathBuf,
}

impl NodePolicy {
    /// The tenant's memory on the GPU `uuid`: `memory` on a listed GPU, 0 on any other.
    pub fn memory_on(&self, uuid: &str) -> u64 {
        let key = canonical_uuid(uuid).unwrap_or_else(|| uuid.to_string());
        if self.gpus.is_empty() || self.gpus.contains(&key) {
            self.memory
        } else {
            0
        }
    }

    /// The tenant's ledger: beside the policy.
    pub fn ledger_path(&self) -> PathBuf {
        self.path
            .parent()
            .unwrap_or(Path::new("/"))
            .join(format!("{}.ledger", self.name))
    }
}

/// Where the policy is, if there is one: `policy_file` when it exists (or cannot be checked), else
/// `GPUSLICE_POLICY`. The flag says whether it is the fixed in-container file.
pub fn locate(env: &dyn Fn(&str) -> Option<String>, policy_file: &Path) -> Option<(PathBuf, bool)> {
    match std::fs::symlink_metadata(policy_file) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => env("GPUSLICE_POLICY")
            .filter(|p| !p.trim().is_empty())
            .map(|p| (PathBuf::from(p), false)),
        _ => Some((policy_file.to_path_buf(), true)),
    }
}

/// The device-ledger directory for a policy at `path`: the container's fixed one, or the node
/// layout's `<state>/devices` for `<state>/tenants/<NAME>/policy.toml`.
pub fn device_dir_for(path: &Path, fixed: bool) -> PathBuf {
    if fixed {
        return PathBuf::from(CONTAINER_DEVICE_DIR);
    }
    path.parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .unwrap_or(Path::new("/"))
        .join("devices")
}

/// The device-ledger directory of this process's policy (real environment), if it has one.
pub fn device_dir() -> Option<PathBuf> {
    locate(&|k| std::env::var(k).ok(), Path::new(POLICY_FILE))
        .map(|(path, fixed)| device_dir_for(&path, fixed))
}

/// Reads and checks the policy at `path`. Errors name the file (and line).
pub fn read(path: &Path, fixed: bool) -> Result<NodePolicy, String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("node policy {shown}: {e}"))?;
    if !meta.is_file() || meta.len() > MAX_POLICY_FILE {
        return Err(format!(
            "node policy {shown}: not a regular file of at most {MAX_POLICY_FILE} bytes"
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("node policy {shown}: {e}"))?;
    parse(path, &text, fixed)
}

/// Parses a policy's text (the node writes it with a TOML library; this reads the subset it writes:
/// the quota file's syntax plus the one-line string array `gpus`).
pub fn parse(path: &Path, text: &str, fixed: bool) -> Result<NodePolicy, String> {
    let shown = path.display();
    let mut gpus = Vec::new();
    let mut gpus_line = None;
    // `gpus = [...]` is taken out (its line left blank, so line numbers stay right).
    let rest: Vec<String> = text
        .lines()
        .enumerate()
        .map(|(i, line)| {
            let t = line.trim_start();
            let is_gpus = t
                .strip_prefix("gpus")
                .is_some_and(|r| r.trim_start().starts_with('='));
            if is_gpus && gpus_line.is_none() {
                gpus_line = Some((i + 1, t.to_string()));
                String::new()
            } else {
                line.to_string()
            }
        })
        .collect();
    if let Some((line, t)) = &gpus_line {
        gpus = parse_string_array(t.split_once('=').map_or("", |(_, v)| v.trim()))
            .map_err(|e| format!("{shown}:{line}: gpus: {e}"))?;
        for g in &mut gpus {
            *g = canonical_uuid(g)
                .ok_or_else(|| format!("{shown}:{line}: gpus: {g:?} is not a GPU UUID"))?;
        }
    }
    let (entries, errors) = file::parse(path, &rest.join("\n"));
    if let Some(e) = errors.into_iter().next() {
        return Err(format!("node policy {e}"));
    }
    let mut name = None;
    let mut memory = None;
    let mut share = None;
    let mut limit = 0u8;
    let mut priority = Priority::Normal;
    for e in entries {
        let at = format!("{shown}:{}", e.line);
        let int = |max: u64| match &e.value {
            file::Value::Int(n) if *n <= max => Ok(*n),
            v => Err(format!(
                "{at}: {} = {:?}: expected an integer 0..={max}",
                e.key,
                v.as_text()
            )),
        };
        match (e.table.as_str(), e.key.as_str()) {
            ("", "name") => {
                let v = e.value.as_text();
                super::check_tenant(&v).map_err(|m| format!("{at}: name = {v:?}: {m}"))?;
                name = Some(v);
            }
            ("", "memory") => memory = Some(int(u64::MAX)?),
            ("", "share") => match int(100)? {
                0 => return Err(format!("{at}: share = 0: expected 1..=100")),
                n => share = Some(n as u8),
            },
            ("", "limit") => limit = int(100)? as u8,
            ("", "priority") => {
                priority = match e.value.as_text().as_str() {
                    "high" => Priority::High,
                    "normal" => Priority::Normal,
                    v => return Err(format!("{at}: priority = {v:?}: expected high or normal")),
                }
            }
            ("", "created") => {}
            ("kubernetes", "namespace" | "pod" | "container") => {}
            (table, key) => {
                let key = if table.is_empty() {
                    key.to_string()
                } else {
                    format!("[{table}] {key}")
                };
                return Err(format!("{at}: unknown key {key:?} in a node policy"));
            }
        }
    }
    let missing = |what: &str| format!("node policy {shown}: no {what}");
    Ok(NodePolicy {
        path: path.to_path_buf(),
        name: name.ok_or_else(|| missing("name"))?,
        memory: memory.ok_or_else(|| missing("memory"))?,
        share: share.ok_or_else(|| missing("share"))?,
        limit,
        priority,
        gpus,
        device_dir: device_dir_for(path, fixed),
    })
}

/// Makes the policy (if any) authoritative in `cfg`: tenant, ledger and device directory from it;
/// compute settings from it, lowered (never raised) by the process's own; the memory ceiling is
/// kept in `cfg.policy` ([`Config::memory_ceiling`]). A bad policy refuses everything.
pub(super) fn apply(cfg: &mut Config, env: &dyn Fn(&str) -> Option<String>, policy_file: &Path) {
    let Some((path, fixed)) = locate(env, policy_file) else {
        return;
    };
    let p = match read(&path, fixed) {
        Ok(p) => p,
        Err(e) => {
            cfg.errors.push(e.clone());
            cfg.memory.poison_with(&e);
            cfg.compute_share.poison_with(&e);
            cfg.compute_limit.poison_with(&e);
            return;
        }
    };
    let from = format!(
        "tenant {:?} is created by the node (policy {})",
        p.name,
        path.display()
    );
    let ignored: Vec<&str> = [
        "GPUSLICE_TENANT",
        "GPUSLICE_LEDGER",
        "GPUSLICE_LEDGER_DIR",
        "GPUSLICE_DEVICE_DIR",
        "GPUSLICE_LEDGER_GROUP",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    ]
    .into_iter()
    .filter(|k| env(k).is_some())
    .collect();
    if !ignored.is_empty() {
        cfg.warnings
            .push(format!("{} ignored: {from}", ignored.join(", ")));
    }
    cfg.tenant = p.name.clone();
    cfg.ledger_path = p.ledger_path();
    cfg.ledger_dir = None; // the node's ledger, not a default one to place per user
    cfg.ledger_group = None;

    let share = match cfg.compute_share.get_default() {
        Setting::Value(v) if v < p.share => {
            cfg.notes.push(format!(
                "compute share lowered to {v}% (the node's policy: {}%)",
                p.share
            ));
            v
        }
        Setting::Value(v) if v > p.share => {
            cfg.warnings.push(format!(
                "compute share {v}% ignored: {from} with share {}%",
                p.share
            ));
            p.share
        }
        _ => p.share,
    };
    let cap = match cfg.compute_limit.get_default() {
        Setting::Value(c) if p.limit == 0 || (c > 0 && c < p.limit) => c,
        Setting::Value(c) if c != p.limit => {
            cfg.warnings.push(format!(
                "compute cap {c}% ignored: {from} with cap {}%",
                p.limit
            ));
            p.limit
        }
        _ => p.limit,
    };
    let priority = match (&cfg.priority, p.priority) {
        (Setting::Value(Priority::High), Priority::Normal) => {
            cfg.warnings.push(format!(
                "priority high ignored: {from} with priority normal"
            ));
            Priority::Normal
        }
        (Setting::Value(Priority::Normal), _) => Priority::Normal,
        _ => p.priority,
    };
    let only = |v: u8| PerDevice {
        all: Some(Ok(v)),
        ..PerDevice::default()
    };
    cfg.compute_share = only(share);
    cfg.compute_limit = if cap == 0 {
        PerDevice::default()
    } else {
        only(cap)
    };
    cfg.priority = Setting::Value(priority);
    if cfg
        .context_reserve
        .is_some_and(|r| r < DEFAULT_CONTEXT_RESERVE)
    {
        cfg.warnings.push(format!(
            "GPUSLICE_CONTEXT_RESERVE below the default ignored: {from}"
        ));
        cfg.context_reserve = None;
    }
    if let Setting::Value(m) = cfg.memory.get_default() {
        if m > p.memory {
            cfg.warnings.push(format!(
                "memory limit {} ignored: {from} with {} per GPU",
                super::format_bytes(m),
                super::format_bytes(p.memory)
            ));
        }
    }
    cfg.policy = Some(p);
}

/// `["a", "b"]` on one line.
fn parse_string_array(s: &str) -> Result<Vec<String>, String> {
    let inner = s
        .strip_prefix('[')
        .and_then(|r| r.split_once(']'))
        .filter(|(_, tail)| tail.trim().is_empty() || tail.trim().starts_with('#'))
        .map(|(inner, _)| inner)
        .ok_or_else(|| format!("expected a one-line array of strings, found {s:?}"))?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            item.strip_prefix('"')
                .and_then(|r| r.strip_suffix('"'))
                .filter(|v| !v.contains(['"', '\\']))
                .map(str::to_string)
                .ok_or_else(|| format!("expected a \"string\", found {item:?}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: &str = "GPU-1b2c3d4e-0000-1111-2222-333344445555";

    #[test]
    fn reads_what_the_node_writes() {
        let text = format!(
            "name = \"t1\"\nmemory = 3221225472\nshare = 30\nlimit = 0\npriority = \"high\"\ngpus = [\"{U}\"]\ncreated = \"cli\"\n\n[kubernetes]\nnamespace = \"default\"\npod = \"p\"\ncontainer = \"c\"\n"
        );
        let p = parse(Path::new("/s/tenants/t1/policy.toml"), &text, false).unwrap();
        assert_eq!(p.name, "t1");
        assert_eq!(p.memory, 3 << 30);
        assert_eq!((p.share, p.limit, p.priority), (30, 0, Priority::High));
        assert_eq!(p.gpus, vec![U.to_string()]);
        assert_eq!(p.memory_on(U), 3 << 30);
        assert_eq!(p.memory_on("GPU-00000000-0000-0000-0000-000000000000"), 0);
        assert_eq!(p.ledger_path(), Path::new("/s/tenants/t1/t1.ledger"));
        assert_eq!(p.device_dir, Path::new("/s/devices"));
        let fixed = parse(Path::new(POLICY_FILE), &text, true).unwrap();
        assert_eq!(fixed.device_dir, Path::new(CONTAINER_DEVICE_DIR));
    }

    #[test]
    fn bad_policies_name_file_and_line() {
        let p = Path::new("/p.toml");
        let e = parse(p, "name = \"t\"\nmemory = 1\nshare = 0\n", false).unwrap_err();
        assert!(e.contains("/p.toml:3") && e.contains("share"), "{e}");
        let e = parse(p, "name = \"t\"\nmemory = 1\nshare = 5\nextra = 1\n", false).unwrap_err();
        assert!(e.contains("/p.toml:4") && e.contains("unknown key"), "{e}");
        let e = parse(
            p,
            "name = \"t\"\nmemory = 1\nshare = 5\ngpus = [x]\n",
            false,
        )
        .unwrap_err();
        assert!(e.contains("/p.toml:4"), "{e}");
        let e = parse(p, "name = \"t\"\nshare = 5\n", false).unwrap_err();
        assert!(e.contains("no memory"), "{e}");
    }

    #[test]
    fn the_fixed_file_wins_over_the_variable() {
        let dir = std::env::temp_dir().join(format!("gpuslice-policy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fixed = dir.join("policy.toml");
        let env = |k: &str| (k == "GPUSLICE_POLICY").then(|| "/elsewhere/policy.toml".to_string());
        assert_eq!(
            locate(&env, &fixed),
            Some((PathBuf::from("/elsewhere/policy.toml"), false))
        );
        std::fs::write(&fixed, "").unwrap();
        assert_eq!(locate(&env, &fixed), Some((fixed.clone(), true)));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
