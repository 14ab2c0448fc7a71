//! `gpuslice device-plugin` against a kubelet stand-in (its registration server, a client of the
//! plugin's socket, a PodResources server; tonic on Unix sockets in a temporary directory), on simgpu
//! with 2 GPUs. The plugin is the real command, run as a child process.

mod support;

use gpuslice_node::api::deviceplugin as dp;
use gpuslice_node::api::podresources as pr;
use gpuslice_node::plugin::slice_memory;
use std::path::Path;
use std::time::{Duration, Instant};
use support::kubelet::*;
use support::*;

fn start_plugin(scene: &Scene, kubelet: &Path, podres: &Path, extra: &[&str]) -> PluginProcess {
    let mut cmd = scene.command(gpuslice_bin());
    cmd.arg("device-plugin")
        .arg("--kubelet-dir")
        .arg(kubelet)
        .arg("--state-dir")
        .arg(&scene.state)
        .arg("--cdi-dir")
        .arg(&scene.cdi)
        .arg("--library")
        .arg(library())
        .arg("--pod-resources-socket")
        .arg(podres)
        .args(["--sweep-seconds", "1"])
        .args(extra);
    PluginProcess::spawn(cmd)
}

/// The workload as root in a private mount namespace with an Allocate response's mounts and env
/// (mount points under a tmpfs on /run; the library comes by LD_PRELOAD from its host path).
fn run_allocated(scene: &Scene, resp: &dp::ContainerAllocateResponse, args: &[&str]) -> Run {
    let mut script = String::from("set -e\nmount -t tmpfs -o mode=0755 gpuslice-run /run\n");
    for m in &resp.mounts {
        if !m.container_path.starts_with("/run/gpuslice/") {
            continue;
        }
        let is_dir = Path::new(&m.host_path).is_dir();
        script.push_str(&format!(
            "[ -e '{c}' ] || {{ mkdir -p \"$(dirname '{c}')\"; {mk} '{c}'; }}\nmount --bind '{h}' '{c}'\n",
            c = m.container_path,
            h = m.host_path,
            mk = if is_dir { "mkdir -p" } else { "touch" }
        ));
        if m.read_only {
            script.push_str(&format!(
                "mount -o remount,bind,ro '{}'\n",
                m.container_path
            ));
        }
    }
    script.push_str("exec \"$@\"\n");
    let mut cmd = scene.command("unshare");
    cmd.args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        &script,
        "container",
    ])
    .arg(workload_bin())
    .args(args)
    .env("LD_PRELOAD", library())
    .envs(resp.envs.iter());
    run(&mut cmd)
}

fn device_share(scene: &Scene, tenant: &str) -> Option<u64> {
    let r = run(scene
        .command(gpuslice_bin())
        .args(["status", "--json"])
        .env("GPUSLICE_DEVICE_DIR", scene.state.join("devices"))
        .env("GPUSLICE_LEDGER_DIR", scene.dir.join("none")));
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).ok()?;
    doc["compute"]
        .as_array()?
        .iter()
        .find(|row| row["tenant"] == tenant)
        .and_then(|row| row["share"].as_u64())
}

