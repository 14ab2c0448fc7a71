//! One reading of everything the node's ledgers say, taken at scrape (or refresh) time.
//!
//! Sources (docs/OBSERVABILITY.md, "Where the figures come from"):
//! * node tenants: `<state>/tenants/<NAME>/policy.toml` and `<NAME>.ledger` beside it;
//! * other tenants: every `*.ledger` in the ledger directory;
//! * compute: every `*.dev` in the device directory (and the `.tally` beside it).
//!
//! Every file is opened read-only and read on its own: a file that vanished between the listing and
//! the open gives nothing, a file that cannot be read as a ledger gives an error for that file only.
//! Ledgers are published whole (created under a hidden temporary name, then linked), so a ledger
//! being created is either not listed yet or complete; hidden files are never read.

use gpuslice_state::compute::device::{tenant_name, DeviceLedger, Health, HISTORY_LEN};
use gpuslice_state::compute::shm::{SLOT_ACTIVE, TOTAL_SIZE};
use gpuslice_state::compute::{Holder, MAX_TENANTS};
use gpuslice_state::config::policy::{Kubernetes, Layout, Policy};
use gpuslice_state::ledger::{Ledger, UNLIMITED};
use std::collections::{BTreeMap, HashSet};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Acquire;

/// The node's default state directory.
pub const DEFAULT_STATE_DIR: &str = "/run/gpuslice";

/// Where the ledgers are.
#[derive(Clone, Debug)]
pub struct Sources {
    pub state_dir: PathBuf,
    pub ledger_dir: PathBuf,
    pub device_dir: PathBuf,
}

impl Sources {
    /// The directories from the command line, else the defaults: state `/run/gpuslice`; ledgers
    /// `GPUSLICE_LEDGER_DIR`, else `/dev/shm/gpuslice`; device ledgers `<state>/devices` when it
    /// exists, else `GPUSLICE_DEVICE_DIR`, else `devices/` of the ledger directory.
    pub fn new(
        state_dir: Option<PathBuf>,
        ledger_dir: Option<PathBuf>,
        device_dir: Option<PathBuf>,
    ) -> Sources {
        let state_dir = state_dir.unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
        let ledger_dir = ledger_dir.unwrap_or_else(|| {
            std::env::var_os("GPUSLICE_LEDGER_DIR")
                .filter(|d| d.as_encoded_bytes().first() == Some(&b'/'))
                .map_or_else(
                    || PathBuf::from(gpuslice_state::config::DEFAULT_LEDGER_DIR),
                    PathBuf::from,
                )
        });
        let device_dir = device_dir.unwrap_or_else(|| {
            let node = state_dir.join("devices");
            if node.is_dir() {
                node
            } else if let Some(d) =
                std::env::var_os("GPUSLICE_DEVICE_DIR").filter(|d| !d.is_empty())
            {
                PathBuf::from(d)
            } else {
                ledger_dir.join("devices")
            }
        });
        Sources {
            state_dir,
            ledger_dir,
            device_dir,
        }
    }

