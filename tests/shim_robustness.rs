//! The memory-quota shim under stress and abuse: many processes and threads at once, processes that
//! are killed or stopped, bad configuration, broken ledgers, live limit changes, fork and exec, and
//! the `gpuslice` command line. Every client is a real CUDA program (NVIDIA's `cuda.h`, linked with
//! `-lcuda`) run on simgpu with `libgpuslice.so` preloaded; what is asserted is what the driver API
//! returned to it, simgpu's own counters (`simgpu-stat`), and what `gpuslice status` prints.

use gpuslice_testkit as common;

use common::*;
use common::{libgpuslice as shim_lib, libgpuslice as installed_shim_lib};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `CUDA_ERROR_OUT_OF_MEMORY`, `CUDA_ERROR_INVALID_CONTEXT` as the clients print them.
const OOM: &str = "2";
const INVALID_CONTEXT: &str = "201";
/// What a context costs on these tests' simulated GPU (`SIMGPU_CONTEXT_MEMORY`), and so what the shim
/// charges for it (it measures what the driver spent).
const CONTEXT: u64 = 512 * MIB;
/// How long a client may take to answer one command.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

fn gpuslice_bin() -> PathBuf {
    common::gpuslice_bin()
}

/// A fresh per-test directory for ledgers and quota files (never the default ledger location).
fn tmp_dir(tag: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("shim_robustness")
        .join(format!("{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The client with the shim preloaded and the tenant's ledger at `ledger`.
fn shimmed(sim: &Sim, ledger: &Path) -> Command {
    let mut cmd = sim.command(compile(&ROBUST));
    cmd.env("LD_PRELOAD", shim_lib())
        .env("GPUSLICE_LEDGER", ledger);
    cmd
}

/// `gpuslice ARGS` with a clean environment.
fn gpuslice(sim: &Sim, args: &[&str]) -> Run {
    sim.run(gpuslice_bin(), args)
}

/// The memory section of `gpuslice status --ledger P --json`, parsed (the whole output must be one
/// JSON document).
fn status_json(sim: &Sim, ledger: &Path) -> Json {
    let run = gpuslice(
        sim,
        &["status", "--ledger", ledger.to_str().unwrap(), "--json"],
    );
    run.assert_success();
    let doc = parse_json(run.stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "gpuslice status --json printed bad JSON ({e}):\n{}",
            run.report()
        )
    });
    doc.at("memory").clone()
}

fn num(j: &Json, path: &str) -> u64 {
    j.u64(path)
}

/// A long-running client driven line by line: stdout is read by a thread (so a silent client cannot
/// hang the test), stderr is collected by another (so a chatty one cannot block on a full pipe).
struct Session {
    desc: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    seen: String,
    stderr: Arc<Mutex<String>>,
    stderr_thread: Option<std::thread::JoinHandle<()>>,
}

impl Session {
    fn start(cmd: &mut Command, desc: &str) -> Session {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {desc}: {e}"));
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err_pipe = child.stderr.take().unwrap();
        let sink = stderr.clone();
        let stderr_thread = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = std::io::Read::read(&mut err_pipe, &mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Session {
            desc: desc.to_string(),
            stdin: child.stdin.take(),
            child,
            lines,
            seen: String::new(),
            stderr,
            stderr_thread: Some(stderr_thread),
        }
    }

    fn report(&self) -> String {
        format!(
            "{}\n--- stdout so far ---\n{}--- stderr so far ---\n{}",
            self.desc,
            self.seen,
            self.stderr.lock().unwrap()
        )
    }

    /// Reads lines until `key=` appears; returns the `key=value` pairs read by this call.
    fn until(&mut self, key: &str) -> BTreeMap<String, String> {
        let mut read = String::new();
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push_str(&line);
                    self.seen.push('\n');
                    read.push_str(&line);
                    read.push('\n');
                    if line.starts_with(&format!("{key}=")) {
                        return parse_kv(&read);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("no `{key}=` within {ANSWER_TIMEOUT:?}\n{}", self.report())
                }
                Err(RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(Duration::from_millis(100));
                    panic!("client exited before printing `{key}=`\n{}", self.report())
                }
            }
        }
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| {
                panic!(
                    "cannot write `{line}` to the client ({e})\n{}",
                    self.report()
                )
            });
    }

    /// Sends a command and returns the value printed for `key`.
    fn ask(&mut self, line: &str, key: &str) -> String {
        self.send(line);
        self.until(key).remove(key).unwrap()
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Closes stdin and waits for the exit; returns the status, everything printed and stderr.
    fn finish(mut self) -> (ExitStatus, String, String) {
        drop(self.stdin.take());
        let status = self.child.wait().expect("wait for client");
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Ok(line) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.seen.push_str(&line);
            self.seen.push('\n');
        }
        // A child the client forked may hold stderr open: wait for its end only a while.
        if let Some(t) = self.stderr_thread.take() {
            let deadline = Instant::now() + Duration::from_secs(5);
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let stderr = self.stderr.lock().unwrap().clone();
        (status, self.seen.clone(), stderr)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // A failed assertion must not leave a client (possibly SIGSTOPped) behind.
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: signalling our own child by its pid.
            unsafe {
                libc::kill(self.child.id() as i32, libc::SIGKILL);
            }
            let _ = self.child.wait();
        }
    }
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a child this test started.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig}) failed");
}

/// The device entry of a status document (the tests use one simulated device).
fn device0(status: &Json) -> &Json {
    let devices = status.arr("devices");
    assert_eq!(devices.len(), 1, "expected one device in {status}");
    &devices[0]
}

