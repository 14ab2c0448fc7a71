//! Tenants created by the node (`gpuslice tenant create/list/delete`).
//!
//! A tenant is published in one step: its directory (policy + ledger) is built under a temporary
//! name and renamed into place without replacing anything, so a failure (bad input, full or
//! read-only filesystem) leaves no half-created tenant; what was added to the device ledgers and
//! the CDI directory is taken back.
//!
//! Ownership (docs/KUBERNETES.md, "Who can write what"): the tenant's directory is root:<its gid>
//! 0750, its policy root 0644, its ledger root:<its gid> 0660; the device directory root:<device
//! gid> 0750, the device ledgers root:<device gid> 0660 and the GPUs' measurement locks
//! root:<device gid> 0640. A container gets the tenant's gid and
//! the device gid (CDI `additionalGids`), so any uid can run in it, and no tenant can open another's
//! ledger or change any policy.

use crate::cdi;
use crate::nvml::Gpu;
use crate::policy::{self, Layout, Policy, Priority};
use gpuslice::ledger::{Ledger, LedgerOptions};
use gpuslice::scheduling::device::DeviceLedger;
use gpuslice::scheduling::TenantId;
use serde::Serialize;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Group of the device directory and device ledgers (given to every tenant's container).
pub const DEVICE_GID: u32 = 61000;
/// Tenants' own groups are taken from this range, one per tenant.
pub const TENANT_GIDS: std::ops::RangeInclusive<u32> = 61001..=61999;

/// What `tenant create` asks for: the tenant's policy, except that `gpus` may name GPUs by NVML
/// index too (the created policy lists their UUIDs).
pub type Request = Policy;

/// Where the node keeps things.
#[derive(Clone, Debug)]
pub struct Node {
    pub layout: Layout,
    /// CDI spec directory; `None`: no spec is written.
    pub cdi_dir: Option<PathBuf>,
    /// The library as containers get it (host path).
    pub library: PathBuf,
    /// Put the groups in the spec (`additionalGids`, cdiVersion 0.7.0); without, the runtime must
    /// add them (`podman --group-add`, a pod's `supplementalGroups`) and the spec stays 0.3.0/0.5.0
    /// for runtimes whose CDI library is older (podman 4.3 in Debian 12).
    pub cdi_groups: bool,
    /// Directory holding `gpuslice` and `gpuslice-probe`, mounted into containers (if it exists).
    pub tools: Option<PathBuf>,
}

/// A created tenant.
#[derive(Clone, Debug, Serialize)]
pub struct Tenant {
    #[serde(serialize_with = "policy::serialize")]
    pub policy: Policy,
    pub dir: PathBuf,
    pub ledger: PathBuf,
    pub gid: u32,
    pub cdi_spec: Option<PathBuf>,
    /// `gpuslice.io/tenant=NAME`
    pub cdi_device: String,
}

fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "tenant name {name:?}: expected 1 to 64 of A-Z a-z 0-9 . _ -, not starting with ."
        ))
    }
}

/// The GPUs a request names (UUID or NVML index), or every GPU.
pub fn resolve_gpus<'a>(wanted: &[String], gpus: &'a [Gpu]) -> Result<Vec<&'a Gpu>, String> {
    let known = || {
        gpus.iter()
            .map(|g| format!("{} {}", g.index, g.uuid))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if gpus.is_empty() {
        return Err("NVML reports no GPU on this node".into());
    }
    if wanted.is_empty() {
        return Ok(gpus.iter().collect());
    }
    let mut out: Vec<&Gpu> = Vec::new();
    for w in wanted {
        let found = match w.trim().parse::<u32>() {
            Ok(i) => gpus.iter().find(|g| g.index == i),
            Err(_) => {
                gpuslice::config::canonical_uuid(w).and_then(|u| gpus.iter().find(|g| g.uuid == u))
            }
        };
        let g = found.ok_or_else(|| {
            format!(
                "--gpu {w}: no such GPU on this node (NVML reports: {})",
                known()
            )
        })?;
        if !out.iter().any(|o| o.uuid == g.uuid) {
            out.push(g);
        }
    }
    Ok(out)
}