    /// Reads every ledger now. Ledgers are taken only where the node and the library put them:
    /// plain files (never a link, never a file with another name too: a hard link of someone
    /// else's ledger is not a tenant), in plain directories, owned by whoever must own them
    /// ([`plain_file`]); each file once; a name a node tenant has is never taken by another ledger.
    pub fn read(&self) -> Reading {
        let mut tenants = Vec::new();
        let mut seen: HashSet<(u64, u64)> = HashSet::new();
        let mut owners: BTreeMap<String, Option<Kubernetes>> = BTreeMap::new();
        let layout = Layout::new(&self.state_dir);
        // Node tenants' files are the owner's of the tenants directory (root on a node).
        let node_owner = plain_dir(&layout.tenants_dir(), None);
        for dir in visible_entries(&layout.tenants_dir()) {
            let Some(dir_name) = dir.file_name().map(|n| n.to_string_lossy().into_owned()) else {
                continue;
            };
            if node_owner.is_none() || plain_dir(&dir, node_owner).is_none() {
                continue;
            }
            // The layout names the ledger after the directory; the policy names the tenant (the
            // same name when the node wrote both). A policy that cannot be read (missing, being
            // replaced, corrupt) costs this tenant its pod labels only.
            let ledger = layout.ledger_path(&dir_name);
            let policy = Policy::read(&layout.policy_path(&dir_name)).ok();
            let k8s = policy.as_ref().and_then(|p| p.kubernetes.clone());
            let name = policy.map_or(dir_name, |p| p.name);
            owners.insert(name.clone(), k8s.clone());
            let Some(id) = plain_file(&ledger, node_owner, false) else {
                continue;
            };
            seen.insert(id);
            if let Some(t) = read_tenant(&ledger, Some(name), k8s) {
                tenants.push(t);
            }
        }
        let mut others = 0;
        for (path, owner) in ledger_files(&self.ledger_dir) {
            let Some(id) = plain_file(&path, owner, true) else {
                continue;
            };
            if others >= MAX_LEDGERS || !seen.insert(id) {
                continue;
            }
            others += 1;
            if let Some(t) = read_tenant(&path, None, None) {
                if !owners.contains_key(&t.tenant) {
                    tenants.push(t);
                }
            }
        }
        let node_devices = self.device_dir == layout.devices_dir();
        let devices = visible_entries(&self.device_dir)
            .into_iter()
            .filter(|p| p.extension().is_some_and(|x| x == "dev"))
            .filter(|p| plain_file(p, None, !node_devices).is_some())
            .take(MAX_LEDGERS)
            .filter_map(|p| read_device(&p))
            .collect();
        Reading {
            tenants,
            devices,
            owners,
            also_allocated: read_conflicts(&self.state_dir.join("device-plugin/conflicts")),
            unmanaged: crate::procs::read_unmanaged(&self.state_dir),
        }
    }
}

/// GPUs the device plugin found also allocated through NVIDIA's resource
/// (`<state>/device-plugin/conflicts`: `<uuid>\t<namespace>\t<pod>\t<container>` lines, root's).
/// Read without following a link or blocking, a regular file of at most 64 KiB; anything else, or
/// no file, is nothing.
pub fn read_conflicts(path: &Path) -> Vec<(String, Kubernetes)> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    const MAX: u64 = 64 << 10;
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    else {
        return Vec::new();
    };
    if !f.metadata().is_ok_and(|m| m.is_file() && m.len() <= MAX) {
        return Vec::new();
    }
    let mut text = String::new();
    if f.take(MAX).read_to_string(&mut text).is_err() {
        return Vec::new();
    }
    text.lines()
        .filter_map(|l| {
            let mut it = l.split('\t');
            let uuid = it.next()?.to_string();
            let k = Kubernetes {
                namespace: it.next()?.to_string(),
                pod: it.next()?.to_string(),
                container: it.next()?.to_string(),
            };
            // A GPU's UUID, or a MIG instance's.
            (uuid.starts_with("GPU-") || uuid.starts_with("MIG-")).then_some((uuid, k))
        })
        .collect()
}

/// Most ledgers (and device ledgers) read outside the node's tenants in one scrape.
pub const MAX_LEDGERS: usize = 4096;

/// `path` is a directory, not a link, owned by `owner` when given; its owner.
fn plain_dir(path: &Path, owner: Option<u32>) -> Option<u32> {
    let m = std::fs::symlink_metadata(path).ok()?;
    (m.file_type().is_dir() && owner.map_or(true, |o| m.uid() == o)).then_some(m.uid())
}

/// `path` is a regular file, not a link, owned by `owner` when given and (`single`) with no other
/// name: its identity (device, inode).
fn plain_file(path: &Path, owner: Option<u32>, single: bool) -> Option<(u64, u64)> {
    let m = std::fs::symlink_metadata(path).ok()?;
    let ok = m.file_type().is_file()
        && owner.map_or(true, |o| m.uid() == o)
        && (!single || m.nlink() == 1);
    ok.then_some((m.dev(), m.ino()))
}

