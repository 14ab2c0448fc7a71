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

//!
//! This module is the one definition of the file (fields, syntax, the node's directory layout) for
//! everything that reads or writes it: the library (enforcement), the node crate (which writes it
//! atomically with [`Policy::to_toml`]) and the exporter and `gpuslice top` (labels). It parses with
//! the quota file's small reader, so the preloaded library carries no TOML or serde dependency.

use super::{canonical_uuid, file, Priority};
use std::path::{Path, PathBuf};

/// Where a container of a node-created tenant finds its directory (mounted read-only by CDI).
pub const POLICY_DIR: &str = "/run/gpuslice/tenant";
/// The policy inside [`POLICY_DIR`].
pub const POLICY_FILE: &str = "/run/gpuslice/tenant/policy.toml";
/// Where a container finds the node's device ledgers (mounted by CDI).
pub const CONTAINER_DEVICE_DIR: &str = "/run/gpuslice/devices";
/// The node's default state directory.
pub const DEFAULT_STATE_DIR: &str = "/run/gpuslice";
/// A policy is a dozen lines.
const MAX_POLICY_FILE: u64 = 64 * 1024;

/// Who created the tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Created {
    #[default]
    Cli,
    DevicePlugin,
}

impl Created {
    /// The value in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            Created::Cli => "cli",
            Created::DevicePlugin => "device-plugin",
        }
    }
}

/// The pod a device-plugin tenant belongs to, once PodResources names it (`[kubernetes]`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Kubernetes {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// `policy.toml`: a node-created tenant's limits, as written by the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub name: String,
    /// Bytes on each listed GPU.
    pub memory: u64,
    /// Percent, 1..=100.
    pub share: u8,
    /// Compute cap, percent; 0 = none.
    pub limit: u8,
    pub priority: Priority,
    /// Canonical UUIDs; empty = every GPU.
    pub gpus: Vec<String>,
    pub created: Created,
    pub kubernetes: Option<Kubernetes>,
}

impl Policy {
    /// The tenant's memory on the GPU `uuid`: `memory` on a listed GPU, 0 on any other.
    pub fn memory_on(&self, uuid: &str) -> u64 {
        let key = canonical_uuid(uuid).unwrap_or_else(|| uuid.to_string());
        if self.gpus.is_empty() || self.gpus.contains(&key) {
            self.memory
        } else {
            0
        }
    }

    /// Reads and checks the policy at `path`. Errors name the file (and line).
    pub fn read(path: &Path) -> Result<Policy, String> {
        let shown = path.display();
        let meta = std::fs::metadata(path).map_err(|e| format!("node policy {shown}: {e}"))?;
        if !meta.is_file() || meta.len() > MAX_POLICY_FILE {
            return Err(format!(
                "node policy {shown}: not a regular file of at most {MAX_POLICY_FILE} bytes"
            ));
        }
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("node policy {shown}: {e}"))?;
        Policy::parse(path, &text)
    }

    /// Parses a policy's text (`path` names it in errors): the quota file's syntax plus the
    /// one-line string array `gpus`. Unknown keys are errors naming `file:line`.
    pub fn parse(path: &Path, text: &str) -> Result<Policy, String> {
        parse(path, text)
    }

    /// The file's text, in the subset [`Policy::parse`] reads back to the same policy. Refuses a
    /// value that subset cannot carry (a string with a control character other than tab/newline).
    pub fn to_toml(&self) -> Result<String, String> {
        let mut out = format!(
            "name = {}\nmemory = {}\nshare = {}\nlimit = {}\npriority = \"{}\"\ngpus = [{}]\ncreated = \"{}\"\n",
            quoted(&self.name)?,
            self.memory,
            self.share,
            self.limit,
            match self.priority {
                Priority::High => "high",
                Priority::Normal => "normal",
            },
            self.gpus
                .iter()
                .map(|g| quoted(g))
                .collect::<Result<Vec<_>, _>>()?
                .join(", "),
            self.created.as_str(),
        );
        if let Some(k) = &self.kubernetes {
            out.push_str(&format!(
                "\n[kubernetes]\nnamespace = {}\npod = {}\ncontainer = {}\n",
                quoted(&k.namespace)?,
                quoted(&k.pod)?,
                quoted(&k.container)?
            ));
        }
        Ok(out)
    }
}

/// A basic string in the quota file's syntax.
fn quoted(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                return Err(format!("{s:?}: a control character cannot go in a policy"))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    Ok(out)
}

/// A policy read from its place, as the library applies it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePolicy {
    /// The policy file that was read.
    pub path: PathBuf,
    /// Directory of the device ledgers the tenant's processes join.
    pub device_dir: PathBuf,
    pub policy: Policy,
}