fn alive_processes(status: &Json) -> Vec<&Json> {
    status
        .arr("processes")
        .iter()
        .filter(|p| p.at("alive") == &Json::Bool(true))
        .collect()
}

fn process_bytes(p: &Json) -> u64 {
    p.arr("used").iter().map(|u| u.u64("bytes")).sum()
}

// ---------------------------------------------------------------------------------------------
// 1. Storm
// ---------------------------------------------------------------------------------------------

/// `processes` clients in `mode` (`storm` or `swap`: `threads` threads each for 3 s, seeds from
/// `seed`) under a 3 GiB quota, in simgpu group `mode`; started together once every one holds its
/// context.
fn threads_in_processes(
    sim: &Sim,
    ledger: &Path,
    mode: &str,
    processes: usize,
    threads: u32,
    seed: usize,
) -> Vec<Session> {
    let mut clients: Vec<Session> = (0..processes)
        .map(|i| {
            let mut cmd = shimmed(sim, ledger);
            cmd.env("GPUSLICE_MEMORY_LIMIT", "3GiB")
                .env("GPUSLICE_LOG", "error")
                .env("SIMGPU_GROUP", mode)
                .args([mode, "3", &threads.to_string(), &(seed + i).to_string()]);
            Session::start(&mut cmd, &format!("{mode} client {i}"))
        })
        .collect();
    // Everyone holds its context before anyone allocates.
    for c in &mut clients {
        c.until("ready");
    }
    for c in &mut clients {
        c.send("go");
    }
    clients
}

#[test]
fn storm_of_threads_and_processes_never_passes_the_limit() {
    const PROCESSES: usize = 4;
    const LIMIT: u64 = 3 * GIB;
    let dir = tmp_dir("storm");
    let ledger = dir.join("storm.ledger");
    // simgpu charges a context what the shim charges for it, so simgpu's peak is exact.
    let sim = Sim::new("storm").env("SIMGPU_CONTEXT_MEMORY", "512MiB");
    let mut clients = threads_in_processes(&sim, &ledger, "storm", PROCESSES, 8, 1000);
    let mut refused = 0;
    let mut allocs = 0;
    let mut async_allocs = 0;
    for c in &mut clients {
        let kv = c.until("freed");
        let report = c.report();
        assert_eq!(kv["bad"], "0", "a call failed other than by OOM:\n{report}");
        refused += kv["refused"].parse::<u64>().unwrap();
        allocs += kv["allocs"].parse::<u64>().unwrap();
        async_allocs += kv["async_allocs"].parse::<u64>().unwrap();
    }
    // Everyone has freed everything but still holds its context.
    let during = status_json(&sim, &ledger);
    let stat = sim.stat();
    assert_eq!(
        num(device0(&during), "used"),
        PROCESSES as u64 * CONTEXT,
        "ledger after every allocation was freed (4 contexts x 512 MiB expected):\n{during}"
    );
    assert_eq!(alive_processes(&during).len(), PROCESSES, "{during}");
    assert_eq!(
        group(&stat, "storm").u64("used.0"),
        PROCESSES as u64 * CONTEXT,
        "simgpu after every allocation was freed: {stat}"
    );
    let mut runs = Vec::new();
    for c in clients {
        runs.push(c.finish());
    }
    for (status, out, err) in &runs {
        assert!(
            status.success() && out.contains("done=1"),
            "storm client failed: {status}\n{out}\n{err}"
        );
    }
    let stat = sim.stat();
    let peak = group(&stat, "storm").u64("peak.0");
    let report = format!(
        "allocs {allocs} (async {async_allocs}), refused {refused}\nsimgpu: {stat}\nledger: {}",
        status_json(&sim, &ledger)
    );
    assert!(
        peak <= LIMIT,
        "simgpu saw the tenant use {peak} bytes at once, over its {LIMIT} limit\n{report}"
    );
    assert!(
        peak > LIMIT - 64 * MIB,
        "the tenant never came near its limit (peak {peak}): the storm did not test it\n{report}"
    );
    assert!(refused > 0, "no allocation was refused\n{report}");
    assert!(
        allocs > 1000 && async_allocs > 100,
        "too little traffic\n{report}"
    );
    let after = status_json(&sim, &ledger);
    for d in after.arr("devices") {
        assert_eq!(
            d.u64("used"),
            0,
            "ledger after every process exited: {after}"
        );
        assert!(
            d.u64("peak") <= LIMIT,
            "ledger peak over the limit: {after}"
        );
    }
    assert_eq!(group(&stat, "storm").u64("used.0"), 0, "simgpu: {stat}");
}

