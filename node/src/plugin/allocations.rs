//! The plugin's state: the GPUs it offers, which tenant holds which slices (recorded under
//! `<state>/device-plugin/`), one container's allocation and the answer the kubelet gets.

use super::device_id;
use super::show_dirs;
use super::slices::parse_id;
use super::tenant_name;
use super::Config;
use super::NvidiaCdi;
use super::MAX_RECORD;
use super::PLUGIN_DIR;
use crate::api::deviceplugin as dp;
use crate::files::read_untrusted;
use crate::nvml::{self, Gpu};
use crate::policy::{self, Created, Kubernetes, Priority};
use crate::tenant::{self, Request};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tracing::{info, warn};

/// A GPU the plugin offers, with its slice count.
#[derive(Clone, Debug)]
pub(super) struct Offered {
    pub(super) gpu: Gpu,
    pub(super) slices: u32,
}

pub(super) struct Plugin {
    pub(super) cfg: Config,
    pub(super) gpus: Vec<Offered>,
    /// Allocations and sweeps one at a time.
    pub(super) lock: Arc<tokio::sync::Mutex<()>>,
    /// GPU UUID → NVIDIA's CDI device naming it (empty when off or no spec).
    pub(super) nvidia: Mutex<HashMap<String, String>>,
    /// Where NVIDIA's spec was found (for the log, when it changes).
    pub(super) nvidia_spec: Mutex<Option<PathBuf>>,
    /// GPUs of ours an `nvidia.com/gpu` pod also holds, and by whom.
    pub(super) conflicts: Mutex<BTreeMap<String, Vec<Kubernetes>>>,
}

impl Plugin {
    pub(super) fn devices(&self, gpus: &[Gpu]) -> Vec<dp::Device> {
        let conflicts = self.conflicts.lock().map(|c| c.clone()).unwrap_or_default();
        self.gpus
            .iter()
            .flat_map(|o| {
                let healthy = gpus.iter().any(|g| g.uuid == o.gpu.uuid && g.healthy)
                    && !conflicts.contains_key(&o.gpu.uuid);
                (0..o.slices).map(move |i| dp::Device {
                    id: device_id(&o.gpu.uuid, i),
                    health: if healthy { "Healthy" } else { "Unhealthy" }.into(),
                    topology: None,
                })
            })
            .collect()
    }

    /// NVML now; a GPU NVML no longer answers for is unhealthy.
    pub(super) async fn current_gpus(&self) -> Vec<Gpu> {
        tokio::task::spawn_blocking(nvml::gpus)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default()
    }

    pub(super) fn plugin_dir(&self) -> PathBuf {
        self.cfg.node.layout.state.join(PLUGIN_DIR)
    }

    pub(super) fn record_path(&self, name: &str) -> PathBuf {
        self.plugin_dir().join(format!("{name}.slices"))
    }

    /// The slices a tenant was allocated, from the plugin's record (tenants of an older plugin:
    /// the `slices` file in the tenant's directory). Read defensively; a record that cannot be read
    /// is an error naming why.
    pub(super) fn read_slices(&self, name: &str) -> Result<Vec<String>, String> {
        let record = self.record_path(name);
        let text = match read_untrusted(&record, MAX_RECORD) {
            Ok(t) => t,
            Err(_) if !record.exists() && std::fs::symlink_metadata(&record).is_err() => {
                read_untrusted(
                    &self.cfg.node.layout.tenant_dir(name).join("slices"),
                    MAX_RECORD,
                )?
            }
            Err(e) => return Err(e),
        };
        let mut v: Vec<String> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        v.sort();
        v.dedup();
        Ok(v)
    }

    pub(super) fn write_slices(&self, name: &str, ids: &[String]) -> Result<(), String> {
        let text = if ids.is_empty() {
            String::new()
        } else {
            format!("{}\n", ids.join("\n"))
        };
        crate::files::write_atomically(&self.record_path(name), text.as_bytes(), 0o600)
    }

    /// Device-plugin tenants and their slices (a record that cannot be read: no slices, logged).
    pub(super) fn tenants_and_slices(&self) -> Vec<(String, Vec<String>)> {
        let layout = &self.cfg.node.layout;
        let mut out = Vec::new();
        for name in layout.tenant_names().unwrap_or_default() {
            if !name.starts_with("k8s-") {
                continue;
            }
            match self.read_slices(&name) {
                Ok(v) => out.push((name, v)),
                Err(e) => {
                    warn!(
                        "tenant {name}: its slices cannot be read ({e}); counted as holding none"
                    );
                    out.push((name, Vec::new()));
                }
            }
        }
        out
    }

