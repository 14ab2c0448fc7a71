//! The node's state directory: its skeleton opened without following what a tenant planted, the
//! tenants' groups, and the node's lock.

use crate::files::Dir;
pub use crate::host::{DEVICE_GID, TENANT_GIDS};
use crate::policy::Layout;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

pub(super) fn io(what: &str, path: &Path) -> impl FnOnce(std::io::Error) -> String {
    let msg = format!("{what} {}", path.display());
    move |e| format!("{msg}: {e}")
}

/// The state directory's skeleton, opened: `<state>` and `tenants/` root 0755, `devices/`
/// root:DEVICE_GID 0750; each reached without following anything another user could plant.
pub struct StateDirs {
    pub state: Dir,
    pub tenants: Dir,
    pub devices: Dir,
}

/// Opens (creating what is missing) the state directory's skeleton.
pub fn state_dirs(layout: &Layout) -> Result<StateDirs, String> {
    let state = Dir::open_or_create(&layout.state)?;
    state.fix(Some(0), Some(0), Some(0o755))?;
    let tenants = state.subdir("tenants", 0, 0o755, false)?;
    let devices = state.subdir("devices", DEVICE_GID, 0o750, false)?;
    Ok(StateDirs {
        state,
        tenants,
        devices,
    })
}

/// The state directory's skeleton: `<state>` and `tenants/` 0755 root, `devices/` root:DEVICE_GID 0750.
pub fn ensure_state(layout: &Layout) -> Result<(), String> {
    state_dirs(layout).map(|_| ())
}

/// The tenant's group: the group of its directory.
pub fn tenant_gid(layout: &Layout, name: &str) -> Option<u32> {
    std::fs::symlink_metadata(layout.tenant_dir(name))
        .ok()
        .filter(|m| m.is_dir())
        .map(|m| m.gid())
}

/// A group no directory in `tenants/` has (published tenants and creates under way alike).
pub(super) fn free_gid(tenants: &Dir) -> Result<u32, String> {
    let used: Vec<u32> = tenants
        .names()?
        .iter()
        .filter_map(|n| tenants.stat(n))
        .map(|st| st.st_gid)
        .collect();
    TENANT_GIDS
        .clone()
        .find(|g| !used.contains(g))
        .ok_or_else(|| "no free tenant group left (61001..=61999)".into())
}

/// The node's lock (`<state>/.node.lock`, root 0600): creates, deletes and policy changes of one
/// node run one at a time. Only root can open the file, so no tenant or user can hold it. Released
/// when dropped (or when the process dies).
pub struct NodeLock(#[allow(dead_code)] std::fs::File);

/// How long a create or delete waits for another one to finish.
pub(super) const NODE_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Takes the node's lock (waiting up to [`NODE_LOCK_WAIT`]).
pub fn lock_node(state: &Dir) -> Result<NodeLock, String> {
    let f = state.create_file(".node.lock", 0, 0, 0o600)?;
    let start = std::time::Instant::now();
    loop {
        // SAFETY: a valid descriptor.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(NodeLock(f));
        }
        if start.elapsed() >= NODE_LOCK_WAIT {
            return Err(format!(
                "{}: another tenant create or delete has held the node's lock for {NODE_LOCK_WAIT:?}",
                state.path().join(".node.lock").display()
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