/// Threads free each other's allocations, in processes that also have a memory pool: the ledger
/// returns exactly to what is held, simgpu never sees the limit passed, and every refused
/// `cuMemAlloc` counts once as denied (a refusal settles the pools and tries again first).
#[test]
fn threads_freeing_each_others_memory_keep_the_ledger_exact_and_count_each_refusal_once() {
    const PROCESSES: usize = 3;
    const LIMIT: u64 = 3 * GIB;
    let dir = tmp_dir("swap");
    let ledger = dir.join("swap.ledger");
    let sim = Sim::new("swap").env("SIMGPU_CONTEXT_MEMORY", "512MiB");
    let mut clients = threads_in_processes(&sim, &ledger, "swap", PROCESSES, 6, 2000);
    let (mut refused, mut allocs, mut frees) = (0, 0, 0);
    for c in &mut clients {
        let kv = c.until("freed");
        assert_eq!(
            kv["bad"],
            "0",
            "a call failed other than by OOM:\n{}",
            c.report()
        );
        refused += kv["refused"].parse::<u64>().unwrap();
        allocs += kv["allocs"].parse::<u64>().unwrap();
        frees += kv["frees"].parse::<u64>().unwrap();
    }
    let during = status_json(&sim, &ledger);
    let stat = sim.stat();
    let report = format!(
        "allocs {allocs}, frees {frees}, refused {refused}\nsimgpu: {stat}\nledger: {during}"
    );
    assert_eq!(allocs, frees, "{report}");
    assert_eq!(
        num(device0(&during), "used"),
        PROCESSES as u64 * CONTEXT,
        "ledger after every allocation was freed (contexts only expected)\n{report}"
    );
    assert_eq!(
        group(&stat, "swap").u64("used.0"),
        PROCESSES as u64 * CONTEXT,
        "{report}"
    );
    let peak = group(&stat, "swap").u64("peak.0");
    assert!(
        peak <= LIMIT,
        "simgpu saw {peak} bytes at once, over the limit\n{report}"
    );
    assert!(
        refused > 0 && allocs > 500,
        "the storm did not reach the limit\n{report}"
    );
    assert_eq!(
        num(device0(&during), "denied"),
        refused,
        "the ledger's denied count is not the number of refused calls\n{report}"
    );
    for c in clients {
        let (status, out, err) = c.finish();
        assert!(
            status.success() && out.contains("done=1"),
            "swap client failed: {status}\n{out}\n{err}"
        );
    }
    let after = status_json(&sim, &ledger);
    assert_eq!(num(device0(&after), "used"), 0, "{after}");
    assert_eq!(group(&sim.stat(), "swap").u64("used.0"), 0);
}

// ---------------------------------------------------------------------------------------------
// 2. SIGKILL and SIGSTOP
// ---------------------------------------------------------------------------------------------

#[test]
fn killed_holder_memory_returns_within_a_second_stopped_holder_keeps_it() {
    let dir = tmp_dir("kill");
    let ledger = dir.join("kill.ledger");
    let sim = Sim::new("kill").env("SIMGPU_CONTEXT_MEMORY", "512MiB");
    // 2.5 GiB: the holder's context + 1 GiB, and the other's context, fit; a second 1 GiB does not.
    let limit = "2560MiB";
    let start = |args: &[&str], desc: &str| {
        let mut cmd = shimmed(&sim, &ledger);
        cmd.env("GPUSLICE_MEMORY_LIMIT", limit).args(args);
        Session::start(&mut cmd, desc)
    };
    let mut holder = start(&["hold", "1024"], "holder");
    holder.until("ready");

    // Stopped: it still holds its memory, so the other process must stay refused.
    let mut waiter = start(&["retry", "1024", "1500"], "waiter (holder stopped)");
    assert_eq!(waiter.until("first")["first"], OOM, "{}", waiter.report());
    signal(holder.pid(), libc::SIGSTOP);
    waiter.send("go");
    let kv = waiter.until("tries");
    assert_eq!(
        (kv["got"].as_str(), kv["last"].as_str()),
        ("0", OOM),
        "a stopped process's memory was given away\n{}",
        waiter.report()
    );
    let (st, _, _) = waiter.finish();
    assert!(st.success());
    let status = status_json(&sim, &ledger);
    assert_eq!(num(device0(&status), "used"), 2 * CONTEXT + GIB, "{status}");

    // Killed (while stopped): its 1 GiB and its context come back within a second.
    let mut waiter = start(&["retry", "1024", "3000"], "waiter (holder killed)");
    assert_eq!(waiter.until("first")["first"], OOM, "{}", waiter.report());
    signal(holder.pid(), libc::SIGKILL);
    let (st, _, _) = holder.finish();
    assert_eq!(st.signal(), Some(libc::SIGKILL));
    waiter.send("go");
    let kv = waiter.until("tries");
    let report = waiter.report();
    assert_eq!(
        kv["got"], "1",
        "never got the killed process's memory\n{report}"
    );
    let ms: u64 = kv["elapsed_ms"].parse().unwrap();
    assert!(
        ms < 1000,
        "took {ms} ms to get the killed process's memory\n{report}"
    );
    let status = status_json(&sim, &ledger);
    assert_eq!(num(device0(&status), "used"), CONTEXT + GIB, "{status}");
    assert_eq!(
        status.arr("processes").len(),
        1,
        "dead slot not reclaimed: {status}"
    );
    let (st, _, _) = waiter.finish();
    assert!(st.success());
}

// ---------------------------------------------------------------------------------------------
// 3. Bad input: fail closed with a message naming the source, the value and what was expected
// ---------------------------------------------------------------------------------------------

