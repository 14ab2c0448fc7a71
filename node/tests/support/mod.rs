//! What the node tests share: the workspace's built programs, a private scene (state, CDI and
//! simgpu state under one temporary directory), and running a tenant's program the way a container
//! runtime would: in its own mount and PID namespaces with the CDI spec's mounts, as another uid
//! with the spec's groups. What those programs load or run from the build tree (the library,
//! simgpu, the workspace's programs) comes from copies in the scene's directory, which other uids can
//! traverse wherever the tree is (a clone under `/root` or in a 0700 home directory).
#![allow(dead_code)]

pub mod kubelet;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use common::{clients, compile_into};
#[allow(unused_imports)] // each test file uses a different part
pub use common::{
    exporter_address, finish, gpuslice_bin, reachable_copy, reachable_simgpu, require, root,
    run_command as run, scrape_metrics, simgpu_lib_dir, start_in, target_dir, venv_python,
    wait_for_key, Run, GIB, MIB,
};
use gpuslice_testkit as common;

pub fn workload_bin() -> PathBuf {
    require(
        target_dir().join("debug/gpuslice-workload"),
        "gpuslice-workload",
    )
}

pub fn library() -> PathBuf {
    require(target_dir().join("debug/libgpuslice.so"), "libgpuslice.so")
}

/// tests/clients/compute_client.c (the compute-share client of the library's tests), built into
/// `dir` against NVIDIA's headers (scripts/fetch-nvidia.sh) and simgpu's libcuda.
pub fn compute_client(dir: &Path) -> PathBuf {
    compile_into(&clients::COMPUTE, &dir.join("compute_client"), &[])
}

/// tests/clients/quota_overhead.c (the driver-overhead client of the library's tests), built into
/// `dir` (which other uids can reach) against NVIDIA's headers and simgpu's libcuda.
pub fn overhead_client(dir: &Path) -> PathBuf {
    compile_into(&clients::QUOTA_OVERHEAD, &dir.join("quota_overhead"), &[])
}

/// One node: a private directory (0755, so other uids can reach the state dir) holding the state
/// directory, the CDI directory, simgpu's state file, and (in `reachable/`) the copies of what
/// programs of other uids load and run.
pub struct Scene {
    pub dir: PathBuf,
    pub reachable: PathBuf,
    pub state: PathBuf,
    pub cdi: PathBuf,
    pub simgpu_state: PathBuf,
    env: Vec<(String, String)>,
}

impl Scene {
    pub fn new(tag: &str, simgpu: &[(&str, &str)]) -> Scene {
        static N: AtomicU32 = AtomicU32::new(0);
        // On a tmpfs, as a node's state is (`/run`): its device ledgers are mapped and written by
        // every tenant's processes, and root fsyncs the files it writes beside them. On a disk
        // filesystem that fsync waited behind the ledgers' writeback for up to 4.7 s on a busy
        // machine, which a node never does. Removed on drop; `scripts/test` checks nothing named
        // `gpuslice*` is left in /dev/shm.
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!(
            "gpuslice-node-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let simgpu_state = dir.join("simgpu.state");
        let mut env: Vec<(String, String)> = simgpu
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.push(("SIMGPU_STATE".into(), simgpu_state.display().to_string()));
        // The node's programs never read or leave anything in the machine's default ledger
        // directory (a stale ledger there must not change any outcome).
        env.push((
            "GPUSLICE_LEDGER_DIR".into(),
            dir.join("default-ledgers").display().to_string(),
        ));
        let reachable = dir.join("reachable");
        env.push((
            "LD_LIBRARY_PATH".into(),
            reachable_simgpu(&reachable.join("simgpu"))
                .display()
                .to_string(),
        ));
        Scene {
            reachable,
            state: dir.join("state"),
            cdi: dir.join("cdi"),
            simgpu_state,
            dir,
            env,
        }
    }

    /// A command with this node's environment and nothing inherited that could change the outcome.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = common::clean_command(program);
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// `gpuslice ARGS` as root, with this node's directories appended where they apply.
    pub fn gpuslice(&self, args: &[&str]) -> Run {
        let mut cmd = self.command(gpuslice_bin());
        cmd.args(args);
        let sub = (args.first().copied(), args.get(1).copied());
        if matches!(
            sub,
            (Some("tenant"), Some("create" | "delete")) | (Some("cdi"), _)
        ) {
            cmd.arg("--state-dir").arg(&self.state);
            cmd.arg("--cdi-dir").arg(&self.cdi);
            cmd.arg("--library").arg(library());
        } else if matches!(sub, (Some("tenant"), Some("list"))) {
            cmd.arg("--state-dir").arg(&self.state);
        }
        run(&mut cmd)
    }

    /// The CDI spec `tenant create` wrote for `name`, parsed.
    pub fn spec(&self, name: &str) -> serde_json::Value {
        let path = self.cdi.join(format!("gpuslice.io-tenant-{name}.json"));
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).unwrap()
    }

    /// The library under test, where other uids can open it.
    pub fn library(&self) -> PathBuf {
        reachable_copy(&library(), &self.reachable.join("libgpuslice.so"))
    }

