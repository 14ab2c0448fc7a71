//! Shared harness of the integration tests that judge simgpu (and later gpuslice) through real
//! clients: C programs compiled against NVIDIA's real `cuda.h`, NVIDIA's Python packages, each run
//! as a separate process that finds the driver through `LD_LIBRARY_PATH` exactly as it would find
//! NVIDIA's. The figures tests assert on come from the clients' own output and from `simgpu-stat`
//! (simgpu's shared state), never from the code under test reporting on itself.
//!
//! Everything this needs is installed by `scripts/test`; a missing piece is a panic naming it, never
//! a silent skip.
//!
//! A dev-dependency of the crates whose tests run clients (the root crate, `node`); a test file
//! says `use gpuslice_testkit as common;` and then `use common::*;`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// The repository root (this crate is `<root>/tests/kit`).
pub fn root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .nth(2)
        .expect("the kit lives in <root>/tests/kit")
        .to_path_buf()
}

/// Cargo's target directory: `CARGO_TARGET_DIR` if set, else `<root>/target`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => root().join(d),
        _ => root().join("target"),
    }
}

/// `path`, which `scripts/test` builds or installs; a panic naming `what` when it is missing.
pub fn require(path: PathBuf, what: &str) -> PathBuf {
    assert!(
        path.exists(),
        "run scripts/test ({what} is not installed at {})",
        path.display()
    );
    path
}

/// The `gpuslice` command (package `gpuslice-cli`), built beside the test binaries by
/// `cargo build --workspace` (test binaries live in `<target>/<profile>/deps`).
pub fn gpuslice_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binaries live in <target>/<profile>/deps");
    require(
        profile_dir.join("gpuslice"),
        "the gpuslice command (cargo build -p gpuslice-cli)",
    )
}

/// The directory where tests put their private files: `<target>/tmp`, what cargo names
/// `CARGO_TARGET_TMPDIR` to integration tests (a library crate is not given it), found from the
/// test binary's path (`<target>/<profile>/deps/<test>`).
pub fn tmp_dir() -> PathBuf {
    let dir = profile_dir()
        .parent()
        .expect("test binaries live in <target>/<profile>/deps")
        .join("tmp");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

/// The build profile's directory (`<target>/<profile>`): libgpuslice.so, the drop-in cdylibs and
/// the binaries, beside the test binaries' `deps/`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent()
        .and_then(Path::parent)
        .expect("test binaries live in <target>/<profile>/deps")
        .to_path_buf()
}

/// The `libgpuslice.so` under test, built by `cargo build --workspace`.
pub fn libgpuslice() -> PathBuf {
    require(
        profile_dir().join("libgpuslice.so"),
        "libgpuslice.so (cargo build --workspace)",
    )
}

/// The drop-in libraries (`libcuda.so.1`, `libnvidia-ml.so.1`) laid out by
/// `scripts/install-dropin.sh` in this test binary's own directory, once per process.
pub fn dropin_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary's path");
        let name = exe
            .file_stem()
            .map_or_else(|| "tests".into(), |n| n.to_string_lossy().into_owned());
        let dest = tmp_dir()
            .join(format!("dropin-{name}-{}", std::process::id()));
        let out = Command::new(root().join("scripts/install-dropin.sh"))
            .arg(profile_dir())
            .arg(&dest)
            .output()
            .expect("run scripts/install-dropin.sh");
        assert!(
            out.status.success(),
            "scripts/install-dropin.sh failed (build the workspace first: cargo build --workspace):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        dest
    })
    .clone()
}

/// Where `scripts/install-simgpu.sh` put simgpu's `libcuda.so.1` and `libnvidia-ml.so.1`.
pub fn simgpu_lib_dir() -> PathBuf {
    let dir = target_dir().join("simgpu/lib");
    require(dir.join("libcuda.so.1"), "simgpu");
    require(dir.join("libnvidia-ml.so.1"), "simgpu");
    dir
}

/// The `simgpu-stat` binary installed beside the libraries.
pub fn simgpu_stat_bin() -> PathBuf {
    require(target_dir().join("simgpu/bin/simgpu-stat"), "simgpu-stat")
}

