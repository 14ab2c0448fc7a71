//! `gpuslice node reconcile`: the node's side of driver-memory reconciliation (docs/MEMORY.md,
//! "Reconciled by the node") and its report of unmanaged GPU memory (docs/OBSERVABILITY.md).
//!
//! A process in a container cannot find itself in NVML's process lists (the driver lists host
//! PIDs), so it cannot read what the driver really holds for it. The node sees host PIDs: at each
//! pass it lists every GPU's processes (NVML), finds the ledger slot each one holds (its slot lock,
//! `gpuslice_observe::procs`), and writes into that slot the driver memory the process holds beyond
//! its allocations (NVML's figure less what the slot was charged for allocations, read just before
//! and just after NVML: the larger, so the figure is never inflated by an allocation in between).
//! The process then charges what its recorded overhead misses, as it does from its own figure in
//! the host's PID namespace. Processes holding no slot are written to `<state>/reconcile/unmanaged`.
//!
//! Every ledger is the tenant's to write: what is read from it (claims, charges) is only used to
//! compute the word written back into the same ledger, never anywhere else; files are found as the
//! exporter finds them (plain files, no links, owned as they must be) and opened without following
//! a link.

use gpuslice_observe::procs::{self, Descriptors, GpuProcess, Unmanaged};
use gpuslice_observe::Sources;
use gpuslice_state::ledger::{Ledger, NodeWord, MAX_DEVICES, MAX_SLOTS, NODE_NOT_LISTED};
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where a pass looks.
#[derive(Clone, Debug)]
pub struct Options {
    pub sources: Sources,
    /// The `/proc` of the initial PID namespace (the driver's PIDs name its entries).
    pub proc_root: PathBuf,
}

