//! `gpuslice status`: a read-only view of a tenant's ledger and of the device ledgers (`gpuslice set`,
//! the live changes, is `set.rs`). `status --json` prints exactly one JSON document whose shape is
//! documented in docs/CLI.md; its types are [`StatusDocument`] and below.

use super::compute::{self, ComputeRow};
use super::LedgerArgs;
use gpuslice_state::config::format_bytes;
use gpuslice_state::ledger::{Ledger, ProcessSnapshot, Snapshot, UNLIMITED};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::PathBuf;

mod node_tenants;
use node_tenants::{node_table, node_tenants, NodeTenant};

/// `gpuslice status`'s arguments.
#[derive(clap::Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    ledger: LedgerArgs,
    /// One JSON document instead of tables (shape: docs/CLI.md).
    #[arg(long)]
    json: bool,
    /// Only the compute shares (device ledgers), not the tenant's memory ledger.
    #[arg(long)]
    compute: bool,
    /// Only this GPU's device ledger (compute section).
    #[arg(long, value_name = "GPU-UUID")]
    device: Option<String>,
    /// Directory of the device ledgers (default: GPUSLICE_DEVICE_DIR, else the default).
    #[arg(long, value_name = "DIR")]
    device_dir: Option<PathBuf>,
    /// A node's state directory: `--tenant NAME` is then the node-created tenant, and the device
    /// ledgers are the node's.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["ledger", "device_dir"])]
    state_dir: Option<PathBuf>,
}

/// The whole of `status --json`: one document, in every state. A section that could not be read is
/// `null` with its reason in the matching `_error` field.
#[derive(Serialize)]
struct StatusDocument {
    memory: Option<MemoryDocument>,
    memory_error: Option<String>,
    compute: Option<Vec<ComputeRow>>,
    compute_error: Option<String>,
    /// With --state-dir: GPUs the device plugin found also allocated through `nvidia.com/gpu`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    also_allocated: Vec<AlsoAllocated>,
    /// Each device ledger's health (what may keep processes out of its arbitration).
    compute_health: Vec<compute::HealthRow>,
    /// Processes using a GPU under no tenant, from the node's last report
    /// (`<state>/reconcile/unmanaged` of `--state-dir`); `null`: no `--state-dir`, or no report
    /// (no node reconciling).
    unmanaged: Option<Vec<UnmanagedDocument>>,
    /// With --state-dir: every tenant the node created, with the exporter's figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    node_tenants: Option<Vec<NodeTenant>>,
}

#[derive(Serialize)]
struct AlsoAllocated {
    uuid: String,
    namespace: String,
    pod: String,
    container: String,
}

#[derive(Serialize)]
struct MemoryDocument {
    tenant: String,
    ledger: String,
    devices: Vec<DeviceDocument>,
    processes: Vec<ProcessDocument>,
    /// When a node's reconciliation last went through the ledger (unix ms).
    node_reconciled_unix_ms: Option<u64>,
}

#[derive(Serialize)]
struct DeviceDocument {
    index: usize,
    uuid: String,
    /// `null`: unlimited.
    limit: Option<u64>,
    invalid_config: bool,
    used: u64,
    peak: u64,
    /// Allocations refused at the quota on this device.
    denied: u64,
}

#[derive(Serialize)]
struct ProcessDocument {
    pid: u64,
    alive: bool,
    /// Everything charged to the process: `allocations` + `overhead`.
    used: Vec<ProcessUsage>,
    /// What the program allocated.
    allocations: Vec<ProcessUsage>,
    /// What the driver spent for it (contexts, module code, limits).
    overhead: Vec<ProcessUsage>,
    /// How its driver memory is known: `own` (its own NVML figure), `node` (the node's word),
    /// `estimated` (neither: not reconciled), `unknown` (nothing published yet).
    driver_memory: &'static str,
    /// The PID the driver lists it under, as the node found it.
    host_pid: Option<u32>,
}

/// A process using a GPU under no tenant, as the node last reported it.
#[derive(Serialize)]
struct UnmanagedDocument {
    uuid: String,
    pid: u32,
    /// `null`: NVML cannot say.
    used: Option<u64>,
    command: String,
}

fn driver_memory(how: u32) -> &'static str {
    match how {
        gpuslice_state::ledger::RECONCILED_OWN => "own",
        gpuslice_state::ledger::RECONCILED_NODE => "node",
        gpuslice_state::ledger::RECONCILED_ESTIMATED => "estimated",
        _ => "unknown",
    }
}