fn io(what: &str, path: &Path) -> impl FnOnce(std::io::Error) -> String {
    let msg = format!("{what} {}", path.display());
    move |e| format!("{msg}: {e}")
}

/// `dir` with this owner group and mode, created if missing.
fn ensure_dir(dir: &Path, gid: u32, mode: u32) -> Result<(), String> {
    match std::fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => {}
        Err(e) => return Err(io("creating", dir)(e)),
    }
    let meta = std::fs::metadata(dir).map_err(io("reading", dir))?;
    if meta.gid() != gid || meta.uid() != 0 {
        std::os::unix::fs::chown(dir, Some(0), Some(gid)).map_err(io("chown of", dir))?;
    }
    if meta.mode() & 0o7777 != mode {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
            .map_err(io("chmod of", dir))?;
    }
    Ok(())
}

/// The state directory's skeleton: `<state>` and `tenants/` 0755 root, `devices/` root:DEVICE_GID 0750.
pub fn ensure_state(layout: &Layout) -> Result<(), String> {
    std::fs::create_dir_all(&layout.state).map_err(io("creating", &layout.state))?;
    ensure_dir(&layout.state, 0, 0o755)?;
    ensure_dir(&layout.tenants_dir(), 0, 0o755)?;
    ensure_dir(&layout.devices_dir(), DEVICE_GID, 0o750)
}

/// The device ledger of `gpu`, created (root:DEVICE_GID 0660) if missing.
fn device_ledger(layout: &Layout, uuid: &str) -> Result<DeviceLedger, String> {
    let path = layout.device_ledger(uuid);
    let l = DeviceLedger::open(&path, uuid, true).map_err(|e| e.to_string())?;
    let meta = std::fs::metadata(&path).map_err(io("reading", &path))?;
    if meta.gid() != DEVICE_GID || meta.mode() & 0o777 != 0o660 {
        std::os::unix::fs::chown(&path, Some(0), Some(DEVICE_GID))
            .map_err(io("chown of", &path))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660))
            .map_err(io("chmod of", &path))?;
    }
    Ok(l)
}

/// The GPU's measurement lock (`<devices>/<GPU-UUID>.measure`, root:DEVICE_GID 0640), created if
/// missing. Every tenant's processes `flock` it around an operation whose driver memory they
/// measure (docs/MEMORY.md), so that the tenants of the GPU measure one at a time; they cannot
/// create files in the device directory, and need only read it.
fn measure_lock(layout: &Layout, uuid: &str) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = layout.measure_lock(uuid);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(io("creating", &path))?;
    let meta = file.metadata().map_err(io("reading", &path))?;
    if meta.uid() != 0 || meta.gid() != DEVICE_GID {
        std::os::unix::fs::fchown(&file, Some(0), Some(DEVICE_GID))
            .map_err(io("chown of", &path))?;
    }
    if meta.mode() & 0o7777 != 0o640 {
        file.set_permissions(std::fs::Permissions::from_mode(0o640))
            .map_err(io("chmod of", &path))?;
    }
    Ok(())
}

/// Adds (or resets) the tenant's entry in a device ledger, and makes sure the GPU has its
/// measurement lock. `id` is the tenant's identity (its memory ledger's): device ledgers know
/// tenants by it. The ledger is created if missing, and repaired in place when it was grown,
/// shrunk or marked damaged (as it is opened). Root never waits on what a tenant can hold: the
/// arbitration lock for at most its bound, and without a process slot when every free one is
/// locked (`DeviceLedger::with_admin_lock`); an unhealthy ledger is reported.
fn add_to_device(layout: &Layout, uuid: &str, p: &Policy, id: TenantId) -> Result<(), String> {
    let l = device_ledger(layout, uuid)?;
    measure_lock(layout, uuid)?;
    l.sweep(None);
    let health = l.health();
    if health.unhealthy() {
        eprintln!(
            "warning: device ledger {}: {}",
            l.path().display(),
            health.describe()
        );
    }
    let high = p.priority == Priority::High;
    let cap = u32::from(p.limit) % 100;
    let t = l.with_admin_lock(|g| {
        let t = l.find_or_add_tenant(g, id, &p.name, u32::from(p.share), cap, high)?;
        let e = &l.layout().tenants[t];
        e.share
            .store(u32::from(p.share), std::sync::atomic::Ordering::Release);
        e.cap.store(cap, std::sync::atomic::Ordering::Release);
        e.priority
            .store(high as u32, std::sync::atomic::Ordering::Release);
        Some(t)
    });
    t.map(|_| ()).ok_or_else(|| {
        format!(
            "device ledger {}: no room for another tenant",
            l.path().display()
        )
    })
}

