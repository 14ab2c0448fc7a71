//! CDI specs (github.com/cncf-tags/container-device-interface, SPEC.md): a tenant's device
//! `gpuslice.io/tenant=NAME`, and the node-wide parts (`gpuslice cdi generate`).
//!
//! A tenant's container gets: the library (the versioned file the installed symlink names, so a later
//! install never changes what a running container mapped), `/etc/ld.so.preload` naming it, the
//! tenant's directory at `/run/gpuslice/tenant`, the device directory at `/run/gpuslice/devices`,
//! and the tenant's and the device group (`additionalGids`, which needs cdiVersion 0.7.0).
//!
//! Both directories are mounted **read-only**: root writes into them (policies, compute policies,
//! temporaries), and a container's root is host uid 0 unless the runtime maps it elsewhere (user
//! namespaces), so a writable mount would let it replace policies or plant links where root
//! writes. What a tenant must write is bind-mounted read-write over them, one file each: its
//! memory ledger, and the device ledger of each of its GPUs (docs/SECURITY.md).

use crate::files::write_atomically;
use crate::host::{Node, DEVICE_GID};
use crate::policy::Policy;
use gpuslice_state::config::policy::{CONTAINER_DEVICE_DIR, POLICY_DIR, POLICY_FILE};
use serde::Serialize;
use std::path::{Path, PathBuf};

pub const TENANT_KIND: &str = "gpuslice.io/tenant";
pub const NODE_KIND: &str = "gpuslice.io/node";
/// Where containers find the library.
pub const CONTAINER_LIBRARY: &str = "/usr/lib/gpuslice/libgpuslice.so";
/// Default host path of the installed library (a symlink to the versioned file).
pub const DEFAULT_LIBRARY: &str = "/usr/local/lib/gpuslice/libgpuslice.so";
/// Default CDI directory.
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";

#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    pub devices: Vec<Device>,
    #[serde(skip_serializing_if = "Edits::is_empty")]
    pub container_edits: Edits,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    pub container_edits: Edits,
}

#[derive(Serialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Edits {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub additional_gids: Vec<u32>,
}

impl Edits {
    fn is_empty(&self) -> bool {
        self.env.is_empty() && self.mounts.is_empty() && self.additional_gids.is_empty()
    }
}

#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    pub options: Vec<String>,
}

/// A bind mount; `noexec` for data (never for the library, which is mapped executable).
fn mount(host: &Path, container: &str, writable: bool) -> Mount {
    let mut options = vec![
        if writable { "rw" } else { "ro" },
        "nosuid",
        "nodev",
        "bind",
    ];
    if container != CONTAINER_LIBRARY && container != CONTAINER_TOOLS {
        options.push("noexec");
    }
    Mount {
        host_path: host.to_string_lossy().into_owned(),
        container_path: container.into(),
        options: options.into_iter().map(String::from).collect(),
    }
}

/// The lowest cdiVersion whose fields the spec uses (the CDI project's own rules).
pub fn minimum_version(spec: &Spec) -> &'static str {
    let gids = !spec.container_edits.additional_gids.is_empty()
        || spec
            .devices
            .iter()
            .any(|d| !d.container_edits.additional_gids.is_empty());
    let digit_name = spec
        .devices
        .iter()
        .any(|d| d.name.starts_with(|c: char| c.is_ascii_digit()));
    if gids {
        "0.7.0"
    } else if digit_name {
        "0.5.0"
    } else {
        "0.3.0"
    }
}

/// The library as the node installed it: the versioned file its symlink names (what containers
/// mount), or the path itself.
pub fn library_file(library: &Path) -> PathBuf {
    std::fs::canonicalize(library).unwrap_or_else(|_| library.to_path_buf())
}

/// Where containers find the `gpuslice` command and its probe (for `gpuslice doctor`).
pub const CONTAINER_TOOLS: &str = "/usr/lib/gpuslice/bin";

