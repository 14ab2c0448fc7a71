//! Talking to the kubelet: registration, PodResources, and the sweep of tenants no pod holds.

use super::allocations::Offered;
use super::allocations::Plugin;
use super::Config;
use super::API_VERSION;
use super::CONFLICTS_FILE;
use super::KUBELET_SOCKET;
use super::SOCKET_NAME;
use crate::api::deviceplugin as dp;
use crate::api::podresources as pr;
use crate::files::read_untrusted;
use crate::policy::{self, Created, Kubernetes};
use crate::tenant::{self};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, error, info, warn};

/// A Unix-socket gRPC channel (the URI is a placeholder: the connector dials the socket).
pub async fn unix_channel(path: &Path) -> Result<tonic::transport::Channel, String> {
    let p = path.to_path_buf();
    tonic::transport::Endpoint::try_from("http://[::1]:50051")
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let p = p.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(p).await?,
                ))
            }
        }))
        .await
        .map_err(|e| format!("{}: {}", path.display(), error_chain(&e)))
}

pub(super) async fn register(cfg: &Config) -> Result<(), String> {
    let path = cfg.kubelet_dir.join(KUBELET_SOCKET);
    let channel = unix_channel(&path).await?;
    dp::registration_client::RegistrationClient::new(channel)
        .register(dp::RegisterRequest {
            version: API_VERSION.into(),
            endpoint: SOCKET_NAME.into(),
            resource_name: cfg.resource.clone(),
            options: Some(dp::DevicePluginOptions {
                pre_start_required: false,
                get_preferred_allocation_available: true,
            }),
        })
        .await
        .map_err(|s| match s.code() {
            // No answer: the connection ended under the call (a kubelet stopping or restarting).
            tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled => format!(
                "{}: the kubelet hung up during Register ({})",
                path.display(),
                s.message()
            ),
            _ => format!("{}: Register refused: {}", path.display(), s.message()),
        })?;
    Ok(())
}

/// What PodResources says: who holds which of our slices, and which devices of NVIDIA's resource.
struct Held {
    ours: HashMap<String, Kubernetes>,
    nvidia: Vec<(String, Kubernetes)>,
}

async fn pod_slices(socket: &Path, resource: &str, nvidia: &str) -> Result<Held, String> {
    let channel = unix_channel(socket).await?;
    let list = pr::pod_resources_lister_client::PodResourcesListerClient::new(channel)
        .list(pr::ListPodResourcesRequest {})
        .await
        .map_err(|s| format!("{}: List: {}", socket.display(), s.message()))?
        .into_inner();
    let mut held = Held {
        ours: HashMap::new(),
        nvidia: Vec::new(),
    };
    for pod in list.pod_resources {
        for c in &pod.containers {
            let who = Kubernetes {
                namespace: pod.namespace.clone(),
                pod: pod.name.clone(),
                container: c.name.clone(),
            };
            for d in &c.devices {
                for id in &d.device_ids {
                    if d.resource_name == resource {
                        held.ours.insert(id.clone(), who.clone());
                    } else if d.resource_name == nvidia {
                        held.nvidia.push((id.clone(), who.clone()));
                    }
                }
            }
        }
    }
    Ok(held)
}

/// GPUs of ours that NVIDIA's resource also hands out (its device IDs are UUIDs, or NVML indexes
/// with `--device-id-strategy=index`).
pub(super) fn conflicts_of(
    gpus: &[Offered],
    nvidia: &[(String, Kubernetes)],
) -> BTreeMap<String, Vec<Kubernetes>> {
    let mut out: BTreeMap<String, Vec<Kubernetes>> = BTreeMap::new();
    for (id, who) in nvidia {
        if let Some(o) = gpus
            .iter()
            .find(|o| o.gpu.uuid == *id || o.gpu.index_name() == *id)
        {
            out.entry(o.gpu.uuid.clone()).or_default().push(who.clone());
        }
    }
    out
}