/// NVIDIA's real 535 driver, fetched by `scripts/fetch-nvidia.sh`.
pub fn nvidia_driver_dir() -> PathBuf {
    let dir = root().join("target/nvidia/driver");
    require(
        dir.join("libcuda.so.1"),
        "NVIDIA's driver (scripts/fetch-nvidia.sh)",
    );
    dir
}

/// NVIDIA's headers: `cu12` or `cu13` (cuda.h, cudaTypedefs.h) or `nvml` (nvml.h).
pub fn nvidia_include(which: &str) -> PathBuf {
    let dir = root().join("target/nvidia/include").join(which);
    require(dir.clone(), "NVIDIA's headers (scripts/fetch-nvidia.sh)");
    dir
}

/// The venv made by `scripts/setup-python.sh` (cuda-bindings, nvidia-ml-py).
pub fn venv_python() -> PathBuf {
    require(
        root().join("target/venv/bin/python"),
        "the Python venv (scripts/setup-python.sh)",
    )
}

/// `src` at `dest`, where processes of other uids can open it; `dest`'s missing directories are made
/// 0755. Clients a test starts as other uids (`setpriv`) need the library, simgpu and their own
/// programs, and the tree they are built in may be one only its owner can traverse (a clone under
/// `/root`, a 0700 home directory): they get copies in the test's own private, world-traversable
/// directory instead. A hard link where `dest` is on the same file system (no copy of a large
/// binary), else a copy; a symbolic link is followed. Done once: an existing `dest` is kept.
pub fn reachable_copy(src: &Path, dest: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let parent = dest.parent().expect("a file path");
    for dir in parent.ancestors().collect::<Vec<_>>().into_iter().rev() {
        if !dir.exists() {
            std::fs::create_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    if dest.exists() {
        return dest.to_path_buf();
    }
    let src = std::fs::canonicalize(src).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
    if std::fs::hard_link(&src, dest).is_err() {
        let tmp = parent.join(format!(
            ".{}.{}",
            dest.file_name().unwrap().to_string_lossy(),
            std::process::id()
        ));
        std::fs::copy(&src, &tmp)
            .unwrap_or_else(|e| panic!("copying {} to {}: {e}", src.display(), tmp.display()));
        std::fs::rename(&tmp, dest).unwrap();
    }
    dest.to_path_buf()
}

/// simgpu's libraries (`simgpu_lib_dir`) copied by [`reachable_copy`] into `dir`, for the
/// `LD_LIBRARY_PATH` of clients that run as other uids.
pub fn reachable_simgpu(dir: &Path) -> PathBuf {
    let from = simgpu_lib_dir();
    for name in [
        "libcuda.so.1",
        "libcuda.so",
        "libnvidia-ml.so.1",
        "libnvidia-ml.so",
    ] {
        reachable_copy(&from.join(name), &dir.join(name));
    }
    dir.to_path_buf()
}

pub mod clients;
pub use clients::*;
pub mod memory;

/// One simulated machine: a unique `SIMGPU_STATE` (so tests are isolated and run in parallel) and
/// the `SIMGPU_*` settings every process of the test shares. The state file is removed on drop.
pub struct Sim {
    pub state: String,
    /// This machine's private directory for default ledgers (`GPUSLICE_LEDGER_DIR`) and device
    /// ledgers (its `devices/`): nothing a test runs reads or writes the machine's defaults.
    pub dir: PathBuf,
    env: BTreeMap<String, String>,
}

impl Sim {
    pub fn new(tag: &str) -> Sim {
        static N: AtomicU32 = AtomicU32::new(0);
        let state = format!(
            "gpuslice-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let _ = std::fs::remove_file(Path::new("/dev/shm").join(&state));
        let dir = Path::new("/dev/shm").join(format!("{state}.d"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut env = BTreeMap::new();
        env.insert("SIMGPU_STATE".to_string(), state.clone());
        env.insert(
            "GPUSLICE_LEDGER_DIR".to_string(),
            dir.to_string_lossy().into_owned(),
        );
        Sim { state, dir, env }
    }

    /// Set a `SIMGPU_*` (or other) variable for every process of this machine.
    pub fn env(mut self, k: &str, v: &str) -> Sim {
        self.env.insert(k.to_string(), v.to_string());
        self
    }

    /// A command with this machine's environment: simgpu on `LD_LIBRARY_PATH`, and nothing
    /// inherited that could change the outcome (other `SIMGPU_*`, `CUDA_*`, preloads).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        self.command_with_driver(program, &simgpu_lib_dir())
    }

    /// Like [`Sim::command`] with another driver directory (NVIDIA's real one for oracle tests).
    pub fn command_with_driver(
        &self,
        program: impl AsRef<std::ffi::OsStr>,
        driver: &Path,
    ) -> Command {
        let mut cmd = clean_command(program);
        cmd.env("LD_LIBRARY_PATH", driver);
        cmd.envs(&self.env);
        cmd
    }

    /// Run a program to completion with stdin closed.
    pub fn run(&self, program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Run {
        self.run_cmd(self.command(program).args(args))
    }

    pub fn run_cmd(&self, cmd: &mut Command) -> Run {
        run_command(cmd)
    }

    /// Start a program with piped stdin/stdout (for long-running clients).
    pub fn spawn(&self, cmd: &mut Command) -> Child {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"))
    }

    /// Run a Python client from tests/clients/ with the venv's interpreter.
    pub fn run_python(&self, script: &str, args: &[&str]) -> Run {
        let mut cmd = self.command(venv_python());
        cmd.arg(client_source(script)).args(args);
        self.run_cmd(&mut cmd)
    }

    /// simgpu's shared state, as `simgpu-stat --state NAME` prints it: the judge of every figure.
    pub fn stat(&self) -> Json {
        let run = self.run_cmd(
            self.command(simgpu_stat_bin())
                .args(["--state", &self.state]),
        );
        run.assert_success();
        parse_json(&run.stdout)
            .unwrap_or_else(|e| panic!("simgpu-stat printed bad JSON ({e}):\n{}", run.stdout))
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(Path::new("/dev/shm").join(&self.state));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `cmd` to its end, stdin closed.
pub fn run_command(cmd: &mut Command) -> Run {
    let desc = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {desc}: {e}"));
    Run::new(desc, out)
}

/// `program` without the variables of this process that could change a test's outcome (simgpu's,
/// CUDA's, gpuslice's, LD_PRELOAD).
pub fn clean_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("SIMGPU_")
            || k.starts_with("CUDA_")
            || k.starts_with("GPUSLICE_")
            || k == "LD_PRELOAD"
        {
            cmd.env_remove(k.as_ref());
        }
    }
    cmd
}

/// A finished process: its output and `key=value` lines.
pub struct Run {
    pub desc: String,
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn new(desc: String, out: Output) -> Run {
        Run {
            desc,
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Everything about the run, for assertion messages.
    pub fn report(&self) -> String {
        format!(
            "{}\nexit: {}\n--- stdout ---\n{}--- stderr ---\n{}",
            self.desc, self.status, self.stdout, self.stderr
        )
    }

    pub fn assert_success(&self) -> &Run {
        assert!(self.status.success(), "client failed:\n{}", self.report());
        self
    }

    /// The run ended with an exit status other than 0 (not by a signal).
    pub fn assert_failure(&self) -> &Run {
        assert!(
            self.status.code().is_some_and(|c| c != 0),
            "expected a failure:\n{}",
            self.report()
        );
        self
    }

    /// `key=value` lines (the last value of a repeated key).
    pub fn kv(&self) -> BTreeMap<String, String> {
        parse_kv(&self.stdout)
    }

    /// The value printed for `key`; panics with the whole output if absent.
    pub fn get(&self, key: &str) -> String {
        self.kv()
            .remove(key)
            .unwrap_or_else(|| panic!("client printed no `{key}=`:\n{}", self.report()))
    }

    pub fn get_u64(&self, key: &str) -> u64 {
        let v = self.get(key);
        v.parse()
            .unwrap_or_else(|_| panic!("`{key}={v}` is not an integer:\n{}", self.report()))
    }

    pub fn get_f64(&self, key: &str) -> f64 {
        let v = self.get(key);
        v.parse()
            .unwrap_or_else(|_| panic!("`{key}={v}` is not a number:\n{}", self.report()))
    }
}

pub fn parse_kv(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// Read `key=value` lines from a running child's stdout until `key` appears.
pub fn wait_for_key(child: &mut Child, key: &str) -> BTreeMap<String, String> {
    use std::io::BufRead;
    let stdout = child.stdout.as_mut().expect("piped stdout");
    let mut reader = std::io::BufReader::new(stdout);
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        let n = reader.read_line(&mut line).unwrap();
        if n == 0 {
            panic!("child exited before printing `{key}=`; it printed:\n{seen}");
        }
        seen.push_str(&line);
        if line.starts_with(&format!("{key}=")) {
            return parse_kv(&seen);
        }
    }
}

/// Close a child's stdin (the clients' signal to finish) and collect its output.
pub fn finish(mut child: Child, desc: &str) -> Run {
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("wait for child");
    Run::new(desc.to_string(), out)
}

/// Write lines to a child's stdin and collect everything it prints.
pub fn feed(mut child: Child, input: &str, desc: &str) -> Run {
    let mut stdin = child.stdin.take().expect("piped stdin");
    let input = input.to_string();
    // A writer thread: the child's stdout could fill before all input is written.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(input.as_bytes());
    });
    let out = child.wait_with_output().expect("wait for child");
    writer.join().unwrap();
    Run::new(desc.to_string(), out)
}

/// A JSON document (`simgpu-stat`'s output, `gpuslice status --json`, Prometheus answers): serde_json's
/// value, read by path through [`JsonExt`].
pub use serde_json::Value as Json;

/// `text` as a JSON document.
pub fn parse_json(text: &str) -> Result<Json, serde_json::Error> {
    serde_json::from_str(text)
}

/// Reading a document by path (`devices.0.busy_ns`: object keys and array indices); each panics,
/// naming the path and the document, when the value is absent or of another kind.
pub trait JsonExt {
    /// The value at `path`.
    fn at(&self, path: &str) -> &Json;
    /// The count at `path` (a number, 0 or more).
    fn u64(&self, path: &str) -> u64;
    /// The string at `path`.
    fn str(&self, path: &str) -> &str;
    /// The array at `path`.
    fn arr(&self, path: &str) -> &[Json];
    /// The element of array `path` whose field `key` equals `value` (e.g. a group by name).
    fn find(&self, path: &str, key: &str, value: &Json) -> Option<&Json>;
}

impl JsonExt for Json {
    fn at(&self, path: &str) -> &Json {
        let mut v = self;
        for part in path.split('.').filter(|p| !p.is_empty()) {
            let next = match (v, part.parse::<usize>()) {
                (Json::Array(a), Ok(i)) => a.get(i),
                (Json::Object(o), _) => o.get(part),
                _ => None,
            };
            v = next
                .unwrap_or_else(|| panic!("simgpu-stat has no `{path}` (at `{part}`) in:\n{self}"));
        }
        v
    }

    fn u64(&self, path: &str) -> u64 {
        let v = self.at(path);
        v.as_u64()
            .or_else(|| v.as_f64().filter(|n| *n >= 0.0).map(|n| n as u64))
            .unwrap_or_else(|| panic!("simgpu-stat `{path}` is not a count: {v:?}"))
    }

    fn str(&self, path: &str) -> &str {
        match self.at(path) {
            Json::String(s) => s,
            other => panic!("simgpu-stat `{path}` is not a string: {other:?}"),
        }
    }

    fn arr(&self, path: &str) -> &[Json] {
        match self.at(path) {
            Json::Array(a) => a,
            other => panic!("simgpu-stat `{path}` is not an array: {other:?}"),
        }
    }

    fn find(&self, path: &str, key: &str, value: &Json) -> Option<&Json> {
        self.arr(path)
            .iter()
            .find(|e| e.as_object().and_then(|o| o.get(key)) == Some(value))
    }
}

/// Expected `simgpu-stat` shape check helpers.
pub fn group<'a>(stat: &'a Json, name: &str) -> &'a Json {
    stat.find("groups", "name", &Json::String(name.to_string()))
        .unwrap_or_else(|| panic!("simgpu-stat has no group `{name}`:\n{stat}"))
}

/// Process `pid`'s entry in the tenant ledger `ledger` (a file), read as the tools read it; panics,
/// naming what the ledger holds, when the process is not in it.
pub fn ledger_process(ledger: &Path, pid: &str) -> gpuslice_state::ledger::ProcessSnapshot {
    let opened = gpuslice_state::ledger::Ledger::open_readonly(ledger)
        .unwrap_or_else(|e| panic!("{}: {e}", ledger.display()));
    let snapshot = opened.snapshot();
    snapshot
        .processes
        .iter()
        .find(|p| p.pid.to_string() == pid)
        .cloned()
        .unwrap_or_else(|| panic!("process {pid} not in {}: {snapshot:?}", ledger.display()))
}

/// Bytes summed over devices: what [`ledger_process`] lists per device.
pub fn total(per_device: &[(usize, u64)]) -> u64 {
    per_device.iter().map(|(_, bytes)| bytes).sum()
}

/// A fresh private directory for one test (`<prefix>-<tag>-<pid>-<n>` under the test target's
/// temporary directory): ledgers, device ledgers, measurement locks.
pub fn scratch_dir(prefix: &str, tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = tmp_dir().join(format!(
        "{prefix}-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Tenant `z` alone on simgpu, the shim preloaded, its ledgers in `dir` and `env` added, spinning
/// 200 µs kernels for `ms` from a start 0.7 s ahead (`compute_client spin`): the run, and the part
/// of its wall time simgpu's busy counter gives group `z`. How a compute setting's effect is judged
/// (a cap of 1% keeps it to a few percent; no cap, nearly all).
pub fn spin_alone(sim: &Sim, dir: &Path, env: &[(&str, &str)], ms: u64) -> (Run, f64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let start = now + 700_000_000;
    let mut cmd = sim.command(compile(&COMPUTE));
    cmd.env("LD_PRELOAD", libgpuslice())
        .env("SIMGPU_GROUP", "z")
        .env("GPUSLICE_TENANT", "z")
        .env("GPUSLICE_LEDGER", dir.join("z.ledger"))
        .env("GPUSLICE_DEVICE_DIR", dir.join("devices"))
        .envs(env.iter().copied())
        .args(["spin", &start.to_string(), &ms.to_string(), "200"]);
    let run = sim.run_cmd(&mut cmd);
    run.assert_success();
    let wall = run.get_u64("end_ns") - run.get_u64("start_ns");
    let busy = sim
        .stat()
        .find("groups", "name", &Json::String("z".into()))
        .map_or(0, |g| g.u64("busy_ns.0"));
    (run, busy as f64 / wall.max(1) as f64)
}

/// What the live process `pid` uses on simgpu device `device` by simgpu's counters.
pub fn process_used_on(stat: &Json, pid: &str, device: usize) -> u64 {
    let Json::Array(procs) = stat.at("processes") else {
        panic!("simgpu-stat: no processes in {stat}")
    };
    procs
        .iter()
        .find(|p| p.u64("pid").to_string() == pid)
        .map_or_else(
            || panic!("process {pid} not in {stat}"),
            |p| p.u64(&format!("used.{device}")),
        )
}

/// The group's (tenant's) peak device memory on simgpu device `device` (0 when it has none).
pub fn group_peak_on(stat: &Json, name: &str, device: usize) -> u64 {
    stat.find("groups", "name", &Json::String(name.to_string()))
        .map_or(0, |g| g.u64(&format!("peak.{device}")))
}

/// One scenario: a simulated machine and a private directory for its ledgers and device ledgers
/// (`<dir>/devices`), removed when the scenario ends. A test file that adds its own methods declares
/// its local `Scene` with [`local_scene!`].
pub struct Scene {
    pub sim: Sim,
    pub dir: PathBuf,
}

impl Scene {
    /// `prefix` names the test file's scenarios, `tag` this one (any text; made into a file name).
    pub fn new(prefix: &str, tag: &str) -> Scene {
        let tag: String = tag
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let dir = tmp_dir().join(format!("{prefix}-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scene {
            sim: Sim::new(&format!("{prefix}-{tag}")),
            dir,
        }
    }

    /// Busy ns of simgpu group `group` on device 0.
    pub fn busy(&self, group: &str) -> u64 {
        self.busy_on(group, 0)
    }

    /// Busy ns of simgpu group `group` on `device`.
    pub fn busy_on(&self, group: &str, device: usize) -> u64 {
        self.sim
            .stat()
            .find("groups", "name", &Json::String(group.into()))
            .map_or(0, |g| g.u64(&format!("busy_ns.{device}")))
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Declares `Scene` in a test file: the kit's [`Scene`] under a type of the file's own, so that the
/// file can give it methods (`impl Scene { ... }`; a type of another crate takes none); its fields and
/// the kit's methods are reached through it, and `Scene::new` makes one.
#[macro_export]
macro_rules! local_scene {
    () => {
        /// The kit's scene, with this file's methods.
        struct Scene($crate::Scene);

        impl std::ops::Deref for Scene {
            type Target = $crate::Scene;
            fn deref(&self) -> &$crate::Scene {
                &self.0
            }
        }

        impl std::ops::DerefMut for Scene {
            fn deref_mut(&mut self) -> &mut $crate::Scene {
                &mut self.0
            }
        }

        impl Scene {
            fn new(prefix: &str, tag: &str) -> Scene {
                Scene($crate::Scene::new(prefix, tag))
            }
        }
    };
}

/// CLOCK_REALTIME ns `ms` from now (clients started together begin then, after their setup).
pub fn start_in(ms: u64) -> u64 {
    (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        + std::time::Duration::from_millis(ms))
    .as_nanos() as u64
}

/// A client argument.
pub fn s(x: impl ToString) -> String {
    x.to_string()
}

/// The `host:port` that a `gpuslice exporter` started with `--listen 127.0.0.1:0` and a piped
/// stdout prints on its first line (`... http://HOST:PORT/metrics`).
pub fn exporter_address(exporter: &mut Child) -> String {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(
        exporter
            .stdout
            .as_mut()
            .expect("the exporter's stdout is piped"),
    )
    .read_line(&mut line)
    .unwrap();
    line.split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("exporter printed {line:?}"))
        .to_string()
}

/// The body of one `GET /metrics` from `addr` (HTTP/1.0: read until the exporter closes).
pub fn scrape_metrics(addr: &str) -> String {
    use std::io::Read;
    let mut s =
        std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    raw.split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string())
}

#[cfg(test)]
mod json_tests {
    use super::{parse_json, Json, JsonExt};

    #[test]
    fn reads_a_stat_like_document_by_path() {
        let j = parse_json(r#"{"devices":[{"capacity":1073741824,"used":0,"busy_ns":5,"kernels":1}],"groups":[{"name":"a\"b","used":[1]}],"x":null,"t":true}"#).unwrap();
        assert_eq!(j.u64("devices.0.capacity"), 1 << 30);
        assert_eq!(j.str("groups.0.name"), "a\"b");
        assert_eq!(j.u64("groups.0.used.0"), 1);
        assert_eq!(j.at("x"), &Json::Null);
        assert_eq!(j.arr("devices").len(), 1);
        let g = j.find("groups", "name", &Json::String("a\"b".into()));
        assert_eq!(g.map(|g| g.u64("used.0")), Some(1));
        assert!(j
            .find("groups", "name", &Json::String("c".into()))
            .is_none());
    }

    #[test]
    fn counts_are_exact_beyond_a_double() {
        let j = parse_json(r#"{"n":18446744073709551615,"f":2.5}"#).unwrap();
        assert_eq!(j.u64("n"), u64::MAX);
        assert_eq!(j.u64("f"), 2);
    }

    #[test]
    #[should_panic(expected = "has no `devices.1`")]
    fn a_missing_path_panics_naming_it() {
        parse_json(r#"{"devices":[{}]}"#).unwrap().at("devices.1");
    }

    #[test]
    #[should_panic(expected = "is not a count")]
    fn a_negative_number_is_not_a_count() {
        parse_json(r#"{"n":-1}"#).unwrap().u64("n");
    }
}