/// What one pass did.
#[derive(Clone, Debug, Default)]
pub struct Pass {
    /// Processes whose ledger slot got the node's word.
    pub reconciled: Vec<(PathBuf, usize, u32)>,
    /// Processes using a GPU under no tenant.
    pub unmanaged: Vec<Unmanaged>,
    /// Listed processes whose descriptors could not be read (host PID, why): neither.
    pub unreadable: Vec<(u32, String)>,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Per active slot: its claim and, per device, what it is charged for allocations (charged less
/// published driver overhead).
type Charges = HashMap<usize, (u64, [u64; MAX_DEVICES])>;

fn charges(ledger: &Ledger) -> Charges {
    let mut out = HashMap::new();
    for slot in 0..MAX_SLOTS {
        let mut per_device = [0u64; MAX_DEVICES];
        let mut claim = None;
        for (dev, alloc) in per_device.iter_mut().enumerate() {
            if let Some((c, used, overhead)) = ledger.slot_charges(slot, dev) {
                claim = Some(c);
                *alloc = used.saturating_sub(overhead);
            }
        }
        if let Some(c) = claim {
            out.insert(slot, (c, per_device));
        }
    }
    out
}

/// One pass: reads the ledgers and NVML, writes every listed tenant process's word and the
/// report of unmanaged processes.
pub fn pass(opts: &Options) -> Result<Pass, String> {
    let reading = opts.sources.read();
    // The ledgers by file identity.
    let mut ledgers: Vec<(PathBuf, Ledger)> = Vec::new();
    let mut by_file: HashMap<(u64, u64), usize> = HashMap::new();
    for t in &reading.tenants {
        if t.memory.is_err() {
            continue;
        }
        let Ok(m) = std::fs::symlink_metadata(&t.ledger) else {
            continue;
        };
        if !m.file_type().is_file() {
            continue;
        }
        match Ledger::open_existing(&t.ledger) {
            Ok(l) => {
                by_file.insert((m.dev(), m.ino()), ledgers.len());
                ledgers.push((t.ledger.clone(), l));
            }
            Err(e) => tracing::debug!("{e}: not reconciled"),
        }
    }
    // Charges bracket NVML's figures: the larger of the two readings is at least what the driver
    // held for a process's allocations when it answered (a reservation precedes its allocation,
    // a release follows its free).
    let before: Vec<Charges> = ledgers.iter().map(|(_, l)| charges(l)).collect();
    let listed = procs::gpu_processes()?;
    let after: Vec<Charges> = ledgers.iter().map(|(_, l)| charges(l)).collect();
    let now = unix_ms();
    let mut by_pid: BTreeMap<u32, Vec<&GpuProcess>> = BTreeMap::new();
    for p in &listed {
        by_pid.entry(p.pid).or_default().push(p);
    }
    let mut done = Pass::default();
    for (pid, on) in by_pid {
        let locks = match procs::slot_locks(&opts.proc_root, pid) {
            Descriptors::Read(l) => l,
            Descriptors::Unreadable(why) => {
                done.unreadable.push((pid, why));
                continue;
            }
        };
        let ours = locks
            .iter()
            .find_map(|l| by_file.get(&l.file).map(|&i| (i, l.slot)));
        let Some((i, slot)) = ours else {
            if !locks.iter().any(|l| procs::is_ledger(&l.fd_path)) {
                let command = procs::command_name(&opts.proc_root, pid);
                done.unmanaged.extend(on.iter().map(|p| Unmanaged {
                    uuid: p.uuid.clone(),
                    pid,
                    used: p.used,
                    command: command.clone(),
                }));
            }
            continue;
        };
        let (path, ledger) = &ledgers[i];
        let (Some(b), Some(a)) = (before[i].get(&slot), after[i].get(&slot)) else {
            continue;
        };
        if b.0 != a.0 {
            continue; // claimed again meanwhile: the next pass
        }
        let mut words = [NODE_NOT_LISTED; MAX_DEVICES];
        for p in &on {
            let (Some(dev), Some(used)) = (ledger.find_device(&p.uuid), p.used) else {
                continue;
            };
            let allocated = b.1[dev].max(a.1[dev]);
            words[dev] = used.saturating_sub(allocated);
        }
        let word = NodeWord {
            claim: a.0,
            host_pid: pid,
            overhead: words,
            now_ms: now,
        };
        ledger.publish_node_word(slot, &word);
        done.reconciled.push((path.clone(), slot, pid));
    }
    for (_, l) in &ledgers {
        l.publish_node_pass(now);
    }
    write_report(&opts.sources.state_dir, now, &done.unmanaged)?;
    Ok(done)
}

/// Writes `<state>/reconcile/unmanaged` atomically (the directory made root's, 0755).
fn write_report(state_dir: &Path, now: u64, unmanaged: &[Unmanaged]) -> Result<(), String> {
    let path = state_dir.join(procs::UNMANAGED_FILE);
    if let Some(dir) = path.parent() {
        if !dir.is_dir() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .mode(0o755)
                .recursive(true)
                .create(dir)
                .map_err(|e| format!("{}: {e}", dir.display()))?;
        }
    }
    crate::files::write_atomically(
        &path,
        procs::format_unmanaged(now, unmanaged).as_bytes(),
        0o644,
    )
}

/// Runs a pass every `interval` until killed (or once). A failed pass is logged (once per kind of
/// failure in a row) and tried again at the next.
pub fn run(opts: &Options, interval: Duration, once: bool) -> Result<(), String> {
    tracing::info!(
        "reconciling driver memory every {} ms (ledgers: {}, node state: {})",
        interval.as_millis(),
        opts.sources.ledger_dir.display(),
        opts.sources.state_dir.display()
    );
    let mut last_error = String::new();
    let mut last_unmanaged: Vec<(String, u32)> = Vec::new();
    loop {
        match pass(opts) {
            Ok(p) => {
                last_error.clear();
                let now: Vec<(String, u32)> = p
                    .unmanaged
                    .iter()
                    .map(|u| (u.uuid.clone(), u.pid))
                    .collect();
                for u in &p.unmanaged {
                    if !last_unmanaged.contains(&(u.uuid.clone(), u.pid)) {
                        tracing::warn!(
                            "process {} ({}) uses {} on {} under no tenant",
                            u.pid,
                            u.command,
                            u.used.map_or(
                                "an unknown amount".into(),
                                gpuslice_state::config::format_bytes
                            ),
                            u.uuid
                        );
                    }
                }
                last_unmanaged = now;
                for (pid, why) in &p.unreadable {
                    tracing::debug!("process {pid}: {why}");
                }
                if once {
                    return Ok(());
                }
            }
            Err(e) => {
                if once {
                    return Err(e);
                }
                if e != last_error {
                    tracing::error!("{e}");
                    last_error = e;
                }
            }
        }
        std::thread::sleep(interval);
    }
}
