//! `gpuslice doctor`: whether a CUDA program started in this environment would have its quota
//! enforced, how (preloaded library, drop-in library, neither), with which real driver and ledger, and
//! what is misconfigured, in plain words. Exit code 0 only when enforcement would happen and nothing is
//! wrong.
//!
//! What gets loaded is not guessed from variables: `gpuslice-probe` (installed beside this binary, and
//! linked without gpuslice, unlike this binary) is started under the caller's environment, opens
//! `libcuda.so.1` and `libnvidia-ml.so.1` as CUDA programs do and reports what the loader gave it.
//! The configuration, quota file and ledger are checked here with the library's own parsers.

use gpuslice_state::config::{self, format_bytes, Config};
use gpuslice_state::ledger::Ledger;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the probe saw.
#[derive(Default, Debug)]
struct Probe {
    preloaded: Vec<String>,
    kv: BTreeMap<String, Vec<String>>,
    messages: Vec<String>,
}

impl Probe {
    fn get(&self, key: &str) -> Option<&str> {
        self.kv.get(key).and_then(|v| v.last()).map(String::as_str)
    }
    fn all(&self, key: &str) -> &[String] {
        self.kv.get(key).map(Vec::as_slice).unwrap_or(&[])
    }
}

fn probe_binary() -> Result<PathBuf, String> {
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find this program's path: {e}"))?;
    let probe = exe.with_file_name("gpuslice-probe");
    if probe.exists() {
        Ok(probe)
    } else {
        Err(format!(
            "{} is missing (it is installed beside gpuslice)",
            probe.display()
        ))
    }
}

fn run_probe() -> Result<Probe, String> {
    let bin = probe_binary()?;
    let out = Command::new(&bin)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut probe = Probe::default();
    for line in stdout.lines() {
        if let Some((k, v)) = line.split_once('=') {
            if k == "preloaded" {
                probe.preloaded.push(v.to_owned());
            }
            probe.kv.entry(k.to_owned()).or_default().push(v.to_owned());
        }
    }
    probe.messages = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("gpuslice:"))
        .map(str::to_owned)
        .collect();
    if probe.get("done") != Some("1") {
        return Err(format!(
            "{} did not finish ({}); a program started here may crash when it loads the driver:\n{}",
            bin.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(probe)
}

/// Entries of LD_PRELOAD or /etc/ld.so.preload (separated by spaces or colons) that are not there.
fn missing_preloads(list: &str) -> Vec<String> {
    list.split([' ', ':', '\n', '\t'])
        .filter(|e| !e.is_empty())
        .filter(|e| e.contains('/') && !Path::new(e).exists())
        .map(str::to_owned)
        .collect()
}

/// Whether this user may write `path`, or create it (its nearest existing ancestor is writable).
fn writable(path: &Path) -> bool {
    let mut p = path.to_path_buf();
    loop {
        if p.exists() {
            let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else {
                return false;
            };
            // SAFETY: `c` is a NUL-terminated path; access only inspects it.
            return unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0;
        }
        if !p.pop() {
            return false;
        }
    }
}

/// What the library would make of the ledger at `path`: (state shown, a problem if it could not
/// use it). The same join as the library's (owner, type, header, DAMAGED), without claiming a slot.
fn ledger_check(
    path: &Path,
    meta: std::io::Result<std::fs::Metadata>,
    configured: bool,
) -> (String, Option<String>) {
    let refused = "every allocation would be refused";
    match meta {
        Ok(_) => match Ledger::open_existing(path) {
            Ok(_) => ("exists, valid, usable by this user".into(), None),
            Err(e) => ("unusable".into(), Some(format!("{e}: {refused}"))),
        },
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => (
            "unusable".into(),
            Some(format!("ledger {}: {e}: {refused}", path.display())),
        ),
        Err(_) if writable(path) => ("created by the first CUDA program".into(), None),
        Err(_) => (
            "cannot be created".into(),
            configured.then(|| {
                format!(
                    "the ledger {} cannot be created by this user: {refused}",
                    path.display()
                )
            }),
        ),
    }
}

/// Whether the device ledgers in `dir` (compute shares) can be created or joined by this user: each
/// reason they cannot is a problem when compute settings are configured, or a ledger is there.
/// `node_created`: the node creates the device ledgers (a node policy names the directory), so the
/// directory itself need not be writable, only the ledgers in it.
fn device_dir_check(
    dir: &Path,
    compute_configured: bool,
    node_created: bool,
) -> (String, Vec<String>) {
    let unenforced = "compute shares would not be enforced for programs started here";
    let meta = match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return if writable(dir) {
                (
                    "created by the first CUDA program that launches".into(),
                    vec![],
                )
            } else if compute_configured {
                (
                    "cannot be created".into(),
                    vec![format!(
                        "the device ledger directory {} cannot be created by this user: {unenforced}",
                        dir.display()
                    )],
                )
            } else {
                ("cannot be created".into(), vec![])
            };
        }
        Err(e) => {
            return (
                "unusable".into(),
                vec![format!(
                    "device ledger directory {}: {e}: {unenforced}",
                    dir.display()
                )],
            )
        }
        Ok(m) => m,
    };
    if !meta.is_dir() {
        return (
            "unusable".into(),
            vec![format!(
                "device ledger directory {} is not a directory: {unenforced}",
                dir.display()
            )],
        );
    }
    let mut problems = Vec::new();
    if compute_configured && !node_created && !writable(dir) {
        problems.push(format!(
            "device ledger directory {} is not writable by this user: {unenforced}",
            dir.display()
        ));
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            problems.push(format!(
                "device ledger directory {}: {e}: {unenforced}",
                dir.display()
            ));
            return ("unusable".into(), problems);
        }
    };
    let mut count = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().map_or(true, |e| e != "dev") {
            continue;
        }
        count += 1;
        if let Err(e) = gpuslice_state::compute::device::DeviceLedger::open(&path, "", false) {
            problems.push(format!(
                "{e}: compute shares would not be enforced on that GPU"
            ));
        }
    }
    let state = if problems.is_empty() {
        format!("{count} device ledger(s), usable")
    } else {
        "NOT usable".into()
    };
    (state, problems)
}