#[test]
fn device_plugin_against_a_kubelet_stand_in() {
    let scene = Scene::new(
        "plugin",
        &[("SIMGPU_DEVICES", "2"), ("SIMGPU_MEMORY", "16GiB")],
    );
    let kubelet = scene.dir.join("kubelet");
    std::fs::create_dir_all(&kubelet).unwrap();
    let podres_sock = scene.dir.join("pod-resources.sock");
    let rt = kubelet_runtime();
    let _guard = rt.enter();
    let pods = PodResources::default();
    let serve_pods = |pods: &PodResources| {
        let _ = std::fs::remove_file(&podres_sock);
        serve_pod_resources(&rt, &podres_sock, pods)
    };
    let pod_server = serve_pods(&pods);

    // The plugin starts before the kubelet listens: it retries until it can register.
    let plugin = start_plugin(&scene, &kubelet, &podres_sock, &[]);
    std::thread::sleep(Duration::from_millis(1500));
    let mut registrations = serve_kubelet(&kubelet);
    let reg = rt.block_on(next_registration(&mut registrations));
    assert_eq!(reg.version, "v1beta1");
    assert_eq!(reg.endpoint, "gpuslice.sock");
    assert_eq!(reg.resource_name, "gpuslice.io/slice");
    assert!(reg.options.unwrap().get_preferred_allocation_available);

    // ListAndWatch: 10 healthy slices of each of the 2 GPUs.
    let devices = rt.block_on(first_device_list(&kubelet));
    assert_eq!(devices.len(), 20, "{devices:?}");
    assert!(devices.iter().all(|d| d.health == "Healthy"));
    let uuids: Vec<String> = devices
        .iter()
        .map(|d| d.id.split("::").next().unwrap().to_string())
        .fold(Vec::new(), |mut v, u| {
            if !v.contains(&u) {
                v.push(u);
            }
            v
        });
    assert_eq!(uuids.len(), 2);
    let id = |g: usize, i: u32| format!("{}::{i}", uuids[g]);
    for g in 0..2 {
        for i in 0..10 {
            assert!(
                devices.iter().any(|d| d.id == id(g, i)),
                "{} missing",
                id(g, i)
            );
        }
    }

    // GetPreferredAllocation packs: 3 slices go where exactly 3 are left, 5 onto one GPU.
    let mut available: Vec<String> = (7..10).map(|i| id(0, i)).collect();
    available.extend((0..10).map(|i| id(1, i)));
    let preferred = rt.block_on(async {
        plugin_client(&kubelet)
            .await
            .get_preferred_allocation(dp::PreferredAllocationRequest {
                container_requests: vec![
                    dp::ContainerPreferredAllocationRequest {
                        available_device_i_ds: available.clone(),
                        must_include_device_i_ds: vec![],
                        allocation_size: 3,
                    },
                    dp::ContainerPreferredAllocationRequest {
                        available_device_i_ds: available.clone(),
                        must_include_device_i_ds: vec![],
                        allocation_size: 5,
                    },
                ],
            })
            .await
            .unwrap()
            .into_inner()
            .container_responses
    });
    assert_eq!(preferred[0].device_i_ds, vec![id(0, 7), id(0, 8), id(0, 9)]);
    assert_eq!(preferred[1].device_i_ds.len(), 5);
    assert!(preferred[1]
        .device_i_ds
        .iter()
        .all(|d| d.starts_with(&uuids[1])));

    // Allocate across two GPUs is refused, and creates nothing.
    let err = rt
        .block_on(async {
            plugin_client(&kubelet)
                .await
                .allocate(dp::AllocateRequest {
                    container_requests: vec![dp::ContainerAllocateRequest {
                        devices_ids: vec![id(0, 0), id(1, 0)],
                    }],
                })
                .await
        })
        .unwrap_err();
    assert!(err.message().contains("must be on one GPU"), "{err:?}");
    assert!(
        !scene.state.join("tenants").exists()
            || std::fs::read_dir(scene.state.join("tenants"))
                .unwrap()
                .count()
                == 0
    );

    // All or nothing: the first container's slices are fine, the second's are not; the first
    // container's tenant is removed again.
    let err = rt
        .block_on(async {
            plugin_client(&kubelet)
                .await
                .allocate(dp::AllocateRequest {
                    container_requests: vec![
                        dp::ContainerAllocateRequest {
                            devices_ids: vec![id(0, 5), id(0, 6)],
                        },
                        dp::ContainerAllocateRequest {
                            devices_ids: vec![id(0, 7), id(1, 7)],
                        },
                    ],
                })
                .await
        })
        .unwrap_err();
    assert!(err.message().contains("must be on one GPU"), "{err:?}");
    let left: Vec<_> = std::fs::read_dir(scene.state.join("tenants"))
        .unwrap()
        .chain(std::fs::read_dir(&scene.cdi).into_iter().flatten())
        .map(|e| e.unwrap().path())
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(device_share(&scene, &format!("k8s-{}-5", uuids[0])), None);

    // Allocate 3 of 10 slices of GPU 0: a tenant with 3/10 of its memory and share 30.
    let resp = rt
        .block_on(async {
            plugin_client(&kubelet)
                .await
                .allocate(dp::AllocateRequest {
                    container_requests: vec![dp::ContainerAllocateRequest {
                        devices_ids: vec![id(0, 0), id(0, 1), id(0, 2)],
                    }],
                })
                .await
        })
        .unwrap()
        .into_inner()
        .container_responses
        .remove(0);
    let tenant = format!("k8s-{}-0", uuids[0]);
    assert_eq!(
        resp.cdi_devices
            .iter()
            .map(|d| d.name.as_str())
            .collect::<Vec<_>>(),
        vec![format!("gpuslice.io/tenant={tenant}")]
    );
    assert_eq!(resp.envs.get("NVIDIA_VISIBLE_DEVICES"), Some(&uuids[0]));
    assert!(scene
        .cdi
        .join(format!("gpuslice.io-tenant-{tenant}.json"))
        .exists());
    let quota = slice_memory(16 << 30, 3, 10);
    assert_eq!(quota, 2457 * 2 * MIB);
    let r = run_allocated(&scene, &resp, &["--chunk", "2"]);
    r.assert_success();
    assert_eq!(r.get_u64("total"), quota, "{}", r.report());
    // The context is charged what simgpu spent on it (300 MiB by default; docs/MEMORY.md).
    assert_eq!(r.get_u64("allocated"), quota - 300 * MIB, "{}", r.report());
    assert_eq!(
        r.get("outcome"),
        "CUDA_ERROR_OUT_OF_MEMORY",
        "{}",
        r.report()
    );
    assert_eq!(device_share(&scene, &tenant), Some(30));

    // The kubelet restarts: its directory is wiped; the plugin serves and registers again.
    for e in std::fs::read_dir(&kubelet).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    let mut registrations = serve_kubelet(&kubelet);
    let reg = rt.block_on(next_registration(&mut registrations));
    assert_eq!(reg.endpoint, "gpuslice.sock");
    let devices = rt.block_on(first_device_list(&kubelet));
    assert_eq!(devices.len(), 20);

    // PodResources names the pod in the tenant's policy.
    let pod = |ids: Vec<String>| pr::PodResources {
        name: "trainer-0".into(),
        namespace: "ml".into(),
        containers: vec![pr::ContainerResources {
            name: "main".into(),
            devices: vec![pr::ContainerDevices {
                resource_name: "gpuslice.io/slice".into(),
                device_ids: ids,
            }],
        }],
    };
    *pods.0.lock().unwrap() = vec![pod(vec![id(0, 0), id(0, 1), id(0, 2)])];
    let policy_path = scene.state.join(format!("tenants/{tenant}/policy.toml"));
    wait_until(
        "the pod named in the policy",
        Duration::from_secs(30),
        || std::fs::read_to_string(&policy_path).is_ok_and(|p| p.contains("pod = \"trainer-0\"")),
    );

    // PodResources goes away: nothing is removed while the plugin cannot tell which pods exist.
    pod_server.abort();
    let _ = rt.block_on(pod_server);
    pods.0.lock().unwrap().clear();
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        policy_path.exists(),
        "removed while PodResources was unreachable"
    );
    *pods.0.lock().unwrap() = vec![pod(vec![id(0, 0), id(0, 1), id(0, 2)])];
    let _pod_server = serve_pods(&pods);

    // The pod is gone but a process of its tenant lives: the tenant stays until it ends.
    let holder_resp = resp.clone();
    let scene_ref = &scene;
    std::thread::scope(|s| {
        let holder = s.spawn(move || {
            run_allocated(
                scene_ref,
                &holder_resp,
                &["--chunk", "256", "--max", "256", "--hold-ms", "6000"],
            )
        });
        // Its ledger slot is taken once the workload has allocated.
        wait_until("the holder's allocation", Duration::from_secs(30), || {
            gpuslice_state::ledger::Ledger::open_readonly(
                &scene_ref
                    .state
                    .join(format!("tenants/{tenant}/{tenant}.ledger")),
            )
            .is_ok_and(|l| {
                l.snapshot()
                    .processes
                    .iter()
                    .any(|p| p.alive && !p.used.is_empty())
            })
        });
        pods.0.lock().unwrap().clear();
        std::thread::sleep(Duration::from_secs(4));
        assert!(
            policy_path.exists(),
            "removed while a process of the tenant was alive"
        );
        holder.join().unwrap().assert_success();
    });
    wait_until(
        "the gone pod's tenant removed",
        Duration::from_secs(30),
        || {
            // The plugin logs the removal after it is done.
            !scene.state.join(format!("tenants/{tenant}")).exists()
                && plugin.stderr_so_far().contains("removed (its pod is gone)")
        },
    );
    assert!(!scene
        .cdi
        .join(format!("gpuslice.io-tenant-{tenant}.json"))
        .exists());
    assert_eq!(device_share(&scene, &tenant), None);

    let stderr = plugin.stop();
    assert!(
        stderr.contains("registering with the kubelet") && stderr.contains("retrying"),
        "{stderr}"
    );
    assert!(stderr.contains("the kubelet restarted"), "{stderr}");
    assert!(stderr.contains("removed (its pod is gone)"), "{stderr}");
    // The all-or-nothing Allocate had created the first container's tenant before it took it back.
    assert!(
        stderr.contains(&format!("tenant k8s-{}-5 removed", uuids[0])),
        "{stderr}"
    );
    assert!(
        stderr.contains("PodResources: ") && stderr.contains("no tenant removed this time"),
        "{stderr}"
    );
}