/// Edits every gpuslice container gets: library, preload list, the device directory (read-only)
/// with the device ledgers of `gpus` (read-write, one mount each), and the tools directory
/// (`gpuslice`, `gpuslice-probe`) when the node has one.
fn node_edits(node: &Node, gpus: &[String]) -> Edits {
    let mut edits = Edits {
        env: Vec::new(),
        mounts: vec![
            mount(&library_file(&node.library), CONTAINER_LIBRARY, false),
            mount(
                &preload_file(&node.layout.state),
                "/etc/ld.so.preload",
                false,
            ),
            // Read-only: root writes here (compute policies); see the module's documentation.
            mount(&node.layout.devices_dir(), CONTAINER_DEVICE_DIR, false),
        ],
        additional_gids: if node.cdi_groups {
            vec![DEVICE_GID]
        } else {
            Vec::new()
        },
    };
    // The device ledgers themselves, writable (every tenant of a GPU writes its device ledger).
    for uuid in gpus {
        let ledger = node.layout.device_ledger(uuid);
        edits.mounts.push(mount(
            &ledger,
            &format!("{CONTAINER_DEVICE_DIR}/{uuid}.dev"),
            true,
        ));
        // Its per-tenant counters, where the node made them (a bind mount needs the file).
        let tally = gpuslice_state::compute::device::tally_path_for(&ledger);
        if tally.is_file() {
            edits.mounts.push(mount(
                &tally,
                &format!("{CONTAINER_DEVICE_DIR}/{uuid}.tally"),
                true,
            ));
        }
    }
    if let Some(tools) = node.tools.as_ref().filter(|t| t.is_dir()) {
        edits.mounts.push(mount(tools, CONTAINER_TOOLS, false));
    }
    edits
}

/// The GPUs with a device ledger on the node (regular `<devices>/<GPU-UUID>.dev` files), sorted.
fn device_ledgers(node: &Node) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(node.layout.devices_dir())
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .filter_map(|e| e.file_name().into_string().ok())
                .filter_map(|n| n.strip_suffix(".dev").map(str::to_string))
                .filter(|u| {
                    gpuslice_state::config::canonical_uuid(u).as_deref() == Some(u.as_str())
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// `<state>/ld.so.preload`: the file mounted as the container's `/etc/ld.so.preload`.
pub fn preload_file(state: &Path) -> PathBuf {
    state.join("ld.so.preload")
}

/// Writes `<state>/ld.so.preload` (naming the library at its container path).
pub fn write_preload(state: &Path) -> Result<(), String> {
    write_atomically(
        &preload_file(state),
        format!("{CONTAINER_LIBRARY}\n").as_bytes(),
        0o644,
    )
}

/// The spec of a tenant's device.
pub fn tenant_spec(node: &Node, policy: &Policy, gid: u32) -> Spec {
    let layout = &node.layout;
    let gpus = if policy.gpus.is_empty() {
        device_ledgers(node)
    } else {
        policy.gpus.clone()
    };
    let mut edits = node_edits(node, &gpus);
    // Read-only: root writes the policy here; only the tenant's ledger is writable, by its own
    // mount over the directory's.
    edits
        .mounts
        .push(mount(&layout.tenant_dir(&policy.name), POLICY_DIR, false));
    edits
        .mounts
        .push(mount(&layout.policy_path(&policy.name), POLICY_FILE, false));
    edits.mounts.push(mount(
        &layout.ledger_path(&policy.name),
        &format!("{POLICY_DIR}/{}.ledger", policy.name),
        true,
    ));
    if node.cdi_groups {
        edits.additional_gids.insert(0, gid);
    }
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: TENANT_KIND.into(),
        devices: vec![Device {
            name: policy.name.clone(),
            container_edits: edits,
        }],
        container_edits: Edits::default(),
    };
    spec.cdi_version = minimum_version(&spec).into();
    spec
}

/// The node-wide spec (`gpuslice cdi generate`): device `gpuslice.io/node=library`.
pub fn node_spec(node: &Node) -> Spec {
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: NODE_KIND.into(),
        devices: vec![Device {
            name: "library".into(),
            container_edits: node_edits(node, &device_ledgers(node)),
        }],
        container_edits: Edits::default(),
    };
    spec.cdi_version = minimum_version(&spec).into();
    spec
}