/// The non-hidden entries of `dir`, sorted; nothing when it does not exist or cannot be listed.
/// The `*.ledger` files of the ledger directory and of its per-user directories: `uid-<uid>/` and
/// `group-<group>/` in it, `<dir>-uid-<uid>/` beside it (docs/CONFIGURATION.md, "Several users").
/// Each with the uid that must own it: `uid-<uid>/`'s and `<dir>-uid-<uid>/`'s are that user's (the
/// directory too); others' owner is not fixed.
fn ledger_files(dir: &Path) -> Vec<(PathBuf, Option<u32>)> {
    let uid_of = |p: &Path, prefix: &str| -> Option<u32> {
        let n = p.file_name()?.to_string_lossy().into_owned();
        let uid = n.strip_prefix(prefix)?.parse::<u32>().ok()?;
        plain_dir(p, Some(uid)).map(|_| uid)
    };
    let group = |p: &Path| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("group-"))
            && plain_dir(p, None).is_some()
    };
    let mut dirs: Vec<(PathBuf, Option<u32>)> = Vec::new();
    if plain_dir(dir, None).is_some() {
        dirs.push((dir.to_path_buf(), None));
    }
    for p in visible_entries(dir) {
        if let Some(uid) = uid_of(&p, "uid-") {
            dirs.push((p, Some(uid)));
        } else if group(&p) {
            dirs.push((p, None));
        }
    }
    if let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) {
        let beside = format!("{}-uid-", name.to_string_lossy());
        for p in visible_entries(parent) {
            if let Some(uid) = uid_of(&p, &beside) {
                dirs.push((p, Some(uid)));
            }
        }
    }
    dirs.iter()
        .flat_map(|(d, owner)| visible_entries(d).into_iter().map(move |p| (p, *owner)))
        .filter(|(p, _)| p.extension().is_some_and(|x| x == "ledger"))
        .collect()
}

fn visible_entries(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| !e.file_name().as_encoded_bytes().starts_with(b"."))
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// Everything read at one moment.
#[derive(Clone, Debug, Default)]
pub struct Reading {
    pub tenants: Vec<TenantReading>,
    pub devices: Vec<DeviceReading>,
    /// Node tenants' Kubernetes owners by tenant name (to label their compute series too).
    pub owners: BTreeMap<String, Option<Kubernetes>>,
    /// GPUs also allocated through NVIDIA's resource, and to whom ([`read_conflicts`]).
    pub also_allocated: Vec<(String, Kubernetes)>,
    /// The node's last report of processes using a GPU under no tenant (when, which).
    pub unmanaged: Option<(u64, Vec<crate::procs::Unmanaged>)>,
}

impl Reading {
    /// The Kubernetes owner of tenant `name`, if the node says it has one.
    pub fn owner(&self, name: &str) -> Option<&Kubernetes> {
        self.owners.get(name).and_then(Option::as_ref)
    }
}