/// Files under the tenants and CDI directories (a half-created tenant would leave one).
fn node_files(scene: &Scene) -> Vec<String> {
    let mut out = Vec::new();
    for dir in [scene.state.join("tenants"), scene.cdi.clone()] {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            out.extend(entries.filter_map(|e| e.ok()).map(|e| {
                e.path()
                    .strip_prefix(&scene.dir)
                    .unwrap()
                    .display()
                    .to_string()
            }));
        }
    }
    out.sort();
    out
}

/// A kubelet that dies mid-call: its registration socket accepts the plugin's Register call and
/// closes the connection without answering; later its Allocate call is dropped after the plugin
/// created the tenant but before the answer. The plugin says so, retries registration until a
/// kubelet answers, and removes the unanswered allocation's tenant (directory, policy, ledger,
/// device-ledger entry, CDI spec); then it still registers after a restart and allocates.
#[test]
fn kubelet_going_away_mid_call() {
    use std::io::Read;
    let scene = Scene::new("gone", &[("SIMGPU_MEMORY", "16GiB")]);
    let kubelet = scene.dir.join("kubelet");
    std::fs::create_dir_all(&kubelet).unwrap();
    let rt = kubelet_runtime();
    let _guard = rt.enter();

    // A kubelet socket that reads the start of each connection and hangs up, until the plugin has
    // said that a Register call was cut (the gRPC channel reconnects by itself, so a cut connection
    // is not always a failed call).
    let listener = std::os::unix::net::UnixListener::bind(kubelet.join("kubelet.sock")).unwrap();
    listener.set_nonblocking(true).unwrap();
    // No PodResources: the sweep never removes a tenant, so only Allocate's own undo can.
    let plugin = start_plugin(
        &scene,
        &kubelet,
        &scene.dir.join("no-pod-resources.sock"),
        &["--allocate-answer-delay-ms", "15000"],
    );
    let mut hung_up = 0;
    wait_until("a Register call cut", Duration::from_secs(60), || {
        while let Ok((mut conn, _)) = listener.accept() {
            conn.set_nonblocking(false).unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            // The HTTP/2 preface and the call's frames, then the connection dropped.
            let mut buf = [0u8; 4096];
            if conn.read(&mut buf).unwrap_or(0) > 0 {
                hung_up += 1;
            }
        }
        plugin
            .stderr_so_far()
            .contains("the kubelet hung up during Register")
    });
    assert!(hung_up > 0);
    drop(listener);
    std::fs::remove_file(kubelet.join("kubelet.sock")).unwrap();
    let mut registrations = serve_kubelet(&kubelet);
    let reg = rt.block_on(next_registration(&mut registrations));
    assert_eq!(reg.endpoint, "gpuslice.sock");
    let devices = rt.block_on(first_device_list(&kubelet));
    let uuid = devices[0].id.split("::").next().unwrap().to_string();
    let ids: Vec<String> = (0..3).map(|i| format!("{uuid}::{i}")).collect();
    let tenant = format!("k8s-{uuid}-0");
    let before = node_files(&scene);
    assert!(before.is_empty(), "{before:?}");

    // Allocate, and the kubelet goes away once the tenant exists, before the answer.
    let call = {
        let kubelet = kubelet.clone();
        let ids = ids.clone();
        rt.spawn(async move {
            plugin_client(&kubelet)
                .await
                .allocate(dp::AllocateRequest {
                    container_requests: vec![dp::ContainerAllocateRequest { devices_ids: ids }],
                })
                .await
        })
    };
    let tenant_dir = scene.state.join(format!("tenants/{tenant}"));
    wait_until("the tenant created", Duration::from_secs(60), || {
        scene
            .state
            .join(format!("device-plugin/{tenant}.slices"))
            .exists()
            && tenant_dir.join(format!("{tenant}.ledger")).exists()
    });
    assert_eq!(device_share(&scene, &tenant), Some(30));
    call.abort();
    assert!(rt.block_on(call).unwrap_err().is_cancelled());
    wait_until(
        "the unanswered tenant removed",
        Duration::from_secs(60),
        || node_files(&scene) == before,
    );
    assert_eq!(device_share(&scene, &tenant), None);

    // The kubelet restarts: registration again, and an Allocate that is answered keeps its tenant.
    for e in std::fs::read_dir(&kubelet).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    let mut registrations = serve_kubelet(&kubelet);
    rt.block_on(next_registration(&mut registrations));
    let resp = rt
        .block_on(async {
            plugin_client(&kubelet)
                .await
                .allocate(dp::AllocateRequest {
                    container_requests: vec![dp::ContainerAllocateRequest { devices_ids: ids }],
                })
                .await
        })
        .unwrap()
        .into_inner();
    assert_eq!(
        resp.container_responses[0].cdi_devices[0].name,
        format!("gpuslice.io/tenant={tenant}")
    );
    assert!(tenant_dir.join(format!("{tenant}.ledger")).exists());
    assert!(scene
        .cdi
        .join(format!("gpuslice.io-tenant-{tenant}.json"))
        .exists());
    assert_eq!(device_share(&scene, &tenant), Some(30));

    let stderr = plugin.stop();

    assert!(
        stderr.contains("the kubelet hung up during Register") && stderr.contains("retrying"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "the kubelet went away before the answer; tenant {tenant} removed"
        )),
        "{stderr}"
    );
    assert!(stderr.contains("the kubelet restarted"), "{stderr}");
}