/// Runs the client with `env`, asks for 256 MiB, and checks that it was refused and why.
fn assert_fails_closed(sim: &Sim, ledger: &Path, env: &[(&str, &str)], message: &str) {
    let mut cmd = shimmed(sim, ledger);
    cmd.envs(env.iter().copied()).arg("cmd");
    let desc = format!("client with {env:?}");
    let run = feed(sim.spawn(&mut cmd), "alloc 256\ninfo\nexit\n", &desc);
    assert!(run.status.success(), "client crashed:\n{}", run.report());
    // The context (device memory too) is refused, so nothing can be allocated at all.
    assert_eq!(
        run.get("retain"),
        OOM,
        "context not refused:\n{}",
        run.report()
    );
    // No context: the driver says INVALID_CONTEXT; a shim that checks the quota first, OOM.
    let alloc = run.get("alloc");
    assert!(
        alloc == INVALID_CONTEXT || alloc == OOM,
        "allocation not refused:\n{}",
        run.report()
    );
    assert_eq!(run.get("bye"), "1");
    assert!(
        run.stderr.contains(message),
        "stderr lacks\n  {message}\n{}",
        run.report()
    );
    // Whatever happened, no ledger was left without a limit.
    if ledger.exists() {
        if let Ok(meta) = std::fs::symlink_metadata(ledger) {
            if meta.is_file() && meta.len() > 1000 {
                let s = gpuslice(
                    sim,
                    &["status", "--ledger", ledger.to_str().unwrap(), "--json"],
                );
                let j = parse_json(s.stdout.trim()).unwrap();
                if s.status.success() && j.at("memory") != &Json::Null {
                    for d in j.arr("memory.devices") {
                        assert_ne!(d.at("limit"), &Json::Null, "unlimited ledger left: {j}");
                    }
                }
            }
        }
    }
}

#[test]
fn bad_memory_limit_values_fail_closed() {
    let dir = tmp_dir("badenv");
    let sim = Sim::new("badenv").env("SIMGPU_CONTEXT_MEMORY", "512MiB");
    let size_hint = "(expected a size such as 4GiB, 512MiB or 4294967296)";
    let cases = [
        (
            "4 GB",
            "GPUSLICE_MEMORY_LIMIT=\"4 GB\": unknown unit \"GB\" (expected B, KiB, MiB, GiB, TiB, Ki, Mi, Gi, Ti, K, M, G, T)".to_string(),
        ),
        ("-1", format!("GPUSLICE_MEMORY_LIMIT=\"-1\": not a number {size_hint}")),
        ("abc", format!("GPUSLICE_MEMORY_LIMIT=\"abc\": not a number {size_hint}")),
        (
            "0=1GiB,zz=2",
            "GPUSLICE_MEMORY_LIMIT=\"0=1GiB,zz=2\": bad device key \"zz\" (expected an index such as 0 or a UUID such as GPU-1b2c3d4e-0000-1111-2222-333344445555)".to_string(),
        ),
    ];
    for (i, (value, message)) in cases.iter().enumerate() {
        let ledger = dir.join(format!("env{i}.ledger"));
        assert_fails_closed(
            &sim,
            &ledger,
            &[("GPUSLICE_MEMORY_LIMIT", value)],
            &format!(
                "gpuslice: error: {message}; allocations on the devices it concerns are refused"
            ),
        );
    }
}

#[test]
fn bad_quota_files_fail_closed() {
    let dir = tmp_dir("badfile");
    let sim = Sim::new("badfile").env("SIMGPU_CONTEXT_MEMORY", "512MiB");
    let cases = [
        (
            "syntax",
            "memory_limit = \"4GiB\"\ntenant = \"x\n",
            ":2: unterminated string \"\\\"x\"",
            EVERYWHERE,
        ),
        (
            "unknown-key",
            "# quota\nmemory_limit = \"4GiB\"\nmemory_limt = \"8GiB\"\n",
            ":3: unknown key \"memory_limt\" (expected tenant, ledger, ledger_group, memory_limit, compute_share, compute_limit, priority or a [devices] table)",
            EVERYWHERE,
        ),
        (
            "bad-value",
            "memory_limit = \"lots\"\n",
            ":1: memory_limit=\"lots\": not a number (expected a size such as 4GiB, 512MiB or 4294967296)",
            "allocations on the devices it concerns are refused",
        ),
    ];
    // A quota file that does not parse concerns every device (and compute).
    const EVERYWHERE: &str = "allocations on every device are refused, and compute runs at share 1% and cap 1% (strictest)";
    for (name, text, tail, effect) in cases {
        let file = dir.join(format!("{name}.toml"));
        std::fs::write(&file, text).unwrap();
        let ledger = dir.join(format!("{name}.ledger"));
        assert_fails_closed(
            &sim,
            &ledger,
            &[("GPUSLICE_QUOTA_FILE", file.to_str().unwrap())],
            &format!("gpuslice: error: {}{tail}; {effect}", file.display()),
        );
    }
}

/// A valid ledger (limit 4 GiB) made by a real client, for the corruption cases to start from.
fn make_ledger(sim: &Sim, path: &Path) -> Vec<u8> {
    let mut cmd = shimmed(sim, path);
    cmd.env("GPUSLICE_MEMORY_LIMIT", "4GiB").arg("cmd");
    let run = feed(sim.spawn(&mut cmd), "alloc 1\nexit\n", "ledger maker");
    assert_eq!(run.get("alloc"), "0", "{}", run.report());
    std::fs::read(path).unwrap()
}

