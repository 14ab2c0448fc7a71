//! What the creator of a ledger puts in it: the limits from the configuration, keyed by GPU UUID.

use super::*;

/// What the creator of a ledger puts in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerOptions {
    pub tenant: String,
    /// Limit for devices not in `devices` (a joiner adding a device gets this).
    pub default_limit: Limit,
    /// Known devices (UUID) and their limits.
    pub devices: Vec<(String, Limit)>,
    /// Group (name or gid) sharing the ledger: mode 0660 instead of 0600.
    pub group: Option<String>,
}

impl LedgerOptions {
    /// From the configuration and the process's visible devices `(index, uuid)`. Devices named by
    /// UUID in the configuration are added too, so a joiner that sees them gets their limit.
    pub fn from_config(cfg: &Config, visible: &[(u32, String)]) -> LedgerOptions {
        let mut devices: Vec<(String, Limit)> = visible
            .iter()
            .map(|(i, uuid)| (uuid.clone(), cfg.memory_limit_for(*i, uuid)))
            .collect();
        for uuid in cfg.memory.by_uuid.keys() {
            if !devices
                .iter()
                .any(|(u, _)| canonical_uuid(u).as_deref() == Some(uuid))
            {
                // Index u32::MAX: an index key cannot match a device this process does not see.
                devices.push((uuid.clone(), cfg.memory_limit_for(u32::MAX, uuid)));
            }
        }
        let mut default_limit = cfg.default_memory_limit();
        if let Some(msg) = unmatched_keys(cfg, visible) {
            // Limits were configured, none for a device this process can use: refuse, say why.
            for (uuid, limit) in devices.iter_mut() {
                if visible.iter().any(|(_, u)| u == uuid) {
                    *limit = Limit::Invalid(msg.clone());
                }
            }
            default_limit = Limit::Invalid(msg);
        }
        LedgerOptions {
            tenant: cfg.tenant.clone(),
            default_limit,
            devices,
            group: cfg.ledger_group.clone(),
        }
    }
}

/// When the memory limit is a list of per-device keys none of which names a visible device (a
/// typo in a UUID, index 1 on a one-GPU machine, a MIG key), the message that refuses allocations:
/// the keys given and the devices visible. A list that matches at least one visible device is valid.
pub fn unmatched_keys(cfg: &Config, visible: &[(u32, String)]) -> Option<String> {
    let m = &cfg.memory;
    if m.poison.is_some() || m.all.is_some() || (m.by_index.is_empty() && m.by_uuid.is_empty()) {
        return None;
    }
    if visible.is_empty() {
        return None;
    }
    let matched = visible.iter().any(|(i, u)| {
        m.by_index.contains_key(i) || canonical_uuid(u).is_some_and(|c| m.by_uuid.contains_key(&c))
    });
    if matched {
        return None;
    }
    let keys: Vec<String> = m
        .by_index
        .keys()
        .map(|i| i.to_string())
        .chain(m.by_uuid.keys().cloned())
        .collect();
    let seen: Vec<String> = visible.iter().map(|(i, u)| format!("{i}={u}")).collect();
    Some(format!(
        "{}: the memory limit lists devices {} but none of them is visible to this process (visible: {}); no device would have a limit",
        cfg.memory_source,
        keys.join(", "),
        seen.join(", ")
    ))
}

/// `Limit` as stored: (bytes, flags). Invalid configuration = limit 0 (deny all) + a flag saying why.
pub(super) fn stored(limit: &Limit) -> (u64, u32) {
    match limit {
        Limit::Bytes(b) => (*b, 0),
        Limit::Unlimited => (UNLIMITED, 0),
        Limit::Invalid(_) => (0, shm::DEV_FLAG_INVALID),
    }
}

/// The ledger key of a device: its canonical UUID (or the string as given if it is not a UUID).
pub(super) fn device_key(uuid: &str) -> Option<[u64; 8]> {
    shm::pack_key(&canonical_uuid(uuid).unwrap_or_else(|| uuid.trim().to_string()))
}