/// A CDI-default cluster: once NVIDIA's CDI spec (kind `nvidia.com/gpu`) is in a CDI spec
/// directory, Allocate names NVIDIA's device for the GPU beside ours; before it, and with
/// `--nvidia-cdi off`, it does not; with `--nvidia-cdi on` it names the GPU by UUID regardless.
#[test]
fn nvidia_cdi_device_beside_ours() {
    let scene = Scene::new(
        "nvcdi",
        &[("SIMGPU_DEVICES", "2"), ("SIMGPU_MEMORY", "8GiB")],
    );
    let kubelet = scene.dir.join("kubelet");
    let specs = scene.dir.join("etc-cdi");
    std::fs::create_dir_all(&kubelet).unwrap();
    std::fs::create_dir_all(&specs).unwrap();
    let rt = kubelet_runtime();
    let _guard = rt.enter();
    let spec_dir = specs.display().to_string();
    let plugin = start_plugin(
        &scene,
        &kubelet,
        &scene.dir.join("no-pod-resources.sock"),
        &["--cdi-spec-dir", &spec_dir],
    );
    wait_for_socket(&kubelet, &plugin);
    let devices = rt.block_on(first_device_list(&kubelet));
    let uuid = devices[0].id.split("::").next().unwrap().to_string();
    let other = devices
        .iter()
        .map(|d| d.id.split("::").next().unwrap().to_string())
        .find(|u| *u != uuid)
        .unwrap();

    // No NVIDIA spec yet: our device only.
    let (r, _) = allocate(&rt, &kubelet, vec![format!("{uuid}::0")]);
    let resp = r.unwrap();
    let ours = format!("gpuslice.io/tenant=k8s-{uuid}-0");
    assert_eq!(cdi_names(&resp), vec![ours.clone()]);

    // NVIDIA's spec appears (as the GPU Operator's toolkit writes it, YAML, names by index and
    // UUID): the next Allocate names NVIDIA's device for its GPU.
    std::fs::write(
        specs.join("nvidia.yaml"),
        format!(
            "---\ncdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n- name: {uuid}\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n- name: \"1\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia1\ncontainerEdits:\n  deviceNodes:\n  - path: /dev/nvidiactl\n"
        ),
    )
    .unwrap();
    wait_until("NVIDIA's spec found", Duration::from_secs(30), || {
        plugin
            .stderr_so_far()
            .contains("NVIDIA's CDI spec found at")
    });
    let (r, _) = allocate(&rt, &kubelet, vec![format!("{uuid}::1")]);
    assert_eq!(
        cdi_names(&r.unwrap()),
        vec![
            format!("gpuslice.io/tenant=k8s-{uuid}-1"),
            format!("nvidia.com/gpu={uuid}")
        ]
    );
    // The other GPU is named by index only in the spec: by index.
    let (r, _) = allocate(&rt, &kubelet, vec![format!("{other}::0")]);
    let names = cdi_names(&r.unwrap());
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(
        names[1] == "nvidia.com/gpu=1" || names[1] == "nvidia.com/gpu=0",
        "{names:?}"
    );
    let stderr = plugin.stop();
    assert!(stderr.contains("no NVIDIA CDI spec in"), "{stderr}");

    // Off: never; on: by UUID even without a spec.
    for (mode, want) in [
        ("off", None),
        ("on", Some(format!("nvidia.com/gpu={uuid}"))),
    ] {
        let _ = std::fs::remove_file(specs.join("nvidia.yaml"));
        let _ = std::fs::remove_file(kubelet.join("gpuslice.sock"));
        let plugin = start_plugin(
            &scene,
            &kubelet,
            &scene.dir.join("no-pod-resources.sock"),
            &["--cdi-spec-dir", &spec_dir, "--nvidia-cdi", mode],
        );
        wait_for_socket(&kubelet, &plugin);
        let (r, _) = allocate(&rt, &kubelet, vec![format!("{uuid}::5")]);
        let names = cdi_names(&r.unwrap());
        assert_eq!(
            names.get(1).cloned(),
            want,
            "--nvidia-cdi {mode}: {names:?}"
        );
        plugin.stop();
    }
}

