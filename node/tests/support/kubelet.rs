//! The kubelet's side of a device plugin, stood in for: its registration server, a client of the
//! plugin's socket, a PodResources server (tonic on Unix sockets in a private directory), and the
//! plugin itself, the real `gpuslice device-plugin` run as a child process whose standard error is
//! collected as it comes.

use gpuslice_node::api::deviceplugin as dp;
use gpuslice_node::api::podresources as pr;
use gpuslice_node::plugin::unix_channel;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

struct Kubelet {
    tx: mpsc::UnboundedSender<dp::RegisterRequest>,
}

#[tonic::async_trait]
impl dp::registration_server::Registration for Kubelet {
    async fn register(
        &self,
        request: tonic::Request<dp::RegisterRequest>,
    ) -> Result<tonic::Response<dp::Empty>, tonic::Status> {
        let _ = self.tx.send(request.into_inner());
        Ok(tonic::Response::new(dp::Empty {}))
    }
}

/// The pods the PodResources stand-in lists (shared with the test, which changes them).
#[derive(Clone, Default)]
pub struct PodResources(pub Arc<Mutex<Vec<pr::PodResources>>>);

#[tonic::async_trait]
impl pr::pod_resources_lister_server::PodResourcesLister for PodResources {
    async fn list(
        &self,
        _: tonic::Request<pr::ListPodResourcesRequest>,
    ) -> Result<tonic::Response<pr::ListPodResourcesResponse>, tonic::Status> {
        Ok(tonic::Response::new(pr::ListPodResourcesResponse {
            pod_resources: self.0.lock().unwrap().clone(),
        }))
    }
}

/// The kubelet's registration server on `<dir>/kubelet.sock` (call inside the runtime).
pub fn serve_kubelet(dir: &Path) -> mpsc::UnboundedReceiver<dp::RegisterRequest> {
    let (tx, rx) = mpsc::unbounded_channel();
    let listener = tokio::net::UnixListener::bind(dir.join("kubelet.sock")).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(dp::registration_server::RegistrationServer::new(Kubelet {
                tx,
            }))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    rx
}

/// The PodResources server listing `pods` on `socket`.
pub fn serve_pod_resources(
    rt: &tokio::runtime::Runtime,
    socket: &Path,
    pods: &PodResources,
) -> tokio::task::JoinHandle<Result<(), tonic::transport::Error>> {
    let listener = {
        let _guard = rt.enter();
        tokio::net::UnixListener::bind(socket).unwrap()
    };
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(
                pr::pod_resources_lister_server::PodResourcesListerServer::new(pods.clone()),
            )
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    )
}

pub async fn next_registration(
    rx: &mut mpsc::UnboundedReceiver<dp::RegisterRequest>,
) -> dp::RegisterRequest {
    tokio::time::timeout(Duration::from_secs(60), rx.recv())
        .await
        .expect("the plugin registers within 60 s")
        .expect("registration channel open")
}

/// The first device list ListAndWatch sends.
pub async fn first_device_list(kubelet: &Path) -> Vec<dp::Device> {
    let mut stream = plugin_client(kubelet)
        .await
        .list_and_watch(dp::Empty {})
        .await
        .unwrap()
        .into_inner();
    stream.message().await.unwrap().unwrap().devices
}

pub async fn plugin_client(
    kubelet: &Path,
) -> dp::device_plugin_client::DevicePluginClient<tonic::transport::Channel> {
    dp::device_plugin_client::DevicePluginClient::new(
        unix_channel(&kubelet.join("gpuslice.sock")).await.unwrap(),
    )
}

/// The plugin process, killed when the test ends however it ends; its standard error is collected
/// as it comes.
pub struct PluginProcess {
    child: Option<Child>,
    stderr: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl PluginProcess {
    /// Starts `cmd` (a `gpuslice device-plugin` command line), collecting its standard error.
    pub fn spawn(mut cmd: Command) -> PluginProcess {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("gpuslice device-plugin starts");
        let pipe = child.stderr.take().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let collected = stderr.clone();
        let reader = std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut s = collected.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        PluginProcess {
            child: Some(child),
            stderr,
            reader: Some(reader),
        }
    }

    /// What it has written to standard error so far.
    pub fn stderr_so_far(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Stops it and returns what it wrote to standard error.
    pub fn stop(mut self) -> String {
        let mut child = self.child.take().expect("running");
        let _ = child.kill();
        let _ = child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        self.stderr_so_far()
    }
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One Allocate call of one container, and how long it took.
pub fn allocate(
    rt: &tokio::runtime::Runtime,
    kubelet: &Path,
    ids: Vec<String>,
) -> (
    Result<dp::ContainerAllocateResponse, tonic::Status>,
    Duration,
) {
    let start = Instant::now();
    let r = rt.block_on(async {
        plugin_client(kubelet)
            .await
            .allocate(dp::AllocateRequest {
                container_requests: vec![dp::ContainerAllocateRequest { devices_ids: ids }],
            })
            .await
    });
    (
        r.map(|r| r.into_inner().container_responses.remove(0)),
        start.elapsed(),
    )
}

/// The plugin's socket answers (it serves before it registers, so no kubelet is needed).
pub fn wait_for_socket(kubelet: &Path, plugin: &PluginProcess) {
    wait_until("the plugin serving", Duration::from_secs(60), || {
        assert!(
            !plugin.stderr_so_far().contains("gpuslice: "),
            "{}",
            plugin.stderr_so_far()
        );
        kubelet.join("gpuslice.sock").exists()
    });
}

/// The CDI devices an Allocate answered.
pub fn cdi_names(resp: &dp::ContainerAllocateResponse) -> Vec<String> {
    resp.cdi_devices.iter().map(|d| d.name.clone()).collect()
}

pub fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The runtime the kubelet stand-in's gRPC servers and clients run on.
pub fn kubelet_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
