//! Taking back what a killed create or delete left, and the space a tenant grew its files by.

use super::devices::device_uuids;
use super::devices::publish_with;
use super::devices::remove_from_device;
use crate::cdi;
use crate::files::Dir;
pub use crate::host::Node;
use crate::policy::Layout;
use crate::tenant::check_name;
use crate::tenant::StateDirs;
use gpuslice_state::compute::TenantId;
use gpuslice_state::ledger::Ledger;

/// Prefixes of the temporary names of a create under way and of a delete under way in `tenants/`.
pub(super) const NEW_PREFIX: &str = ".new-";
pub(super) const DEL_PREFIX: &str = ".del-";

/// The tenant a create or delete temporary belongs to: `.new-<NAME>.<hex>` / `.del-<NAME>.<hex>`.
pub(super) fn temporary_tenant(entry: &str) -> Option<&str> {
    let rest = entry
        .strip_prefix(NEW_PREFIX)
        .or_else(|| entry.strip_prefix(DEL_PREFIX))?;
    let (name, hex) = rest.rsplit_once('.')?;
    (hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()) && check_name(name).is_ok())
        .then_some(name)
}

pub(super) fn temporary_dir_name(prefix: &str, name: &str) -> String {
    let t = crate::files::temporary_name(name);
    // `.gs-<name>.<hex>.tmp` → `<prefix><name>.<hex>`
    let hex = &t[t.len() - 20..t.len() - 4];
    format!("{prefix}{name}.{hex}")
}

/// Takes back what a killed `tenant create` or `tenant delete` left (the caller holds the node's
/// lock, so none is under way): each temporary tenant directory is removed with the device-ledger
/// entries and the CDI spec of its tenant, unless that tenant is published; stale temporary files
/// are removed from the state directories; grown ledgers are cut back ([`reclaim_space`]).
/// Returns what it did, one line each.
pub fn recover(node: &Node, dirs: &StateDirs) -> Vec<String> {
    let layout = &node.layout;
    let mut done = Vec::new();
    let entries = dirs.tenants.names().unwrap_or_default();
    for entry in &entries {
        let Some(name) = temporary_tenant(entry) else {
            continue;
        };
        let tmp = dirs.tenants.path().join(entry);
        let id = Ledger::open_readonly(&tmp.join(format!("{name}.ledger")))
            .ok()
            .and_then(|l| l.id())
            .map(TenantId);
        let published = layout.policy_path(name).exists();
        if !published {
            for uuid in device_uuids(&dirs.devices) {
                remove_from_device(layout, &uuid, name, id);
            }
            if let Some(cdi_dir) = &node.cdi_dir {
                if let Ok(d) = Dir::open(cdi_dir) {
                    let _ = d.remove_file(&cdi::tenant_spec_name(name));
                }
            }
        }
        match dirs.tenants.remove_tree(entry) {
            Ok(()) => done.push(format!(
                "removed {} (an interrupted create or delete)",
                tmp.display()
            )),
            Err(e) => done.push(e),
        }
    }
    // Under the node's lock, temporaries of what only a create or delete writes are left over
    // whatever their age; others' (the device plugin's files, `cdi generate`) after a minute.
    let now = std::time::Duration::ZERO;
    let minute = std::time::Duration::from_secs(60);
    dirs.state.sweep_temporaries(now, Some("ld.so.preload"));
    dirs.state.sweep_temporaries(minute, None);
    dirs.tenants.sweep_temporaries(now, None);
    dirs.devices.sweep_temporaries(now, None);
    for name in layout.tenant_names().unwrap_or_default() {
        if let Ok(d) = dirs.tenants.open_subdir(&name) {
            d.sweep_temporaries(now, Some("policy.toml"));
            d.sweep_temporaries(minute, None);
        }
    }
    if let Some(d) = node.cdi_dir.as_ref().and_then(|c| Dir::open(c).ok()) {
        d.sweep_temporaries(now, Some("gpuslice.io-tenant-"));
        d.sweep_temporaries(minute, None);
    }
    done.extend(reclaim_space(layout, dirs));
    if !done.is_empty() {
        let _ = publish_with(layout, &dirs.devices, None);
    }
    done
}

/// Cuts every tenant ledger and device ledger back to its layout's size: a tenant can write these
/// files (and so grow them, `truncate -s` or writes past the end), and the state directory is
/// usually a small tmpfs shared by the whole node. The library maps only the layout's size, so the
/// cut never takes anything a process uses. Returns what was cut, one line each.
pub fn reclaim_space(layout: &Layout, dirs: &StateDirs) -> Vec<String> {
    let mut done = Vec::new();
    let mut cut = |dir: &Dir, name: &str, size: usize| {
        let Some(st) = dir.stat(name) else { return };
        let used = (st.st_blocks as u64).saturating_mul(512);
        if st.st_mode & libc::S_IFMT != libc::S_IFREG
            || (st.st_size as u64 <= size as u64 && used <= (size as u64).saturating_add(1 << 20))
        {
            return;
        }
        match dir.open_file(name, true) {
            Ok(f) => {
                // Past the layout, then back: punches out what was written beyond it.
                if f.set_len(size as u64).is_ok() {
                    done.push(format!(
                        "{}: {} bytes ({} in use) cut back to {size}",
                        dir.path().join(name).display(),
                        st.st_size,
                        used
                    ));
                }
            }
            Err(e) => done.push(e),
        }
    };
    for name in layout.tenant_names().unwrap_or_default() {
        if let Ok(d) = dirs.tenants.open_subdir(&name) {
            cut(
                &d,
                &format!("{name}.ledger"),
                size_of::<gpuslice_state::ledger::Layout>(),
            );
        }
    }
    for uuid in device_uuids(&dirs.devices) {
        cut(
            &dirs.devices,
            &format!("{uuid}.dev"),
            gpuslice_state::compute::shm::TOTAL_SIZE,
        );
    }
    done
}
