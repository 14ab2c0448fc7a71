//! `gpuslice run`: the environment of a tenant, `LD_PRELOAD`, then exec.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;

/// Where libgpuslice.so is: `GPUSLICE_LIBRARY`, beside this executable, or the install locations.
pub(crate) fn library_path() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("GPUSLICE_LIBRARY") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate this executable: {e}"))?;
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    let candidates = [
        dir.join("libgpuslice.so"),
        dir.join("../lib/gpuslice/libgpuslice.so"),
        dir.join("../lib/libgpuslice.so"),
        PathBuf::from("/usr/lib/gpuslice/libgpuslice.so"),
    ];
    candidates
        .iter()
        .find(|p| p.exists())
        .map(|p| p.canonicalize().unwrap_or_else(|_| p.clone()))
        .ok_or_else(|| {
            format!(
                "libgpuslice.so not found beside {} (set GPUSLICE_LIBRARY)",
                exe.display()
            )
        })
}

/// `gpuslice run`'s arguments.
#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// Device-memory quota (GPUSLICE_MEMORY_LIMIT): SIZE, or per device `0=4GiB,GPU-<uuid>=2GiB`.
    #[arg(long, value_name = "SIZE")]
    memory: Option<String>,
    /// Tenant name (GPUSLICE_TENANT).
    #[arg(long, value_name = "NAME")]
    tenant: Option<String>,
    /// Ledger file (GPUSLICE_LEDGER).
    #[arg(long, value_name = "PATH")]
    ledger: Option<PathBuf>,
    /// Guaranteed share of GPU time under contention, percent (GPUSLICE_COMPUTE_SHARE).
    #[arg(long, value_name = "PCT")]
    share: Option<String>,
    /// Hard cap on GPU time, percent (GPUSLICE_COMPUTE_LIMIT).
    #[arg(long, value_name = "PCT")]
    limit: Option<String>,
    /// `high` for latency-sensitive work (GPUSLICE_PRIORITY).
    #[arg(long, value_name = "high|normal")]
    priority: Option<String>,
    /// The program and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    command: Vec<String>,
}

/// A program joining an existing ledger obeys that ledger's limits, not its own: `--memory` would
/// be a promise `run` cannot keep. Refused, naming the ledger and its larger limit, when the ledger
/// the program would join (the library's own choice of path, from the same settings) exists with a
/// limit above what `--memory` asks for on any device.
fn refuse_larger_ledger(a: &RunArgs, memory: &str) -> Result<(), String> {
    use gpuslice_state::config::{format_bytes, Setting};
    let env = |name: &str| -> Option<String> {
        match name {
            "GPUSLICE_MEMORY_LIMIT" => Some(memory.to_string()),
            "GPUSLICE_TENANT" if a.tenant.is_some() => a.tenant.clone(),
            "GPUSLICE_LEDGER" if a.ledger.is_some() => {
                a.ledger.as_ref().map(|p| p.display().to_string())
            }
            _ => std::env::var(name).ok(),
        }
    };
    let cfg = gpuslice_state::config::load_from(
        &env,
        std::path::Path::new(gpuslice_state::config::DEFAULT_QUOTA_FILE),
    );
    if cfg.policy.is_some() {
        // A node tenant: the node's policy rules, and the library says so itself.
        return Ok(());
    }
    let Ok(ledger) = gpuslice_state::ledger::Ledger::open_readonly(&cfg.ledger_path) else {
        return Ok(());
    };
    let snap = ledger.snapshot();
    let shown = |l: u64| {
        if l == gpuslice_state::ledger::UNLIMITED {
            "no limit".to_string()
        } else {
            format_bytes(l)
        }
    };
    let mut larger = Vec::new();
    for d in &snap.devices {
        if let Setting::Value(want) = cfg.memory.get(u32::MAX, &d.uuid) {
            if d.limit > want {
                larger.push(format!(
                    "{} on {} (asked: {})",
                    shown(d.limit),
                    d.uuid,
                    format_bytes(want)
                ));
            }
        }
    }
    if let Setting::Value(want) = cfg.memory.get_default() {
        if snap.default_limit > want {
            larger.push(format!(
                "{} on devices it has not seen yet (asked: {})",
                shown(snap.default_limit),
                format_bytes(want)
            ));
        }
    }
    if larger.is_empty() {
        return Ok(());
    }
    Err(format!(
        "--memory {memory:?}: the ledger {} (tenant {:?}) already exists with a larger limit: {}; \
         a program joining it obeys the ledger's limits, not --memory. Name another tenant \
         (--tenant) or ledger (--ledger), or lower the ledger's limit first (gpuslice set --ledger {} --memory {memory})",
        cfg.ledger_path.display(),
        snap.tenant,
        larger.join(", "),
        cfg.ledger_path.display()
    ))
}

pub(crate) fn run(a: RunArgs) -> Result<i32, String> {
    let Some((program, program_args)) = a.command.split_first() else {
        return Err("run: no command given (gpuslice run --memory 4GiB -- CMD ARGS...)".into());
    };
    let library = library_path()?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(program_args);
    if let Some(m) = &a.memory {
        // The library's own parser judges the value, so `run` accepts exactly what a program would.
        let cfg = gpuslice_state::config::load_from(
            &|name| (name == "GPUSLICE_MEMORY_LIMIT").then(|| m.clone()),
            std::path::Path::new("/nonexistent"),
        );
        if let Some(e) = cfg.errors.first() {
            // The library names the variable; here the value came from --memory.
            let reason = e.split_once("\": ").map_or(e.as_str(), |(_, r)| r);
            return Err(format!("--memory {m:?}: {reason}"));
        }
        cmd.env("GPUSLICE_MEMORY_LIMIT", m);
        refuse_larger_ledger(&a, m)?;
    }
    if let Some(l) = &a.ledger {
        cmd.env("GPUSLICE_LEDGER", l);
    }
    for (value, var) in [
        (&a.tenant, "GPUSLICE_TENANT"),
        (&a.share, "GPUSLICE_COMPUTE_SHARE"),
        (&a.limit, "GPUSLICE_COMPUTE_LIMIT"),
        (&a.priority, "GPUSLICE_PRIORITY"),
    ] {
        if let Some(v) = value {
            cmd.env(var, v);
        }
    }
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(existing) if !existing.is_empty() => format!("{}:{existing}", library.display()),
        _ => library.display().to_string(),
    };
    cmd.env("LD_PRELOAD", preload);
    // exec: the program replaces us, so its exit status and signals are the caller's to see.
    let err = cmd.exec();
    Err(format!("cannot run {program:?}: {err}"))
}
