//! The part of a node tenant's `policy.toml` (docs/DEPLOYMENT.md, `<state>/tenants/<NAME>/policy.toml`)
//! that the exporter and `gpuslice top` use: the tenant's name and, for tenants created by the
//! device plugin, the pod that owns it. Read-only and tolerant: the node validates the file it
//! writes; here a file that cannot be read or parsed only loses that tenant its Kubernetes labels.

use serde::Deserialize;
use std::path::Path;

/// The Kubernetes owner of a tenant (the `[kubernetes]` table).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Kubernetes {
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub pod: String,
    #[serde(default)]
    pub container: String,
}

/// What is read of a policy file. Other keys (memory, share, gpus, ...) are the node's business.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct PolicyLabels {
    pub name: String,
    #[serde(default)]
    pub created: String,
    pub kubernetes: Option<Kubernetes>,
}

/// Reads `path`; the error names the file (and the line, for TOML errors).
pub fn read_labels(path: &Path) -> Result<PolicyLabels, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_node_layout() {
        let p: PolicyLabels = toml::from_str(
            "name = \"t1\"\nmemory = 3221225472\nshare = 30\nlimit = 0\npriority = \"normal\"\n\
             gpus = []\ncreated = \"device-plugin\"\n[kubernetes]\nnamespace = \"default\"\n\
             pod = \"trainer-0\"\ncontainer = \"main\"\n",
        )
        .unwrap();
        assert_eq!(p.name, "t1");
        assert_eq!(p.kubernetes.unwrap().pod, "trainer-0");
        let cli: PolicyLabels = toml::from_str("name = \"t2\"\ncreated = \"cli\"\n").unwrap();
        assert!(cli.kubernetes.is_none());
        assert!(toml::from_str::<PolicyLabels>("name = ").is_err());
    }
}
