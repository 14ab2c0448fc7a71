//! `gpuslice demo`: two tenants share one GPU; one is stopped cleanly at its quota.
//!
//! Each tenant is `gpuslice-workload` (a plain CUDA program that knows nothing of gpuslice) run with
//! libgpuslice.so preloaded and its own ledger. With no NVIDIA driver on the machine it runs on simgpu,
//! the project's simulated driver, found beside the build (`target/simgpu/lib`) or by `GPUSLICE_SIMGPU`.

use super::run::library_path;
use gpuslice_state::config::format_bytes;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Tenant {
    name: &'static str,
    quota: &'static str,
    /// The workload asks for at most this many MiB.
    wants_mib: u64,
}

const TENANTS: [Tenant; 2] = [
    Tenant {
        name: "alpha",
        quota: "2GiB",
        wants_mib: 4096,
    },
    Tenant {
        name: "beta",
        quota: "3GiB",
        wants_mib: 1024,
    },
];

/// Part two: the same two tenants keep the GPU busy at once, with compute shares 30 and 70.
fn compute_part(
    workload: &Path,
    library: &Path,
    env: &[(String, String)],
    scratch: &Path,
    seconds: u64,
) -> Result<bool, String> {
    const SPIN_US: &str = "200";
    let seconds = seconds.to_string();
    let seconds = seconds.as_str();
    println!(
        "\nCompute: both tenants launch {SPIN_US} us kernels back to back for {seconds} s, with shares 30 and 70."
    );
    let shares = [("alpha", 30u64), ("beta", 70u64)];
    let children: Vec<_> = shares
        .iter()
        .map(|(name, share)| {
            Command::new(workload)
                .args(["--spin-us", SPIN_US, "--seconds", seconds, "--ready"])
                .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .env("GPUSLICE_COMPUTE_SHARE", share.to_string())
                .env("GPUSLICE_TENANT", name)
                .env("GPUSLICE_LEDGER", scratch.join(format!("{name}.ledger")))
                .env("LD_PRELOAD", library)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot run {}: {e}", workload.display()))
        })
        .collect::<Result<_, _>>()?;
    // Both set up (context, module, stream) before either launches: the shares are measured under
    // contention, not skewed by one tenant starting sooner on a busy machine.
    let mut children: Vec<_> = children
        .into_iter()
        .map(|mut child| {
            let mut stdout = std::io::BufReader::new(child.stdout.take().expect("piped"));
            let mut line = String::new();
            while std::io::BufRead::read_line(&mut stdout, &mut line).is_ok_and(|n| n > 0)
                && line.trim() != "ready"
            {
                line.clear();
            }
            (child, stdout)
        })
        .collect();
    for (child, _) in &mut children {
        if let Some(stdin) = child.stdin.as_mut() {
            let _ = std::io::Write::write_all(stdin, b"go\n");
        }
    }
    let mut results = Vec::new();
    let mut ok = true;
    for ((child, mut stdout), (name, share)) in children.into_iter().zip(shares) {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut rest);
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        let text = rest;
        let kv: HashMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
        let gpu_us = kv.get("gpu_us").and_then(|v| v.parse::<u64>().ok());
        if !out.status.success() || gpu_us.is_none() {
            ok = false;
            eprint!("{}", String::from_utf8_lossy(&out.stderr));
        }
        results.push((name, share, gpu_us.unwrap_or(0)));
    }
    let total: u64 = results.iter().map(|r| r.2).sum::<u64>().max(1);
    println!("{:<7} {:>6}  {:>18}", "tenant", "share", "GPU time it got");
    for (name, share, us) in &results {
        println!(
            "{:<7} {:>5}%  {:>6.2} s ({:>4.1}%)",
            name,
            share,
            *us as f64 / 1e6,
            *us as f64 * 100.0 / total as f64
        );
    }
    Ok(ok)
}

fn simgpu_dir(exe_dir: &Path) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GPUSLICE_SIMGPU") {
        return Some(PathBuf::from(p));
    }
    [
        exe_dir.join("../simgpu/lib"),
        exe_dir.join("../../simgpu/lib"),
        exe_dir.join("../lib/simgpu"),
    ]
    .into_iter()
    .find(|d| d.join("libcuda.so.1").exists())
}

/// A working NVIDIA driver: the workload itself initialises CUDA and sees a device.
fn real_driver_present(workload: &Path) -> bool {
    if std::env::var_os("GPUSLICE_DEMO_SIMGPU").is_some() {
        return false;
    }
    Command::new(workload)
        .args(["--max", "0"])
        .env_remove("LD_PRELOAD")
        .output()
        .is_ok_and(|o| {
            o.status.success()
                && String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .any(|l| l.starts_with("total=") && l != "total=0")
        })
}

/// `gpuslice demo`'s arguments.
#[derive(clap::Args)]
pub(crate) struct DemoArgs {
    /// How long the compute part runs (and, beyond 3 s, how long the memory part holds its memory
    /// for half of it): time to watch it with `gpuslice top` or the exporter.
    #[arg(long, value_name = "SECONDS", default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=3600))]
    seconds: u64,
}

