//! The compute-share part of the command line: `gpuslice set --share/--limit/--priority` (live changes
//! in the device ledgers) and the compute section of `gpuslice status`.

use gpuslice_state::compute::device::{tenant_name, DeviceLedger, HISTORY_LEN};
use gpuslice_state::compute::{device_dir, Holder, TenantId, MAX_TENANTS};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::*;

/// The device ledgers in `dir` (default: GPUSLICE_DEVICE_DIR, else the default); only `device`'s when
/// a GPU UUID is given. A missing directory means no device ledger.
fn ledgers(dir: Option<&Path>, device: Option<&str>) -> Result<Vec<PathBuf>, String> {
    let dir = dir.map_or_else(device_dir, Path::to_path_buf);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "dev"))
        .collect();
    if let Some(dev) = device {
        out.retain(|p| p.file_stem().is_some_and(|s| s.to_string_lossy() == dev));
    }
    out.sort();
    Ok(out)
}

fn percent(flag: &str, v: &str) -> Result<u32, String> {
    let t = v.trim().trim_end_matches('%');
    match t.parse::<u32>() {
        Ok(p) if p <= 100 => Ok(p),
        _ => Err(format!("--{flag} {v:?}: expected a percentage 0..=100")),
    }
}

/// A compute change asked of `gpuslice set`.
pub(crate) struct ComputeChange<'a> {
    pub tenant: Option<String>,
    pub share: Option<&'a str>,
    pub limit: Option<&'a str>,
    pub priority: Option<&'a str>,
    pub device: Option<&'a str>,
    pub device_dir: Option<&'a Path>,
}

/// `gpuslice set [--tenant T] [--share P] [--limit P|none] [--priority high|normal] [--device GPU-..]`.
pub(crate) fn set(c: ComputeChange) -> Result<i32, String> {
    let tenant = c
        .tenant
        .unwrap_or_else(|| gpuslice_state::config::load().tenant);
    let share = c.share.map(|v| percent("share", v)).transpose()?;
    let cap = match c.limit {
        Some("none") | Some("0") => Some(0),
        Some(v) => Some(percent("limit", v)? % 100),
        None => None,
    };
    let high = match c.priority {
        Some("high") => Some(true),
        Some("normal") => Some(false),
        Some(v) => return Err(format!("--priority {v:?}: expected high or normal")),
        None => None,
    };
    let mut changed = 0;
    for path in ledgers(c.device_dir, c.device)? {
        let l = DeviceLedger::open(&path, "", false).map_err(|e| e.to_string())?;
        // One word each, without a slot or the arbitration lock (a tenant can hold both). A tenant
        // is its memory ledger; the name is a label: every tenant carrying it is changed.
        for t in l
            .update_tenant(&tenant, share, cap, high)
            .map_err(|e| e.to_string())?
        {
            println!(
                "{}: tenant {tenant} ({}) updated",
                l.uuid(),
                short_id(l.tenant_id(t))
            );
            changed += 1;
        }
    }
    if changed == 0 {
        return Err(format!("no device ledger has a tenant {tenant:?}"));
    }
    Ok(0)
}

/// The first 8 hex digits of a tenant's identity (enough to tell tenants apart on one device).
fn short_id(id: TenantId) -> String {
    format!("{:08x}", (id.0 >> 96) as u32)
}

/// One tenant of one GPU in `gpuslice status`'s compute section (and its JSON).
#[derive(Serialize, Clone)]
pub(crate) struct ComputeRow {
    pub device: String,
    /// The tenant's label (`GPUSLICE_TENANT`); two tenants may carry the same one.
    pub tenant: String,
    /// The tenant's identity (its memory ledger's), first 8 hex digits.
    pub id: String,
    pub share: u32,
    /// 0: no cap.
    pub cap: u32,
    pub priority: &'static str,
    /// Share of the device's time over the last window (up to 15 s).
    pub achieved_percent: f64,
    pub waited_s: f64,
    pub charged_ns: u64,
    /// The tenant holds the device now.
    pub owner: bool,
    /// Ownerships of the device granted to its processes, and taken back from them (dead or
    /// stopped), from the per-tenant counters' file (null: the GPU has none). Words any tenant can
    /// write: counts to read, nothing more.
    pub handovers: Option<u64>,
    pub revocations: Option<u64>,
}

/// Per device and tenant: share, cap, priority, achieved share over the last window (up to 15 s),
/// time spent waiting. Empty when no device ledger exists; unreadable device ledgers are skipped.
pub(crate) fn rows(dir: Option<&Path>, device: Option<&str>) -> Result<Vec<ComputeRow>, String> {
    let mut rows = Vec::new();
    for path in ledgers(dir, device)? {
        let Ok(l) = DeviceLedger::open_readonly(&path) else {
            continue;
        };
        let lay = l.layout();
        let h = &lay.header;
        let seq = h.sample_seq.load(Acquire) as usize;
        let n = HISTORY_LEN;
        let (window, span) = if seq > 1 {
            let newest = (seq - 1) % n;
            let oldest = seq.saturating_sub(n) % n;
            let span = h.sample_ns[newest]
                .load(Acquire)
                .saturating_sub(h.sample_ns[oldest].load(Acquire));
            (Some((oldest, newest)), span)
        } else {
            (None, 0)
        };
        // The tenant holding the device: the owner word names a slot, untrusted.
        let owner = Holder::from_word(h.owner.load(Acquire))
            .slot()
            .map(|slot| lay.slots[slot].tenant.load(Acquire) as usize);
        let uuid = l.uuid();
        for t in 0..MAX_TENANTS {
            let e = &lay.tenants[t];
            if e.state.load(Acquire) == 0 {
                continue;
            }
            let achieved_percent = match window {
                Some((o, nw)) if span > 0 => {
                    let ns = e.samples[nw]
                        .load(Acquire)
                        .saturating_sub(e.samples[o].load(Acquire));
                    ((ns as f64 * 1000.0 / span as f64).round() / 10.0).min(100.0)
                }
                _ => 0.0,
            };
            rows.push(ComputeRow {
                device: uuid.clone(),
                tenant: tenant_name(&l, t),
                id: short_id(l.tenant_id(t)),
                // What the arbitration obeys (the node's compute policy for the tenants it lists).
                share: l.view(t).share,
                cap: l.view(t).cap,
                priority: if l.is_high(t) { "high" } else { "normal" },
                achieved_percent,
                waited_s: (e.wait_ns.load(Acquire) / 1_000_000) as f64 / 1000.0,
                charged_ns: e.charged_ns.load(Acquire),
                owner: owner == Some(t),
                handovers: l.tenant_counts(t).map(|c| c.0),
                revocations: l.tenant_counts(t).map(|c| c.1),
            });
        }
    }
    Ok(rows)
}