    /// `program` (and `gpuslice`'s probe beside it) where other uids can run it, when it is in the
    /// build tree; any other program as it is.
    pub fn reachable_program(&self, program: &Path) -> PathBuf {
        if !(program.starts_with(root()) || program.starts_with(target_dir())) {
            return program.to_path_buf();
        }
        let name = program.file_name().expect("a program");
        if name == "gpuslice" {
            let probe = program.with_file_name("gpuslice-probe");
            reachable_copy(&probe, &self.reachable.join("bin/gpuslice-probe"));
        }
        reachable_copy(program, &self.reachable.join("bin").join(name))
    }

    /// `program args` as `uid` in a fresh mount + PID namespace that has the tenant's CDI mounts
    /// (those under /run/gpuslice: a tmpfs on /run holds their mount points, so nothing of the
    /// machine's /run is touched) and the spec's groups. The library comes by LD_PRELOAD (its host
    /// path): binding it and /etc/ld.so.preload would need those paths to exist on this machine.
    pub fn in_container(&self, tenant: &str, uid: u32, program: &Path, args: &[&str]) -> Command {
        let spec = self.spec(tenant);
        let edits = &spec["devices"][0]["containerEdits"];
        let gids: Vec<String> = edits["additionalGids"]
            .as_array()
            .expect("additionalGids")
            .iter()
            .map(|g| g.as_u64().unwrap().to_string())
            .collect();
        let mut script = String::from(
            "set -e\nmount -t tmpfs -o mode=0755 gpuslice-run /run\nmkdir -p /run/gpuslice/tenant /run/gpuslice/devices\n",
        );
        for m in edits["mounts"].as_array().expect("mounts") {
            let container = m["containerPath"].as_str().unwrap();
            if !container.starts_with("/run/gpuslice/") {
                continue;
            }
            let host = m["hostPath"].as_str().unwrap();
            let ro = m["options"].as_array().unwrap().iter().any(|o| o == "ro");
            script.push_str(&format!("mount --bind '{host}' '{container}'\n"));
            if ro {
                script.push_str(&format!(
                    "mount -o remount,bind,ro,nosuid,nodev '{container}'\n"
                ));
            }
        }
        script.push_str(&format!(
            "exec setpriv --reuid={uid} --regid={uid} --groups={} --inh-caps=-all -- \"$@\"\n",
            gids.join(",")
        ));
        let mut cmd = self.command("unshare");
        cmd.args(["--mount", "--pid", "--fork", "--propagation", "private"])
            .args(["sh", "-c", &script, "container"])
            .arg(self.reachable_program(program))
            .args(args)
            .env("LD_PRELOAD", self.library())
            .env("SIMGPU_GROUP", tenant);
        cmd
    }

    /// simgpu's busy time of a group on device 0, ns (simgpu-stat: the judge).
    pub fn busy(&self, group: &str) -> u64 {
        let r = run(self
            .command(target_dir().join("simgpu/bin/simgpu-stat"))
            .arg("--state")
            .arg(&self.simgpu_state));
        r.assert_success();
        let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
        v["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|g| g["name"] == group)
            .and_then(|g| g["busy_ns"][0].as_u64())
            .unwrap_or(0)
    }
}

impl Scene {
    /// The processes still running with this scene's environment (every command it starts carries
    /// `SIMGPU_STATE=<its state file>`, through `unshare`, `setpriv` and `exec`), this test's own
    /// process excepted.
    fn processes(&self) -> Vec<i32> {
        let mut marker = b"SIMGPU_STATE=".to_vec();
        marker.extend_from_slice(self.simgpu_state.as_os_str().as_encoded_bytes());
        marker.push(0);
        let me = std::process::id() as i32;
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|&pid| pid != me)
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|env| env.windows(marker.len()).any(|w| w == marker))
            })
            .collect()
    }
}

impl Drop for Scene {
    /// Ends what the scene started and removes its directory. A test that fails while its tenants'
    /// programs run would otherwise leave them running, recreating files in a directory being
    /// removed, and the scene would stay in /dev/shm.
    fn drop(&mut self) {
        for _ in 0..100 {
            let left = self.processes();
            if left.is_empty() {
                break;
            }
            for pid in left {
                // SAFETY: kill(2) with a pid read from /proc; at worst the process has gone.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        for _ in 0..10 {
            if std::fs::remove_dir_all(&self.dir).is_ok() || !self.dir.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

/// What simgpu spends on a context (SIMGPU_CONTEXT_MEMORY's default).
pub const SIM_CONTEXT: u64 = 300 * MIB;
/// The driver reserves device memory in 2 MiB pages: a measured charge is exact to one of them.
pub const GRANULE: u64 = 2 * MIB;

/// A program in its own PID namespace (where NVML's process lists, which carry host PIDs, never
/// show its own PID) filled `quota` in 2 MiB chunks: its context was charged what simgpu spent on
/// it, one granule at most apart, not a fixed reservation.
pub fn assert_context_charged_as_spent(r: &Run, quota: u64) {
    let allocated = r.get_u64("allocated");
    assert!(
        allocated <= quota - SIM_CONTEXT && allocated + GRANULE >= quota - SIM_CONTEXT,
        "allocated {allocated} of {quota}: the context must be charged simgpu's {SIM_CONTEXT} \
         bytes, one granule at most apart\n{}",
        r.report()
    );
}