/// A container root's and a kubelet's worst: the plugin answers every Allocate within 2 s and
/// refuses what it must.
/// * one slice ID sent several times (it would be the whole GPU) is refused;
/// * the `slices` file of a tenant replaced by a FIFO, or by a link to /dev/zero (and the
///   plugin's own record likewise): Allocate and the sweep go on;
/// * the next pod given the same slices gets a new tenant with a new ledger, not the previous
///   pod's (whose ledger the departing pod had wrecked).
#[test]
fn hostile_files_and_requests() {
    let scene = Scene::new("hostile", &[("SIMGPU_MEMORY", "16GiB")]);
    let kubelet = scene.dir.join("kubelet");
    std::fs::create_dir_all(&kubelet).unwrap();
    let podres_sock = scene.dir.join("pod-resources.sock");
    let rt = kubelet_runtime();
    let _guard = rt.enter();
    let pods = PodResources::default();
    serve_pod_resources(&rt, &podres_sock, &pods);
    let plugin = start_plugin(&scene, &kubelet, &podres_sock, &[]);
    wait_for_socket(&kubelet, &plugin);
    let devices = rt.block_on(first_device_list(&kubelet));
    let uuid = devices[0].id.split("::").next().unwrap().to_string();
    let id = |i: u32| format!("{uuid}::{i}");
    let within = |d: Duration, what: &str| {
        assert!(d < Duration::from_secs(2), "{what}: answered after {d:?}");
    };

    // Duplicate IDs: refused, nothing created.
    let (r, took) = allocate(&rt, &kubelet, vec![id(3); 10]);
    within(took, "duplicate IDs");
    let e = r.unwrap_err();
    assert!(e.message().contains("more than once"), "{e:?}");
    assert!(node_files(&scene).is_empty(), "{:?}", node_files(&scene));

    // A tenant no pod holds (yet).
    let (r, took) = allocate(&rt, &kubelet, vec![id(0), id(1)]);
    within(took, "first pod");
    let tenant = format!("k8s-{uuid}-0");
    assert_eq!(
        cdi_names(&r.unwrap()),
        vec![format!("gpuslice.io/tenant={tenant}")]
    );
    let hold = |ids: Vec<String>, name: &str| pr::PodResources {
        name: name.into(),
        namespace: "ml".into(),
        containers: vec![pr::ContainerResources {
            name: "main".into(),
            devices: vec![pr::ContainerDevices {
                resource_name: "gpuslice.io/slice".into(),
                device_ids: ids,
            }],
        }],
    };
    *pods.0.lock().unwrap() = vec![hold(vec![id(0), id(1)], "first")];

    // Container root plants a FIFO and a link to /dev/zero where a tenant's `slices` file was,
    // and the same over the plugin's own record.
    let tenant_dir = scene.state.join(format!("tenants/{tenant}"));
    let record = scene.state.join(format!("device-plugin/{tenant}.slices"));
    assert!(record.is_file(), "{}", record.display());
    let mkfifo = |p: &Path| {
        let _ = std::fs::remove_file(p);
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    };
    mkfifo(&tenant_dir.join("slices"));
    mkfifo(&record);
    let (r, took) = allocate(&rt, &kubelet, vec![id(4)]);
    within(took, "a FIFO planted");
    r.unwrap();
    std::fs::remove_file(&record).unwrap();
    std::fs::remove_file(tenant_dir.join("slices")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &record).unwrap();
    std::os::unix::fs::symlink("/dev/zero", tenant_dir.join("slices")).unwrap();
    let (r, took) = allocate(&rt, &kubelet, vec![id(5)]);
    within(took, "a link to /dev/zero planted");
    r.unwrap();
    // Sweeps over the planted files: the plugin lives and answers; the tenant whose record is
    // unreadable counts as holding nothing, so (no process of it alive) it goes.
    wait_until(
        "the tenant with a wrecked record removed",
        Duration::from_secs(30),
        || !tenant_dir.exists(),
    );
    let (r, took) = allocate(&rt, &kubelet, vec![id(6)]);
    within(took, "after sweeps over planted files");
    r.unwrap();
    let stderr = plugin.stderr_so_far();
    assert!(
        stderr.contains("a FIFO, expected a regular file")
            || stderr.contains("a symbolic link (not followed)"),
        "{stderr}"
    );

    // The next pod after a pod with the same slices: a pod's tenant, held by its pod, wrecks its
    // ledger and ends; the kubelet gives the same slices to the next pod before any sweep saw the
    // first pod go.
    let (r, _) = allocate(&rt, &kubelet, vec![id(8), id(9)]);
    let first = r.unwrap();
    let tenant = format!("k8s-{uuid}-8");
    assert_eq!(
        cdi_names(&first),
        vec![format!("gpuslice.io/tenant={tenant}")]
    );
    *pods.0.lock().unwrap() = vec![hold(vec![id(8), id(9)], "first")];
    let ledger = scene
        .state
        .join(format!("tenants/{tenant}/{tenant}.ledger"));
    let first_id = gpuslice_state::ledger::Ledger::open_readonly(&ledger)
        .unwrap()
        .id()
        .unwrap();
    std::fs::write(&ledger, b"wrecked").unwrap();
    let (r, took) = allocate(&rt, &kubelet, vec![id(8), id(9)]);
    within(took, "the next pod");
    let next = r.unwrap();
    *pods.0.lock().unwrap() = vec![hold(vec![id(8), id(9)], "next")];
    let next_tenant = cdi_names(&next)[0]
        .strip_prefix("gpuslice.io/tenant=")
        .unwrap()
        .to_string();
    let next_ledger = scene
        .state
        .join(format!("tenants/{next_tenant}/{next_tenant}.ledger"));
    let next_id = gpuslice_state::ledger::Ledger::open_readonly(&next_ledger)
        .expect("the next pod's tenant has a ledger of its own")
        .id()
        .unwrap();
    assert_ne!(
        next_id, first_id,
        "the next pod got the previous pod's tenant"
    );
    let r = run_allocated(&scene, &next, &["--chunk", "2"]);
    r.assert_success();
    assert_eq!(
        r.get_u64("total"),
        slice_memory(16 << 30, 2, 10),
        "{}",
        r.report()
    );
    assert_eq!(
        r.get("outcome"),
        "CUDA_ERROR_OUT_OF_MEMORY",
        "{}",
        r.report()
    );
    plugin.stop();
}