/// The health of one device ledger (`gpuslice status`): what may keep processes out of its
/// arbitration, from the kernel's evidence (slot locks, the file's size) and its counters.
#[derive(Serialize, Clone)]
pub(crate) struct HealthRow {
    pub ledger: String,
    pub healthy: bool,
    /// Free slots locked by someone not in them (nobody can claim them).
    pub squatted_slots: usize,
    pub free_slots: usize,
    pub size: Option<u64>,
    pub expected_size: u64,
    pub slot_denials: u64,
    pub lock_takeovers: u64,
    pub size_repairs: u64,
    /// Times a process was kept from its due by an owner whose ledger words lie and launched
    /// paced (counted by the victims; anybody can write it: a report).
    pub forged_owner: u64,
    /// Slots taken back from a tenant over its slot limit (a report, like the others).
    pub slot_reclaims: u64,
    pub detail: String,
}

/// Every device ledger's health; one that cannot be opened is unhealthy, with the reason.
pub(crate) fn health(dir: Option<&Path>, device: Option<&str>) -> Result<Vec<HealthRow>, String> {
    let mut out = Vec::new();
    for path in ledgers(dir, device)? {
        let ledger = path.display().to_string();
        let row = match DeviceLedger::open_readonly(&path) {
            Ok(l) => {
                let h = l.health();
                HealthRow {
                    ledger,
                    healthy: !h.unhealthy(),
                    squatted_slots: h.squatted_slots,
                    free_slots: h.free_slots,
                    size: h.size,
                    expected_size: h.expected_size,
                    slot_denials: h.slot_denials,
                    lock_takeovers: h.lock_takeovers,
                    size_repairs: h.size_repairs,
                    forged_owner: h.forged_owner,
                    slot_reclaims: h.slot_reclaims,
                    detail: h.describe(),
                }
            }
            Err(e) => HealthRow {
                ledger,
                healthy: false,
                squatted_slots: 0,
                free_slots: 0,
                size: std::fs::symlink_metadata(&path).ok().map(|m| m.len()),
                expected_size: gpuslice_state::compute::shm::TOTAL_SIZE as u64,
                slot_denials: 0,
                lock_takeovers: 0,
                size_repairs: 0,
                forged_owner: 0,
                slot_reclaims: 0,
                detail: format!("{e} (the next process that joins repairs a wrong size)"),
            },
        };
        out.push(row);
    }
    Ok(out)
}

/// The unhealthy ledgers, and those where processes reported a forged owner, as text (nothing
/// when all are healthy and none did).
pub(crate) fn health_text(rows: &[HealthRow]) -> String {
    let mut out = String::new();
    for r in rows {
        if !r.healthy {
            let _ = writeln!(out, "device ledger {:?}: UNHEALTHY: {}", r.ledger, r.detail);
        } else if r.forged_owner > 0 {
            let _ = writeln!(
                out,
                "device ledger {:?}: FORGED OWNER: {} time(s) a process was kept out by an owner \
                 whose ledger words lie and launched paced to its share; {}",
                r.ledger, r.forged_owner, r.detail
            );
        }
    }
    out
}

/// The compute section as text, one block per device.
pub(crate) fn table(rows: &[ComputeRow]) -> String {
    let mut out = String::new();
    let mut device = "";
    for r in rows {
        if r.device != device {
            device = &r.device;
            let _ = writeln!(out, "compute {device}");
            let _ = writeln!(
                out,
                "  {:<20} {:<8} {:>6} {:>6} {:>8} {:>9} {:>10} {:>9} {:>7}",
                "tenant",
                "id",
                "share",
                "cap",
                "priority",
                "achieved",
                "waited",
                "handovers",
                "revoked"
            );
        }
        let _ = writeln!(
            out,
            "  {:<20} {:<8} {:>5}% {:>6} {:>8} {:>8.1}% {:>9.2}s {:>9} {:>7}{}",
            r.tenant,
            r.id,
            r.share,
            if r.cap == 0 {
                "-".to_string()
            } else {
                format!("{}%", r.cap)
            },
            r.priority,
            r.achieved_percent,
            r.waited_s,
            r.handovers.map_or("-".to_string(), |n| n.to_string()),
            r.revocations.map_or("-".to_string(), |n| n.to_string()),
            if r.owner { "  (running)" } else { "" }
        );
    }
    out
}