/// The top-level keys of a quota file (and `[devices]` when it has that table), for the settings
/// report; the file itself is parsed by the library (`cfg.errors` says what is wrong with it).
fn quota_file_keys(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut keys = Vec::new();
    let mut in_table = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_table = true;
            keys.push(line.split('#').next().unwrap_or("").trim().to_owned());
        } else if let (false, Some((k, _))) = (in_table, line.split_once('=')) {
            if !k.trim_start().starts_with('#') {
                keys.push(k.trim().to_owned());
            }
        }
    }
    keys
}

fn describe_limits(cfg: &Config) -> String {
    let mut parts = Vec::new();
    let show = |v: &Result<u64, String>| match v {
        Ok(b) => format_bytes(*b),
        Err(e) => format!("invalid ({e})"),
    };
    if let Some(all) = &cfg.memory.all {
        parts.push(format!("{} per device", show(all)));
    }
    for (i, v) in &cfg.memory.by_index {
        parts.push(format!("device {i}: {}", show(v)));
    }
    for (u, v) in &cfg.memory.by_uuid {
        parts.push(format!("{u}: {}", show(v)));
    }
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

/// A node's pass older than this does not count as reconciling (the node stopped).
const NODE_PASS_FRESH_MS: u64 = 30_000;

/// How a program started here knows the driver memory it is charged (docs/MEMORY.md): from its
/// own line in NVML's lists (the host's PID namespace), from the node's word (a node's
/// reconciliation went through the ledger lately), else estimated. The note when estimated.
fn driver_memory_check(ledger: &std::path::Path) -> (String, Option<String>) {
    let me = std::process::id();
    let seen = std::fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str().and_then(|s| s.parse::<u32>().ok()));
    let initial = std::fs::read_link("/proc/self/ns/pid")
        .map_or(true, |ns| ns.to_str() == Some("pid:[4026531836]"));
    if seen.map_or(true, |p| p == me) && initial {
        return (
            "reconciled from each process's own NVML figure (the host's PID namespace)".into(),
            None,
        );
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let pass = gpuslice_state::ledger::Ledger::open_readonly(ledger)
        .ok()
        .and_then(|l| l.snapshot().node_ms);
    match pass {
        Some(ms) if now.saturating_sub(ms) <= NODE_PASS_FRESH_MS => (
            format!(
                "reconciled by the node (its last pass through the ledger {:.1} s ago)",
                now.saturating_sub(ms) as f64 / 1000.0
            ),
            None,
        ),
        _ => (
            "estimated, not reconciled".into(),
            Some(
                "driver memory is estimated, not reconciled: this environment has a PID namespace of \
                 its own (NVML lists host PIDs, so a program cannot find its own figure) and no node \
                 reconciliation (`gpuslice node reconcile`) has gone through the ledger in the last \
                 30 s: memory the driver spends outside the calls gpuslice measures (code loaded at \
                 a kernel's first launch, caches) is not charged (docs/MEMORY.md)"
                    .into(),
            ),
        ),
    }
}

pub fn doctor() -> Result<i32, String> {
    let mut problems: Vec<String> = Vec::new();
    let mut notes: Vec<String> = Vec::new();

    // What a program started here would load.
    let probe = match run_probe() {
        Ok(p) => p,
        Err(e) => {
            problems.push(e);
            Probe::default()
        }
    };
    let ld_preload = std::env::var("LD_PRELOAD").unwrap_or_default();
    for m in missing_preloads(&ld_preload) {
        problems.push(format!(
            "LD_PRELOAD names {m}, which does not exist (the loader skips it with a warning)"
        ));
    }
    if let Ok(text) = std::fs::read_to_string("/etc/ld.so.preload") {
        for m in missing_preloads(&text) {
            problems.push(format!(
                "/etc/ld.so.preload names {m}, which does not exist"
            ));
        }
    }
    let preloaded = probe.preloaded.first().cloned();
    let cuda_dropin = probe.get("cuda_gpuslice") == Some("1");
    let nvml_dropin = probe.get("nvml_gpuslice") == Some("2");
    let cuda_path = probe.get("cuda_path").map(str::to_owned);
    let cuda_real = probe.all("cuda_real").first().cloned();
    let nvml_real = probe.all("nvml_real").first().cloned();

    println!("gpuslice doctor: what a CUDA program started in this environment gets");
    match &preloaded {
        Some(p) => println!("  preloaded library: {p}"),
        None => println!(
            "  preloaded library: none (LD_PRELOAD {})",
            if ld_preload.is_empty() {
                "is not set".to_owned()
            } else {
                format!("= {ld_preload:?} holds no gpuslice library")
            }
        ),
    }
    match (&cuda_path, cuda_dropin) {
        (Some(p), true) => println!("  libcuda.so.1: {p} (gpuslice drop-in library)"),
        (Some(p), false) => println!("  libcuda.so.1: {p} (the driver itself)"),
        (None, _) => println!(
            "  libcuda.so.1: not found ({})",
            probe.get("cuda_error").unwrap_or("probe failed")
        ),
    }
    match &cuda_real {
        Some(p) => println!(
            "  real CUDA driver: {p} ({})",
            probe.get("cuda_call").unwrap_or("")
        ),
        None => println!("  real CUDA driver: not found"),
    }
    match (probe.get("nvml_path"), nvml_dropin) {
        (Some(p), true) => println!("  libnvidia-ml.so.1: {p} (gpuslice drop-in library)"),
        (Some(p), false) => println!("  libnvidia-ml.so.1: {p} (NVIDIA's library itself)"),
        (None, _) => println!("  libnvidia-ml.so.1: not found"),
    }
    if let Some(p) = &nvml_real {
        println!("  real NVML: {p}");
    }

    // The configuration, as the library reads it.
    let cfg = config::load();
    problems.extend(cfg.problem_lines());
    notes.extend(cfg.note_lines());
    if let Ok(q) = std::env::var("GPUSLICE_QUOTA_FILE") {
        if std::fs::File::open(&q).is_err() {
            problems.push(format!(
                "GPUSLICE_QUOTA_FILE={q} cannot be read by this user"
            ));
        }
    }
    let ledger_meta = std::fs::symlink_metadata(&cfg.ledger_path);
    let ledger_exists = ledger_meta.is_ok();
    let configured = cfg.is_configured() || ledger_exists;
    println!("  tenant: {}", cfg.tenant);
    println!("  memory quota: {}", describe_limits(&cfg));
    if let Some(q) = &cfg.quota_file {
        println!("  quota file: {}", q.display());
    }
    if let Some(p) = &cfg.policy {
        println!(
            "  node policy: {} (read-only; {} on {}, share {}%, cap {}, priority {}; this environment can only lower it)",
            p.path.display(),
            format_bytes(p.memory),
            if p.gpus.is_empty() {
                "every GPU".to_string()
            } else {
                p.gpus.join(", ")
            },
            p.share,
            if p.limit == 0 {
                "none".to_string()
            } else {
                format!("{}%", p.limit)
            },
            if p.priority == config::Priority::High {
                "high"
            } else {
                "normal"
            }
        );
        println!("  device ledgers: {}", p.device_dir.display());
    }
    let (ledger_state, problem) = ledger_check(&cfg.ledger_path, ledger_meta, configured);
    problems.extend(problem);
    println!("  ledger: {} ({ledger_state})", cfg.ledger_path.display());
    // Where each setting comes from (the first of its sources that is set: config::table).
    let keys = cfg
        .quota_file
        .as_deref()
        .map(quota_file_keys)
        .unwrap_or_default();
    for line in config::table::report(&|name| std::env::var(name).ok(), &keys) {
        println!("  setting {line}");
    }
    let compute_configured = cfg.compute_share.is_set()
        || cfg.compute_limit.is_set()
        || cfg.priority != config::Setting::Unset;
    let dir = gpuslice_state::compute::device_dir();
    let (device_state, device_problems) =
        device_dir_check(&dir, compute_configured, cfg.policy.is_some());
    problems.extend(device_problems);
    println!("  device ledgers: {} ({device_state})", dir.display());
    let (driver_memory, estimated) = driver_memory_check(&cfg.ledger_path);
    println!("  driver memory: {driver_memory}");
    notes.extend(estimated);
    for m in &probe.messages {
        notes.push(format!("the library says: {m}"));
    }

    // The verdict.
    let how = match (&preloaded, cuda_dropin) {
        (Some(_), true) => Some(
            "drop-in libcuda.so.1 (the preloaded library defers to it, nothing is counted twice)",
        ),
        (Some(_), false) => Some("preloaded library (LD_PRELOAD or /etc/ld.so.preload)"),
        (None, true) => Some("drop-in libcuda.so.1 on the library path"),
        (None, false) => None,
    };
    if how.is_none() {
        match &cuda_path {
            Some(p) => problems.push(format!(
                "libcuda.so.1 on the library path is the real driver ({p}) and no gpuslice library is \
                 preloaded: CUDA programs here reach the driver directly (set LD_PRELOAD to libgpuslice.so, \
                 or put the drop-in libraries first on the library path; see docs/DEPLOYMENT.md)"
            )),
            None => problems.push(
                "no gpuslice library is preloaded and no libcuda.so.1 is on the library path".into(),
            ),
        }
    }
    if how.is_some() && cuda_real.is_none() {
        problems.push(
            "gpuslice found no real CUDA driver: every CUDA call would fail (set GPUSLICE_REAL_LIBCUDA to \
             the driver's libcuda.so.1)"
                .into(),
        );
    }
    if !configured {
        problems.push(
            "no quota is configured (no GPUSLICE_MEMORY_LIMIT, no quota file, no ledger): gpuslice is \
             transparent and limits nothing"
                .into(),
        );
    }
    let active = how.is_some() && cuda_real.is_some() && configured;
    match (active, how) {
        (true, Some(how)) if problems.is_empty() => println!("enforcement: ACTIVE via {how}"),
        (true, Some(how)) => println!(
            "enforcement: ACTIVE via {how}, but NOT WORKING as configured: {} problem(s) below",
            problems.len()
        ),
        _ => println!("enforcement: NOT ACTIVE"),
    }
    for n in &notes {
        println!("note: {n}");
    }
    for p in &problems {
        println!("problem: {p}");
    }
    Ok(if active && problems.is_empty() { 0 } else { 1 })
}