/// `--slice-memory 4GiB`: 2 slices on an 8 GiB GPU, 4 on a 16 GiB one, each 4 GiB with a share
/// proportional to it; node labels for NFD say so; 3 slices over two GPUs of 2 free slices each
/// are refused naming why. No kubelet: the log has a start-up summary and retry lines naming the
/// missing socket, with timestamps and levels (and as JSON with --log-format json).
#[test]
fn slices_by_memory_and_a_daemon_log() {
    for (memory, per_gpu, share) in [("8GiB", 2u32, 50u64), ("16GiB", 4, 25)] {
        let scene = Scene::new(
            "bysize",
            &[("SIMGPU_DEVICES", "2"), ("SIMGPU_MEMORY", memory)],
        );
        let kubelet = scene.dir.join("kubelet");
        std::fs::create_dir_all(&kubelet).unwrap();
        let features = scene.dir.join("features.d");
        let rt = kubelet_runtime();
        let _guard = rt.enter();
        let json = memory == "16GiB";
        let mut args = vec![
            "--slice-memory",
            "4GiB",
            "--nfd-features-dir",
            features.to_str().unwrap(),
        ];
        if json {
            args.extend(["--log-format", "json"]);
        }
        let plugin = start_plugin(
            &scene,
            &kubelet,
            &scene.dir.join("no-pod-resources.sock"),
            &args,
        );
        wait_for_socket(&kubelet, &plugin);
        let devices = rt.block_on(first_device_list(&kubelet));
        assert_eq!(devices.len() as u32, 2 * per_gpu, "{memory}: {devices:?}");
        let mut uuids: Vec<String> = devices
            .iter()
            .map(|d| d.id.split("::").next().unwrap().to_string())
            .collect();
        uuids.dedup();
        assert_eq!(uuids.len(), 2);
        let labels = std::fs::read_to_string(features.join("gpuslice")).unwrap();
        assert!(
            labels.contains("gpuslice.io/slice.memory-mib=4096\n"),
            "{labels}"
        );
        assert!(
            labels.contains(&format!("gpuslice.io/slice.count={}\n", 2 * per_gpu)),
            "{labels}"
        );

        // One slice: 4 GiB and the proportional share, whatever the GPU's size.
        let (r, _) = allocate(&rt, &kubelet, vec![format!("{}::0", uuids[0])]);
        let resp = r.unwrap();
        let tenant = format!("k8s-{}-0", uuids[0]);
        let policy =
            std::fs::read_to_string(scene.state.join(format!("tenants/{tenant}/policy.toml")))
                .unwrap();
        assert!(
            policy.contains(&format!("memory = {}", 4u64 << 30)),
            "{policy}"
        );
        assert_eq!(device_share(&scene, &tenant), Some(share));
        drop(resp);

        if memory == "8GiB" {
            // GPU 0 has slice 1 free, GPU 1 both: a request of 3 fits no single GPU.
            let ids = vec![
                format!("{}::1", uuids[0]),
                format!("{}::0", uuids[1]),
                format!("{}::1", uuids[1]),
            ];
            let (r, took) = allocate(&rt, &kubelet, ids);
            assert!(took < Duration::from_secs(2), "{took:?}");
            let e = r.unwrap_err();
            let m = e.message();
            assert!(m.contains("3 slices requested"), "{m}");
            assert!(m.contains("fit on no single GPU"), "{m}");
            assert!(m.contains(&format!("{} has 1 of 2 free", uuids[0])), "{m}");
            assert!(m.contains(&format!("{} has 2 of 2 free", uuids[1])), "{m}");
        }

        let stderr = plugin.stop();
        let sock = kubelet.join("kubelet.sock").display().to_string();
        let summary = stderr
            .lines()
            .find(|l| l.contains("starting: resource gpuslice.io/slice"))
            .unwrap_or_else(|| panic!("no start-up summary: {stderr}"));
        assert!(summary.contains("4 GiB on every GPU"), "{summary}");
        assert!(summary.contains(&format!("{per_gpu} slices")), "{summary}");
        let retry = stderr
            .lines()
            .find(|l| l.contains("registering with the kubelet"))
            .unwrap_or_else(|| panic!("no retry line: {stderr}"));
        assert!(retry.contains(&sock), "{retry}");
        assert!(retry.contains("No such file or directory"), "{retry}");
        assert!(retry.contains("retrying in"), "{retry}");
        if json {
            let v: serde_json::Value = serde_json::from_str(retry).unwrap();
            assert_eq!(v["level"], "WARN", "{retry}");
            assert!(
                v["timestamp"].as_str().is_some_and(|t| t.starts_with("20")),
                "{retry}"
            );
        } else {
            assert!(retry.contains(" WARN "), "{retry}");
            // RFC 3339 timestamp first.
            assert!(
                retry.starts_with("20") && retry.as_bytes()[10] == b'T',
                "{retry}"
            );
            assert!(summary.contains(" INFO "), "{summary}");
        }
    }
}

