//! Tenants in the GPUs' device ledgers and compute policies: adding and removing a tenant's entry,
//! the measurement lock of each GPU, and the policies the library obeys over the ledgers' words.

use crate::files::Dir;
pub use crate::host::DEVICE_GID;
use crate::policy::{Layout, Policy, Priority};
use crate::tenant::lock_node;
use crate::tenant::state_dirs;
use gpuslice_state::compute::device::DeviceLedger;
use gpuslice_state::compute::TenantId;
use gpuslice_state::ledger::Ledger;
use std::path::Path;

/// The device ledger of `gpu` and its per-tenant counters, created (root:DEVICE_GID 0660) if missing.
pub(super) fn device_ledger(
    layout: &Layout,
    devices: &Dir,
    uuid: &str,
) -> Result<DeviceLedger, String> {
    let path = layout.device_ledger(uuid);
    let l = DeviceLedger::open(&path, uuid, true).map_err(|e| e.to_string())?;
    devices.fix_file(&format!("{uuid}.dev"), 0, DEVICE_GID, 0o660)?;
    // Its per-tenant counters, created with it (none where the file could not be made: arbitration
    // works without them).
    if gpuslice_state::compute::device::tally_path_for(&path).is_file() {
        devices.fix_file(&format!("{uuid}.tally"), 0, DEVICE_GID, 0o660)?;
    }
    Ok(l)
}

/// The GPU's measurement lock (`<devices>/<GPU-UUID>.measure`, root:DEVICE_GID 0640), created if
/// missing. Every tenant's processes `flock` it around an operation whose driver memory they
/// measure (docs/MEMORY.md), so that the tenants of the GPU measure one at a time; they cannot
/// create files in the device directory, and need only read it.
pub(super) fn measure_lock(devices: &Dir, uuid: &str) -> Result<(), String> {
    let name = gpuslice_state::config::paths::measure_lock(Path::new(""), uuid);
    let name = name.to_string_lossy();
    devices.create_file(&name, 0, DEVICE_GID, 0o640).map(drop)
}

/// Adds (or resets) the tenant's entry in a device ledger, and makes sure the GPU has its
/// measurement lock. `id` is the tenant's identity (its memory ledger's): device ledgers know
/// tenants by it. The ledger is created if missing, and repaired in place when it was grown,
/// shrunk or marked damaged (as it is opened). Root never waits on what a tenant can hold: the
/// arbitration lock for at most its bound, and without a process slot when every free one is
/// locked (`DeviceLedger::with_admin_lock`); an unhealthy ledger is reported.
pub(super) fn add_to_device(
    layout: &Layout,
    devices: &Dir,
    uuid: &str,
    p: &Policy,
    id: TenantId,
) -> Result<(), String> {
    let l = device_ledger(layout, devices, uuid)?;
    measure_lock(devices, uuid)?;
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

/// Removes the tenant's entry (by identity where known, else by label) from a device ledger. The
/// caller has made sure no process of the tenant is alive (or was told to go on regardless).
pub(super) fn remove_from_device(layout: &Layout, uuid: &str, name: &str, id: Option<TenantId>) {
    let Ok(l) = DeviceLedger::open(&layout.device_ledger(uuid), uuid, false) else {
        return;
    };
    l.sweep(None);
    l.with_admin_lock(|_| {
        let found = match id {
            Some(id) => l.find_tenant_by_id(id),
            None => l.find_tenant(name),
        };
        if let Some(t) = found {
            l.layout().tenants[t]
                .state
                .store(0, std::sync::atomic::Ordering::Release);
        }
    });
}

/// The GPUs with a device ledger (`<devices>/<GPU-UUID>.dev`, regular files only).
pub(super) fn device_uuids(devices: &Dir) -> Vec<String> {
    let mut out: Vec<String> = devices
        .names()
        .unwrap_or_default()
        .into_iter()
        .filter(|n| {
            devices
                .stat(n)
                .is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG)
        })
        .filter_map(|n| n.strip_suffix(".dev").map(str::to_string))
        .filter(|u| gpuslice_state::config::canonical_uuid(u).as_deref() == Some(u.as_str()))
        .collect();
    out.sort();
    out
}