/// Live processes of tenant `name` in a device ledger (slots whose lock is held).
fn device_processes(l: &DeviceLedger, name: &str) -> usize {
    use std::sync::atomic::Ordering::Acquire;
    let Some(t) = l.find_tenant(name) else {
        return 0;
    };
    l.layout()
        .slots
        .iter()
        .enumerate()
        .filter(|(i, s)| {
            s.state.load(Acquire) != 0
                && s.tenant.load(Acquire) as usize == t
                && l.slot_alive(*i, None)
        })
        .count()
}

/// Removes the tenant's entry from a device ledger unless a process of it is alive.
fn remove_from_device(layout: &Layout, uuid: &str, name: &str) {
    let Ok(l) = DeviceLedger::open(&layout.device_ledger(uuid), uuid, false) else {
        return;
    };
    if device_processes(&l, name) > 0 {
        return;
    }
    l.sweep(None);
    l.with_admin_lock(|_| {
        if let Some(t) = l.find_tenant(name) {
            l.layout().tenants[t]
                .state
                .store(0, std::sync::atomic::Ordering::Release);
        }
    });
}

/// Writes every GPU's compute policy (`<devices>/<GPU-UUID>.policy`, root 0644, atomically) from
/// the tenants' policies: for each node tenant of the GPU, its identity (its memory ledger's id),
/// share, cap and class. The preloaded library obeys it over the device ledger's words, which every
/// tenant of the GPU can write (docs/SECURITY.md). A tenant whose policy or ledger cannot be read
/// is left out (it is then scheduled with share 1).
pub fn publish_compute_policies(layout: &Layout) -> Result<(), String> {
    use gpuslice::scheduling::policy::{self as compute, Record};
    let mut tenants = Vec::new();
    for name in layout.tenant_names().unwrap_or_default() {
        let Ok(p) = Policy::read(&layout.policy_path(&name)) else {
            continue;
        };
        let Some(id) = Ledger::open_readonly(&layout.ledger_path(&name))
            .ok()
            .and_then(|l| l.id())
        else {
            continue;
        };
        tenants.push((p, TenantId(id)));
    }
    let dir = layout.devices_dir();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(());
    };
    for uuid in entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".dev").map(str::to_string))
    {
        let records: Vec<Record> = tenants
            .iter()
            .filter(|(p, _)| p.gpus.is_empty() || p.gpus.contains(&uuid))
            .map(|(p, id)| Record {
                id: *id,
                share: u32::from(p.share),
                cap: u32::from(p.limit) % 100,
                high: p.priority == Priority::High,
                label: p.name.clone(),
            })
            .collect();
        let path = compute::path_for_ledger(&layout.device_ledger(&uuid));
        crate::files::write_atomically(&path, compute::render(&records).as_bytes(), 0o644)?;
        // A GPU set up before the node made measurement locks gets its own at the next change.
        measure_lock(layout, &uuid)?;
    }
    Ok(())
}

/// The tenant's group: the group of its directory.
pub fn tenant_gid(layout: &Layout, name: &str) -> Option<u32> {
    std::fs::metadata(layout.tenant_dir(name))
        .ok()
        .map(|m| m.gid())
}