/// Beside NVIDIA's device plugin: a GPU an `nvidia.com/gpu` pod holds (PodResources) is reported
/// (log, `<state>/device-plugin/conflicts`) and its slices turn unhealthy until the pod is gone;
/// `--gpus` keeps the plugin to its own GPUs.
#[test]
fn gpu_also_allocated_through_nvidia() {
    let scene = Scene::new(
        "twice",
        &[("SIMGPU_DEVICES", "2"), ("SIMGPU_MEMORY", "8GiB")],
    );
    let kubelet = scene.dir.join("kubelet");
    std::fs::create_dir_all(&kubelet).unwrap();
    let podres_sock = scene.dir.join("pod-resources.sock");
    let rt = kubelet_runtime();
    let _guard = rt.enter();
    let pods = PodResources::default();
    serve_pod_resources(&rt, &podres_sock, &pods);
    let plugin = start_plugin(&scene, &kubelet, &podres_sock, &[]);
    wait_for_socket(&kubelet, &plugin);
    let mut stream = rt
        .block_on(async {
            plugin_client(&kubelet)
                .await
                .list_and_watch(dp::Empty {})
                .await
        })
        .unwrap()
        .into_inner();
    let first = rt.block_on(stream.message()).unwrap().unwrap().devices;
    assert!(first.iter().all(|d| d.health == "Healthy"));
    let uuid = first[0].id.split("::").next().unwrap().to_string();
    *pods.0.lock().unwrap() = vec![pr::PodResources {
        name: "whole-gpu".into(),
        namespace: "ml".into(),
        containers: vec![pr::ContainerResources {
            name: "cuda".into(),
            devices: vec![pr::ContainerDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: vec![uuid.clone()],
            }],
        }],
    }];
    let next = rt
        .block_on(tokio::time::timeout(
            Duration::from_secs(30),
            stream.message(),
        ))
        .expect("a new device list within 30 s")
        .unwrap()
        .unwrap()
        .devices;
    for d in &next {
        let want = if d.id.starts_with(&uuid) {
            "Unhealthy"
        } else {
            "Healthy"
        };
        assert_eq!(d.health, want, "{d:?}");
    }
    let conflicts = std::fs::read_to_string(scene.state.join("device-plugin/conflicts")).unwrap();
    assert_eq!(conflicts, format!("{uuid}\tml\twhole-gpu\tcuda\n"));
    // `gpuslice status --state-dir` reports it.
    let status = run(scene
        .command(gpuslice_bin())
        .args(["status", "--json", "--compute", "--state-dir"])
        .arg(&scene.state));
    let doc: serde_json::Value = serde_json::from_str(&status.stdout).expect(&status.stdout);
    assert_eq!(
        doc["also_allocated"][0]["uuid"],
        uuid.as_str(),
        "{}",
        status.stdout
    );
    assert_eq!(
        doc["also_allocated"][0]["pod"], "whole-gpu",
        "{}",
        status.stdout
    );
    assert!(
        status.stderr.contains("handed out twice"),
        "{}",
        status.stderr
    );
    pods.0.lock().unwrap().clear();
    let healed = rt
        .block_on(tokio::time::timeout(
            Duration::from_secs(30),
            stream.message(),
        ))
        .expect("a new device list within 30 s")
        .unwrap()
        .unwrap()
        .devices;
    assert!(healed.iter().all(|d| d.health == "Healthy"), "{healed:?}");
    let stderr = plugin.stop();
    assert!(
        stderr.contains(&format!(
            "GPU {uuid} is also allocated through nvidia.com/gpu to ml/whole-gpu (cuda)"
        )),
        "{stderr}"
    );
    assert!(stderr.contains(" ERROR "), "{stderr}");

    // --gpus: only the GPU named is offered.
    let _ = std::fs::remove_file(kubelet.join("gpuslice.sock"));
    let plugin = start_plugin(&scene, &kubelet, &podres_sock, &["--gpus", "1"]);
    wait_for_socket(&kubelet, &plugin);
    let devices = rt.block_on(first_device_list(&kubelet));
    assert_eq!(devices.len(), 10);
    assert!(
        devices.iter().all(|d| !d.id.starts_with(&uuid)),
        "{devices:?}"
    );
    plugin.stop();
}

