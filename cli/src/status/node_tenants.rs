//! `status --state-dir`'s node tenants: every tenant the node created, read as the exporter reads
//! it, as JSON (`node_tenants` of the status document) or as a table.

use gpuslice_state::config::format_bytes;
use serde::Serialize;
use std::fmt::Write as _;

/// A node tenant as the exporter reads it (`gpuslice_observe::collect`): its pod, and per GPU its
/// memory (exited processes' part apart), or why its ledger could not be read.
#[derive(Serialize)]
pub(super) struct NodeTenant {
    tenant: String,
    namespace: Option<String>,
    pod: Option<String>,
    container: Option<String>,
    ledger: String,
    /// Live processes attached to its ledger.
    processes: Option<usize>,
    devices: Vec<NodeTenantDevice>,
    error: Option<String>,
}

#[derive(Serialize)]
pub(super) struct NodeTenantDevice {
    uuid: String,
    /// `null`: unlimited.
    limit: Option<u64>,
    used: u64,
    /// The part of `used` still charged to processes that have exited.
    exited: u64,
    peak: u64,
    denied: u64,
}

/// The node's tenants under `state` (`<state>/tenants/*`), read as the exporter reads them.
pub(super) fn node_tenants(state: &std::path::Path) -> Vec<NodeTenant> {
    let layout = gpuslice_node::policy::Layout::new(state);
    let sources = gpuslice_observe::collect::Sources::new(
        Some(state.to_path_buf()),
        // Only the node's tenants: no other ledger directory is listed.
        Some(layout.tenants_dir().join(".none")),
        Some(layout.devices_dir()),
    );
    let tenants_dir = layout.tenants_dir();
    sources
        .read()
        .tenants
        .into_iter()
        .filter(|t| t.ledger.starts_with(&tenants_dir))
        .map(|t| {
            let k = t.kubernetes.as_ref();
            let (processes, devices, error) = match &t.memory {
                Ok(m) => (
                    Some(m.processes),
                    m.devices
                        .iter()
                        .map(|d| NodeTenantDevice {
                            uuid: d.uuid.clone(),
                            limit: d.limit,
                            used: d.used,
                            exited: d.exited,
                            peak: d.peak,
                            denied: d.denied,
                        })
                        .collect(),
                    None,
                ),
                Err(e) => (None, Vec::new(), Some(e.clone())),
            };
            NodeTenant {
                tenant: t.tenant.clone(),
                namespace: k.map(|k| k.namespace.clone()),
                pod: k.map(|k| k.pod.clone()),
                container: k.map(|k| k.container.clone()),
                ledger: t.ledger.display().to_string(),
                processes,
                devices,
                error,
            }
        })
        .collect()
}

/// The node tenants as text: one line per tenant and GPU.
pub(super) fn node_table(tenants: &[NodeTenant]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<24} {:<28} {:<14} {:>10} {:>10} {:>10} {:>6} {:>9}",
        "node tenant", "pod", "gpu", "used", "exited", "limit", "denied", "processes"
    );
    for t in tenants {
        let pod = match (&t.namespace, &t.pod) {
            (Some(ns), Some(pod)) => format!("{ns}/{pod}"),
            _ => "-".into(),
        };
        if let Some(e) = &t.error {
            let _ = writeln!(out, "{:<24} {:<28} unreadable: {e}", t.tenant, pod);
            continue;
        }
        for d in &t.devices {
            let gpu: String = d.uuid.chars().take(12).collect();
            let _ = writeln!(
                out,
                "{:<24} {:<28} {:<14} {:>10} {:>10} {:>10} {:>6} {:>9}",
                t.tenant,
                pod,
                gpu,
                format_bytes(d.used),
                format_bytes(d.exited),
                d.limit.map_or("unlimited".into(), format_bytes),
                d.denied,
                t.processes.unwrap_or(0)
            );
        }
    }
    out
}