/// File name of a tenant's spec in the CDI directory.
pub fn tenant_spec_name(name: &str) -> String {
    format!("gpuslice.io-tenant-{name}.json")
}

/// A spec's host paths must exist: a runtime refuses a container whose mount source is missing.
pub fn check_sources(spec: &Spec) -> Result<(), String> {
    check_sources_except(spec, None)
}

/// [`check_sources`], except for paths under `pending` (a tenant published after its spec).
fn check_sources_except(spec: &Spec, pending: Option<&Path>) -> Result<(), String> {
    for d in &spec.devices {
        for m in &d.container_edits.mounts {
            let host = Path::new(&m.host_path);
            if pending.is_some_and(|p| host.starts_with(p)) {
                continue;
            }
            if !host.exists() {
                return Err(format!(
                    "CDI spec {}={}: {} does not exist (for {}; install the library with `gpuslice install-library` or name it with --library)",
                    spec.kind, d.name, m.host_path, m.container_path
                ));
            }
        }
    }
    Ok(())
}

/// Writes a spec as `<dir>/<file>` (directory created if missing) once its mount sources exist;
/// returns its path.
pub fn write_spec(dir: &Path, file: &str, spec: &Spec) -> Result<PathBuf, String> {
    check_sources(spec)?;
    write_checked_spec(dir, file, spec)
}

/// [`write_spec`] for a tenant whose directory `tenant_dir` is published after its spec (`tenant
/// create`: a tenant never exists without its spec).
pub fn write_tenant_spec(
    dir: &Path,
    file: &str,
    spec: &Spec,
    tenant_dir: &Path,
) -> Result<PathBuf, String> {
    check_sources_except(spec, Some(tenant_dir))?;
    write_checked_spec(dir, file, spec)
}

fn write_checked_spec(dir: &Path, file: &str, spec: &Spec) -> Result<PathBuf, String> {
    let d = crate::files::Dir::open_or_create(dir)?;
    let text = serde_json::to_string_pretty(spec).map_err(|e| e.to_string())?;
    d.write_file(file, text.as_bytes(), 0o644, crate::files::root_owned())?;
    Ok(dir.join(file))
}

/// Installs the library `from` into `dir` as `libgpuslice.so.<content hash>` (never overwritten: a
/// running container may map it) and points the symlink `dir/libgpuslice.so` at it by an atomic
/// rename. Returns the versioned file.
pub fn install_library(from: &Path, dir: &Path) -> Result<PathBuf, String> {
    let bytes = std::fs::read(from).map_err(|e| format!("{}: {e}", from.display()))?;
    // FNV-1a over the content: the same build installs to the same name.
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    });
    let d = crate::files::Dir::open_or_create(dir)?;
    let name = format!("libgpuslice.so.{hash:016x}");
    let versioned = dir.join(&name);
    if d.stat(&name).is_none() {
        d.write_file(&name, &bytes, 0o755, crate::files::root_owned())?;
    }
    d.replace_with_symlink("libgpuslice.so", &name)?;
    Ok(versioned)
}

/// The CDI kind of NVIDIA's GPUs (nvidia-container-toolkit's `nvidia-ctk cdi generate`, the GPU
/// Operator's default since 25.10): devices `nvidia.com/gpu=<UUID>`, `=<index>`, `=all`.
pub const NVIDIA_KIND: &str = "nvidia.com/gpu";
/// Where CDI specs live (the CDI specification's default spec directories).
pub const SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];
/// Largest CDI spec read when looking for NVIDIA's (a spec of a large node is well under 1 MiB).
const MAX_SPEC_FILE: u64 = 4 << 20;

/// NVIDIA's CDI spec as found on the node: the file and the names of its `nvidia.com/gpu` devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvidiaSpec {
    pub path: PathBuf,
    pub names: std::collections::BTreeSet<String>,
}