impl std::ops::Deref for NodePolicy {
    type Target = Policy;
    fn deref(&self) -> &Policy {
        &self.policy
    }
}

impl NodePolicy {
    /// The tenant's ledger: beside the policy.
    pub fn ledger_path(&self) -> PathBuf {
        self.path
            .parent()
            .unwrap_or(Path::new("/"))
            .join(format!("{}.ledger", self.name))
    }
}

/// Paths of the node layout under one state directory (docs/KUBERNETES.md, "State directory"):
///
/// ```text
/// <state>/tenants/<NAME>/policy.toml     root:root 0644, read-only to the tenant
/// <state>/tenants/<NAME>/<NAME>.ledger   the tenant's memory ledger
/// <state>/devices/<GPU-UUID>.dev         device ledgers (compute)
/// ```
#[derive(Clone, Debug)]
pub struct Layout {
    pub state: PathBuf,
}

impl Layout {
    pub fn new(state: impl Into<PathBuf>) -> Layout {
        Layout {
            state: state.into(),
        }
    }

    pub fn tenants_dir(&self) -> PathBuf {
        self.state.join("tenants")
    }

    pub fn tenant_dir(&self, name: &str) -> PathBuf {
        self.tenants_dir().join(name)
    }

    pub fn policy_path(&self, name: &str) -> PathBuf {
        self.tenant_dir(name).join("policy.toml")
    }

    pub fn ledger_path(&self, name: &str) -> PathBuf {
        self.tenant_dir(name).join(format!("{name}.ledger"))
    }

    pub fn devices_dir(&self) -> PathBuf {
        self.state.join("devices")
    }

    pub fn device_ledger(&self, uuid: &str) -> PathBuf {
        self.devices_dir().join(format!("{uuid}.dev"))
    }

    /// The GPU's measurement lock (`config::paths::measure_lock`), shared by its tenants.
    pub fn measure_lock(&self, uuid: &str) -> PathBuf {
        super::paths::measure_lock(&self.devices_dir(), uuid)
    }

    /// The state directory of a policy at `<state>/tenants/<NAME>/policy.toml`.
    pub fn of_policy(path: &Path) -> Layout {
        Layout::new(
            path.parent()
                .and_then(Path::parent)
                .and_then(Path::parent)
                .unwrap_or(Path::new("/")),
        )
    }

    /// Names of the tenants (directories holding a policy), sorted.
    pub fn tenant_names(&self) -> Result<Vec<String>, String> {
        let dir = self.tenants_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(format!("{}: {e}", dir.display())),
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| !n.starts_with('.'))
            .filter(|n| self.policy_path(n).exists())
            .collect();
        names.sort();
        Ok(names)
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
    Layout::of_policy(path).devices_dir()
}

/// Reads and checks the policy at `path` (`fixed`: the in-container file). Errors name the file.
pub fn read(path: &Path, fixed: bool) -> Result<NodePolicy, String> {
    Ok(NodePolicy {
        path: path.to_path_buf(),
        device_dir: device_dir_for(path, fixed),
        policy: Policy::read(path)?,
    })
}

fn parse(path: &Path, text: &str) -> Result<Policy, String> {
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
    let mut created = Created::Cli;
    let mut kubernetes: Option<Kubernetes> = None;
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
        let k8s = || kubernetes.clone().unwrap_or_default();
        match (e.table.as_str(), e.key.as_str()) {
            ("", "name") => {
                let v = e.value.as_text();
                super::readers::check_tenant(&v).map_err(|m| format!("{at}: name = {v:?}: {m}"))?;
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
            ("", "created") => {
                created = match e.value.as_text().as_str() {
                    "cli" => Created::Cli,
                    "device-plugin" => Created::DevicePlugin,
                    v => {
                        return Err(format!(
                            "{at}: created = {v:?}: expected cli or device-plugin"
                        ))
                    }
                }
            }
            ("kubernetes", "namespace") => {
                kubernetes = Some(Kubernetes {
                    namespace: e.value.as_text(),
                    ..k8s()
                })
            }
            ("kubernetes", "pod") => {
                kubernetes = Some(Kubernetes {
                    pod: e.value.as_text(),
                    ..k8s()
                })
            }
            ("kubernetes", "container") => {
                kubernetes = Some(Kubernetes {
                    container: e.value.as_text(),
                    ..k8s()
                })
            }
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
    Ok(Policy {
        name: name.ok_or_else(|| missing("name"))?,
        memory: memory.ok_or_else(|| missing("memory"))?,
        share: share.ok_or_else(|| missing("share"))?,
        limit,
        priority,
        gpus,
        created,
        kubernetes,
    })
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
#[path = "policy_tests.rs"]
mod tests;