#[derive(Serialize)]
struct ProcessUsage {
    device: usize,
    bytes: u64,
}

impl From<&Snapshot> for MemoryDocument {
    fn from(s: &Snapshot) -> Self {
        MemoryDocument {
            tenant: s.tenant.clone(),
            ledger: s.path.display().to_string(),
            devices: s
                .devices
                .iter()
                .map(|d| DeviceDocument {
                    index: d.index,
                    uuid: d.uuid.clone(),
                    limit: (d.limit != UNLIMITED).then_some(d.limit),
                    invalid_config: d.invalid_config,
                    used: d.used,
                    peak: d.peak,
                    denied: d.denied,
                })
                .collect(),
            processes: s
                .processes
                .iter()
                .map(|p| {
                    let usage = |v: &[(usize, u64)]| {
                        v.iter()
                            .map(|&(device, bytes)| ProcessUsage { device, bytes })
                            .collect()
                    };
                    ProcessDocument {
                        pid: u64::from(p.pid),
                        alive: p.alive,
                        used: usage(&p.used),
                        allocations: usage(&allocations(p)),
                        overhead: usage(&p.overhead),
                        driver_memory: driver_memory(p.reconciled),
                        host_pid: p.node.map(|(pid, _)| pid),
                    }
                })
                .collect(),
            node_reconciled_unix_ms: s.node_ms,
        }
    }
}

pub(crate) fn status(mut a: StatusArgs) -> Result<i32, String> {
    if let Some(state) = &a.state_dir {
        let layout = gpuslice_node::policy::Layout::new(state);
        if let Some(t) = &a.ledger.tenant {
            a.ledger.ledger = Some(layout.ledger_path(t));
        }
        a.device_dir = Some(layout.devices_dir());
    }
    // A node's state directory without --tenant: every node tenant (below), not a default ledger.
    let node = (a.state_dir.is_some() && a.ledger.tenant.is_none() && !a.compute)
        .then(|| a.state_dir.as_deref().map(node_tenants).unwrap_or_default());
    let memory = if a.compute || node.is_some() {
        None
    } else {
        let path = a.ledger.path();
        Some(
            Ledger::open_readonly(&path)
                .map(|l| l.snapshot())
                .map_err(|e| e.to_string()),
        )
    };
    let compute = compute::rows(a.device_dir.as_deref(), a.device.as_deref());
    // The compute section is shown when device ledgers exist, or when it was asked for.
    let compute = match compute {
        Ok(rows) if rows.is_empty() && !a.compute => None,
        Ok(rows) if rows.is_empty() => {
            Some(Err("no device ledger (no compute shares in use)".into()))
        }
        other => Some(other),
    };
    let health = compute::health(a.device_dir.as_deref(), a.device.as_deref()).unwrap_or_default();
    let shown = matches!(memory, Some(Ok(_)))
        || matches!(compute, Some(Ok(_)))
        || node.as_ref().is_some_and(|n| !n.is_empty());
    let node_asked = node.is_some();
    let twice: Vec<AlsoAllocated> = a
        .state_dir
        .as_ref()
        .map(|s| gpuslice_observe::collect::read_conflicts(&s.join("device-plugin/conflicts")))
        .unwrap_or_default()
        .into_iter()
        .map(|(uuid, k)| AlsoAllocated {
            uuid,
            namespace: k.namespace,
            pod: k.pod,
            container: k.container,
        })
        .collect();
    // The node's report of processes using a GPU under no tenant (with --state-dir).
    let unmanaged = a
        .state_dir
        .as_deref()
        .and_then(gpuslice_observe::procs::read_unmanaged)
        .map(|(_, list)| {
            list.into_iter()
                .map(|u| UnmanagedDocument {
                    uuid: u.uuid,
                    pid: u.pid,
                    used: u.used,
                    command: u.command,
                })
                .collect::<Vec<_>>()
        });
    for t in &twice {
        eprintln!(
            "gpuslice: GPU {} is also allocated through nvidia.com/gpu to {}/{} ({}): handed out twice",
            t.uuid, t.namespace, t.pod, t.container
        );
    }
    if a.json {
        let doc = StatusDocument {
            memory: memory
                .as_ref()
                .and_then(|m| m.as_ref().ok())
                .map(Into::into),
            memory_error: memory.as_ref().and_then(|m| m.as_ref().err()).cloned(),
            compute: compute.as_ref().and_then(|c| c.as_ref().ok()).cloned(),
            compute_error: compute.as_ref().and_then(|c| c.as_ref().err()).cloned(),
            also_allocated: twice,
            compute_health: health,
            unmanaged,
            node_tenants: node,
        };
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        println!("{text}");
    } else {
        // Labels and names come from files tenants write: escaped for the terminal.
        use gpuslice_observe::top::printable;
        if let Some(Ok(snap)) = &memory {
            print!("{}", printable(&table(snap)));
        }
        if let Some(n) = node.as_ref().filter(|n| !n.is_empty()) {
            print!("{}", printable(&node_table(n)));
        }
        if let Some(Ok(rows)) = &compute {
            if matches!(memory, Some(Ok(_))) || node.as_ref().is_some_and(|n| !n.is_empty()) {
                println!();
            }
            print!("{}", printable(&compute::table(rows)));
        }
        if compute.is_some() {
            print!("{}", compute::health_text(&health));
        }
        if let Some(list) = unmanaged.as_ref().filter(|l| !l.is_empty()) {
            let mut text = String::from("GPU memory used under no tenant (unmanaged):\n");
            for u in list {
                let _ = writeln!(
                    text,
                    "  pid {:<10} {:<42} {:>12}  {}",
                    u.pid,
                    u.uuid,
                    u.used.map_or_else(|| "?".into(), format_bytes),
                    u.command
                );
            }
            print!("{}", printable(&text));
        }
    }
    if shown {
        return Ok(0);
    }
    // Nothing to show: the reason, as an error (for --json, the document above carries it too).
    let reason = memory
        .and_then(Result::err)
        .or_else(|| compute.and_then(Result::err))
        .unwrap_or_else(|| match node_asked {
            true => "no node tenants and no device ledgers".into(),
            false => "nothing to show".into(),
        });
    Err(reason)
}

