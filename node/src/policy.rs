//! The node's state directory and a tenant's policy (docs/KUBERNETES.md, "State directory"):
//!
//! ```text
//! <state>/tenants/<NAME>/policy.toml     root:root 0644, read-only to the tenant
//! <state>/tenants/<NAME>/<NAME>.ledger   the tenant's memory ledger, root:<tenant gid> 0660
//! <state>/devices/<GPU-UUID>.dev         device ledgers (compute), root:<device gid> 0660
//! ```
//!
//! The preloaded library reads the same file with its own small reader
//! (`gpuslice::config::policy`); a test checks that it accepts what [`write`] writes.

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/run/gpuslice";

/// Compute priority class.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    High,
    #[default]
    Normal,
}

/// Who created the tenant.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Created {
    #[default]
    Cli,
    DevicePlugin,
}

/// The pod a device-plugin tenant belongs to, once PodResources names it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Kubernetes {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// `policy.toml`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    pub name: String,
    /// Bytes on each GPU listed.
    pub memory: u64,
    /// Percent, 1..=100.
    pub share: u8,
    /// Compute cap percent, 0 = none.
    #[serde(default)]
    pub limit: u8,
    #[serde(default)]
    pub priority: Priority,
    /// UUIDs; empty = every GPU of the node.
    #[serde(default)]
    pub gpus: Vec<String>,
    #[serde(default)]
    pub created: Created,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<Kubernetes>,
}

/// Paths of the node layout under one state directory.
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

/// Reads a policy; errors name the file and, for syntax, the line.
pub fn read(path: &Path) -> Result<Policy, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("{}: {}", path.display(), e.to_string().trim()))
}

/// Writes a policy atomically (temporary file + rename), root-readable by all (0644).
pub fn write(path: &Path, policy: &Policy) -> Result<(), String> {
    let text = toml::to_string(policy).map_err(|e| format!("{}: {e}", path.display()))?;
    let dir = path.parent().unwrap_or(Path::new("/"));
    let tmp = dir.join(format!(".policy.toml.{}.tmp", std::process::id()));
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("writing {}: {e}", path.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_reads_what_the_node_writes() {
        let dir = std::env::temp_dir().join(format!("gpuslice-node-policy-{}", std::process::id()));
        let layout = Layout::new(&dir);
        std::fs::create_dir_all(layout.tenant_dir("t1")).unwrap();
        let policy = Policy {
            name: "t1".into(),
            memory: 3 << 30,
            share: 30,
            limit: 50,
            priority: Priority::High,
            gpus: vec![
                "GPU-1b2c3d4e-0000-1111-2222-333344445555".into(),
                "GPU-1b2c3d4e-0000-1111-2222-333344445556".into(),
            ],
            created: Created::DevicePlugin,
            kubernetes: Some(Kubernetes {
                namespace: "default".into(),
                pod: "trainer-0".into(),
                container: "main".into(),
            }),
        };
        let path = layout.policy_path("t1");
        write(&path, &policy).unwrap();
        assert_eq!(read(&path).unwrap(), policy);
        let lib = gpuslice::config::policy::read(&path, false).unwrap();
        assert_eq!(lib.name, "t1");
        assert_eq!(lib.memory, 3 << 30);
        assert_eq!((lib.share, lib.limit), (30, 50));
        assert_eq!(lib.priority, gpuslice::config::Priority::High);
        assert_eq!(lib.gpus, policy.gpus);
        assert_eq!(lib.ledger_path(), layout.ledger_path("t1"));
        assert_eq!(lib.device_dir, layout.devices_dir());

        std::fs::write(&path, "name = \"t1\"\nmemory = 1\nshare = 5\nquota = 7\n").unwrap();
        let e = read(&path).unwrap_err();
        assert!(e.contains("policy.toml") && e.contains("line 4"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
