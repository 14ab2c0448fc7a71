//! `podman run --device gpuslice.io/tenant=t1`: the CDI spec `gpuslice tenant create` wrote, used by a
//! real container runtime (podman and runc, installed by scripts/test), runs a simgpu client limited
//! to the tenant's quota.
//!
//! Hermetic: podman runs in a mount namespace of its own in which a tmpfs covers /run (so /var/run/cdi
//! is the scene's CDI directory bound there, and nothing of the machine's /run is seen or written),
//! with its storage, run and temporary directories in the scene, a private containers.conf
//! (CONTAINERS_CONF), no network and no image: the container's root is a directory holding the
//! client and the libraries it links (`--rootfs`). Podman 4.3 (Debian 12) reads CDI specs only from
//! /etc/cdi and /var/run/cdi (`cdi_spec_dirs` in containers.conf came with later versions; it is set
//! too, for them). simgpu stands in for the GPU as NVIDIA's CDI device would: a second spec, of
//! NVIDIA's kind (`nvidia.com/gpu`, devices named by the GPU's UUID and `all`, as `nvidia-ctk cdi
//! generate` names them), mounts its libraries and its state file; the container gets
//! `nvidia.com/gpu=<UUID>` beside `gpuslice.io/tenant=t1`, as the device plugin answers on a
//! CDI-default cluster.
//!
//! `podman_runs_a_pod_set_up_by_the_chart` takes the whole set-up from the Helm chart instead:
//! `helm template` (helm as scripts/check-deploy installs it under `<target>/tools`; skipped, saying
//! so, without helm or podman), the DaemonSet's install step and device plugin run with the rendered
//! arguments, environment and mounts, and podman runs what the plugin's Allocate answers.

mod support;

use std::path::{Path, PathBuf};
use support::kubelet::*;
use support::*;

/// `name` on PATH, or None.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Copies `file` and every library `ldd` says it loads into `rootfs`, each at its host path.
fn copy_with_libraries(rootfs: &Path, file: &Path, to: &str) {
    let place = |from: &Path, to: &Path| {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    };
    place(file, &rootfs.join(to.trim_start_matches('/')));
    let r = run(std::process::Command::new("ldd").arg(file));
    r.assert_success();
    for line in r.stdout.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or "/lib64/ld-linux-x86-64.so.2 (0x…)"
        let path = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            place(Path::new(p), &rootfs.join(p.trim_start_matches('/')));
        }
    }
}

/// The node's "GPU": a CDI spec in `dir` mounting simgpu's driver libraries and its state.
fn write_simgpu_spec(scene: &Scene, dir: &Path, uuid: &str) {
    let lib = |name: &str| {
        std::fs::canonicalize(simgpu_lib_dir().join(name))
            .unwrap()
            .display()
            .to_string()
    };
    let mount = |host: String, container: &str, mode: &str| {
        serde_json::json!({"hostPath": host, "containerPath": container,
                           "options": [mode, "nosuid", "nodev", "bind"]})
    };
    let spec = serde_json::json!({
        "cdiVersion": "0.3.0",
        "kind": "nvidia.com/gpu",
        "devices": ([uuid, "all"].iter().map(|name| serde_json::json!({"name": name, "containerEdits": {
            "env": ["SIMGPU_STATE=/var/lib/simgpu/state", "LD_LIBRARY_PATH=/opt/simgpu"],
            "mounts": [
                mount(lib("libcuda.so.1"), "/opt/simgpu/libcuda.so.1", "ro"),
                mount(lib("libnvidia-ml.so.1"), "/opt/simgpu/libnvidia-ml.so.1", "ro"),
                mount(scene.simgpu_state.display().to_string(), "/var/lib/simgpu/state", "rw"),
            ]}})).collect::<Vec<_>>())
    });
    std::fs::write(
        dir.join("nvidia.json"),
        serde_json::to_string_pretty(&spec).unwrap(),
    )
    .unwrap();
}

struct Podman {
    podman: PathBuf,
    dir: PathBuf,
    rootfs: PathBuf,
    cdi: PathBuf,
}

