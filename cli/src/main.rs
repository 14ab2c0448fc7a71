//! The `gpuslice` command line. Each subcommand is a module; arguments are declared with clap, JSON is
//! written with serde. This crate is never linked into the preloaded library, so it uses well-kept
//! crates freely; it reaches ledgers and configuration through the `gpuslice` library crate.

mod compute;
mod demo;
mod doctor;
mod node;
mod observe;
mod run;
mod set;
mod status;
mod tenant;

use clap::{Args, CommandFactory, Parser, Subcommand};
use std::path::PathBuf;

/// `gpuslice --version`: the package version and the commit it was built from (cli/build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("GPUSLICE_COMMIT"),
    ")"
);

/// GPU sharing for unmodified CUDA programs: device-memory quotas and compute shares.
#[derive(Parser)]
#[command(name = "gpuslice", version = VERSION, after_help = AFTER_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

const AFTER_HELP: &str =
    "SIZE: 4GiB, 4096MiB, 4Gi, 4G, 1.5GiB or bytes (all binary units). Environment: see docs/CONFIGURATION.md.";

#[derive(Subcommand)]
enum Command {
    /// Run CMD with libgpuslice.so preloaded and the given quota (exit code and signals pass through).
    Run(run::RunArgs),
    /// Per device: limit, used, peak; the tenant's processes; the compute shares (read-only).
    Status(status::StatusArgs),
    /// Change a running tenant's memory limit, compute share, cap or priority.
    Set(set::SetArgs),
    /// Is the quota enforced for CUDA programs started here, how, and what is misconfigured (exit 1 if not).
    Doctor,
    /// Two tenants share one GPU (simulated by simgpu when no NVIDIA driver is present).
    Demo(demo::DemoArgs),
    /// Serve every tenant's figures as Prometheus metrics on /metrics (docs/OBSERVABILITY.md).
    Exporter(observe::ExporterArgs),
    /// Live view per GPU and tenant: memory against quota, achieved against promised share, waiting.
    Top(observe::TopArgs),
    /// Tenants created by the node (root): create, list, delete.
    #[command(subcommand)]
    Tenant(tenant::TenantCommand),
    /// CDI specs for the node.
    #[command(subcommand)]
    Cdi(tenant::CdiCommand),
    /// Install libgpuslice.so as a versioned file and repoint its symlink atomically.
    InstallLibrary(tenant::InstallArgs),
    /// Kubernetes device plugin: GPUs as slices, a tenant per allocation (root).
    DevicePlugin(tenant::DevicePluginArgs),
    /// Node daemons: driver-memory reconciliation for tenants in containers (root, host PIDs).
    #[command(subcommand)]
    Node(node::NodeCommand),
    /// Print a completion script for SHELL (e.g. `gpuslice completions bash > /etc/bash_completion.d/gpuslice`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// Which tenant ledger a subcommand works on.
#[derive(Args, Clone, Default)]
pub(crate) struct LedgerArgs {
    /// The tenant whose default ledger to use (`<ledger dir>/uid-<uid>/<NAME>.ledger`, docs/CONFIGURATION.md).
    #[arg(long, value_name = "NAME")]
    pub tenant: Option<String>,
    /// The ledger file itself.
    #[arg(long, value_name = "PATH", conflicts_with = "tenant")]
    pub ledger: Option<PathBuf>,
}

impl LedgerArgs {
    /// `--ledger`, else the tenant's default ledger, else the configuration's.
    pub fn path(&self) -> PathBuf {
        if let Some(p) = &self.ledger {
            return p.clone();
        }
        match &self.tenant {
            // The tenant's default ledger, as the library would choose it for a program run with
            // GPUSLICE_TENANT=NAME (and no GPUSLICE_LEDGER).
            Some(t) => {
                let mut cfg = gpuslice_state::config::load_from(
                    &|name| match name {
                        "GPUSLICE_TENANT" => Some(t.clone()),
                        "GPUSLICE_LEDGER" => None,
                        _ => std::env::var(name).ok(),
                    },
                    std::path::Path::new(gpuslice_state::config::DEFAULT_QUOTA_FILE),
                );
                cfg.place_default_ledger();
                cfg.ledger_path
            }
            None => gpuslice_state::config::load().ledger_path,
        }
    }
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => run::run(a),
        Command::Status(a) => status::status(a),
        Command::Set(a) => set::set(a),
        Command::Doctor => doctor::doctor(),
        Command::Demo(a) => demo::demo(a),
        Command::Exporter(a) => observe::exporter(a),
        Command::Top(a) => observe::top(a),
        Command::Tenant(c) => tenant::tenant(c),
        Command::Cdi(c) => tenant::cdi(c),
        Command::InstallLibrary(a) => tenant::install(a),
        Command::DevicePlugin(a) => tenant::device_plugin(a),
        Command::Node(c) => node::node(c),
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "gpuslice",
                &mut std::io::stdout(),
            );
            Ok(0)
        }
    };
    let code = match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("gpuslice: {message}");
            2
        }
    };
    std::process::exit(code);
}