fn free_gid(layout: &Layout) -> Result<u32, String> {
    let used: Vec<u32> = std::fs::read_dir(layout.tenants_dir())
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.gid())
                .collect()
        })
        .unwrap_or_default();
    TENANT_GIDS
        .clone()
        .find(|g| !used.contains(g))
        .ok_or_else(|| "no free tenant group left (61001..=61999)".into())
}

/// Renames `from` to `to` unless `to` exists.
fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let a = std::ffi::CString::new(from.as_os_str().as_bytes())?;
    let b = std::ffi::CString::new(to.as_os_str().as_bytes())?;
    // SAFETY: two valid NUL-terminated paths.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Creates a tenant. `gpus` is what NVML reports. All or nothing.
pub fn create(node: &Node, req: &Request, gpus: &[Gpu]) -> Result<Tenant, String> {
    check_name(&req.name)?;
    if !(1..=100).contains(&req.share) {
        return Err(format!("--share {}: expected 1..=100", req.share));
    }
    if req.limit > 100 {
        return Err(format!(
            "--limit {}: expected 0..=100 (0: no cap)",
            req.limit
        ));
    }
    let selected = resolve_gpus(&req.gpus, gpus)?;
    if req.memory == 0 {
        return Err("--memory 0: a tenant needs some memory".into());
    }
    for g in &selected {
        if req.memory > g.memory {
            return Err(format!(
                "--memory {}: larger than GPU {} {} ({})",
                gpuslice::config::format_bytes(req.memory),
                g.index,
                g.uuid,
                gpuslice::config::format_bytes(g.memory)
            ));
        }
    }
    let layout = &node.layout;
    let dir = layout.tenant_dir(&req.name);
    if dir.exists() {
        return Err(format!(
            "tenant {:?} already exists ({}); delete it first",
            req.name,
            dir.display()
        ));
    }
    ensure_state(layout)?;
    let policy = Policy {
        gpus: if req.gpus.is_empty() {
            Vec::new()
        } else {
            selected.iter().map(|g| g.uuid.clone()).collect()
        },
        ..req.clone()
    };
    let gid = free_gid(layout)?;
    let tmp = layout
        .tenants_dir()
        .join(format!(".{}.{}.tmp", req.name, std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let mut added_devices: Vec<String> = Vec::new();
    let mut spec = None;
    let result = (|| -> Result<(), String> {
        ensure_dir(&tmp, gid, 0o750)?;
        policy::write(&tmp.join("policy.toml"), &policy)?;
        let opts = LedgerOptions {
            tenant: req.name.clone(),
            default_limit: gpuslice::config::Limit::Bytes(if policy.gpus.is_empty() {
                req.memory
            } else {
                0
            }),
            devices: selected
                .iter()
                .map(|g| (g.uuid.clone(), gpuslice::config::Limit::Bytes(req.memory)))
                .collect(),
            group: Some(gid.to_string()),
        };
        let ledger_tmp = tmp.join(format!("{}.ledger", req.name));
        let id = Ledger::open(&ledger_tmp, &opts)
            .map_err(|e| e.to_string())?
            .id()
            .map(TenantId)
            .ok_or_else(|| format!("{}: no tenant identity", ledger_tmp.display()))?;
        for g in &selected {
            added_devices.push(g.uuid.clone());
            add_to_device(layout, &g.uuid, &policy, id)?;
        }
        rename_noreplace(&tmp, &dir).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                format!("tenant {:?} already exists ({})", req.name, dir.display())
            } else {
                format!("publishing {}: {e}", dir.display())
            }
        })?;
        publish_compute_policies(layout)?;
        if let Some(cdi_dir) = &node.cdi_dir {
            cdi::write_preload(&layout.state)?;
            let s = cdi::tenant_spec(node, &policy, gid);
            spec = Some(cdi::write_spec(
                cdi_dir,
                &cdi::tenant_spec_name(&req.name),
                &s,
            )?);
        }
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        if spec.is_none() && dir.exists() && tenant_gid(layout, &req.name) == Some(gid) {
            let _ = std::fs::remove_dir_all(&dir);
        }
        for uuid in &added_devices {
            remove_from_device(layout, uuid, &req.name);
        }
        let _ = publish_compute_policies(layout);
        return Err(format!("tenant {:?} not created: {e}", req.name));
    }
    Ok(Tenant {
        dir,
        ledger: layout.ledger_path(&req.name),
        gid,
        cdi_spec: spec,
        cdi_device: format!("{}={}", cdi::TENANT_KIND, req.name),
        policy,
    })
}