pub(crate) fn demo(args: DemoArgs) -> Result<i32, String> {
    let library = library_path()?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let exe_dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    let workload = exe_dir.join("gpuslice-workload");
    if !workload.exists() {
        return Err(format!(
            "{} is missing (build the whole package: cargo build)",
            workload.display()
        ));
    }
    // Everything the demo creates (ledgers, device ledgers, the simulated GPU's state) lives in one
    // directory, removed when the demo ends, fails or is interrupted.
    let scratch = Scratch::create()?;
    let scratch = scratch.path();

    // Device ledgers and measurement locks too: nothing goes to the machine's defaults.
    let mut env: Vec<(String, String)> = vec![
        (
            "GPUSLICE_DEVICE_DIR".into(),
            scratch.join("devices").display().to_string(),
        ),
        ("GPUSLICE_LEDGER_DIR".into(), scratch.display().to_string()),
    ];
    let device = if real_driver_present(&workload) {
        "the NVIDIA GPU".to_string()
    } else {
        let dir = simgpu_dir(&exe_dir).ok_or(
            "no NVIDIA driver here and simgpu is not built: run scripts/demo (or set GPUSLICE_SIMGPU to its lib dir)",
        )?;
        let ld = match std::env::var("LD_LIBRARY_PATH") {
            Ok(v) if !v.is_empty() => format!("{}:{v}", dir.display()),
            _ => dir.display().to_string(),
        };
        env.push(("LD_LIBRARY_PATH".into(), ld));
        env.push((
            "SIMGPU_STATE".into(),
            scratch.join("simgpu-state").display().to_string(),
        ));
        env.push(("SIMGPU_MEMORY".into(), "8GiB".into()));
        "a simulated 8 GiB GPU (simgpu; no NVIDIA driver on this machine)".to_string()
    };

    println!("gpuslice demo: two tenants share {device}.");
    println!(
        "Watch it from another terminal (`gpuslice demo --seconds 60` gives you time):\n  \
         gpuslice top --ledger-dir {dir}\n  \
         gpuslice exporter --ledger-dir {dir}    (Prometheus metrics on http://localhost:9842/metrics)\n",
        dir = scratch.display()
    );
    let hold_ms = if args.seconds > 3 {
        args.seconds * 500
    } else {
        300
    };
    let children: Vec<_> = TENANTS
        .iter()
        .map(|t| {
            let ledger = scratch.join(format!("{}.ledger", t.name));
            let mut cmd = Command::new(&workload);
            cmd.args([
                "--chunk",
                "256",
                "--max",
                &t.wants_mib.to_string(),
                "--hold-ms",
                &hold_ms.to_string(),
            ])
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("GPUSLICE_MEMORY_LIMIT", t.quota)
            .env("GPUSLICE_TENANT", t.name)
            .env("GPUSLICE_LEDGER", &ledger)
            .env("LD_PRELOAD", &library);
            cmd.output()
        })
        .collect();

    println!(
        "{:<7} {:>6}  {:>16}  {:>22}  result",
        "tenant", "quota", "cuMemGetInfo total", "allocated (256 MiB each)"
    );
    let mut ok = true;
    let mut log_lines = Vec::new();
    let mut alpha_chunks = 0;
    for (t, out) in TENANTS.iter().zip(children) {
        let out = out.map_err(|e| format!("cannot run {}: {e}", workload.display()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let kv: HashMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
        let num = |k: &str| kv.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let outcome = kv.get("outcome").copied().unwrap_or("?");
        let result = match (kv.get("error"), outcome) {
            (Some(e), _) => {
                ok = false;
                format!("failed: {e}")
            }
            (None, "ok") => format!("got all it asked for ({} MiB)", t.wants_mib),
            (None, "CUDA_ERROR_OUT_OF_MEMORY") => {
                "stopped at its quota: CUDA_ERROR_OUT_OF_MEMORY".to_string()
            }
            (None, other) => {
                ok = false;
                format!("unexpected: {other}")
            }
        };
        if t.name == "alpha" {
            alpha_chunks = num("chunks");
        }
        println!(
            "{:<7} {:>6}  {:>18}  {:>24}  {result}",
            t.name,
            t.quota.replace("GiB", " GiB"),
            format_bytes(num("total")),
            format!("{} ({})", format_bytes(num("allocated")), num("chunks"))
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            ok = false;
            eprint!("{stderr}");
        }
        log_lines.extend(
            stderr
                .lines()
                .filter(|l| l.starts_with("gpuslice:"))
                .map(str::to_owned),
        );
    }
    if !log_lines.is_empty() {
        println!("\nWhat gpuslice logged:");
        for l in &log_lines {
            println!("  {l}");
        }
    }
    interrupted()?;
    ok &= compute_part(&workload, &library, &env, scratch, args.seconds)?;
    interrupted()?;
    println!(
        "\nEach tenant sees its quota as the card's size. The device memory the driver spends on each\n\
         process's context is charged to its quota too (measured, docs/MEMORY.md), so alpha's 2 GiB\n\
         held {alpha_chunks} allocations of 256 MiB.\n\
         Under contention each tenant gets its share of the GPU's time; alone, a tenant gets all of it.\n\
         Try: gpuslice run --memory 1GiB --share 30 -- <your CUDA program>"
    );
    Ok(if ok { 0 } else { 1 })
}

/// The demo's private directory, removed on drop (the end, an error, or an interruption).
struct Scratch(PathBuf);

impl Scratch {
    fn create() -> Result<Scratch, String> {
        // Shared memory when the machine has it (ledgers live there in real use), else the temp dir.
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("gpuslice-demo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        on_interrupt_set_flag();
        Ok(Scratch(dir))
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn note_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Ctrl-C (SIGINT), SIGTERM and SIGHUP set a flag instead of killing the demo, so that it removes
/// its directory before it exits. The workloads, in the same process group, get Ctrl-C themselves
/// (a handler, unlike an ignored signal, is reset by exec) and end at once.
fn on_interrupt_set_flag() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: `note_interrupt` only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(
                sig,
                note_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
    }
}

/// An error once the demo was interrupted (its directory is then removed on the way out).
fn interrupted() -> Result<(), String> {
    if INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
        Err("demo interrupted; its files are removed".into())
    } else {
        Ok(())
    }
}
