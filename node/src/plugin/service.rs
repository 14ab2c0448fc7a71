//! The device-plugin gRPC service the kubelet calls, and allocating a request all or nothing.

use super::allocations::Plugin;
use super::preferred;
use crate::api::deviceplugin as dp;
use crate::tenant::{self};
use dp::device_plugin_server::DevicePlugin;
use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::Stream;
use tonic::{Request as GrpcRequest, Response, Status};
use tracing::{error, info, warn};

pub(super) struct Service(pub(super) Arc<Plugin>);

type DeviceStream = Pin<Box<dyn Stream<Item = Result<dp::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _: GrpcRequest<dp::Empty>,
    ) -> Result<Response<dp::DevicePluginOptions>, Status> {
        Ok(Response::new(dp::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _: GrpcRequest<dp::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let plugin = self.0.clone();
        tokio::spawn(async move {
            let mut last: Option<Vec<dp::Device>> = None;
            loop {
                let devices = plugin.devices(&plugin.current_gpus().await);
                if last.as_ref() != Some(&devices) {
                    let unhealthy = devices.iter().filter(|d| d.health != "Healthy").count();
                    info!(
                        "ListAndWatch: {} slices, {unhealthy} unhealthy",
                        devices.len()
                    );
                    let msg = dp::ListAndWatchResponse {
                        devices: devices.clone(),
                    };
                    if tx.send(Ok(msg)).await.is_err() {
                        return;
                    }
                    last = Some(devices);
                }
                tokio::select! {
                    _ = tokio::time::sleep(plugin.cfg.sweep_interval) => {}
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn get_preferred_allocation(
        &self,
        request: GrpcRequest<dp::PreferredAllocationRequest>,
    ) -> Result<Response<dp::PreferredAllocationResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .iter()
            .map(|r| dp::ContainerPreferredAllocationResponse {
                device_i_ds: preferred(
                    &r.available_device_i_ds,
                    &r.must_include_device_i_ds,
                    usize::try_from(r.allocation_size).unwrap_or(0),
                ),
            })
            .collect();
        Ok(Response::new(dp::PreferredAllocationResponse {
            container_responses,
        }))
    }

    /// All of a request's containers or none: the work runs in a task of its own, so a kubelet
    /// that goes away mid-call (its call, and so this future, dropped) cannot stop it half-way; the
    /// tenants it created are removed again when a container fails or nobody is left to answer.
    /// The call is answered within `allocate_timeout` whatever the task waits for.
    async fn allocate(
        &self,
        request: GrpcRequest<dp::AllocateRequest>,
    ) -> Result<Response<dp::AllocateResponse>, Status> {
        let (mut answer, answered) = tokio::sync::oneshot::channel();
        let plugin = self.0.clone();
        let requests: Vec<Vec<String>> = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|r| r.devices_ids)
            .collect();
        let shown = format!("{requests:?}");
        tokio::spawn(async move {
            let _g = plugin.lock.clone().lock_owned().await;
            if answer.is_closed() {
                warn!(
                    "Allocate {requests:?}: the kubelet went away (or the call timed out) before it started; no tenant created"
                );
                return;
            }
            let outcome = allocate_all(&plugin, &requests).await;
            let created = match &outcome {
                Ok((_, created)) => created.clone(),
                Err(_) => Vec::new(),
            };
            if !created.is_empty() && !plugin.cfg.answer_delay.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(plugin.cfg.answer_delay) => {}
                    _ = answer.closed() => {}
                }
            }
            let reply = outcome.map(|(responses, _)| responses);
            if answer.send(reply).is_err() && !created.is_empty() {
                let removed = remove_tenants(&plugin, &created).await;
                warn!("Allocate {requests:?}: the kubelet went away before the answer; {removed}");
            }
        });
        // The test-only answer delay comes on top.
        let limit = self.0.cfg.allocate_timeout + self.0.cfg.answer_delay;
        match tokio::time::timeout(limit, answered).await {
            Ok(Ok(Ok(container_responses))) => Ok(Response::new(dp::AllocateResponse {
                container_responses,
            })),
            Ok(Ok(Err(e))) => Err(Status::failed_precondition(e)),
            Ok(Err(_)) => Err(Status::internal(
                "the allocation task ended without an answer",
            )),
            Err(_) => {
                error!(
                    "Allocate {shown}: no answer within {limit:?} (an earlier allocation or sweep is still waiting); refused, nothing kept"
                );
                Err(Status::deadline_exceeded(format!(
                    "gpuslice: Allocate not done within {limit:?}: the node's tenants are busy (see the device plugin's log); nothing was allocated"
                )))
            }
        }
    }

    async fn pre_start_container(
        &self,
        _: GrpcRequest<dp::PreStartContainerRequest>,
    ) -> Result<Response<dp::PreStartContainerResponse>, Status> {
        Ok(Response::new(dp::PreStartContainerResponse {}))
    }
}

/// Allocates every container of a request, or none: on a failure the tenants already created for
/// it are removed again. Returns the answers and the tenants created.
async fn allocate_all(
    plugin: &Arc<Plugin>,
    requests: &[Vec<String>],
) -> Result<(Vec<dp::ContainerAllocateResponse>, Vec<String>), String> {
    let mut responses = Vec::new();
    let mut created = Vec::new();
    let mut seen = BTreeSet::new();
    if let Some(dup) = requests
        .iter()
        .flatten()
        .find(|id| !seen.insert(id.as_str()))
    {
        let e = format!(
            "{dup:?} requested more than once in one Allocate: each slice can be given once"
        );
        warn!("Allocate {requests:?} refused: {e}");
        return Err(e);
    }
    for ids in requests {
        let one = {
            let plugin = plugin.clone();
            let ids = ids.clone();
            tokio::task::spawn_blocking(move || plugin.allocate_one(&ids))
                .await
                .unwrap_or_else(|e| Err(format!("allocation task failed: {e}")))
        };
        match one {
            Ok((resp, new)) => {
                responses.push(resp);
                created.push(new);
            }
            Err(e) => {
                let removed = remove_tenants(plugin, &created).await;
                warn!("Allocate {ids:?} refused: {e}; {removed}");
                return Err(e);
            }
        }
    }
    Ok((responses, created))
}

/// Removes tenants an unanswered or failed Allocate created; says what it did.
async fn remove_tenants(plugin: &Arc<Plugin>, names: &[String]) -> String {
    if names.is_empty() {
        return "no tenant created".into();
    }
    let plugin = plugin.clone();
    let names = names.to_vec();
    tokio::task::spawn_blocking(move || {
        names
            .iter()
            .map(|name| match tenant::delete(&plugin.cfg.node, name, false) {
                Ok(()) => {
                    let _ = std::fs::remove_file(plugin.record_path(name));
                    format!("tenant {name} removed")
                }
                Err(e) => format!("tenant {name} NOT removed: {e}"),
            })
            .collect::<Vec<_>>()
            .join("; ")
    })
    .await
    .unwrap_or_else(|e| format!("removing tenants failed: {e}"))
}