    /// Allocates one container's slices; returns the answer and the tenant created.
    pub(super) fn allocate_one(
        &self,
        ids: &[String],
    ) -> Result<(dp::ContainerAllocateResponse, String), String> {
        if ids.is_empty() {
            return Err("no slice requested".into());
        }
        let mut parsed = Vec::new();
        let mut seen = BTreeSet::new();
        for id in ids {
            if !seen.insert(id.as_str()) {
                return Err(format!(
                    "{id:?} requested more than once: each slice can be given once"
                ));
            }
            let (uuid, i) = parse_id(id).ok_or_else(|| format!("{id:?}: not a gpuslice slice"))?;
            let o = self
                .gpus
                .iter()
                .find(|o| o.gpu.uuid == uuid)
                .ok_or_else(|| format!("{id:?}: {uuid} is not a GPU this plugin offers"))?;
            if i >= o.slices {
                return Err(format!("{id:?}: slice {i} of {} on {uuid}", o.slices));
            }
            parsed.push((uuid.to_string(), i));
        }
        let uuid = parsed[0].0.clone();
        let tenants = self.tenants_and_slices();
        if parsed.iter().any(|(u, _)| *u != uuid) {
            return Err(self.spread_message(ids, &parsed, &tenants));
        }
        let offered = self
            .gpus
            .iter()
            .find(|o| o.gpu.uuid == uuid)
            .ok_or_else(|| format!("{uuid}: not a GPU of this node"))?;
        let gpu = &offered.gpu;
        let k = u32::try_from(ids.len()).unwrap_or(u32::MAX);
        let first = parsed.iter().map(|(_, i)| *i).min().unwrap_or(0);
        let mut wanted: Vec<String> = ids.to_vec();
        wanted.sort();
        // The kubelet gave these slices to a new container: whoever had them before is gone.
        for (old, slices) in &tenants {
            if !slices.iter().any(|s| wanted.contains(s)) {
                continue;
            }
            match tenant::delete(&self.cfg.node, old, false) {
                Ok(()) => {
                    let _ = std::fs::remove_file(self.record_path(old));
                    info!("tenant {old} removed: its slices now belong to a new container");
                }
                Err(e) => {
                    self.write_slices(old, &[])?;
                    warn!(
                        "tenant {old} retired (its slices now belong to a new container; removed once its processes end): {e}"
                    );
                }
            }
        }
        let layout = &self.cfg.node.layout;
        let base = tenant_name(&uuid, first);
        let name = (1..=1000)
            .map(|n| {
                if n == 1 {
                    base.clone()
                } else {
                    format!("{base}-{n}")
                }
            })
            .find(|n| {
                std::fs::symlink_metadata(layout.tenant_dir(n)).is_err()
                    && std::fs::symlink_metadata(self.record_path(n)).is_err()
            })
            .ok_or_else(|| format!("{base}: 1000 earlier tenants of this name still linger"))?;
        let req = Request {
            name: name.clone(),
            memory: self.cfg.slicing.memory(gpu.memory, k),
            share: self.cfg.slicing.share(gpu.memory, k),
            limit: 0,
            priority: Priority::Normal,
            gpus: vec![uuid.clone()],
            created: Created::DevicePlugin,
            kubernetes: None,
        };
        self.write_slices(&name, &wanted)?;
        if let Err(e) = tenant::create(&self.cfg.node, &req, std::slice::from_ref(gpu)) {
            let _ = std::fs::remove_file(self.record_path(&name));
            return Err(e);
        }
        info!(
            "tenant {name} created: {} of GPU {} ({} slice(s): {}, share {})",
            gpuslice_state::config::format_bytes(req.memory),
            uuid,
            k,
            wanted.join(" "),
            req.share
        );
        Ok((self.response(&name, gpu), name))
    }

