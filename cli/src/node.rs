//! `gpuslice node ...`: node daemons that are neither the device plugin nor the exporter.

use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Subcommand)]
pub(crate) enum NodeCommand {
    /// Publish each tenant process's driver memory (NVML, by host PID) into its ledger slot, so that
    /// processes in containers reconcile their driver overhead; report processes using a GPU under
    /// no tenant (<state>/reconcile/unmanaged). Root with host PIDs (docs/MEMORY.md).
    Reconcile(ReconcileArgs),
}

#[derive(clap::Args)]
pub(crate) struct ReconcileArgs {
    #[command(flatten)]
    sources: crate::observe::SourceArgs,
    /// Milliseconds between passes.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    interval_ms: u64,
    /// The initial PID namespace's /proc (the driver's PIDs name its entries).
    #[arg(long, value_name = "DIR", default_value = "/proc")]
    proc: PathBuf,
    /// One pass, then exit (status 2 if it failed).
    #[arg(long)]
    once: bool,
    /// Log format: text or json (timestamps and levels in both).
    #[arg(long, value_name = "FORMAT", default_value = "text")]
    log_format: gpuslice_node::plugin::LogFormat,
    /// Log level or filter: error, warn, info, debug, trace.
    #[arg(long, value_name = "LEVEL", default_value = "info")]
    log_level: String,
}

pub(crate) fn node(c: NodeCommand) -> Result<i32, String> {
    match c {
        NodeCommand::Reconcile(a) => {
            gpuslice_node::plugin::init_logging(a.log_format, &a.log_level)?;
            if a.interval_ms == 0 {
                return Err("--interval-ms 0: give at least 1".into());
            }
            let opts = gpuslice_node::reconcile::Options {
                sources: a.sources.sources(),
                proc_root: a.proc,
            };
            gpuslice_node::reconcile::run(&opts, Duration::from_millis(a.interval_ms), a.once)?;
            Ok(0)
        }
    }
}
