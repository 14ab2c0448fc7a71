//! The node's side of a tenant's policy: writing it. The type, its syntax, its reader and the
//! state directory's layout are the library's ([`gpuslice_state::config::policy`]), so the node, the
//! preloaded library and the exporter read one definition of the file.

pub use gpuslice_state::config::policy::{Created, Kubernetes, Layout, Policy, DEFAULT_STATE_DIR};
pub use gpuslice_state::config::Priority;
use std::path::Path;

/// Writes a policy atomically (temporary file + rename), root-readable by all (0644). The text is
/// read back before it is written: the node never writes a policy the library would refuse.
/// The directory is reached without following anything another user could have planted, and the
/// file is written under an unpredictable temporary name and renamed (`crate::files`).
pub fn write(path: &Path, policy: &Policy) -> Result<(), String> {
    let (dir, _) = crate::files::split(path)?;
    write_in(&crate::files::Dir::open(dir)?, policy)
}

/// [`write`] as `policy.toml` in an opened directory, root:root 0644.
pub fn write_in(dir: &crate::files::Dir, policy: &Policy) -> Result<(), String> {
    let path = dir.path().join("policy.toml");
    let text = policy
        .to_toml()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let back = Policy::parse(&path, &text)?;
    if &back != policy {
        return Err(format!(
            "{}: the policy would read back as {back:?}, not {policy:?}",
            path.display()
        ));
    }
    dir.write_file(
        "policy.toml",
        text.as_bytes(),
        0o644,
        crate::files::root_owned(),
    )
}

/// Serialises a policy (JSON of `tenant create/list --json`) as the table its file holds, so the
/// JSON and the file have the same keys and values.
pub fn serialize<S: serde::Serializer>(policy: &Policy, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::Error;
    let text = policy.to_toml().map_err(S::Error::custom)?;
    let table: toml::Table = toml::from_str(&text).map_err(S::Error::custom)?;
    serde::Serialize::serialize(&table, s)
}

/// [`serialize`] for an optional policy.
pub fn serialize_opt<S: serde::Serializer>(
    policy: &Option<Policy>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match policy {
        Some(p) => serialize(p, s),
        None => s.serialize_none(),
    }
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
                pod: "trainer-0 \"quoted\" \\".into(),
                container: "main".into(),
            }),
        };
        let path = layout.policy_path("t1");
        write(&path, &policy).unwrap();
        assert_eq!(Policy::read(&path).unwrap(), policy);
        // A TOML library reads it too (the file is TOML for whoever else reads it).
        let generic: toml::Table =
            toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            generic["kubernetes"]["pod"].as_str(),
            Some("trainer-0 \"quoted\" \\")
        );
        assert_eq!(generic["gpus"].as_array().map(Vec::len), Some(2));
        let lib = gpuslice_state::config::policy::read(&path, false).unwrap();
        assert_eq!(lib.policy, policy);
        assert_eq!(lib.ledger_path(), layout.ledger_path("t1"));
        assert_eq!(lib.device_dir, layout.devices_dir());

        // The JSON of `tenant list --json` has the file's keys and values.
        #[derive(serde::Serialize)]
        struct Doc<'a>(#[serde(serialize_with = "serialize")] &'a Policy);
        let json = serde_json::to_value(Doc(&policy)).unwrap();
        assert_eq!(json["memory"], 3u64 << 30);
        assert_eq!(json["priority"], "high");
        assert_eq!(json["created"], "device-plugin");
        assert_eq!(json["kubernetes"]["container"], "main");
        assert_eq!(json["gpus"][1], policy.gpus[1]);

        // What cannot be written faithfully is refused, and the old file stays.
        let mut bad = policy.clone();
        bad.kubernetes.as_mut().unwrap().container = "a\u{1}b".into();
        assert!(write(&path, &bad).is_err());
        bad.gpus = vec!["not-a-uuid".into()];
        assert!(write(&path, &bad).is_err());
        assert_eq!(Policy::read(&path).unwrap(), policy);

        std::fs::write(&path, "name = \"t1\"\nmemory = 1\nshare = 5\nquota = 7\n").unwrap();
        let e = Policy::read(&path).unwrap_err();
        assert!(e.contains("policy.toml:4") && e.contains("quota"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