pub(crate) fn limit_text(limit: u64, invalid: bool) -> String {
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
    if !s.processes.is_empty() {
        let _ = writeln!(
            out,
            "  {:<12} {:<42} {:>12} {:>12} {:>12}",
            "pid", "device", "allocations", "overhead", "used"
        );
    }
    for p in &s.processes {
        let state = if p.alive {
            ""
        } else {
            " (exited, being reclaimed)"
        };
        let allocated = allocations(p);
        for (i, &(dev, used)) in p.used.iter().enumerate() {
            let uuid = s
                .devices
                .iter()
                .find(|d| d.index == dev)
                .map_or("?", |d| d.uuid.as_str());
            let _ = writeln!(
                out,
                "  {:<12} {uuid:<42} {:>12} {:>12} {:>12}{state}",
                if i == 0 {
                    p.pid.to_string()
                } else {
                    String::new()
                },
                format_bytes(on_device(&allocated, dev)),
                format_bytes(on_device(&p.overhead, dev)),
                format_bytes(used),
            );
        }
        if p.used.is_empty() {
            let _ = writeln!(out, "  {:<12} (nothing charged){state}", p.pid);
        }
    }
    for p in s.processes.iter().filter(|p| p.alive) {
        let how = match (p.reconciled, p.node) {
            (gpuslice_state::ledger::RECONCILED_NODE, Some((host, _))) => {
                format!("reconciled by the node (the driver lists it as PID {host})")
            }
            (gpuslice_state::ledger::RECONCILED_NODE, None) => "reconciled by the node".into(),
            (gpuslice_state::ledger::RECONCILED_ESTIMATED, _) => {
                "estimated, not reconciled (another PID namespace, and no node's word: run `gpuslice node reconcile` on the node)".into()
            }
            _ => continue,
        };
        let _ = writeln!(out, "driver memory of process {}: {how}", p.pid);
    }
    out
}

/// Bytes on device `dev` in a `(device index, bytes)` list.
fn on_device(v: &[(usize, u64)], dev: usize) -> u64 {
    v.iter().find(|(d, _)| *d == dev).map_or(0, |&(_, b)| b)
}

/// A process's allocations per device: what is charged to it less the driver's overhead (read
/// from shared memory, so never below 0).
fn allocations(p: &ProcessSnapshot) -> Vec<(usize, u64)> {
    p.used
        .iter()
        .map(|&(dev, used)| (dev, used.saturating_sub(on_device(&p.overhead, dev))))
        .collect()
}