#[test]
fn broken_ledgers_fail_closed() {
    let dir = tmp_dir("badledger");
    let sim = Sim::new("badledger").env("SIMGPU_CONTEXT_MEMORY", "512MiB");
    let good = dir.join("good.ledger");
    let valid = make_ledger(&sim, &good);
    let size = valid.len();
    let limit = [("GPUSLICE_MEMORY_LIMIT", "4GiB")];
    let tail = "; every allocation is refused until this is fixed";

    let p = dir.join("truncated.ledger");
    std::fs::write(&p, &valid[..10]).unwrap();
    let msg = format!(
        "gpuslice: error: ledger {}: truncated (10 bytes, a ledger has {size}){tail}",
        p.display()
    );
    assert_fails_closed(&sim, &p, &limit, &msg);

    // 1 MiB of pseudo-random bytes (xorshift: no dependency, same bytes every run).
    let p = dir.join("garbage.ledger");
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let garbage: Vec<u8> = (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(&p, garbage).unwrap();
    let msg = format!(
        "gpuslice: error: ledger {}: not a gpuslice ledger (bad magic){tail}",
        p.display()
    );
    assert_fails_closed(&sim, &p, &limit, &msg);

    let p = dir.join("magic.ledger");
    let mut bytes = valid.clone();
    bytes[..8].copy_from_slice(b"GPUSLICX");
    std::fs::write(&p, bytes).unwrap();
    let msg = format!(
        "gpuslice: error: ledger {}: not a gpuslice ledger (bad magic){tail}",
        p.display()
    );
    assert_fails_closed(&sim, &p, &limit, &msg);

    // Header: magic u64 at 0, layout version u32 at 8 (state/src/ledger/shm.rs).
    let p = dir.join("version.ledger");
    let mut bytes = valid.clone();
    let version = gpuslice::ledger::LAYOUT_VERSION;
    assert_eq!(
        u32::from_ne_bytes(bytes[8..12].try_into().unwrap()),
        version
    );
    bytes[8..12].copy_from_slice(&(version + 1).to_ne_bytes());
    std::fs::write(&p, bytes).unwrap();
    let msg = format!(
        "gpuslice: error: ledger {}: layout version {}, this gpuslice uses {version} (all processes sharing it must run the same gpuslice){tail}",
        p.display(),
        version + 1
    );
    assert_fails_closed(&sim, &p, &limit, &msg);

    let p = dir.join("link.ledger");
    std::os::unix::fs::symlink(&good, &p).unwrap();
    let msg = format!(
        "gpuslice: error: ledger {}: is a symbolic link (refused; point GPUSLICE_LEDGER at the file itself){tail}",
        p.display()
    );
    assert_fails_closed(&sim, &p, &limit, &msg);
    // The same broken ledgers with no limit configured at all: the file alone makes the shim enforce.
    assert_fails_closed(
        &sim,
        &dir.join("magic.ledger"),
        &[],
        "not a gpuslice ledger (bad magic)",
    );
    // The good ledger is untouched by all this and still works.
    let mut cmd = shimmed(&sim, &good);
    cmd.arg("cmd");
    let run = feed(sim.spawn(&mut cmd), "alloc 256\nexit\n", "good ledger");
    assert_eq!(run.get("alloc"), "0", "{}", run.report());
}

#[test]
fn a_joiner_cannot_loosen_the_quota() {
    let dir = tmp_dir("joiner");
    let ledger = dir.join("joiner.ledger");
    let sim = Sim::new("joiner").env("SIMGPU_CONTEXT_MEMORY", "512MiB");
    let mut first = shimmed(&sim, &ledger);
    first.env("GPUSLICE_MEMORY_LIMIT", "2GiB").arg("cmd");
    let mut first = Session::start(&mut first, "creator (2 GiB)");
    first.until("ready");
    assert_eq!(first.ask("alloc 256", "alloc"), "0"); // 512 + 256 in use

    // A joiner asking for more: the ledger's 2 GiB rules.
    let mut more = shimmed(&sim, &ledger);
    more.env("GPUSLICE_MEMORY_LIMIT", "8GiB").arg("cmd");
    let run = feed(
        sim.spawn(&mut more),
        "info\nalloc 1024\nexit\n",
        "joiner asking 8 GiB",
    );
    assert_eq!(run.get("retain"), "0", "{}", run.report());
    assert_eq!(run.get_u64("info_total"), 2 * GIB, "{}", run.report());
    assert_eq!(
        run.get("alloc"),
        OOM,
        "8 GiB joiner loosened the quota:\n{}",
        run.report()
    );

    // A joiner with no limit at all (only the ledger): the same.
    let mut none = shimmed(&sim, &ledger);
    none.arg("cmd");
    let run = feed(
        sim.spawn(&mut none),
        "alloc 768\nalloc 512\nexit\n",
        "joiner without a limit",
    );
    assert_eq!(run.get("retain"), "0", "{}", run.report());
    let allocs: Vec<&str> = run
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("alloc="))
        .collect();
    // 768 + 512 + 768 = 2048 fits exactly; another 512 does not.
    assert_eq!(allocs, ["0", OOM], "{}", run.report());
    let status = status_json(&sim, &ledger);
    assert_eq!(num(device0(&status), "limit"), 2 * GIB, "{status}");
    let (st, _, _) = first.finish();
    assert!(st.success());
}

// ---------------------------------------------------------------------------------------------
// 4. Live limit changes
// ---------------------------------------------------------------------------------------------