/// The cgroup the test's containers are made under (runc needs one), removed when the test ends:
/// podman's default parent (`libpod_parent`) would stay on the machine.
fn cgroup_parent() -> String {
    format!("/gpuslice-test-podman-{}", std::process::id())
}

impl Drop for Podman {
    fn drop(&mut self) {
        let name = cgroup_parent();
        let name = name.trim_start_matches('/');
        let root = Path::new("/sys/fs/cgroup");
        remove_cgroup(&root.join(name));
        for controller in std::fs::read_dir(root).into_iter().flatten().flatten() {
            remove_cgroup(&controller.path().join(name));
        }
    }
}

/// Removes an empty cgroup and the empty cgroups under it (podman leaves `conmon`'s).
fn remove_cgroup(dir: &Path) {
    for child in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if child.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup(&child.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

impl Podman {
    /// Podman reading CDI specs from `cdi` (bound on /var/run/cdi).
    fn new(scene: &Scene, podman: PathBuf, runtime: &Path, cdi: &Path) -> Podman {
        let dir = scene.dir.join("podman");
        for d in ["storage", "run", "tmp", "empty"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        // No rlimits in the container's spec: runc sets them with prlimit, and podman's defaults
        // (nofile, nproc) fail there on a machine whose root lacks CAP_SYS_RESOURCE.
        std::fs::write(
            dir.join("containers.conf"),
            format!(
                "[containers]\nnetns = \"none\"\ndefault_ulimits = []\n\
                 [engine]\ncdi_spec_dirs = [\"{cdi}\"]\nruntime = \"{rt}\"\n\
                 cgroup_manager = \"cgroupfs\"\nevents_logger = \"none\"\n\
                 [engine.runtimes]\n{rt} = [\"{path}\"]\n",
                cdi = cdi.display(),
                rt = runtime.file_name().unwrap().to_string_lossy(),
                path = runtime.display()
            ),
        )
        .unwrap();
        let rootfs = dir.join("rootfs");
        for d in ["proc", "sys", "dev", "tmp", "run", "etc"] {
            std::fs::create_dir_all(rootfs.join(d)).unwrap();
        }
        copy_with_libraries(&rootfs, &workload_bin(), "/bin/gpuslice-workload");
        // What the library needs (its dependencies are the client's: libc, libgcc_s).
        copy_with_libraries(&rootfs, &library(), "/tmp/libgpuslice-deps.so");
        std::fs::remove_file(rootfs.join("tmp/libgpuslice-deps.so")).unwrap();
        Podman {
            podman,
            dir,
            rootfs,
            cdi: cdi.to_path_buf(),
        }
    }

    /// `podman run --rm ARGS --rootfs <rootfs> /bin/gpuslice-workload WORKLOAD` in its own mount
    /// namespace.
    fn run(&self, scene: &Scene, args: &[&str], workload: &[&str]) -> Run {
        let script = "set -e\n\
            mount -t tmpfs -o mode=0755 gpuslice-podman /run\n\
            [ -L /var/run ] || mount -t tmpfs -o mode=0755 gpuslice-podman /var/run\n\
            mkdir -p /var/run/cdi\n\
            mount --bind \"$CDI\" /var/run/cdi\n\
            if [ -d /etc/cdi ]; then mount --bind \"$EMPTY\" /etc/cdi; fi\n\
            exec \"$PODMAN\" --root \"$DIR/storage\" --runroot \"$DIR/run\" --tmpdir \"$DIR/tmp\" \
                 --storage-driver vfs \"$@\"\n";
        let mut cmd = scene.command("unshare");
        cmd.args(["--mount", "--propagation", "private", "sh", "-c", script])
            .arg("podman")
            .args(["run", "--rm", "--network", "none", "--cgroup-parent"])
            .arg(cgroup_parent())
            .args(args)
            .arg("--rootfs")
            .arg(&self.rootfs)
            .arg("/bin/gpuslice-workload")
            .args(workload)
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .env("CDI", &self.cdi)
            .env("EMPTY", self.dir.join("empty"))
            .env("DIR", &self.dir)
            .env("PODMAN", &self.podman)
            // Nothing of simgpu or gpuslice reaches the container but what the specs give it.
            .env_remove("LD_LIBRARY_PATH");
        run(&mut cmd)
    }
}

#[test]
fn podman_runs_a_client_within_its_tenant_quota() {
    let (Some(podman), Some(runtime)) = (
        on_path("podman"),
        on_path("runc").or_else(|| on_path("crun")),
    ) else {
        panic!("podman and runc (or crun) are needed: scripts/test installs them (apt-get install podman runc)");
    };
    let etc_cdi_before = Path::new("/etc/cdi").exists();
    let scene = Scene::new("podman", &[("SIMGPU_MEMORY", "16GiB")]);
    // simgpu's state, made by a first client on the host.
    scene.gpuslice(&["tenant", "list"]).assert_success();
    // Podman 4.3's CDI library predates cdiVersion 0.7.0 (additionalGids): the groups are given with
    // --group-add instead.
    let r = scene.gpuslice(&[
        "tenant",
        "create",
        "t1",
        "--memory",
        "2GiB",
        "--gpu",
        "0",
        "--cdi-without-groups",
    ]);
    r.assert_success();
    let policy = std::fs::read_to_string(scene.state.join("tenants/t1/policy.toml")).unwrap();
    let uuid = policy
        .lines()
        .find_map(|l| l.strip_prefix("gpus = [\""))
        .and_then(|l| l.split('"').next())
        .unwrap_or_else(|| panic!("no GPU in {policy}"))
        .to_string();
    write_simgpu_spec(&scene, &scene.cdi, &uuid);
    // The device plugin finds this spec and names the GPU's device as the container below gets it.
    let nvidia_device = gpuslice_node::cdi::find_nvidia(std::slice::from_ref(&scene.cdi))
        .expect("the stand-in is found as NVIDIA's spec")
        .device_for(&uuid, "0")
        .expect("named by UUID");
    assert_eq!(nvidia_device, format!("nvidia.com/gpu={uuid}"));
    let gid = std::os::unix::fs::MetadataExt::gid(
        &std::fs::metadata(scene.state.join("tenants/t1")).unwrap(),
    )
    .to_string();
    let policy_before = std::fs::read(scene.state.join("tenants/t1/policy.toml")).unwrap();
    let pm = Podman::new(&scene, podman, &runtime, &scene.cdi);
    let devices = [
        "--device",
        "gpuslice.io/tenant=t1",
        "--device",
        nvidia_device.as_str(),
    ];

    // Uid 1001 with the tenant's and the device group; its environment asks for far more.
    let mut args = devices.to_vec();
    args.extend(["--user", "1001:1001", "--group-add", &gid, "--group-add"]);
    args.extend(["61000", "-e", "GPUSLICE_MEMORY_LIMIT=100GiB"]);
    let r = pm.run(&scene, &args, &["--chunk", "2"]);
    r.assert_success();
    assert_eq!(r.get_u64("total"), 2 * GIB, "{}", r.report());
    // Everything the context left is allocatable, and nothing more.
    let free = r.get_u64("free");
    assert!(free > 0 && free < 2 * GIB, "{}", r.report());
    assert_eq!(r.get_u64("allocated"), free, "{}", r.report());
    assert_eq!(
        r.get("outcome"),
        "CUDA_ERROR_OUT_OF_MEMORY",
        "{}",
        r.report()
    );
    // The library came in through the spec's /etc/ld.so.preload (no LD_PRELOAD is given).
    assert!(
        r.stderr.contains("tenant t1: cuMemAlloc of 2 MiB") && r.stderr.contains("refused"),
        "{}",
        r.report()
    );
    assert!(
        r.stderr.contains("100 GiB") && r.stderr.contains("ignored"),
        "{}",
        r.report()
    );

    // Without the groups the uid cannot reach its tenant: refused, never unlimited.
    let mut args = devices.to_vec();
    args.extend(["--user", "1001:1001"]);
    let r = pm.run(&scene, &args, &["--chunk", "2"]);
    assert!(
        r.stderr
            .contains("/run/gpuslice/tenant/policy.toml: Permission denied")
            && r.stdout.contains("CUDA_ERROR_OUT_OF_MEMORY")
            && !r.stdout.contains("allocated="),
        "{}",
        r.report()
    );

    // Root in the container gets the same quota; the read-only policy is unchanged.
    let r = pm.run(&scene, &devices, &["--chunk", "64"]);
    r.assert_success();
    assert_eq!(r.get_u64("total"), 2 * GIB, "{}", r.report());
    assert_eq!(r.get("outcome"), "CUDA_ERROR_OUT_OF_MEMORY");
    assert!(r.get_u64("allocated") <= free, "{}", r.report());
    assert_eq!(
        std::fs::read(scene.state.join("tenants/t1/policy.toml")).unwrap(),
        policy_before
    );

    // A spec with the groups (cdiVersion 0.7.0): podman 4.3's CDI library refuses it, and with it
    // every CDI device of the directory (docs/KUBERNETES.md). Checked last: it spoils the directory.
    let version = run(std::process::Command::new(&pm.podman).arg("--version"));
    if version.stdout.trim() == "podman version 4.3.1" {
        scene
            .gpuslice(&["tenant", "create", "t2", "--memory", "1GiB"])
            .assert_success();
        assert_eq!(scene.spec("t2")["cdiVersion"], "0.7.0");
        let mut args = vec!["--device", "gpuslice.io/tenant=t2"];
        args.extend(devices);
        let r = pm.run(&scene, &args, &["--chunk", "64"]);
        r.assert_failure();
        assert!(
            r.stderr.contains("unresolvable CDI devices"),
            "{}",
            r.report()
        );
    }
    assert_eq!(Path::new("/etc/cdi").exists(), etc_cdi_before);
}

/// The device-plugin part of the chart's DaemonSet, as `helm template` renders it.
struct ChartPlugin {
    /// The plugin container's command and arguments.
    command: Vec<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// (mountPath, the hostPath volume's path) of the plugin container.
    mounts: Vec<(String, String)>,
    /// The install init container's `sh -c` script and its mounts.
    install: String,
    install_mounts: Vec<(String, String)>,
}

/// `helm template gpuslice deploy/helm/gpuslice ARGS`, its DaemonSet's device-plugin pod read.
fn render_chart(helm: &Path, set: &[&str]) -> ChartPlugin {
    let r = run(std::process::Command::new(helm)
        .args(["template", "gpuslice"])
        .arg(root().join("deploy/helm/gpuslice"))
        .args(set));
    r.assert_success();
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&r.stdout)
        .map(|d| serde::Deserialize::deserialize(d).expect("a YAML document"))
        .collect();
    let ds = docs
        .iter()
        .find(|d| {
            d["kind"] == "DaemonSet"
                && d["metadata"]["labels"]["app.kubernetes.io/component"] == "device-plugin"
        })
        .unwrap_or_else(|| panic!("no device-plugin DaemonSet in\n{}", r.stdout));
    let pod = &ds["spec"]["template"]["spec"];
    let strings = |v: &serde_yaml::Value| -> Vec<String> {
        v.as_sequence()
            .into_iter()
            .flatten()
            .map(|s| s.as_str().expect("a string").to_string())
            .collect()
    };
    let volumes: Vec<(String, String)> = pod["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .filter_map(|v| {
            Some((
                v["name"].as_str()?.to_string(),
                v["hostPath"]["path"].as_str()?.to_string(),
            ))
        })
        .collect();
    let mounts = |c: &serde_yaml::Value| -> Vec<(String, String)> {
        c["volumeMounts"]
            .as_sequence()
            .into_iter()
            .flatten()
            .map(|m| {
                let name = m["name"].as_str().unwrap();
                let host = volumes
                    .iter()
                    .find(|(n, _)| n == name)
                    .unwrap_or_else(|| panic!("volume {name} is no hostPath volume of the pod"));
                (m["mountPath"].as_str().unwrap().to_string(), host.1.clone())
            })
            .collect()
    };
    let container = |list: &str, name: &str| {
        pod[list]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no {list} {name} in the device-plugin pod"))
            .clone()
    };
    let plugin = container("containers", "device-plugin");
    let install = container("initContainers", "install");
    assert_eq!(strings(&install["command"]), ["/bin/sh", "-c"]);
    ChartPlugin {
        command: strings(&plugin["command"]),
        args: strings(&plugin["args"]),
        env: plugin["env"]
            .as_sequence()
            .into_iter()
            .flatten()
            .map(|e| {
                let get = |k: &str| e[k].as_str().unwrap().to_string();
                (get("name"), get("value"))
            })
            .collect(),
        mounts: mounts(&plugin),
        install: strings(&install["args"]).concat(),
        install_mounts: mounts(&install),
    }
}

/// A path of the node, under the scene's `host/` directory.
fn on_host(scene: &Scene, path: &str) -> PathBuf {
    scene.dir.join("host").join(path.trim_start_matches('/'))
}

/// `path` as a container with `mounts` sees it, where it is on the (scene's) node; None when no mount
/// holds it.
fn through_mounts(scene: &Scene, mounts: &[(String, String)], path: &str) -> Option<PathBuf> {
    mounts
        .iter()
        .filter_map(|(m, h)| {
            let rest = path.strip_prefix(m.as_str())?;
            (rest.is_empty() || rest.starts_with('/')).then_some((m.len(), h, rest))
        })
        .max_by_key(|(len, _, _)| *len)
        .map(|(_, h, rest)| on_host(scene, &format!("{h}{rest}")))
}

/// A pod's whole path on a GPU node, as the chart sets it up: `helm template` renders the chart (its
/// default values; the groups left out of CDI specs, which podman 4.3's CDI library cannot read); the
/// DaemonSet's install init container runs (its script, with the image's paths the build's and its
/// mounts the scene's); the device plugin runs with the DaemonSet's command, arguments and
/// environment, each path in them taken through the container's hostPath mounts into the scene's
/// node directory (a path no mount holds fails the test). The kubelet stand-in sees it register the
/// chart's resource and allocates 2 slices; podman then runs the client with exactly the CDI devices
/// and environment the answer names: gpuslice's tenant and NVIDIA's GPU (a simgpu-backed stand-in of
/// NVIDIA's spec in the chart's CDI directory, found by the plugin there). The client is held to 2
/// slices of the chart's `slices` per GPU, and sees them as its total memory.
#[test]
fn podman_runs_a_pod_set_up_by_the_chart() {
    let helm = target_dir().join("tools/helm");
    if !helm.exists() {
        eprintln!(
            "skipped: helm is not installed at {} (scripts/check-deploy installs it)",
            helm.display()
        );
        return;
    }
    let (Some(podman), Some(runtime)) = (
        on_path("podman"),
        on_path("runc").or_else(|| on_path("crun")),
    ) else {
        eprintln!(
            "skipped: podman and runc (or crun) are not installed (apt-get install podman runc)"
        );
        return;
    };
    let values: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(root().join("deploy/helm/gpuslice/values.yaml")).unwrap(),
    )
    .unwrap();
    let slices = values["devicePlugin"]["slices"].as_u64().expect("slices") as u32;
    let resource = values["devicePlugin"]["resource"]
        .as_str()
        .expect("resource");
    let chart = render_chart(&helm, &["--set", "devicePlugin.cdiWithoutGroups=true"]);

    let etc_cdi_before = Path::new("/etc/cdi").exists();
    let scene = Scene::new("chart", &[("SIMGPU_MEMORY", "16GiB")]);
    // The plugin writes host paths into CDI specs and tenants' files: each is mounted where it is.
    for (m, h) in chart.mounts.iter().chain(&chart.install_mounts) {
        std::fs::create_dir_all(on_host(&scene, h)).unwrap();
        if chart.mounts.contains(&(m.clone(), h.clone())) {
            assert_eq!(m, h, "the device plugin's {m} must be the node's same path");
        }
    }

    // The init container: the library and tools installed from the image into the node's directory.
    let bin = gpuslice_bin();
    let bin_dir = bin.parent().unwrap();
    let mut install = chart
        .install
        .replace(
            "/usr/local/lib/libgpuslice.so",
            &library().display().to_string(),
        )
        .replace("/usr/local/bin/", &format!("{}/", bin_dir.display()));
    for (m, h) in &chart.install_mounts {
        install = install.replace(m.as_str(), &on_host(&scene, h).display().to_string());
    }
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    run(scene.command("sh").args(["-c", &install]).env("PATH", path)).assert_success();

    // The device plugin as the DaemonSet runs it.
    assert_eq!(chart.command, ["gpuslice", "device-plugin"]);
    let arg = |name: &str| -> Option<PathBuf> {
        let v = chart
            .args
            .iter()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")))?;
        Some(through_mounts(&scene, &chart.mounts, v).unwrap_or_else(|| {
            panic!("the chart's --{name}={v}: no volume of the device-plugin container holds it")
        }))
    };
    let kubelet = arg("kubelet-dir").expect("--kubelet-dir");
    let cdi_dir = arg("cdi-dir").expect("--cdi-dir");
    let args: Vec<String> = chart
        .args
        .iter()
        .map(|a| match a.split_once('=') {
            Some((flag, v)) if v.starts_with('/') => {
                let p = through_mounts(&scene, &chart.mounts, v).unwrap_or_else(|| {
                    panic!("the chart's {a}: no volume of the device-plugin container holds it")
                });
                format!("{flag}={}", p.display())
            }
            _ => a.clone(),
        })
        .collect();
    let rt = kubelet_runtime();
    let _guard = rt.enter();
    let mut registrations = serve_kubelet(&kubelet);
    let mut cmd = scene.command(&bin);
    cmd.args(&chart.command[1..]).args(&args);
    cmd.envs(chart.env.iter().map(|(k, v)| (k, v)));
    let plugin = PluginProcess::spawn(cmd);
    let registered = rt.block_on(next_registration(&mut registrations));
    assert_eq!(registered.resource_name, resource);
    let devices = rt.block_on(first_device_list(&kubelet));
    assert_eq!(devices.len(), slices as usize, "{devices:?}");
    let uuid = devices[0].id.split("::").next().unwrap().to_string();

    // NVIDIA's spec (the stand-in) where the GPU Operator's toolkit writes it, the chart's CDI dir.
    write_simgpu_spec(&scene, &cdi_dir, &uuid);
    wait_until(
        "NVIDIA's CDI spec found",
        std::time::Duration::from_secs(60),
        || {
            plugin
                .stderr_so_far()
                .contains("NVIDIA's CDI spec found at")
        },
    );
    let (resp, _) = allocate(
        &rt,
        &kubelet,
        vec![format!("{uuid}::0"), format!("{uuid}::1")],
    );
    let resp = resp.unwrap_or_else(|e| panic!("Allocate: {e}\n{}", plugin.stderr_so_far()));
    let names = cdi_names(&resp);
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names[0].starts_with("gpuslice.io/tenant="), "{names:?}");
    assert_eq!(names[1], format!("nvidia.com/gpu={uuid}"));
    let tenant = names[0].split_once('=').unwrap().1.to_string();

    // The container as a CDI runtime makes it from the answer (its mounts are the tenant's spec's).
    let pm = Podman::new(&scene, podman, &runtime, &cdi_dir);
    let mut args: Vec<String> = Vec::new();
    for n in &names {
        args.extend(["--device".to_string(), n.clone()]);
    }
    for (k, v) in &resp.envs {
        args.extend(["-e".to_string(), format!("{k}={v}")]);
    }
    args.extend(["-e".to_string(), "GPUSLICE_MEMORY_LIMIT=100GiB".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = pm.run(&scene, &args, &["--chunk", "2"]);
    let quota = gpuslice_node::plugin::slice_memory(16 * GIB, 2, slices);
    r.assert_success();
    assert_eq!(r.get_u64("total"), quota, "{}", r.report());
    let free = r.get_u64("free");
    assert!(free > 0 && free < quota, "{}", r.report());
    assert_eq!(r.get_u64("allocated"), free, "{}", r.report());
    assert_eq!(
        r.get("outcome"),
        "CUDA_ERROR_OUT_OF_MEMORY",
        "{}",
        r.report()
    );
    assert!(
        r.stderr
            .contains(&format!("tenant {tenant}: cuMemAlloc of 2 MiB"))
            && r.stderr.contains("refused"),
        "{}",
        r.report()
    );
    let stderr = plugin.stop();
    assert!(!stderr.contains("ERROR"), "{stderr}");
    assert_eq!(Path::new("/etc/cdi").exists(), etc_cdi_before);
}
