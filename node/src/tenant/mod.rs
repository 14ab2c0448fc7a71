//! Tenants created by the node (`gpuslice tenant create/list/delete`).
//!
//! A tenant is published in one step: its directory (policy + ledger) is built under a temporary
//! name (`tenants/.new-<NAME>.<random>`), its device-ledger entries, its GPUs' compute policies
//! and its CDI spec are written, and only then is the directory renamed into place without
//! replacing anything. A failure takes back what was added; a create killed at any point leaves a
//! temporary directory that the next `tenant create`, `delete` or `list` (run as root) finds and
//! rolls back ([`recover`]): no tenant is ever published without its CDI spec, no group stays taken.
//! A delete first renames the tenant's directory to `tenants/.del-<NAME>.<random>` (unpublishing
//! it in one step), then takes the rest back; a killed delete is finished the same way. Creates and
//! deletes of one node run one at a time (`<state>/.node.lock`, root 0600).
//!
//! Every file and directory root writes here is reached through directory descriptors, never
//! through a link, and changed on its own descriptor (`crate::files`).
//!
//! Ownership (docs/KUBERNETES.md, "Who can write what"): the tenant's directory is root:<its gid>
//! 0750, its policy root 0644, its ledger root:<its gid> 0660; the device directory root:<device
//! gid> 0750, the device ledgers root:<device gid> 0660 and the GPUs' measurement locks
//! root:<device gid> 0640. A container gets the tenant's gid and
//! the device gid (CDI `additionalGids`), so any uid can run in it, and no tenant can open another's
//! ledger or change any policy.

use crate::cdi;
use crate::files::Dir;
pub use crate::host::{Node, DEVICE_GID, TENANT_GIDS};
use crate::nvml::Gpu;
use crate::policy::{self, Layout, Policy};
use gpuslice_state::compute::TenantId;
use gpuslice_state::ledger::{Ledger, LedgerOptions};
use serde::Serialize;
use std::path::{Path, PathBuf};

mod devices;
mod recovery;
mod state_dir;

use devices::add_to_device;
use devices::device_uuids;
pub use devices::publish_compute_policies;
use devices::publish_with;
use devices::remove_from_device;
use recovery::temporary_dir_name;
use recovery::DEL_PREFIX;
use recovery::NEW_PREFIX;
pub use recovery::{reclaim_space, recover};
use state_dir::free_gid;
use state_dir::io;
pub use state_dir::{ensure_state, lock_node, state_dirs, tenant_gid, NodeLock, StateDirs};

/// What `tenant create` asks for: the tenant's policy, except that `gpus` may name GPUs by NVML
/// index too (the created policy lists their UUIDs).
pub type Request = Policy;

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
            .map(|g| format!("{} {}", g.index_name(), g.uuid))
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
        // An NVML index (`0`, or `0:1` for MIG device 1 of GPU 0), or a `GPU-`/`MIG-` UUID.
        let found = match gpuslice_state::config::canonical_uuid(w) {
            Some(u) => gpus.iter().find(|g| g.uuid == u),
            None => gpus.iter().find(|g| g.index_name() == w.trim()),
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

/// Changes the policy of the node's tenant whose ledger is `ledger` (`gpuslice set` as root), then
/// the GPUs' compute policies, under the node's lock. Refused unless `ledger` is
/// `<state>/tenants/<NAME>/<NAME>.ledger` in a directory tree no one but root can change, with a
/// root-owned `policy.toml` beside it: a `policy.toml` someone else put beside their own ledger is
/// not the node's, and root never writes where another user could redirect it.
pub fn change_policy(ledger: &Path, change: impl FnOnce(&mut Policy)) -> Result<(), String> {
    let refuse = |why: String| {
        format!(
            "set: {} is not a node tenant's ledger ({why}); a policy.toml beside it is not the node's, and root does not act on it",
            ledger.display()
        )
    };
    let (dir, file) = crate::files::split(ledger)?;
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| refuse("no tenant directory".into()))?;
    check_name(name).map_err(refuse)?;
    if file != format!("{name}.ledger") {
        return Err(refuse(format!("not named {name}.ledger")));
    }
    let policy_path = dir.join("policy.toml");
    let layout = Layout::of_policy(&policy_path);
    if layout.tenant_dir(name) != dir {
        return Err(refuse("not in <state>/tenants/<NAME>/".into()));
    }
    let tenant_dir = Dir::open(dir).map_err(refuse)?;
    let st = tenant_dir
        .stat("policy.toml")
        .ok_or_else(|| refuse("no policy.toml".into()))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_uid != 0 {
        return Err(refuse(format!(
            "policy.toml is not a regular file of root's (uid {})",
            st.st_uid
        )));
    }
    let dirs = state_dirs(&layout).map_err(refuse)?;
    let _lock = lock_node(&dirs.state)?;
    let mut p = Policy::read(&policy_path)?;
    change(&mut p);
    policy::write_in(&tenant_dir, &p)?;
    // The GPUs' compute policies follow (the library re-reads them within a sweep, 100 ms).
    publish_with(&layout, &dirs.devices, None)
}

