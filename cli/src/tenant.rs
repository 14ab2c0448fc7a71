//! `gpuslice tenant create|list|delete`, `gpuslice cdi generate`, `gpuslice install-library`: the node
//! side (crate `gpuslice-node`). docs/KUBERNETES.md describes the layout and who may write what.

use clap::{Args, Subcommand};
use gpuslice_node::cdi;
use gpuslice_node::policy::{Created, Layout, Priority, DEFAULT_STATE_DIR};
use gpuslice_node::tenant::{self, Node, Request};
use gpuslice_state::config::{format_bytes, parse_size, Units};
use std::path::{Path, PathBuf};

/// The node's directories.
#[derive(Args, Clone)]
pub(crate) struct NodeArgs {
    /// State directory (tenants' policies and ledgers, device ledgers).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// CDI spec directory.
    #[arg(long, value_name = "DIR", default_value = cdi::DEFAULT_CDI_DIR)]
    pub cdi_dir: PathBuf,
    /// The installed library (host path; its symlink target is what containers mount).
    #[arg(long, value_name = "PATH", default_value = cdi::DEFAULT_LIBRARY)]
    pub library: PathBuf,
    /// Leave the groups out of CDI specs (`additionalGids` needs cdiVersion 0.7.0, which older
    /// runtimes refuse); the runtime must then add the tenant's and the device group itself.
    #[arg(long)]
    pub cdi_without_groups: bool,
    /// Directory with `gpuslice` and `gpuslice-probe` to mount at /usr/lib/gpuslice/bin in
    /// containers (for `gpuslice doctor`); a directory of its own, e.g. /usr/local/lib/gpuslice/bin.
    #[arg(long, value_name = "DIR")]
    pub tools: Option<PathBuf>,
}

impl NodeArgs {
    fn node(&self) -> Node {
        Node {
            layout: Layout::new(&self.state_dir),
            cdi_dir: Some(self.cdi_dir.clone()),
            library: self.library.clone(),
            cdi_groups: !self.cdi_without_groups,
            tools: self.tools.clone(),
        }
    }
}

#[derive(Subcommand)]
pub(crate) enum TenantCommand {
    /// Create a tenant (root): its policy, ledger, device-ledger entries and CDI device.
    Create(CreateArgs),
    /// The node's tenants: policy, processes, memory in use.
    List(ListArgs),
    /// Delete a tenant (refused while a process of it is alive, unless --force).
    Delete(DeleteArgs),
}

#[derive(Args)]
pub(crate) struct CreateArgs {
    /// Tenant name (A-Za-z0-9._-, at most 64).
    name: String,
    /// Device memory on each of its GPUs (SIZE).
    #[arg(long, value_name = "SIZE")]
    memory: String,
    /// Compute share under contention, percent 1..=100.
    #[arg(long, value_name = "PCT", default_value_t = 10)]
    share: u8,
    /// Compute cap, percent (0: none).
    #[arg(long, value_name = "PCT", default_value_t = 0)]
    limit: u8,
    /// `high` or `normal`.
    #[arg(long, value_name = "high|normal", default_value = "normal")]
    priority: String,
    /// A GPU (UUID or NVML index); repeat for several; default: every GPU.
    #[arg(long = "gpu", value_name = "UUID|INDEX")]
    gpus: Vec<String>,
    /// Allow quotas summing past a GPU's memory and shares summing past 100% (refused otherwise).
    #[arg(long)]
    overcommit: bool,
    #[command(flatten)]
    node: NodeArgs,
}

#[derive(Args)]
pub(crate) struct ListArgs {
    /// One JSON document.
    #[arg(long)]
    json: bool,
    /// State directory.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
}

#[derive(Args)]
pub(crate) struct DeleteArgs {
    name: String,
    /// Delete even while processes of the tenant are alive.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    node: NodeArgs,
}

#[derive(Subcommand)]
pub(crate) enum CdiCommand {
    /// Write the node-wide CDI spec (library, /etc/ld.so.preload, device ledgers).
    Generate {
        /// Where to write it.
        #[arg(long, value_name = "FILE")]
        output: PathBuf,
        #[command(flatten)]
        node: NodeArgs,
    },
}

fn require_root(what: &str) -> Result<(), String> {
    // SAFETY: no arguments; cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(format!(
            "{what}: must be run as root (the node owns tenants' policies)"
        ));
    }
    Ok(())
}

pub(crate) fn tenant(cmd: TenantCommand) -> Result<i32, String> {
    match cmd {
        TenantCommand::Create(a) => create(a),
        TenantCommand::List(a) => list(a),
        TenantCommand::Delete(a) => {
            require_root("tenant delete")?;
            tenant::delete(&a.node.node(), &a.name, a.force)?;
            println!("tenant {} deleted", a.name);
            Ok(0)
        }
    }
}