/// Records (and logs, when it changes) the GPUs also allocated through NVIDIA's resource.
pub(super) fn note_conflicts(plugin: &Plugin, now: BTreeMap<String, Vec<Kubernetes>>) {
    let Ok(mut last) = plugin.conflicts.lock() else {
        return;
    };
    if *last == now {
        return;
    }
    for (uuid, pods) in &now {
        if last.get(uuid) != Some(pods) {
            let who: Vec<String> = pods
                .iter()
                .map(|k| format!("{}/{} ({})", k.namespace, k.pod, k.container))
                .collect();
            error!(
                "GPU {uuid} is also allocated through {} to {}: it is handed out twice; its slices are reported unhealthy until that pod is gone (give each plugin its own GPUs: --gpus, docs/KUBERNETES.md)",
                plugin.cfg.nvidia_resource,
                who.join(", ")
            );
        }
    }
    for uuid in last.keys().filter(|u| !now.contains_key(*u)) {
        info!(
            "GPU {uuid} is no longer allocated through {}",
            plugin.cfg.nvidia_resource
        );
    }
    let mut text = String::new();
    for (uuid, pods) in &now {
        for k in pods {
            text.push_str(&format!(
                "{uuid}\t{}\t{}\t{}\n",
                k.namespace, k.pod, k.container
            ));
        }
    }
    if let Err(e) = crate::files::write_atomically(
        &plugin.plugin_dir().join(CONFLICTS_FILE),
        text.as_bytes(),
        0o644,
    ) {
        warn!("{e}");
    }
    *last = now;
}

/// One sweep: names the pods of tenants in their policies, removes tenants no pod holds (seen so
/// in two sweeps in a row, and with no live process), notes GPUs NVIDIA's resource also holds.
pub(super) async fn sweep(plugin: &Arc<Plugin>, absent: &mut HashMap<String, u32>) {
    {
        let p = plugin.clone();
        let _ = tokio::task::spawn_blocking(move || p.refresh_nvidia()).await;
    }
    let Some(socket) = &plugin.cfg.pod_resources_socket else {
        return;
    };
    let held = match pod_slices(socket, &plugin.cfg.resource, &plugin.cfg.nvidia_resource).await {
        Ok(h) => h,
        Err(e) => {
            warn!("PodResources: {e}; no tenant removed this time");
            return;
        }
    };
    note_conflicts(plugin, conflicts_of(&plugin.gpus, &held.nvidia));
    let guard = plugin.lock.clone().lock_owned().await;
    let p = plugin.clone();
    let mut a = std::mem::take(absent);
    let a = tokio::task::spawn_blocking(move || {
        let _g = guard;
        sweep_tenants(&p, &held.ours, &mut a);
        a
    })
    .await
    .unwrap_or_default();
    *absent = a;
}

fn sweep_tenants(
    plugin: &Plugin,
    held: &HashMap<String, Kubernetes>,
    absent: &mut HashMap<String, u32>,
) {
    let layout = &plugin.cfg.node.layout;
    for (name, slices) in plugin.tenants_and_slices() {
        let path = layout.policy_path(&name);
        let Ok(mut p) =
            read_untrusted(&path, 64 << 10).and_then(|text| policy::Policy::parse(&path, &text))
        else {
            continue;
        };
        if p.created != Created::DevicePlugin {
            continue;
        }
        match slices.iter().find_map(|s| held.get(s)) {
            Some(k) => {
                absent.remove(&name);
                if p.kubernetes.as_ref() != Some(k) {
                    p.kubernetes = Some(k.clone());
                    if let Err(e) = policy::write(&path, &p) {
                        warn!("{e}");
                    }
                }
            }
            None => {
                let n = absent.entry(name.clone()).or_insert(0);
                *n += 1;
                if *n < 2 {
                    continue;
                }
                let alive = tenant::live_processes(layout, &name);
                if alive > 0 {
                    debug!(
                        "tenant {name}: no pod holds its slices, {alive} process(es) alive: kept"
                    );
                    continue;
                }
                match tenant::delete(&plugin.cfg.node, &name, false) {
                    Ok(()) => {
                        absent.remove(&name);
                        let _ = std::fs::remove_file(plugin.record_path(&name));
                        info!("tenant {name} removed (its pod is gone)");
                    }
                    Err(e) => warn!("removing tenant {name}: {e}"),
                }
            }
        }
    }
}

/// An error and its causes, outermost first ("transport error: ...: No such file or directory").
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let c_s = c.to_string();
        if !s.contains(&c_s) {
            s.push_str(": ");
            s.push_str(&c_s);
        }
        cur = c.source();
    }
    s
}