/// One tenant in `tenant list`.
#[derive(Clone, Debug, Serialize)]
pub struct Listed {
    pub name: String,
    pub dir: PathBuf,
    pub ledger: PathBuf,
    pub gid: Option<u32>,
    #[serde(serialize_with = "policy::serialize_opt")]
    pub policy: Option<Policy>,
    /// Live processes (memory ledger).
    pub processes: usize,
    /// Bytes in use per GPU.
    pub used: std::collections::BTreeMap<String, u64>,
    /// What could not be read.
    pub error: Option<String>,
}

/// Live processes of a tenant: its memory ledger's and the device ledgers'.
pub fn live_processes(layout: &Layout, name: &str) -> usize {
    let memory = Ledger::open_readonly(&layout.ledger_path(name))
        .map(|l| l.snapshot().processes.iter().filter(|p| p.alive).count())
        .unwrap_or(0);
    let devices: usize = std::fs::read_dir(layout.devices_dir())
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.path().extension().is_some_and(|x| x == "dev"))
                .filter_map(|e| DeviceLedger::open_readonly(&e.path()).ok())
                .map(|l| device_processes(&l, name))
                .sum()
        })
        .unwrap_or(0);
    memory.max(devices)
}

/// Every tenant of the node.
pub fn list(layout: &Layout) -> Result<Vec<Listed>, String> {
    let mut out = Vec::new();
    for name in layout.tenant_names()? {
        let mut errors = Vec::new();
        let policy = policy::Policy::read(&layout.policy_path(&name))
            .map_err(|e| errors.push(e))
            .ok();
        let mut used = std::collections::BTreeMap::new();
        match Ledger::open_readonly(&layout.ledger_path(&name)) {
            Ok(l) => {
                for d in l.snapshot().devices {
                    used.insert(d.uuid, d.used);
                }
            }
            Err(e) => errors.push(e.to_string()),
        }
        out.push(Listed {
            processes: live_processes(layout, &name),
            dir: layout.tenant_dir(&name),
            ledger: layout.ledger_path(&name),
            gid: tenant_gid(layout, &name),
            name,
            policy,
            used,
            error: (!errors.is_empty()).then(|| errors.join("; ")),
        });
    }
    Ok(out)
}

/// Deletes a tenant: refused while a process of it is alive, unless `force` (its device-ledger
/// entries then stay until its processes are gone).
pub fn delete(node: &Node, name: &str, force: bool) -> Result<(), String> {
    check_name(name)?;
    let layout = &node.layout;
    let dir = layout.tenant_dir(name);
    if !dir.exists() {
        return Err(format!(
            "no tenant {name:?} in {}",
            layout.tenants_dir().display()
        ));
    }
    let alive = live_processes(layout, name);
    if alive > 0 && !force {
        return Err(format!(
            "tenant {name:?} has {alive} live process(es); stop them first, or --force"
        ));
    }
    let gpus: Vec<String> = std::fs::read_dir(layout.devices_dir())
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter_map(|n| n.strip_suffix(".dev").map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    for uuid in &gpus {
        remove_from_device(layout, uuid, name);
    }
    if let Some(cdi_dir) = &node.cdi_dir {
        let spec = cdi_dir.join(cdi::tenant_spec_name(name));
        match std::fs::remove_file(&spec) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("removing {}: {e}", spec.display())),
        }
    }
    std::fs::remove_dir_all(&dir).map_err(io("removing", &dir))?;
    publish_compute_policies(layout)
}