fn create(a: CreateArgs) -> Result<i32, String> {
    require_root("tenant create")?;
    let memory = parse_size(&a.memory, Units::Gpuslice)
        .map_err(|e| format!("--memory {:?}: {e}", a.memory))?;
    let priority = match a.priority.as_str() {
        "high" => Priority::High,
        "normal" => Priority::Normal,
        v => return Err(format!("--priority {v:?}: expected high or normal")),
    };
    let gpus = gpuslice_node::nvml::gpus()?;
    let req = Request {
        name: a.name,
        memory,
        share: a.share,
        limit: a.limit,
        priority,
        gpus: a.gpus,
        created: Created::Cli,
        kubernetes: None,
    };
    let t = tenant::create_with(&a.node.node(), &req, &gpus, a.overcommit)?;
    println!(
        "tenant {} created: {} on {}, share {}%, gid {}, CDI device {}{}",
        t.policy.name,
        format_bytes(t.policy.memory),
        if t.policy.gpus.is_empty() {
            "every GPU".to_string()
        } else {
            t.policy.gpus.join(", ")
        },
        t.policy.share,
        t.gid,
        t.cdi_device,
        t.cdi_spec
            .as_ref()
            .map(|p| format!(" ({})", p.display()))
            .unwrap_or_default()
    );
    Ok(0)
}

fn list(a: ListArgs) -> Result<i32, String> {
    let layout = Layout::new(&a.state_dir);
    let tenants = tenant::list(&layout)?;
    if a.json {
        #[derive(serde::Serialize)]
        struct Doc<'a> {
            state_dir: &'a Path,
            tenants: &'a [tenant::Listed],
        }
        let doc = Doc {
            state_dir: &a.state_dir,
            tenants: &tenants,
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?
        );
        return Ok(0);
    }
    println!(
        "{:<20} {:>12} {:>6} {:>6} {:>8} {:>9}  gpus",
        "tenant", "memory", "share", "cap", "priority", "processes"
    );
    for t in &tenants {
        match &t.policy {
            Some(p) => println!(
                "{:<20} {:>12} {:>5}% {:>6} {:>8} {:>9}  {}",
                t.name,
                format_bytes(p.memory),
                p.share,
                if p.limit == 0 {
                    "-".into()
                } else {
                    format!("{}%", p.limit)
                },
                if p.priority == Priority::High {
                    "high"
                } else {
                    "normal"
                },
                t.processes,
                if p.gpus.is_empty() {
                    "all".into()
                } else {
                    p.gpus.join(",")
                }
            ),
            None => println!(
                "{:<20} {}",
                t.name,
                t.error.as_deref().unwrap_or("unreadable policy")
            ),
        }
    }
    Ok(0)
}

pub(crate) fn cdi(cmd: CdiCommand) -> Result<i32, String> {
    match cmd {
        CdiCommand::Generate { output, node } => {
            let node = node.node();
            cdi::write_preload(&node.layout.state)?;
            let spec = cdi::node_spec(&node);
            let dir = output.parent().unwrap_or(Path::new("."));
            let file = output
                .file_name()
                .ok_or_else(|| format!("--output {}: not a file path", output.display()))?;
            let path = cdi::write_spec(dir, &file.to_string_lossy(), &spec)?;
            println!("{}", path.display());
            Ok(0)
        }
    }
}

/// `gpuslice install-library FILE [--dir DIR]`.
#[derive(Args)]
pub(crate) struct InstallArgs {
    /// The built libgpuslice.so.
    file: PathBuf,
    /// Directory of the installed library (its `libgpuslice.so` symlink is replaced atomically).
    #[arg(long, value_name = "DIR", default_value = "/usr/local/lib/gpuslice")]
    dir: PathBuf,
}

pub(crate) fn install(a: InstallArgs) -> Result<i32, String> {
    let v = cdi::install_library(&a.file, &a.dir)?;
    println!("{}", v.display());
    Ok(0)
}

/// `gpuslice set` on a tenant the node created: root only; root's change is written to its policy
/// too (the policy bounds what the tenant's processes obey).
pub(crate) fn guard_set(
    ledger: &Path,
    memory: Option<u64>,
    device: Option<&str>,
    share: Option<&str>,
    limit: Option<&str>,
    priority: Option<&str>,
) -> Result<(), String> {
    let Some(dir) = ledger.parent() else {
        return Ok(());
    };
    let path = dir.join("policy.toml");
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(());
    }
    // SAFETY: no arguments; cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(format!(
            "set: the tenant of {} was created by the node (policy {}): only root on the node can change its limits",
            ledger.display(),
            path.display()
        ));
    }
    if memory.is_some() && device.is_some() {
        return Err(
            "set: a node-created tenant has one memory size for all its GPUs (drop --device)"
                .into(),
        );
    }
    let pct = |v: &str| v.trim_end_matches('%').parse::<u8>().ok();
    tenant::change_policy(ledger, |p| {
        if let Some(m) = memory {
            p.memory = m;
        }
        if let Some(s) = share.and_then(pct) {
            p.share = s.clamp(1, 100);
        }
        match limit {
            Some("none") => p.limit = 0,
            Some(v) => p.limit = pct(v).unwrap_or(p.limit).min(100),
            None => {}
        }
        match priority {
            Some("high") => p.priority = Priority::High,
            Some("normal") => p.priority = Priority::Normal,
            _ => {}
        }
    })
}