impl NvidiaSpec {
    /// The CDI device naming a GPU: by UUID if the spec has it, else by NVML index.
    /// `index` as [`crate::nvml::Gpu::index_name`] gives it (`0`, or `0:1` for a MIG device).
    pub fn device_for(&self, uuid: &str, index: &str) -> Option<String> {
        if self.names.contains(uuid) {
            return Some(format!("{NVIDIA_KIND}={uuid}"));
        }
        let i = index.to_string();
        self.names
            .contains(&i)
            .then(|| format!("{NVIDIA_KIND}={i}"))
    }
}

/// NVIDIA's CDI specs in `dirs` (files `*.json`, `*.yaml`, `*.yml` whose kind is `nvidia.com/gpu`),
/// their device names merged. Every file is read without following a link, as a regular file of at
/// most 4 MiB; unreadable files are skipped. `None`: no such spec.
pub fn find_nvidia(dirs: &[PathBuf]) -> Option<NvidiaSpec> {
    let mut found: Option<NvidiaSpec> = None;
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        files.sort();
        for path in files {
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
            if !matches!(ext, "json" | "yaml" | "yml") {
                continue;
            }
            let Ok(text) = crate::files::read_untrusted(&path, MAX_SPEC_FILE) else {
                continue;
            };
            let Some(names) = nvidia_device_names(&text, ext == "json") else {
                continue;
            };
            match &mut found {
                Some(f) => f.names.extend(names),
                None => found = Some(NvidiaSpec { path, names }),
            }
        }
    }
    found
}

/// The device names of a spec of kind `nvidia.com/gpu` (JSON parsed; YAML read line by line:
/// the top-level `kind:` and every `name:` key, which in a CDI spec only devices have).
pub fn nvidia_device_names(text: &str, json: bool) -> Option<std::collections::BTreeSet<String>> {
    if json {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        if v.get("kind")?.as_str()? != NVIDIA_KIND {
            return None;
        }
        return Some(
            v.get("devices")?
                .as_array()?
                .iter()
                .filter_map(|d| d.get("name")?.as_str().map(str::to_string))
                .collect(),
        );
    }
    let unquote = |v: &str| {
        let v = v.split(" #").next().unwrap_or("").trim();
        v.trim_matches(|c| c == '"' || c == '\'').to_string()
    };
    let mut kind = None;
    let mut names = std::collections::BTreeSet::new();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("kind:") {
            kind = Some(unquote(v));
            continue;
        }
        let t = line.trim_start().trim_start_matches("- ").trim_start();
        if let Some(v) = t.strip_prefix("name:") {
            let n = unquote(v);
            if !n.is_empty() {
                names.insert(n);
            }
        }
    }
    (kind.as_deref() == Some(NVIDIA_KIND)).then_some(names)
}

#[cfg(test)]
mod nvidia_tests {
    use super::*;

    #[test]
    fn nvidia_specs_in_both_spellings() {
        let yaml = "---\ncdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n- name: GPU-1234\n  containerEdits: {}\n- name: all\ncontainerEdits:\n  hooks:\n  - hookName: createContainer\n    path: /usr/bin/nvidia-cdi-hook\n";
        let names = nvidia_device_names(yaml, false).unwrap();
        assert_eq!(
            names.iter().map(String::as_str).collect::<Vec<_>>(),
            ["0", "GPU-1234", "all"]
        );
        let json = r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"GPU-9","containerEdits":{}}]}"#;
        let spec = NvidiaSpec {
            path: "x".into(),
            names: nvidia_device_names(json, true).unwrap(),
        };
        assert_eq!(
            spec.device_for("GPU-9", "3").as_deref(),
            Some("nvidia.com/gpu=GPU-9")
        );
        assert_eq!(spec.device_for("GPU-8", "3"), None);
        let by_index = NvidiaSpec {
            path: "x".into(),
            names: nvidia_device_names(yaml, false).unwrap(),
        };
        assert_eq!(
            by_index.device_for("GPU-7", "0").as_deref(),
            Some("nvidia.com/gpu=0")
        );
        // Another vendor's spec, or ours, is not NVIDIA's.
        assert!(
            nvidia_device_names("kind: gpuslice.io/tenant\ndevices:\n- name: a\n", false).is_none()
        );
        assert!(nvidia_device_names("{not json", true).is_none());
    }
}