/// Writes every GPU's compute policy (`<devices>/<GPU-UUID>.policy`, root 0644, atomically) from
/// the tenants' policies: for each node tenant of the GPU, its identity (its memory ledger's id),
/// share, cap and class. The preloaded library obeys it over the device ledger's words, which every
/// tenant of the GPU can write (docs/SECURITY.md). A tenant whose policy or ledger cannot be read
/// is left out (it is then scheduled with share 1).
pub fn publish_compute_policies(layout: &Layout) -> Result<(), String> {
    let dirs = state_dirs(layout)?;
    let _lock = lock_node(&dirs.state)?;
    publish_with(layout, &dirs.devices, None)
}

/// [`publish_compute_policies`], with a tenant not yet published (`pending`, with its memory
/// ledger where it is made) counted in.
///
/// Each tenant keeps the entry of the device ledger the GPU's previous policy gave it; a new one
/// gets the lowest entry nobody has (none past the ledger's table). Each record names the
/// tenant's memory ledger by device and inode (it keeps its inode when its directory is
/// published): the file whose locks attest the tenant's processes (docs/SECURITY.md).
pub(super) fn publish_with(
    layout: &Layout,
    devices: &Dir,
    pending: Option<(&Policy, TenantId, &Path)>,
) -> Result<(), String> {
    use gpuslice_state::compute::policy::{self as compute, Record};
    use std::os::unix::fs::MetadataExt;
    let stat = |p: &Path| {
        std::fs::symlink_metadata(p)
            .ok()
            .filter(|m| m.file_type().is_file())
            .map(|m| (m.dev(), m.ino()))
    };
    let mut tenants = Vec::new();
    for name in layout.tenant_names().unwrap_or_default() {
        let Ok(p) = Policy::read(&layout.policy_path(&name)) else {
            continue;
        };
        let ledger = layout.ledger_path(&name);
        let Some(id) = Ledger::open_readonly(&ledger).ok().and_then(|l| l.id()) else {
            continue;
        };
        tenants.push((p, TenantId(id), stat(&ledger)));
    }
    if let Some((p, id, ledger)) = pending {
        tenants.push((p.clone(), id, stat(ledger)));
    }
    for uuid in device_uuids(devices) {
        let mut records: Vec<Record> = tenants
            .iter()
            .filter(|(p, _, _)| p.gpus.is_empty() || p.gpus.contains(&uuid))
            .map(|(p, id, lock)| Record {
                id: *id,
                share: u32::from(p.share),
                cap: u32::from(p.limit) % 100,
                high: p.priority == Priority::High,
                label: p.name.clone(),
                entry: None,
                lock: *lock,
            })
            .collect();
        let previous = previous_entries(&compute::path_for_ledger(&layout.device_ledger(&uuid)));
        assign_entries(&mut records, &previous);
        let path = compute::path_for_ledger(&layout.device_ledger(&uuid));
        let (_, name) = crate::files::split(&path)?;
        devices.write_file(
            name,
            compute::render(&records).as_bytes(),
            0o644,
            crate::files::root_owned(),
        )?;
        // A GPU set up before the node made measurement locks gets its own at the next change.
        measure_lock(devices, &uuid)?;
    }
    Ok(())
}

/// The entries a GPU's compute policy at `path` gives (root's file; a missing or unreadable one
/// gives none).
fn previous_entries(path: &Path) -> Vec<(TenantId, usize)> {
    use gpuslice_state::compute::policy as compute;
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| compute::parse(path, &text).ok())
        .map(|(records, _)| {
            records
                .into_iter()
                .filter_map(|r| Some((r.id, r.entry?)))
                .collect()
        })
        .unwrap_or_default()
}

/// Gives each record an entry of the device ledger: the one `previous` gave its tenant (a
/// running process stays where it is), else the lowest free one; none when all are taken (that
/// tenant's settings then follow its identity words, as before entries).
pub fn assign_entries(
    records: &mut [gpuslice_state::compute::policy::Record],
    previous: &[(TenantId, usize)],
) {
    use gpuslice_state::compute::shm::MAX_TENANTS;
    let mut taken = [false; MAX_TENANTS];
    for r in records.iter_mut() {
        r.entry = previous
            .iter()
            .find(|(id, e)| *id == r.id && *e < MAX_TENANTS && !taken[*e])
            .map(|&(_, e)| e);
        if let Some(e) = r.entry {
            taken[e] = true;
        }
    }
    for r in records.iter_mut().filter(|r| r.entry.is_none()) {
        r.entry = (0..MAX_TENANTS).find(|&e| !taken[e]);
        if let Some(e) = r.entry {
            taken[e] = true;
        }
    }
}
