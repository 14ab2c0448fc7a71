//! `gpuslice status` (read-only view of a tenant's ledger) and `gpuslice set` (live limit changes).

use super::{ledger_path, Args};
use crate::config::{format_bytes, parse_size, Units};
use crate::ledger::{Ledger, Snapshot, UNLIMITED};
use std::fmt::Write as _;

pub(crate) fn status(args: &[String]) -> Result<i32, String> {
    let a = Args::parse(args, &["tenant", "ledger"])?;
    a.only(&["tenant", "ledger", "json"])?;
    let path = ledger_path(&a);
    let ledger = Ledger::open_readonly(&path).map_err(|e| e.to_string())?;
    let snap = ledger.snapshot();
    if a.has("json") {
        println!("{}", json(&snap));
    } else {
        print!("{}", table(&snap));
    }
    Ok(0)
}

fn limit_text(limit: u64, invalid: bool) -> String {
    match (limit, invalid) {
        (_, true) => "invalid config (0)".into(),
        (UNLIMITED, _) => "unlimited".into(),
        (l, _) => format_bytes(l),
    }
}

fn table(s: &Snapshot) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "tenant {} - ledger {}", s.tenant, s.path.display());
    let _ = writeln!(
        out,
        "{:<42} {:>14} {:>12} {:>12}",
        "device", "limit", "used", "peak"
    );
    for d in &s.devices {
        let _ = writeln!(
            out,
            "{:<42} {:>14} {:>12} {:>12}",
            d.uuid,
            limit_text(d.limit, d.invalid_config),
            format_bytes(d.used),
            format_bytes(d.peak)
        );
    }
    let _ = writeln!(out, "processes: {}", s.processes.len());
    for p in &s.processes {
        let usage: Vec<String> = p
            .used
            .iter()
            .map(|(dev, bytes)| {
                let uuid = s
                    .devices
                    .iter()
                    .find(|d| d.index == *dev)
                    .map_or("?", |d| d.uuid.as_str());
                format!("{uuid}: {}", format_bytes(*bytes))
            })
            .collect();
        let state = if p.alive {
            ""
        } else {
            " (exited, being reclaimed)"
        };
        let _ = writeln!(out, "  pid {:<8} {}{state}", p.pid, usage.join(", "));
    }
    out
}

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json(s: &Snapshot) -> String {
    let devices: Vec<String> = s
        .devices
        .iter()
        .map(|d| {
            let limit = if d.limit == UNLIMITED { "null".to_string() } else { d.limit.to_string() };
            format!(
                "{{\"index\":{},\"uuid\":{},\"limit\":{limit},\"invalid_config\":{},\"used\":{},\"peak\":{}}}",
                d.index,
                json_str(&d.uuid),
                d.invalid_config,
                d.used,
                d.peak
            )
        })
        .collect();
    let processes: Vec<String> = s
        .processes
        .iter()
        .map(|p| {
            let used: Vec<String> = p
                .used
                .iter()
                .map(|(d, b)| format!("{{\"device\":{d},\"bytes\":{b}}}"))
                .collect();
            format!(
                "{{\"pid\":{},\"alive\":{},\"used\":[{}]}}",
                p.pid,
                p.alive,
                used.join(",")
            )
        })
        .collect();
    format!(
        "{{\"tenant\":{},\"ledger\":{},\"devices\":[{}],\"processes\":[{}]}}",
        json_str(&s.tenant),
        json_str(&s.path.display().to_string()),
        devices.join(","),
        processes.join(",")
    )
}

pub(crate) fn set(args: &[String]) -> Result<i32, String> {
    let a = Args::parse(args, &["tenant", "ledger", "memory", "device"])?;
    a.only(&["tenant", "ledger", "memory", "device"])?;
    let memory = a
        .value("memory")
        .ok_or("set: --memory SIZE is required (or `unlimited`)")?;
    let bytes = if memory == "unlimited" {
        UNLIMITED
    } else {
        parse_size(memory, Units::Gpuslice).map_err(|e| format!("--memory {memory:?}: {e}"))?
    };
    let path = ledger_path(&a);
    let ledger = Ledger::open_existing(&path).map_err(|e| e.to_string())?;
    let snap = ledger.snapshot();
    let targets: Vec<usize> = match a.value("device") {
        None => snap.devices.iter().map(|d| d.index).collect(),
        Some(key) if key.starts_with("GPU-") => {
            vec![ledger
                .device_index(key)
                .ok_or_else(|| format!("--device {key}: not a GPU UUID"))?]
        }
        Some(key) => {
            let i: usize = key
                .parse()
                .map_err(|_| format!("--device {key:?}: expected a GPU-UUID or a ledger index"))?;
            vec![i]
        }
    };
    if targets.is_empty() {
        return Err(format!(
            "{}: no device has been used yet; name one with --device GPU-...",
            path.display()
        ));
    }
    for dev in targets {
        ledger.set_limit(dev, bytes).map_err(|e| e.to_string())?;
        println!("device {dev}: limit {}", limit_text(bytes, false));
    }
    Ok(0)
}