#[test]
fn live_limit_change_applies_to_the_next_allocation() {
    let dir = tmp_dir("live");
    let ledger = dir.join("live.ledger");
    let p = ledger.to_str().unwrap();
    let sim = Sim::new("live").env("SIMGPU_CONTEXT_MEMORY", "512MiB");
    let mut cmd = shimmed(&sim, &ledger);
    cmd.env("GPUSLICE_MEMORY_LIMIT", "4GiB").arg("cmd");
    let mut c = Session::start(&mut cmd, "live client");
    c.until("ready");
    assert_eq!(c.ask("alloc 1024", "alloc"), "0"); // 1.5 GiB in use

    let set = gpuslice(&sim, &["set", "--memory", "2GiB", "--ledger", p]);
    set.assert_success();
    assert_eq!(
        set.stdout.trim(),
        "device 0: limit 2 GiB",
        "{}",
        set.report()
    );
    let kv = {
        c.send("info");
        c.until("info")
    };
    assert_eq!(kv["info_total"], (2 * GIB).to_string(), "{}", c.report());
    assert_eq!(kv["info_free"], (512 * MIB).to_string(), "{}", c.report());
    assert_eq!(
        c.ask("alloc 1024", "alloc"),
        OOM,
        "lowered limit ignored\n{}",
        c.report()
    );
    assert_eq!(c.ask("alloc 512", "alloc"), "0", "{}", c.report()); // exactly 2 GiB

    let set = gpuslice(&sim, &["set", "--memory", "4GiB", "--ledger", p]);
    set.assert_success();
    assert_eq!(
        c.ask("alloc 1024", "alloc"),
        "0",
        "raised limit ignored\n{}",
        c.report()
    );
    let status = status_json(&sim, &ledger);
    assert_eq!(num(device0(&status), "limit"), 4 * GIB, "{status}");
    assert_eq!(num(device0(&status), "used"), 3 * GIB, "{status}");

    // Below what is in use: nothing is taken away, nothing more is given.
    gpuslice(&sim, &["set", "--memory", "1GiB", "--ledger", p]).assert_success();
    assert_eq!(c.ask("alloc 1", "alloc"), OOM, "{}", c.report());
    assert_eq!(c.ask("free", "free"), "0", "{}", c.report());

    // A bad size changes nothing.
    let bad = gpuslice(&sim, &["set", "--memory", "lots", "--ledger", p]);
    assert_eq!(bad.status.code(), Some(2), "{}", bad.report());
    assert!(
        bad.stderr.contains("--memory \"lots\": not a number"),
        "{}",
        bad.report()
    );
    let status = status_json(&sim, &ledger);
    assert_eq!(num(device0(&status), "limit"), GIB, "{status}");
    let (st, _, _) = c.finish();
    assert!(st.success());
}

// ---------------------------------------------------------------------------------------------
// 5. Fork and exec
// ---------------------------------------------------------------------------------------------

