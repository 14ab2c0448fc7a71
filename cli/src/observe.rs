//! `gpuslice exporter` and `gpuslice top` (crate `gpuslice-observe`): their arguments.

use gpuslice_observe::Sources;
use std::path::PathBuf;
use std::time::Duration;

/// Where the ledgers are (the node's layout: docs/DEPLOYMENT.md).
#[derive(clap::Args)]
pub(crate) struct SourceArgs {
    /// The node's state directory (node tenants: <DIR>/tenants/<NAME>/) [default: /run/gpuslice].
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Directory of other tenants' ledgers (*.ledger) [default: GPUSLICE_LEDGER_DIR, else /dev/shm/gpuslice].
    #[arg(long, value_name = "DIR")]
    ledger_dir: Option<PathBuf>,
    /// Directory of the device ledgers [default: <state>/devices if it exists, else
    /// GPUSLICE_DEVICE_DIR, else <ledger dir>/devices].
    #[arg(long, value_name = "DIR")]
    device_dir: Option<PathBuf>,
}

impl SourceArgs {
    pub(crate) fn sources(self) -> Sources {
        Sources::new(self.state_dir, self.ledger_dir, self.device_dir)
    }
}

#[derive(clap::Args)]
pub(crate) struct ExporterArgs {
    /// Address to serve /metrics on (port 0: any free port; the address is printed).
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:9842")]
    listen: String,
    #[command(flatten)]
    sources: SourceArgs,
}

#[derive(clap::Args)]
pub(crate) struct TopArgs {
    /// Print one view and exit.
    #[arg(long)]
    once: bool,
    /// Seconds between refreshes.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    interval: f64,
    #[command(flatten)]
    sources: SourceArgs,
}

pub(crate) fn exporter(a: ExporterArgs) -> Result<i32, String> {
    gpuslice_observe::exporter::serve(&a.listen, a.sources.sources())?;
    Ok(0)
}

pub(crate) fn top(a: TopArgs) -> Result<i32, String> {
    if !(a.interval.is_finite() && (0.1..=3600.0).contains(&a.interval)) {
        return Err(format!(
            "--interval {}: expected seconds between 0.1 and 3600",
            a.interval
        ));
    }
    gpuslice_observe::top::run(
        &a.sources.sources(),
        Duration::from_secs_f64(a.interval),
        a.once,
    )?;
    Ok(0)
}
