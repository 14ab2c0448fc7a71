//! The compute-share part of the command line: `gpuslice set --share/--limit/--priority` (live changes
//! in the device ledgers) and the compute section of `gpuslice status`.

use super::Args;
use crate::scheduling::device::{now_ns, DeviceLedger};
use crate::scheduling::{device_dir, Holder, PriorityClass, TenantId, MAX_TENANTS};

/// The first 8 hex digits of a tenant's identity (enough to tell tenants apart on one device).
fn short_id(id: TenantId) -> String {
    format!("{:08x}", (id.0 >> 96) as u32)
}
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::Ordering::*;

/// Whether `set` was asked for a compute change.
pub(crate) fn wants(args: &[String]) -> bool {
    args.iter().any(|a| {
        ["--share", "--limit", "--priority"]
            .iter()
            .any(|f| a == f || a.starts_with(&format!("{f}=")))
    })
}

/// The device ledgers: `--device-dir`, else `GPUSLICE_DEVICE_DIR`, else the default; one device when
/// `--device GPU-...` names it.
fn ledgers(a: &Args) -> Result<Vec<PathBuf>, String> {
    let dir = a
        .value("device-dir")
        .map(PathBuf::from)
        .unwrap_or_else(device_dir);
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "dev"))
        .collect();
    if let Some(dev) = a.value("device") {
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

/// `gpuslice set [--tenant T] [--share P] [--limit P|none] [--priority high|normal] [--device GPU-..]`.
pub(crate) fn set(args: &[String]) -> Result<i32, String> {
    let a = Args::parse(
        args,
        &[
            "tenant",
            "share",
            "limit",
            "priority",
            "device",
            "device-dir",
            "ledger",
        ],
    )?;
    a.only(&[
        "tenant",
        "share",
        "limit",
        "priority",
        "device",
        "device-dir",
        "ledger",
    ])?;
    // A tenant is its memory ledger: `--ledger PATH` names it exactly (its identity); `--tenant NAME`
    // names every tenant that carries that label.
    let by_id = match a.value("ledger") {
        Some(p) => Some(
            crate::ledger::Ledger::open_readonly(std::path::Path::new(p))
                .map_err(|e| e.to_string())?
                .id()
                .map(TenantId)
                .ok_or_else(|| {
                    format!("ledger {p}: made before tenant identities; use --tenant")
                })?,
        ),
        None => None,
    };
    let tenant = a
        .value("tenant")
        .map(str::to_owned)
        .unwrap_or_else(|| crate::config::load().tenant);
    let share = a.value("share").map(|v| percent("share", v)).transpose()?;
    let cap = match a.value("limit") {
        Some("none") | Some("0") => Some(0),
        Some(v) => Some(percent("limit", v)? % 100),
        None => None,
    };
    let high = match a.value("priority") {
        Some("high") => Some(true),
        Some("normal") => Some(false),
        Some(v) => return Err(format!("--priority {v:?}: expected high or normal")),
        None => None,
    };
    let mut changed = 0;
    for path in ledgers(&a)? {
        let l = DeviceLedger::open(&path, "", false).map_err(|e| e.to_string())?;
        let found = match by_id {
            Some(id) => l.find_tenant_by_id(id).into_iter().collect(),
            None => l.find_tenants(&tenant),
        };
        for t in found {
            let e = &l.layout().tenants[t];
            if let Some(s) = share {
                e.share.store(s.max(1), Release);
            }
            if let Some(c) = cap {
                e.cap.store(c, Release);
            }
            if let Some(h) = high {
                e.priority.store(PriorityClass::of(h).word(), Release);
            }
            println!(
                "{}: tenant {} ({}) updated",
                l.uuid(),
                crate::scheduling::device::tenant_name(&l, t),
                short_id(l.tenant_id(t))
            );
            changed += 1;
        }
    }
    if changed == 0 {
        return Err(match by_id {
            Some(id) => format!("no device ledger has the tenant {}", short_id(id)),
            None => format!("no device ledger has a tenant {tenant:?}"),
        });
    }
    Ok(0)
}

/// The compute section of `gpuslice status`: per device and tenant, share, cap, priority, achieved
/// share over the last window (up to 15 s), time spent waiting. Empty when no device ledger exists.
pub(crate) fn status_text(args: &[String], json: bool) -> String {
    let Ok(a) = Args::parse(args, &["tenant", "ledger", "device", "device-dir"]) else {
        return String::new();
    };
    let Ok(paths) = ledgers(&a) else {
        return String::new();
    };
    let mut out = String::new();
    let mut items = Vec::new();
    for path in paths {
        let Ok(l) = DeviceLedger::open_readonly(&path) else {
            continue;
        };
        let lay = l.layout();
        let h = &lay.header;
        let seq = h.sample_seq.load(Acquire) as usize;
        let n = crate::scheduling::device::HISTORY_LEN;
        let (old_k, span) = if seq > 1 {
            let newest = (seq - 1) % n;
            let oldest = seq.saturating_sub(n) % n;
            let span = h.sample_ns[newest]
                .load(Acquire)
                .saturating_sub(h.sample_ns[oldest].load(Acquire));
            (Some((oldest, newest)), span)
        } else {
            (None, 0)
        };
        if !json {
            let owner = Holder::from_word(h.owner.load(Acquire))
                .slot()
                .map_or("none".to_string(), |s| s.to_string());
            let _ = writeln!(out, "compute {} (owner slot {owner})", l.uuid());
            let _ = writeln!(
                out,
                "  {:<20} {:<8} {:>6} {:>6} {:>8} {:>9} {:>10}",
                "tenant", "id", "share", "cap", "priority", "achieved", "waited"
            );
        }
        for t in 0..MAX_TENANTS {
            let e = &lay.tenants[t];
            if e.state.load(Acquire) == 0 {
                continue;
            }
            let name = crate::scheduling::device::tenant_name(&l, t);
            let achieved = match old_k {
                Some((o, nw)) if span > 0 => {
                    (e.samples[nw]
                        .load(Acquire)
                        .saturating_sub(e.samples[o].load(Acquire))) as f64
                        * 100.0
                        / span as f64
                }
                _ => 0.0,
            };
            let share = e.share.load(Acquire);
            let cap = e.cap.load(Acquire);
            let high = l.is_high(t);
            let id = short_id(l.tenant_id(t));
            let waited = e.wait_ns.load(Acquire) as f64 / 1e9;
            if json {
                items.push(format!(
                    "{{\"device\":\"{}\",\"tenant\":\"{}\",\"id\":\"{id}\",\"share\":{share},\"cap\":{cap},\"priority\":\"{}\",\"achieved_percent\":{achieved:.1},\"waited_s\":{waited:.3},\"charged_ns\":{}}}",
                    l.uuid(),
                    name.replace('"', "'"),
                    if high { "high" } else { "normal" },
                    e.charged_ns.load(Acquire)
                ));
            } else {
                let _ = writeln!(
                    out,
                    "  {:<20} {:<8} {:>5}% {:>6} {:>8} {:>8.1}% {:>9.2}s",
                    name,
                    id,
                    share,
                    if cap == 0 {
                        "-".to_string()
                    } else {
                        format!("{cap}%")
                    },
                    if high { "high" } else { "normal" },
                    achieved,
                    waited
                );
            }
        }
    }
    let _ = now_ns;
    if json {
        format!("[{}]", items.join(","))
    } else {
        out
    }
}

/// `gpuslice status --compute [--device-dir D] [--json]`.
pub(crate) fn status(args: &[String]) -> Result<i32, String> {
    let a = Args::parse(args, &["tenant", "ledger", "device", "device-dir"])?;
    let text = status_text(args, a.has("json"));
    if text.is_empty() {
        return Err("no device ledger (no compute shares in use)".into());
    }
    print!("{text}");
    if a.has("json") {
        println!();
    }
    Ok(0)
}