/// A tenant process that takes the GPU's arbitration lock (a live slot of its own) and keeps
/// re-stamping it: Allocate, whose tenant creation must enter that lock, still answers within 2 s
/// (refused with the reason when the lock is not given up in time, `--allocate-timeout-seconds 1`);
/// what the late creation made is removed once the lock is free, and the next Allocate works.
#[test]
fn allocate_answers_while_a_tenant_holds_the_arbitration_lock() {
    use gpuslice_state::compute::device::{now_ns, DeviceLedger};
    use std::sync::atomic::{AtomicBool, Ordering};
    let scene = Scene::new("locked", &[("SIMGPU_MEMORY", "16GiB")]);
    let kubelet = scene.dir.join("kubelet");
    std::fs::create_dir_all(&kubelet).unwrap();
    let rt = kubelet_runtime();
    let _guard = rt.enter();
    let plugin = start_plugin(
        &scene,
        &kubelet,
        &scene.dir.join("no-pod-resources.sock"),
        &["--allocate-timeout-seconds", "1"],
    );
    wait_for_socket(&kubelet, &plugin);
    let devices = rt.block_on(first_device_list(&kubelet));
    let uuid = devices[0].id.split("::").next().unwrap().to_string();
    let (r, _) = allocate(&rt, &kubelet, vec![format!("{uuid}::0")]);
    r.unwrap();
    let ledger_path = scene.state.join(format!("devices/{uuid}.dev"));

    let stop = AtomicBool::new(false);
    let held = AtomicBool::new(false);
    let refused = std::thread::scope(|s| {
        s.spawn(|| {
            let l = DeviceLedger::open(&ledger_path, &uuid, false).unwrap();
            let slot = l.claim_slot(0).expect("a free slot");
            let _g = l.lock(slot);
            held.store(true, Ordering::Release);
            let start = Instant::now();
            while !stop.load(Ordering::Acquire) && start.elapsed() < Duration::from_secs(20) {
                l.layout().header.lock_ns.store(now_ns(), Ordering::Release);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        wait_until("the lock held", Duration::from_secs(10), || {
            held.load(Ordering::Acquire)
        });
        let (r, took) = allocate(&rt, &kubelet, vec![format!("{uuid}::1")]);
        let second = rt.block_on(async {
            let start = Instant::now();
            let r = plugin_client(&kubelet)
                .await
                .allocate(dp::AllocateRequest {
                    container_requests: vec![dp::ContainerAllocateRequest {
                        devices_ids: vec![format!("{uuid}::2")],
                    }],
                })
                .await;
            (r, start.elapsed())
        });
        stop.store(true, Ordering::Release);
        assert!(
            took < Duration::from_secs(2),
            "Allocate answered after {took:?}"
        );
        assert!(
            second.1 < Duration::from_secs(2),
            "the next Allocate answered after {:?}",
            second.1
        );
        // Refused with the reason, or (an arbitration that does not let a live holder keep the
        // lock) allocated: never late.
        let mut refused = Vec::new();
        for (i, r) in [(1, r.map(|_| ())), (2, second.0.map(|_| ()))] {
            if let Err(e) = r {
                assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e:?}");
                assert!(e.message().contains("nothing was allocated"), "{e:?}");
                refused.push(i);
            }
        }
        refused
    });
    // The lock is free: what the late creations of refused calls made is taken back, and Allocate
    // works again.
    wait_until("the late tenants removed", Duration::from_secs(30), || {
        refused
            .iter()
            .all(|i| !scene.state.join(format!("tenants/k8s-{uuid}-{i}")).exists())
    });
    let (r, took) = allocate(&rt, &kubelet, vec![format!("{uuid}::3")]);
    r.unwrap();
    assert!(took < Duration::from_secs(2), "{took:?}");
    let stderr = plugin.stop();
    assert!(
        refused.is_empty() || stderr.contains("no answer within"),
        "{stderr}"
    );
}