/// One tenant's memory ledger.
#[derive(Clone, Debug)]
pub struct TenantReading {
    /// The node's name for it, else the name written in the ledger, else the file's stem.
    pub tenant: String,
    pub kubernetes: Option<Kubernetes>,
    pub ledger: PathBuf,
    /// `Err`: the file exists but is not a readable ledger (the reason names the file).
    pub memory: Result<TenantMemory, String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantMemory {
    pub devices: Vec<MemoryDevice>,
    /// Live processes attached to the ledger.
    pub processes: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryDevice {
    pub uuid: String,
    /// `None`: unlimited.
    pub limit: Option<u64>,
    pub used: u64,
    pub peak: u64,
    pub denied: u64,
    /// The part of `used` still charged to processes that have exited (reclaimed when a process
    /// of the tenant next opens the ledger).
    pub exited: u64,
}

/// `None` when the file is gone (deleted, or renamed away, since it was listed).
fn read_tenant(
    path: &Path,
    node_name: Option<String>,
    kubernetes: Option<Kubernetes>,
) -> Option<TenantReading> {
    let stem = || {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let (tenant, memory) = match Ledger::open_readonly(path) {
        Ok(l) => {
            let s = l.snapshot();
            let memory = TenantMemory {
                devices: s
                    .devices
                    .iter()
                    .map(|d| MemoryDevice {
                        uuid: d.uuid.clone(),
                        limit: (d.limit != UNLIMITED).then_some(d.limit),
                        used: d.used,
                        peak: d.peak,
                        denied: d.denied,
                        exited: s
                            .processes
                            .iter()
                            .filter(|p| !p.alive)
                            .flat_map(|p| p.used.iter())
                            .filter(|(i, _)| *i == d.index)
                            .fold(0u64, |a, (_, b)| a.saturating_add(*b))
                            .min(d.used),
                    })
                    .collect(),
                processes: s.processes.iter().filter(|p| p.alive).count(),
            };
            let name = node_name.unwrap_or_else(|| match s.tenant.is_empty() {
                true => stem(),
                false => s.tenant.clone(),
            });
            (name, Ok(memory))
        }
        Err(gpuslice_state::ledger::LedgerError::Io { err, .. })
            if err.kind() == io::ErrorKind::NotFound =>
        {
            return None
        }
        Err(e) => (node_name.unwrap_or_else(stem), Err(e.to_string())),
    };
    Some(TenantReading {
        tenant,
        kubernetes,
        ledger: path.to_path_buf(),
        memory,
    })
}

/// One GPU's device ledger (compute shares).
#[derive(Clone, Debug)]
pub struct DeviceReading {
    /// From the file name (`<GPU-UUID>.dev`), so that a corrupt ledger still names its GPU.
    pub uuid: String,
    pub ledger: PathBuf,
    pub compute: Result<DeviceCompute, String>,
    /// What may keep processes out of its arbitration (squatted slots, a wrong size); an
    /// unreadable ledger counts as unhealthy too.
    pub unhealthy: bool,
    /// The ledger's health as `gpuslice status --compute` prints it (`None`: unreadable).
    pub health: Option<Health>,
    /// The file is not its layout's size (`None`: not a plain file, or its size unreadable); known
    /// also when the ledger cannot be read (a grown or shrunk file is refused by readers).
    pub size_wrong: Option<bool>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DeviceCompute {
    pub tenants: Vec<ComputeTenant>,
    /// Changes of ownership of the device since its ledger was created.
    pub handovers: u64,
    /// Ownerships taken back from a holder that died or stopped.
    pub revocations: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ComputeTenant {
    pub tenant: String,
    /// Percent, 1..=100.
    pub share: u32,
    /// Percent, 0 = no cap.
    pub cap: u32,
    pub high_priority: bool,
    /// Device time charged to it since the device ledger was created (ns).
    pub busy_ns: u64,
    /// Time its launches waited for the device (ns, summed over its processes).
    pub wait_ns: u64,
    /// Its share of the device's time over the ledger's last window (up to 16 s), 0..=1.
    pub recent_share: Option<f64>,
    /// Number of its processes waiting for the device now.
    pub waiting: u32,
    /// It holds the device now.
    pub owner: bool,
    /// Ownerships of the device granted to its processes, and taken back from them (dead or
    /// stopped), as its entry in the per-tenant counters' file says (`None`: no such file). Words any
    /// tenant can write: a count, never trusted for anything else.
    pub handovers: Option<u64>,
    pub revocations: Option<u64>,
}

fn read_device(path: &Path) -> Option<DeviceReading> {
    let uuid = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    use gpuslice_state::compute::device::DeviceLedgerError;
    let l = match DeviceLedger::open_readonly(path) {
        Ok(l) => l,
        Err(DeviceLedgerError::Io(_, _, e)) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(DeviceLedgerError::File(gpuslice_state::ledger::LedgerError::Io { err, .. }))
            if err.kind() == io::ErrorKind::NotFound =>
        {
            return None
        }
        Err(e) => {
            return Some(DeviceReading {
                uuid,
                ledger: path.to_path_buf(),
                compute: Err(e.to_string()),
                unhealthy: true,
                health: None,
                size_wrong: std::fs::symlink_metadata(path)
                    .ok()
                    .filter(|m| m.is_file())
                    .map(|m| m.len() != TOTAL_SIZE as u64),
            })
        }
    };
    let lay = l.layout();
    let h = &lay.header;
    // The achieved share over the history window, as `gpuslice status` computes it.
    let seq = h.sample_seq.load(Acquire) as usize;
    let n = HISTORY_LEN;
    let window = (seq > 1).then(|| ((seq.saturating_sub(n)) % n, (seq - 1) % n));
    let span = window.map_or(0, |(o, nw)| {
        h.sample_ns[nw]
            .load(Acquire)
            .saturating_sub(h.sample_ns[o].load(Acquire))
    });
    let owner = Holder::from_word(h.owner.load(Acquire))
        .slot()
        .and_then(|slot| lay.slots.get(slot))
        .map(|slot| slot.tenant.load(Acquire) as usize);
    let mut waiting = [0u32; MAX_TENANTS];
    for s in lay.slots.iter() {
        let t = s.tenant.load(Acquire) as usize;
        if s.state.load(Acquire) == SLOT_ACTIVE && s.wants.load(Acquire) > 0 && t < MAX_TENANTS {
            waiting[t] = waiting[t].saturating_add(1);
        }
    }
    let tenants = (0..MAX_TENANTS)
        .filter(|&t| lay.tenants[t].state.load(Acquire) != 0)
        .map(|t| {
            let e = &lay.tenants[t];
            let recent_share = match window {
                Some((o, nw)) if span > 0 => {
                    let ns = e.samples[nw]
                        .load(Acquire)
                        .saturating_sub(e.samples[o].load(Acquire));
                    Some((ns as f64 / span as f64).min(1.0))
                }
                _ => None,
            };
            // What the arbitration obeys: the node's compute policy for the tenants it lists.
            let v = l.view(t);
            let counts = l.tenant_counts(t);
            ComputeTenant {
                tenant: tenant_name(&l, t),
                share: v.share.min(100),
                cap: v.cap.min(100),
                high_priority: v.high,
                busy_ns: e.charged_ns.load(Acquire),
                wait_ns: e.wait_ns.load(Acquire),
                recent_share,
                waiting: waiting[t],
                owner: owner == Some(t),
                handovers: counts.map(|c| c.0),
                revocations: counts.map(|c| c.1),
            }
        })
        .collect();
    let named = l.uuid();
    let health = l.health();
    Some(DeviceReading {
        uuid: if named.is_empty() { uuid } else { named },
        unhealthy: health.unhealthy(),
        size_wrong: health.size.map(|s| s != health.expected_size),
        health: Some(health),
        ledger: path.to_path_buf(),
        compute: Ok(DeviceCompute {
            tenants,
            handovers: h.hand_overs.load(Acquire),
            revocations: h.revocations.load(Acquire),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpus::GpuIndex;
    use gpuslice_state::config::Limit;
    use gpuslice_state::ledger::LedgerOptions;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gpuslice-observe-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_vanished_ledger_gives_nothing_and_a_broken_one_an_error() {
        let d = scratch("vanish");
        assert!(read_tenant(&d.join("gone.ledger"), None, None).is_none());
        assert!(read_device(&d.join("GPU-gone.dev")).is_none());
        std::fs::write(d.join("bad.ledger"), b"garbage").unwrap();
        let bad = read_tenant(&d.join("bad.ledger"), None, None).unwrap();
        assert_eq!(bad.tenant, "bad");
        assert!(bad.memory.unwrap_err().contains("bad.ledger"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn node_tenants_are_named_and_labelled_by_their_policy() {
        let d = scratch("node");
        let t = d.join("state/tenants/trainer");
        std::fs::create_dir_all(&t).unwrap();
        std::fs::write(
            t.join("policy.toml"),
            "name = \"trainer\"\nmemory = 1073741824\nshare = 50\ncreated = \"device-plugin\"\n[kubernetes]\nnamespace = \"ml\"\npod = \"p-0\"\ncontainer = \"main\"\n",
        )
        .unwrap();
        let opts = LedgerOptions {
            tenant: "trainer".into(),
            default_limit: Limit::Bytes(1 << 30),
            devices: vec![(
                "GPU-00000000-0000-4000-8000-000000000001".into(),
                Limit::Bytes(1 << 30),
            )],
            group: None,
        };
        drop(Ledger::open(&t.join("trainer.ledger"), &opts).unwrap());
        let sources = Sources::new(Some(d.join("state")), Some(d.join("none")), None);
        let r = sources.read();
        assert_eq!(r.tenants.len(), 1);
        let k = r.tenants[0].kubernetes.clone().unwrap();
        assert_eq!((k.namespace.as_str(), k.pod.as_str()), ("ml", "p-0"));
        let text = crate::metrics::encode(
            &r,
            &mut GpuIndex::with(|| {
                [("GPU-00000000-0000-4000-8000-000000000001".to_string(), 3)].into()
            }),
        );
        let line = text
            .lines()
            .find(|l| l.starts_with("gpuslice_memory_limit_bytes{"))
            .unwrap();
        for part in [
            "gpu=\"3\"",
            "pod=\"p-0\"",
            "namespace=\"ml\"",
            "tenant=\"trainer\"",
            "} 1073741824",
        ] {
            assert!(line.contains(part), "{line}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}

#[cfg(test)]
mod conflict_tests {
    use super::*;
    use crate::gpus::GpuIndex;

    /// The device plugin's record of GPUs also allocated through `nvidia.com/gpu` becomes
    /// `gpuslice_gpu_also_allocated` (the alert's series); lines that name no GPU, a link in its
    /// place, and a file past 64 KiB give nothing.
    #[test]
    fn gpus_allocated_twice_are_exported() {
        let d = std::env::temp_dir().join(format!("observe-conflicts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("device-plugin")).unwrap();
        let file = d.join("device-plugin/conflicts");
        std::fs::write(
            &file,
            "GPU-b\tml\twhole-gpu\tcuda\nnot-a-gpu\tml\tp\tc\nGPU-c\tshort\n",
        )
        .unwrap();
        let sources = Sources::new(Some(d.clone()), Some(d.join("none")), None);
        let r = sources.read();
        assert_eq!(r.also_allocated.len(), 1, "{:?}", r.also_allocated);
        let text = crate::metrics::encode(
            &r,
            &mut GpuIndex::with(|| [("GPU-b".to_string(), 1)].into()),
        );
        let line = text
            .lines()
            .find(|l| l.starts_with("gpuslice_gpu_also_allocated{"))
            .unwrap_or_else(|| panic!("{text}"));
        for part in [
            "gpu=\"1\"",
            "UUID=\"GPU-b\"",
            "namespace=\"ml\"",
            "pod=\"whole-gpu\"",
            "} 1",
        ] {
            assert!(line.contains(part), "{line}");
        }
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(d.join("elsewhere"), &file).unwrap();
        std::fs::write(d.join("elsewhere"), "GPU-b\tml\twhole-gpu\tcuda\n").unwrap();
        assert!(read_conflicts(&file).is_empty(), "a link is not followed");
        std::fs::remove_file(&file).unwrap();
        std::fs::write(&file, "GPU-b\tml\tp\tc\n".repeat(6000)).unwrap();
        assert!(read_conflicts(&file).is_empty(), "past 64 KiB");
        let _ = std::fs::remove_dir_all(&d);
    }
}

#[cfg(test)]
mod ledger_file_tests {
    use super::*;

    #[test]
    fn per_user_directories_are_scanned() {
        let root = std::env::temp_dir().join(format!("observe-ledgers-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let dir = root.join("gpuslice");
        for d in [
            "gpuslice/uid-1000",
            "gpuslice/group-gpu",
            "gpuslice-uid-1001",
            "other",
        ] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        for f in [
            "gpuslice/top.ledger",
            "gpuslice/uid-1000/a.ledger",
            "gpuslice/group-gpu/b.ledger",
            "gpuslice-uid-1001/c.ledger",
            "other/d.ledger",
        ] {
            std::fs::write(root.join(f), b"").unwrap();
        }
        // A per-user directory and its ledgers are that user's (as root, made so here).
        // SAFETY: no arguments; cannot fail.
        let as_root = unsafe { libc::geteuid() } == 0;
        if as_root {
            for (p, uid) in [
                ("gpuslice/uid-1000", 1000),
                ("gpuslice/uid-1000/a.ledger", 1000),
                ("gpuslice-uid-1001", 1001),
                ("gpuslice-uid-1001/c.ledger", 1001),
            ] {
                std::os::unix::fs::chown(root.join(p), Some(uid), Some(uid)).unwrap();
            }
        }
        let found = |dir: &Path| {
            let mut v: Vec<String> = ledger_files(dir)
                .iter()
                .map(|(p, _)| p.strip_prefix(&root).unwrap().display().to_string())
                .collect();
            v.sort();
            v
        };
        let mut expected = vec![
            "gpuslice-uid-1001/c.ledger",
            "gpuslice/group-gpu/b.ledger",
            "gpuslice/top.ledger",
            "gpuslice/uid-1000/a.ledger",
        ];
        if !as_root {
            expected.retain(|p| !p.contains("uid-"));
        }
        assert_eq!(found(&dir), expected);
        // A per-user directory owned by someone else, or a link to one, is not scanned.
        if as_root {
            std::os::unix::fs::chown(root.join("gpuslice/uid-1000"), Some(1002), Some(1002))
                .unwrap();
            std::fs::remove_dir_all(root.join("gpuslice-uid-1001")).unwrap();
            std::os::unix::fs::symlink(root.join("other"), root.join("gpuslice-uid-1001")).unwrap();
            assert_eq!(
                found(&dir),
                ["gpuslice/group-gpu/b.ledger", "gpuslice/top.ledger"]
            );
        }
        let _ = std::fs::remove_dir_all(&root);
    }
}