/// What each GPU already has: tenants, memory promised and shares promised (every tenant that
/// names it, or names no GPU).
fn promised(layout: &Layout, uuid: &str) -> (usize, u64, u32) {
    let mut n = 0;
    let mut memory = 0u64;
    let mut shares = 0u32;
    for name in layout.tenant_names().unwrap_or_default() {
        let Ok(p) = Policy::read(&layout.policy_path(&name)) else {
            // An unreadable tenant still holds its place on every GPU.
            n += 1;
            continue;
        };
        if p.gpus.is_empty() || p.gpus.iter().any(|g| g == uuid) {
            n += 1;
            memory = memory.saturating_add(p.memory);
            shares = shares.saturating_add(u32::from(p.share));
        }
    }
    (n, memory, shares)
}

/// Creates a tenant. `gpus` is what NVML reports. All or nothing. Memory and shares past a GPU's
/// are refused ([`create_with`] with `overcommit` allows them).
pub fn create(node: &Node, req: &Request, gpus: &[Gpu]) -> Result<Tenant, String> {
    create_with(node, req, gpus, false)
}

/// Creates a tenant; `overcommit`: quotas summing past a GPU's memory and shares summing past 100%
/// are allowed.
pub fn create_with(
    node: &Node,
    req: &Request,
    gpus: &[Gpu],
    overcommit: bool,
) -> Result<Tenant, String> {
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
                gpuslice_state::config::format_bytes(req.memory),
                g.index_name(),
                g.uuid,
                gpuslice_state::config::format_bytes(g.memory)
            ));
        }
    }
    let layout = &node.layout;
    let dirs = state_dirs(layout)?;
    let _lock = lock_node(&dirs.state)?;
    recover(node, &dirs);
    let dir = layout.tenant_dir(&req.name);
    if dirs.tenants.stat(&req.name).is_some() {
        return Err(format!(
            "tenant {:?} already exists ({}); delete it first",
            req.name,
            dir.display()
        ));
    }
    for g in &selected {
        let (n, memory, shares) = promised(layout, &g.uuid);
        if n >= gpuslice_state::compute::MAX_TENANTS {
            return Err(format!(
                "tenant {:?} not created: GPU {} {} already has {n} tenants, the most one GPU's \
                 device ledger holds ({}); delete one first",
                req.name,
                g.index,
                g.uuid,
                gpuslice_state::compute::MAX_TENANTS
            ));
        }
        let fmt = gpuslice_state::config::format_bytes;
        if !overcommit && memory.saturating_add(req.memory) > g.memory {
            return Err(format!(
                "tenant {:?} not created: --memory {} on GPU {} {} would promise {} of its {} \
                 ({} already promised to other tenants); use --overcommit to allow it",
                req.name,
                fmt(req.memory),
                g.index,
                g.uuid,
                fmt(memory.saturating_add(req.memory)),
                fmt(g.memory),
                fmt(memory)
            ));
        }
        if !overcommit && shares + u32::from(req.share) > 100 {
            return Err(format!(
                "tenant {:?} not created: --share {} on GPU {} {} would make its shares sum to \
                 {}% ({}% already promised to other tenants); use --overcommit to allow it",
                req.name,
                req.share,
                g.index,
                g.uuid,
                shares + u32::from(req.share),
                shares
            ));
        }
    }
    let policy = Policy {
        gpus: if req.gpus.is_empty() {
            Vec::new()
        } else {
            selected.iter().map(|g| g.uuid.clone()).collect()
        },
        ..req.clone()
    };
    let gid = free_gid(&dirs.tenants)?;
    let tmp_name = temporary_dir_name(NEW_PREFIX, &req.name);
    let tmp = dirs.tenants.path().join(&tmp_name);
    let mut id = None;
    let mut spec = None;
    let result = (|| -> Result<(), String> {
        let tmp_dir = dirs.tenants.subdir(&tmp_name, gid, 0o750, true)?;
        policy::write_in(&tmp_dir, &policy)?;
        let opts = LedgerOptions {
            tenant: req.name.clone(),
            default_limit: gpuslice_state::config::Limit::Bytes(if policy.gpus.is_empty() {
                req.memory
            } else {
                0
            }),
            devices: selected
                .iter()
                .map(|g| {
                    (
                        g.uuid.clone(),
                        gpuslice_state::config::Limit::Bytes(req.memory),
                    )
                })
                .collect(),
            group: Some(gid.to_string()),
        };
        let ledger_name = format!("{}.ledger", req.name);
        let ledger_tmp = tmp.join(&ledger_name);
        let tid = Ledger::open(&ledger_tmp, &opts)
            .map_err(|e| e.to_string())?
            .id()
            .map(TenantId)
            .ok_or_else(|| format!("{}: no tenant identity", ledger_tmp.display()))?;
        tmp_dir.fix_file(&ledger_name, 0, gid, 0o660)?;
        id = Some(tid);
        // The policies of the GPUs that have a device ledger give the tenant its entry first, so
        // that it is added there (a ledger made below gets its policy in the second pass).
        publish_with(layout, &dirs.devices, Some((&policy, tid, &ledger_tmp)))?;
        for g in &selected {
            add_to_device(layout, &dirs.devices, &g.uuid, &policy, tid)?;
        }
        // The GPUs' compute policies list the tenant before it is published.
        publish_with(layout, &dirs.devices, Some((&policy, tid, &ledger_tmp)))?;
        if let Some(cdi_dir) = &node.cdi_dir {
            cdi::write_preload(&layout.state)?;
            let s = cdi::tenant_spec(node, &policy, gid);
            spec = Some(cdi::write_tenant_spec(
                cdi_dir,
                &cdi::tenant_spec_name(&req.name),
                &s,
                &dir,
            )?);
        }
        // Published in one step, never over anything.
        dirs.tenants
            .rename_noreplace(&tmp_name, &dirs.tenants, &req.name)
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    format!("tenant {:?} already exists ({})", req.name, dir.display())
                } else {
                    format!("publishing {}: {e}", dir.display())
                }
            })
    })();
    if let Err(e) = result {
        let _ = dirs.tenants.remove_tree(&tmp_name);
        if let (Some(path), Some(cdi_dir)) = (&spec, &node.cdi_dir) {
            if let Ok(d) = Dir::open(cdi_dir) {
                let _ = d.remove_file(&cdi::tenant_spec_name(&req.name));
            }
            let _ = path;
        }
        for g in &selected {
            remove_from_device(layout, &g.uuid, &req.name, id);
        }
        let _ = publish_with(layout, &dirs.devices, None);
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

/// Live processes of a tenant: processes holding a slot lock in its memory ledger. The kernel's
/// own evidence (an OFD lock lives exactly as long as its process's open file description), in a
/// file only the tenant's group can open: no other tenant can make it look alive, and device
/// ledgers (which every tenant of a GPU writes) are not asked.
pub fn live_processes(layout: &Layout, name: &str) -> usize {
    Ledger::open_readonly(&layout.ledger_path(name))
        .map(|l| l.snapshot().processes.iter().filter(|p| p.alive).count())
        .unwrap_or(0)
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
/// entries then stay until its processes are gone). The tenant is unpublished in one step (its
/// directory renamed to a temporary name) before anything else is taken back.
pub fn delete(node: &Node, name: &str, force: bool) -> Result<(), String> {
    check_name(name)?;
    let layout = &node.layout;
    let dirs = state_dirs(layout)?;
    let _lock = lock_node(&dirs.state)?;
    recover(node, &dirs);
    let dir = layout.tenant_dir(name);
    if !dirs
        .tenants
        .stat(name)
        .is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
    {
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
    let id = Ledger::open_readonly(&layout.ledger_path(name))
        .ok()
        .and_then(|l| l.id())
        .map(TenantId);
    let gone = temporary_dir_name(DEL_PREFIX, name);
    dirs.tenants
        .rename_noreplace(name, &dirs.tenants, &gone)
        .map_err(io("unpublishing", &dir))?;
    if alive == 0 {
        for uuid in device_uuids(&dirs.devices) {
            remove_from_device(layout, &uuid, name, id);
        }
    }
    if let Some(cdi_dir) = &node.cdi_dir {
        if let Ok(d) = Dir::open(cdi_dir) {
            d.remove_file(&cdi::tenant_spec_name(name))?;
        }
    }
    dirs.tenants.remove_tree(&gone)?;
    publish_with(layout, &dirs.devices, None)
}