    /// Why slices of more than one GPU cannot be given to one container, with each GPU's free
    /// slices (those no tenant of ours holds).
    pub(super) fn spread_message(
        &self,
        ids: &[String],
        parsed: &[(String, u32)],
        tenants: &[(String, Vec<String>)],
    ) -> String {
        let held: BTreeSet<&str> = tenants
            .iter()
            .flat_map(|(_, v)| v.iter().map(String::as_str))
            .collect();
        let mut gpus: Vec<&str> = parsed.iter().map(|(u, _)| u.as_str()).collect();
        gpus.dedup();
        let free: Vec<String> = self
            .gpus
            .iter()
            .map(|o| {
                let n = (0..o.slices)
                    .filter(|i| !held.contains(device_id(&o.gpu.uuid, *i).as_str()))
                    .count();
                format!("{} has {n} of {} free", o.gpu.uuid, o.slices)
            })
            .collect();
        let mut by_gpu: BTreeMap<&str, usize> = BTreeMap::new();
        for (u, _) in parsed {
            *by_gpu.entry(u.as_str()).or_default() += 1;
        }
        format!(
            "{} slices requested ({ids:?}) fit on no single GPU: the kubelet offered {}; \
             a container's slices must be on one GPU ({}). Request fewer slices, or wait for a GPU \
             with {} free",
            ids.len(),
            by_gpu
                .iter()
                .map(|(u, n)| format!("{n} on {u}"))
                .collect::<Vec<_>>()
                .join(" + "),
            free.join(", "),
            ids.len()
        )
    }

    pub(super) fn response(&self, name: &str, gpu: &Gpu) -> dp::ContainerAllocateResponse {
        let node = &self.cfg.node;
        let gid = tenant::tenant_gid(&node.layout, name).unwrap_or(0);
        let policy = policy::Policy {
            name: name.into(),
            memory: 0,
            share: 1,
            limit: 0,
            priority: Priority::Normal,
            gpus: Vec::new(),
            created: Created::DevicePlugin,
            kubernetes: None,
        };
        let spec = crate::cdi::tenant_spec(node, &policy, gid);
        let mounts = spec.devices[0]
            .container_edits
            .mounts
            .iter()
            .map(|m| dp::Mount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.clone(),
                read_only: m.options.iter().any(|o| o == "ro"),
            })
            .collect();
        let mut cdi_devices = vec![dp::CdiDevice {
            name: format!("{}={name}", crate::cdi::TENANT_KIND),
        }];
        if let Some(nv) = self.nvidia_device(gpu) {
            cdi_devices.push(dp::CdiDevice { name: nv });
        }
        dp::ContainerAllocateResponse {
            envs: HashMap::from([("NVIDIA_VISIBLE_DEVICES".to_string(), gpu.uuid.clone())]),
            mounts,
            devices: Vec::new(),
            annotations: HashMap::new(),
            cdi_devices,
        }
    }

    /// NVIDIA's CDI device for `gpu`, per `--nvidia-cdi` and the spec found.
    pub(super) fn nvidia_device(&self, gpu: &Gpu) -> Option<String> {
        if self.cfg.nvidia_cdi == NvidiaCdi::Off {
            return None;
        }
        let found = self
            .nvidia
            .lock()
            .ok()
            .and_then(|m| m.get(&gpu.uuid).cloned());
        match (found, self.cfg.nvidia_cdi) {
            (Some(d), _) => Some(d),
            (None, NvidiaCdi::On) => Some(format!("{}={}", crate::cdi::NVIDIA_KIND, gpu.uuid)),
            (None, _) => None,
        }
    }

    /// Looks for NVIDIA's CDI spec again (the toolkit may write it after we start); logs changes.
    pub(super) fn refresh_nvidia(&self) {
        if self.cfg.nvidia_cdi == NvidiaCdi::Off {
            return;
        }
        let spec = crate::cdi::find_nvidia(&self.cfg.cdi_spec_dirs);
        let mut map = HashMap::new();
        if let Some(s) = &spec {
            for o in &self.gpus {
                match s.device_for(&o.gpu.uuid, &o.gpu.index_name()) {
                    Some(d) => {
                        map.insert(o.gpu.uuid.clone(), d);
                    }
                    None => warn!(
                        "NVIDIA's CDI spec {} names no device for GPU {} {} (neither its UUID nor its index)",
                        s.path.display(),
                        o.gpu.index,
                        o.gpu.uuid
                    ),
                }
            }
        }
        let path = spec.map(|s| s.path);
        if let Ok(mut last) = self.nvidia_spec.lock() {
            if *last != path {
                match &path {
                    Some(p) => info!(
                        "NVIDIA's CDI spec found at {}: Allocate names {} devices",
                        p.display(),
                        crate::cdi::NVIDIA_KIND
                    ),
                    None => info!(
                        "no NVIDIA CDI spec in {}: Allocate names no {} device{}",
                        show_dirs(&self.cfg.cdi_spec_dirs),
                        crate::cdi::NVIDIA_KIND,
                        if self.cfg.nvidia_cdi == NvidiaCdi::On {
                            " from a spec (--nvidia-cdi on: by UUID)"
                        } else {
                            ""
                        }
                    ),
                }
                *last = path;
            }
        }
        if let Ok(mut m) = self.nvidia.lock() {
            *m = map;
        }
    }
}