/// `gpuslice device-plugin`.
#[derive(Args)]
pub(crate) struct DevicePluginArgs {
    /// The kubelet's device-plugin directory (its registration socket and ours).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/kubelet/device-plugins"
    )]
    kubelet_dir: PathBuf,
    #[command(flatten)]
    node: NodeArgs,
    /// Slices offered per GPU (each 1/N of its GPU's memory and compute); default 10.
    #[arg(long, value_name = "N", conflicts_with = "slice_memory")]
    slices: Option<u32>,
    /// A slice is SIZE of memory on every GPU (as many slices as fit; compute share proportional
    /// to SIZE over the GPU's memory), e.g. 4GiB.
    #[arg(long, value_name = "SIZE")]
    slice_memory: Option<String>,
    /// The extended resource pods request.
    #[arg(long, value_name = "NAME", default_value = "gpuslice.io/slice")]
    resource: String,
    /// The kubelet's PodResources socket (tenants of pods that are gone are removed; GPUs also
    /// allocated through --nvidia-resource are reported).
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/var/lib/kubelet/pod-resources/kubelet.sock"
    )]
    pod_resources_socket: PathBuf,
    /// Seconds between PodResources and health checks (a gone pod's tenant goes after two).
    #[arg(long, value_name = "S", default_value_t = 5)]
    sweep_seconds: u64,
    /// Name NVIDIA's CDI device for the GPU (`nvidia.com/gpu=<UUID>`) in Allocate answers: auto
    /// (when NVIDIA's CDI spec is in a --cdi-spec-dir), on, off.
    #[arg(long, value_name = "auto|on|off", default_value = "auto")]
    nvidia_cdi: gpuslice_node::plugin::NvidiaCdi,
    /// Where NVIDIA's CDI spec is looked for (repeatable).
    #[arg(long, value_name = "DIR", default_values = ["/etc/cdi", "/var/run/cdi"])]
    cdi_spec_dir: Vec<PathBuf>,
    /// The GPUs this plugin offers, by UUID or NVML index (comma-separated or repeated); default
    /// all. Give the others to NVIDIA's device plugin.
    #[arg(long, value_name = "GPU,...", value_delimiter = ',')]
    gpus: Vec<String>,
    /// NVIDIA's device-plugin resource, watched for GPUs allocated twice.
    #[arg(long, value_name = "NAME", default_value = "nvidia.com/gpu")]
    nvidia_resource: String,
    /// Seconds an Allocate call may take before it is refused.
    #[arg(long, value_name = "S", default_value_t = 10)]
    allocate_timeout_seconds: u64,
    /// Node Feature Discovery's local features directory (e.g.
    /// /etc/kubernetes/node-feature-discovery/features.d): node labels saying what a slice is.
    #[arg(long, value_name = "DIR")]
    nfd_features_dir: Option<PathBuf>,
    /// Log format: text or json (timestamps and levels in both).
    #[arg(long, value_name = "FORMAT", default_value = "text")]
    log_format: gpuslice_node::plugin::LogFormat,
    /// Log level or filter: error, warn, info, debug, trace.
    #[arg(long, value_name = "LEVEL", default_value = "info")]
    log_level: String,
    /// Hold each Allocate answer back this long after its tenants are created (tests only: lets a
    /// test's kubelet go away mid-call).
    #[arg(long, value_name = "MS", default_value_t = 0, hide = true)]
    allocate_answer_delay_ms: u64,
}

pub(crate) fn device_plugin(a: DevicePluginArgs) -> Result<i32, String> {
    use gpuslice_node::plugin::{self, Config, Slicing};
    plugin::init_logging(a.log_format, &a.log_level)?;
    require_root("device-plugin")?;
    let slicing = match (&a.slice_memory, a.slices) {
        (Some(text), _) => Slicing::Memory(
            gpuslice_state::config::parse_size(text, gpuslice_state::config::Units::Gpuslice)
                .map_err(|e| format!("--slice-memory {text}: {e}"))?,
        ),
        (None, n) => Slicing::Count(n.unwrap_or(10)),
    };
    let mut cfg = Config::new(a.kubelet_dir, a.node.node(), slicing);
    cfg.resource = a.resource;
    cfg.pod_resources_socket = Some(a.pod_resources_socket);
    cfg.sweep_interval = std::time::Duration::from_secs(a.sweep_seconds.max(1));
    cfg.answer_delay = std::time::Duration::from_millis(a.allocate_answer_delay_ms);
    cfg.allocate_timeout = std::time::Duration::from_secs(a.allocate_timeout_seconds.max(1));
    cfg.nvidia_cdi = a.nvidia_cdi;
    cfg.cdi_spec_dirs = a.cdi_spec_dir;
    cfg.own_gpus = a.gpus;
    cfg.nvidia_resource = a.nvidia_resource;
    cfg.features_dir = a.nfd_features_dir;
    plugin::run_blocking(cfg)?;
    Ok(0)
}
