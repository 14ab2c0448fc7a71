//! `gpuslice set`: live changes to a tenant's memory limit (its ledger) or compute settings (the
//! device ledgers).

use super::compute;
use super::status::limit_text;
use super::LedgerArgs;
use gpuslice_state::config::{parse_size, Units};
use gpuslice_state::ledger::{Ledger, UNLIMITED};
use std::path::PathBuf;

/// `gpuslice set`'s arguments.
#[derive(clap::Args)]
pub(crate) struct SetArgs {
    #[command(flatten)]
    ledger: LedgerArgs,
    /// New memory limit (SIZE or `unlimited`); applies to the tenant's next allocation.
    #[arg(long, value_name = "SIZE")]
    memory: Option<String>,
    /// Only this device: a GPU (or MIG) UUID, or an index in the ledger (memory) / a GPU (or MIG)
    /// UUID (compute).
    #[arg(long, value_name = "GPU-UUID|INDEX")]
    device: Option<String>,
    /// Compute share under contention, percent.
    #[arg(long, value_name = "PCT")]
    share: Option<String>,
    /// Compute cap, percent, or `none`.
    #[arg(long, value_name = "PCT|none")]
    limit: Option<String>,
    /// `high` or `normal`.
    #[arg(long, value_name = "high|normal")]
    priority: Option<String>,
    /// Directory of the device ledgers (default: GPUSLICE_DEVICE_DIR, else the default).
    #[arg(long, value_name = "DIR")]
    device_dir: Option<PathBuf>,
    /// A node's state directory: `--tenant NAME` is then the node-created tenant (root only).
    #[arg(long, value_name = "DIR", requires = "tenant", conflicts_with_all = ["ledger", "device_dir"])]
    state_dir: Option<PathBuf>,
}

pub(crate) fn set(mut a: SetArgs) -> Result<i32, String> {
    if let (Some(state), Some(t)) = (&a.state_dir, &a.ledger.tenant) {
        let layout = gpuslice_node::policy::Layout::new(state);
        a.ledger.ledger = Some(layout.ledger_path(t));
        a.device_dir = Some(layout.devices_dir());
    }
    let memory_bytes = match a.memory.as_deref() {
        Some("unlimited") => Some(UNLIMITED),
        Some(m) => {
            Some(parse_size(m, Units::Gpuslice).map_err(|e| format!("--memory {m:?}: {e}"))?)
        }
        None => None,
    };
    crate::tenant::guard_set(
        &a.ledger.path(),
        memory_bytes,
        a.device.as_deref(),
        a.share.as_deref(),
        a.limit.as_deref(),
        a.priority.as_deref(),
    )?;
    let compute_change = a.share.is_some() || a.limit.is_some() || a.priority.is_some();
    match (&a.memory, compute_change) {
        (Some(_), true) => Err(
            "set: change --memory and the compute settings (--share/--limit/--priority) in two calls"
                .into(),
        ),
        (None, false) => {
            Err("set: nothing to change (--memory SIZE, --share PCT, --limit PCT or --priority)".into())
        }
        (None, true) => compute::set(compute::ComputeChange {
            tenant: a.ledger.tenant.clone(),
            share: a.share.as_deref(),
            limit: a.limit.as_deref(),
            priority: a.priority.as_deref(),
            device: a.device.as_deref(),
            device_dir: a.device_dir.as_deref(),
        }),
        (Some(memory), false) => set_memory(&a.ledger, memory, a.device.as_deref()),
    }
}

fn set_memory(ledger: &LedgerArgs, memory: &str, device: Option<&str>) -> Result<i32, String> {
    let bytes = if memory == "unlimited" {
        UNLIMITED
    } else {
        parse_size(memory, Units::Gpuslice).map_err(|e| format!("--memory {memory:?}: {e}"))?
    };
    let path = ledger.path();
    let ledger = Ledger::open_existing(&path).map_err(|e| e.to_string())?;
    let snap = ledger.snapshot();
    let targets: Vec<usize> = match device {
        None => snap.devices.iter().map(|d| d.index).collect(),
        // A GPU's UUID, or a MIG instance's (`MIG-…`, as the ledger keys it).
        Some(key) if key.starts_with("GPU-") || key.starts_with("MIG-") => {
            vec![ledger
                .device_index(key)
                .ok_or_else(|| format!("--device {key}: not a GPU or MIG UUID"))?]
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