#[test]
fn forked_and_execd_children_are_counted_and_their_memory_returns() {
    let dir = tmp_dir("fork");
    let ledger = dir.join("fork.ledger");
    let sim = Sim::new("fork").env("SIMGPU_CONTEXT_MEMORY", "512MiB");
    let mut cmd = shimmed(&sim, &ledger);
    cmd.env("GPUSLICE_MEMORY_LIMIT", "2GiB").arg("cmd");
    let mut c = Session::start(&mut cmd, "forking client");
    let parent = c.until("ready")["pid"].parse::<u64>().unwrap();
    assert_eq!(c.ask("alloc 256", "alloc"), "0"); // parent: 512 + 256

    c.send("fork 512");
    let kv = c.until("child_ready");
    assert_eq!(kv["child_alloc"], "0", "{}", c.report());
    let child: u64 = kv["child_pid"].parse().unwrap();
    let status = status_json(&sim, &ledger);
    let alive = alive_processes(&status);
    let find = |pid: u64| {
        alive
            .iter()
            .find(|p| p.u64("pid") == pid)
            .unwrap_or_else(|| panic!("process {pid} not in {status}"))
    };
    assert_eq!(alive.len(), 2, "{status}");
    assert_eq!(process_bytes(find(parent)), CONTEXT + 256 * MIB, "{status}");
    assert_eq!(process_bytes(find(child)), 512 * MIB, "{status}");
    assert_eq!(
        num(device0(&status), "used"),
        CONTEXT + 768 * MIB,
        "{status}"
    );

    // An exec'd child finds the ledger through the environment it inherited.
    c.send("exec 256");
    let kv = c.until("child_ready");
    assert_eq!(kv["exec_alloc"], "0", "{}", c.report());
    let execd: u64 = kv["exec_pid"].parse().unwrap();
    let status = status_json(&sim, &ledger);
    let alive = alive_processes(&status);
    assert_eq!(alive.len(), 3, "{status}");
    let execd_entry = alive.iter().find(|p| p.u64("pid") == execd);
    assert_eq!(
        execd_entry.map(|p| process_bytes(p)),
        Some(CONTEXT + 256 * MIB),
        "{status}"
    );
    assert_eq!(num(device0(&status), "used"), 2 * GIB, "{status}");
    assert_eq!(c.ask("alloc 1", "alloc"), OOM, "{}", c.report());

    // Both children exit without freeing: their memory comes back to the tenant within a second.
    assert_eq!(c.ask("reap", "reaped"), "0");
    assert_eq!(c.ask("reap", "reaped"), "0");
    // What the parent is shown comes back too, without any allocation of its own: cuMemGetInfo
    // gives the dead processes' memory back before it answers (at most every 200 ms).
    let want_free = (2 * GIB - CONTEXT - 256 * MIB).to_string();
    let shown = Instant::now();
    loop {
        c.send("info");
        let info = c.until("info");
        if info["info_free"] == want_free {
            break;
        }
        assert!(
            shown.elapsed() < Duration::from_secs(30),
            "the parent is still shown the dead children's memory: {info:?}\n{}",
            c.report()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let t0 = Instant::now();
    loop {
        match c.ask("alloc 1024", "alloc").as_str() {
            "0" => break,
            OOM if t0.elapsed() < Duration::from_secs(1) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            rc => panic!(
                "children's memory not returned after {:?} (rc {rc})\n{}",
                t0.elapsed(),
                c.report()
            ),
        }
    }
    let status = status_json(&sim, &ledger);
    assert_eq!(status.arr("processes").len(), 1, "{status}");
    assert_eq!(
        num(device0(&status), "used"),
        CONTEXT + 1280 * MIB,
        "{status}"
    );
    let (st, _, _) = c.finish();
    assert!(st.success());
}

// ---------------------------------------------------------------------------------------------
// 6. The command line
// ---------------------------------------------------------------------------------------------

/// A fork child that frees its parent's allocation (undefined for CUDA; simgpu lets it) gives back
/// only what its own slot holds: the parent's allocation stays charged, and the parent cannot
/// allocate past its limit on the strength of the child's free.
#[test]
fn a_fork_child_freeing_its_parents_allocation_leaves_it_charged() {
    let dir = tmp_dir("forkfree");
    let ledger = dir.join("forkfree.ledger");
    let sim = Sim::new("forkfree").env("SIMGPU_CONTEXT_MEMORY", "512MiB");
    let mut cmd = shimmed(&sim, &ledger);
    cmd.env("GPUSLICE_MEMORY_LIMIT", "2GiB").arg("cmd");
    let mut c = Session::start(&mut cmd, "forking client");
    let parent = c.until("ready")["pid"].parse::<u64>().unwrap();
    assert_eq!(c.ask("alloc 1024", "alloc"), "0"); // 512 + 1024
    c.send("forkfree");
    let kv = c.until("forkfree");
    assert_eq!(kv["forkfree"], "0", "{}", c.report());
    let status = status_json(&sim, &ledger);
    let parent_entry = alive_processes(&status)
        .into_iter()
        .find(|p| p.u64("pid") == parent)
        .map(process_bytes);
    assert_eq!(parent_entry, Some(CONTEXT + GIB), "{status}");
    assert_eq!(
        num(device0(&status), "used"),
        CONTEXT + GIB,
        "the tenant's usage lost the parent's allocation\n{status}\n{}",
        c.report()
    );
    // 512 + 1024 + 768 is over 2 GiB.
    assert_eq!(c.ask("alloc 768", "alloc"), OOM, "{}", c.report());
    let stat = sim.stat();
    let used_by_parent = stat
        .arr("processes")
        .iter()
        .find(|p| p.u64("pid") == parent)
        .map(|p| p.u64("used.0"));
    assert!(
        used_by_parent.is_some_and(|u| u <= 2 * GIB),
        "simgpu: the parent holds {used_by_parent:?} bytes, over its 2 GiB limit: {stat}"
    );
    let (st, _, _) = c.finish();
    assert!(st.success());
}

#[test]
fn status_prints_the_documented_table_and_json() {
    let dir = tmp_dir("status");
    let ledger = dir.join("status.ledger");
    let p = ledger.to_str().unwrap();
    let sim = Sim::new("status").env("SIMGPU_CONTEXT_MEMORY", "512MiB");

    let missing = gpuslice(&sim, &["status", "--ledger", p]);
    assert_eq!(missing.status.code(), Some(2), "{}", missing.report());
    assert!(
        missing
            .stderr
            .starts_with(&format!("gpuslice: ledger {p}: open: ")),
        "{}",
        missing.report()
    );

    let mut cmd = shimmed(&sim, &ledger);
    cmd.env("GPUSLICE_MEMORY_LIMIT", "2GiB")
        .env("GPUSLICE_TENANT", "team-a")
        .args(["hold", "1024"]);
    let mut holder = Session::start(&mut cmd, "holder");
    let pid: u64 = holder.until("pid")["pid"].parse().unwrap();

    let table = gpuslice(&sim, &["status", "--ledger", p]);
    table.assert_success();
    let lines: Vec<Vec<&str>> = table
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let report = table.report();
    assert_eq!(lines.len(), 6, "{report}");
    assert_eq!(lines[0], ["tenant", "team-a", "-", "ledger", p], "{report}");
    assert_eq!(lines[1], ["device", "limit", "used", "peak"], "{report}");
    let uuid = lines[2][0];
    assert!(uuid.starts_with("GPU-") && uuid.len() == 40, "{report}");
    assert_eq!(
        lines[2][1..],
        ["2", "GiB", "1.5", "GiB", "1.5", "GiB"],
        "{report}"
    );
    assert_eq!(lines[3], ["processes:", "1"], "{report}");
    assert_eq!(
        lines[4],
        ["pid", "device", "allocations", "overhead", "used"],
        "{report}"
    );
    // Its 1 GiB allocation and the context's reservation, apart.
    assert_eq!(
        lines[5],
        [
            &pid.to_string(),
            uuid,
            "1",
            "GiB",
            "512",
            "MiB",
            "1.5",
            "GiB"
        ],
        "{report}"
    );

    let j = status_json(&sim, &ledger);
    assert_eq!(j.str("tenant"), "team-a", "{j}");
    assert_eq!(j.str("ledger"), p, "{j}");
    let d = device0(&j);
    assert_eq!(d.str("uuid"), uuid);
    assert_eq!(d.u64("index"), 0);
    assert_eq!(d.u64("limit"), 2 * GIB);
    assert_eq!(d.at("invalid_config"), &Json::Bool(false));
    assert_eq!(d.u64("used"), CONTEXT + GIB);
    assert_eq!(d.u64("peak"), CONTEXT + GIB);
    let procs = j.arr("processes");
    assert_eq!(procs.len(), 1, "{j}");
    assert_eq!(procs[0].u64("pid"), pid);
    assert_eq!(procs[0].at("alive"), &Json::Bool(true));
    assert_eq!(procs[0].u64("used.0.device"), 0);
    assert_eq!(procs[0].u64("used.0.bytes"), CONTEXT + GIB);
    assert_eq!(procs[0].u64("allocations.0.bytes"), GIB, "{j}");
    assert_eq!(procs[0].u64("overhead.0.bytes"), CONTEXT, "{j}");

    // Killed: shown as exited until its memory is reclaimed.
    signal(holder.pid(), libc::SIGKILL);
    let (st, _, _) = holder.finish();
    assert_eq!(st.signal(), Some(libc::SIGKILL));
    let j = status_json(&sim, &ledger);
    assert_eq!(j.at("processes.0.alive"), &Json::Bool(false), "{j}");
    let table = gpuslice(&sim, &["status", "--ledger", p]);
    assert!(
        table.stdout.contains(" (exited, being reclaimed)"),
        "{}",
        table.report()
    );
}

#[test]
fn run_passes_exit_codes_and_signals_and_sets_the_quota() {
    let dir = tmp_dir("run");
    let ledger = dir.join("run.ledger");
    let p = ledger.to_str().unwrap();
    let sim = Sim::new("run").env("SIMGPU_CONTEXT_MEMORY", "512MiB");
    let base = ["run", "--memory", "1GiB", "--ledger", p, "--"];

    let exit7 = gpuslice(&sim, &[&base[..], &["sh", "-c", "exit 7"]].concat());
    assert_eq!(exit7.status.code(), Some(7), "{}", exit7.report());
    let term = gpuslice(&sim, &[&base[..], &["sh", "-c", "kill -TERM $$"]].concat());
    assert_eq!(
        term.status.signal(),
        Some(libc::SIGTERM),
        "{}",
        term.report()
    );
    let env = gpuslice(
        &sim,
        &[
            &base[..],
            &[
                "sh",
                "-c",
                "echo \"$LD_PRELOAD|$GPUSLICE_MEMORY_LIMIT|$GPUSLICE_LEDGER\"",
            ],
        ]
        .concat(),
    );
    env.assert_success();
    assert_eq!(
        env.stdout.trim(),
        format!(
            "{}|1GiB|{p}",
            installed_shim_lib().canonicalize().unwrap().display()
        ),
        "{}",
        env.report()
    );

    let bad = gpuslice(&sim, &["run", "--memory", "4 GB", "--", "true"]);
    assert_eq!(bad.status.code(), Some(2), "{}", bad.report());
    assert!(
        bad.stderr
            .contains("--memory \"4 GB\": unknown unit \"GB\""),
        "{}",
        bad.report()
    );

    // A CUDA program under `gpuslice run` gets the quota (1 GiB: 512 MiB context + 512 MiB).
    let client = compile(&ROBUST);
    let mut cmd = sim.command(gpuslice_bin());
    cmd.args([
        "run", "--memory", "1GiB", "--tenant", "t1", "--ledger", p, "--",
    ])
    .arg(&client)
    .arg("cmd");
    let run = feed(
        sim.spawn(&mut cmd),
        "alloc 768\nalloc 512\nexit\n",
        "gpuslice run client",
    );
    run.assert_success();
    let allocs: Vec<&str> = run
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("alloc="))
        .collect();
    assert_eq!(allocs, [OOM, "0"], "{}", run.report());
    let j = status_json(&sim, &ledger);
    assert_eq!(j.str("tenant"), "t1", "{j}");
    assert_eq!(num(device0(&j), "limit"), GIB, "{j}");
}

#[test]
fn a_killed_process_with_a_forked_helper_still_returns_its_memory() {
    // A CUDA process forks a helper that never touches CUDA (data-loader workers, shell-outs), then
    // is SIGKILLed while the helper lives on: its memory must still come back within a second.
    let dir = tmp_dir("forkidle");
    let ledger = dir.join("forkidle.ledger");
    let sim = Sim::new("forkidle").env("SIMGPU_CONTEXT_MEMORY", "512MiB");
    let start = |args: &[&str], desc: &str| {
        let mut cmd = shimmed(&sim, &ledger);
        cmd.env("GPUSLICE_MEMORY_LIMIT", "2560MiB").args(args);
        Session::start(&mut cmd, desc)
    };
    let mut holder = start(&["cmd"], "holder with a helper");
    holder.until("ready");
    assert_eq!(holder.ask("alloc 1024", "alloc"), "0");
    let helper: i32 = holder.ask("forkidle", "idle_pid").parse().unwrap();
    struct Reap(i32);
    impl Drop for Reap {
        fn drop(&mut self) {
            // SAFETY: kill(2) on the helper this test made (an orphan once its parent is killed).
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
    let _helper = Reap(helper);
    let mut waiter = start(&["retry", "1024", "3000"], "waiter");
    assert_eq!(waiter.until("first")["first"], OOM, "{}", waiter.report());
    signal(holder.pid(), libc::SIGKILL);
    let (st, _, _) = holder.finish();
    assert_eq!(st.signal(), Some(libc::SIGKILL));
    waiter.send("go");
    let kv = waiter.until("tries");
    assert_eq!(
        kv["got"],
        "1",
        "the killed process's memory stayed charged while its forked helper (pid {helper}) lives: {}\n{}",
        status_json(&sim, &ledger),
        waiter.report()
    );
    let ms: u64 = kv["elapsed_ms"].parse().unwrap();
    assert!(ms < 1000, "took {ms} ms\n{}", waiter.report());
}
