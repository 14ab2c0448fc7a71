//! The node policy over a loaded configuration (the loader's last step): what the node decided wins,
//! and the process's own settings can only lower it. The policy itself (format, location, the node's
//! layout): `policy.rs`.

use super::policy::read;
use super::{Config, PerDevice, Priority, Setting, DEFAULT_CONTEXT_RESERVE};
use std::path::PathBuf;

/// Makes the policy (if any) authoritative in `cfg`: tenant, ledger and device directory from it;
/// compute settings from it, lowered (never raised) by the process's own; the memory ceiling is
/// kept in `cfg.policy` ([`Config::memory_ceiling`]). A bad policy refuses everything.
/// `located`: where the policy is ([`super::policy::locate`]), if there is one.
pub(super) fn apply(
    cfg: &mut Config,
    env: &dyn Fn(&str) -> Option<String>,
    located: Option<(PathBuf, bool)>,
) {
    let Some((path, fixed)) = located else {
        return;
    };
    let p = match read(&path, fixed) {
        Ok(p) => p,
        Err(e) => {
            cfg.errors.push(e.clone());
            cfg.memory.poison_with(&e);
            cfg.compute_share.poison_with(&e);
            cfg.compute_limit.poison_with(&e);
            return;
        }
    };
    let from = format!(
        "tenant {:?} is created by the node (policy {})",
        p.name,
        path.display()
    );
    let ignored: Vec<&str> = [
        "GPUSLICE_TENANT",
        "GPUSLICE_LEDGER",
        "GPUSLICE_LEDGER_DIR",
        "GPUSLICE_DEVICE_DIR",
        "GPUSLICE_LEDGER_GROUP",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    ]
    .into_iter()
    .filter(|k| env(k).is_some())
    .collect();
    if !ignored.is_empty() {
        cfg.warnings
            .push(format!("{} ignored: {from}", ignored.join(", ")));
    }
    cfg.tenant = p.name.clone();
    cfg.ledger_path = p.ledger_path();
    cfg.ledger_dir = None; // the node's ledger, not a default one to place per user
    cfg.ledger_group = None;

    let share = match cfg.compute_share.get_default() {
        Setting::Value(v) if v < p.share => {
            cfg.notes.push(format!(
                "compute share lowered to {v}% (the node's policy: {}%)",
                p.share
            ));
            v
        }
        Setting::Value(v) if v > p.share => {
            cfg.warnings.push(format!(
                "compute share {v}% ignored: {from} with share {}%",
                p.share
            ));
            p.share
        }
        _ => p.share,
    };
    let cap = match cfg.compute_limit.get_default() {
        Setting::Value(c) if p.limit == 0 || (c > 0 && c < p.limit) => c,
        Setting::Value(c) if c != p.limit => {
            cfg.warnings.push(format!(
                "compute cap {c}% ignored: {from} with cap {}%",
                p.limit
            ));
            p.limit
        }
        _ => p.limit,
    };
    let priority = match (&cfg.priority, p.priority) {
        (Setting::Value(Priority::High), Priority::Normal) => {
            cfg.warnings.push(format!(
                "priority high ignored: {from} with priority normal"
            ));
            Priority::Normal
        }
        (Setting::Value(Priority::Normal), _) => Priority::Normal,
        _ => p.priority,
    };
    let only = |v: u8| PerDevice {
        all: Some(Ok(v)),
        ..PerDevice::default()
    };
    cfg.compute_share = only(share);
    cfg.compute_limit = if cap == 0 {
        PerDevice::default()
    } else {
        only(cap)
    };
    cfg.priority = Setting::Value(priority);
    if cfg
        .context_reserve
        .is_some_and(|r| r < DEFAULT_CONTEXT_RESERVE)
    {
        cfg.warnings.push(format!(
            "GPUSLICE_CONTEXT_RESERVE below the default ignored: {from}"
        ));
        cfg.context_reserve = None;
    }
    if let Setting::Value(m) = cfg.memory.get_default() {
        if m > p.memory {
            cfg.warnings.push(format!(
                "memory limit {} ignored: {from} with {} per GPU",
                super::format_bytes(m),
                super::format_bytes(p.memory)
            ));
        }
    }
    cfg.policy = Some(p);
}
