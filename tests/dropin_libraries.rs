//! The drop-in libraries (shim-c/dropin-cuda, shim-c/dropin-nvml), judged by real clients without
//! LD_PRELOAD: their export lists against NVIDIA's real driver and simgpu, C and Python clients on
//! simgpu with the quota enforced, NVIDIA's real driver answering through them (and through the
//! preloaded library), a drop-in never loading itself as the driver, and preload + drop-in in one
//! process counting everything once. simgpu's counters and the clients' output are the judge.

use gpuslice_testkit as common;

use common::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const QUOTA: u64 = GIB;
const SIMGPU_CONTEXT: u64 = 300 * MIB;
/// What a context is charged: what the driver spent on it (measured).
const CONTEXT_RESERVE: u64 = SIMGPU_CONTEXT;
/// The code of the clients' small PTX module: one 2 MiB page of device memory.
const MODULE: u64 = 2 * MIB;
const CHUNK: u64 = 64 * MIB;

fn ledger(tag: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dropin-ledgers");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{tag}-{}.ledger", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

fn sim(tag: &str) -> Sim {
    Sim::new(tag).env("SIMGPU_MEMORY", "4GiB")
}

/// A command finding the drop-in first on the library path, simgpu (or `real`) as its real driver,
/// with the quota, and no LD_PRELOAD.
fn dropin_command(sim: &Sim, program: impl AsRef<std::ffi::OsStr>, ledger: &Path) -> Command {
    let simgpu = simgpu_lib_dir();
    let mut cmd = sim.command_with_driver(program, &common::dropin_dir());
    cmd.env(
        "LD_LIBRARY_PATH",
        format!("{}:{}", common::dropin_dir().display(), simgpu.display()),
    )
    .env("GPUSLICE_REAL_LIBCUDA", simgpu.join("libcuda.so.1"))
    .env("GPUSLICE_REAL_NVML", simgpu.join("libnvidia-ml.so.1"))
    .env("GPUSLICE_MEMORY_LIMIT", "1GiB")
    .env("GPUSLICE_LEDGER", ledger);
    cmd
}

/// `nm -D --defined-only` names.
fn exports(lib: &Path) -> BTreeSet<String> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib)
        .output()
        .expect("run nm (binutils)");
    assert!(out.status.success(), "nm {}", lib.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_owned))
        .collect()
}

fn soname(lib: &Path) -> String {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(lib)
        .output()
        .expect("run readelf");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.contains("(SONAME)"))
        .and_then(|l| l.split('[').nth(1))
        .map(|s| s.trim_end_matches(']').to_owned())
        .unwrap_or_default()
}

#[test]
fn exports_cover_the_real_libraries_and_simgpu() {
    let drop = common::dropin_dir();
    for (name, real_soname) in [
        ("libcuda.so.1", "libcuda.so.1"),
        ("libnvidia-ml.so.1", "libnvidia-ml.so.1"),
    ] {
        let ours = exports(&drop.join(name));
        let real = exports(&nvidia_driver_dir().join(name));
        let sim = exports(&simgpu_lib_dir().join(name));
        assert!(real.len() > 300, "{name}: NVIDIA's exports {}", real.len());
        let missing: Vec<_> = real.difference(&ours).collect();
        assert!(
            missing.is_empty(),
            "drop-in {name} lacks {} of NVIDIA's exports: {missing:?}",
            missing.len()
        );
        let missing: Vec<_> = sim
            .iter()
            .filter(|s| s.starts_with("cu") || s.starts_with("nvml"))
            .filter(|s| !ours.contains(*s))
            .collect();
        assert!(
            missing.is_empty(),
            "drop-in {name} lacks simgpu's exports {missing:?}"
        );
        assert!(ours.contains("gpuslice_dlsym_hook"), "{name}: probe symbol");
        assert_eq!(soname(&drop.join(name)), real_soname);
        assert!(
            drop.join(name.trim_end_matches(".1")).exists(),
            "unversioned name"
        );
    }
    // The driver's data symbols are data, as in NVIDIA's library.
    let kinds = |lib: &Path| -> Vec<(String, bool)> {
        let out = Command::new("nm")
            .args(["-D", "--defined-only"])
            .arg(lib)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 3).then(|| (f[2].to_owned(), matches!(f[1], "D" | "B" | "d" | "b")))
            })
            .collect()
    };
    let ours: BTreeSet<(String, bool)> = kinds(&drop.join("libcuda.so.1")).into_iter().collect();
    let real_data: Vec<(String, bool)> = kinds(&nvidia_driver_dir().join("libcuda.so.1"))
        .into_iter()
        .filter(|(_, data)| *data)
        .collect();
    assert!(
        real_data.len() >= 20,
        "NVIDIA's data symbols: {real_data:?}"
    );
    for d in &real_data {
        assert!(
            ours.contains(d),
            "drop-in libcuda: {} is not a data symbol",
            d.0
        );
    }
}

/// The `full` run of client.h through the drop-in: the quota is the device.
fn assert_enforced_full(sim: &Sim, run: &Run) {
    run.assert_success();
    let ctx = |what: &str| format!("{what}\n{}", run.report());
    assert_eq!(
        run.get_u64("mem_info_total"),
        QUOTA,
        "{}",
        ctx("total = quota")
    );
    assert_eq!(
        run.get_u64("mem_info_free"),
        QUOTA - CONTEXT_RESERVE,
        "{}",
        ctx("free = quota - context reserve")
    );
    assert_eq!(run.get("roundtrip_equal"), "1", "{}", ctx("round trip"));
    assert_eq!(
        run.get_u64("oom_allocs"),
        (QUOTA - CONTEXT_RESERVE) / CHUNK,
        "{}",
        ctx("64 MiB allocations until the quota")
    );
    assert_eq!(
        run.get("oom_rc"),
        "2",
        "{}",
        ctx("CUDA_ERROR_OUT_OF_MEMORY")
    );
    assert_eq!(run.get("done"), "1");
    let stat = sim.stat();
    assert_eq!(stat.u64("devices.0.used"), 0, "left used: {stat}");
    let peak = stat.u64("groups.0.peak.0");
    assert!(
        peak <= SIMGPU_CONTEXT + QUOTA - CONTEXT_RESERVE,
        "simgpu saw {peak} bytes at peak, more than the quota allows: {stat}"
    );
}

#[test]
fn dlopen_client_is_enforced_without_preload() {
    let sim = sim("dropin-dlopen");
    let ledger = ledger("dlopen");
    let run = sim.run_cmd(dropin_command(&sim, compile(&DLOPEN), &ledger).arg("full"));
    assert!(!run.stderr.contains("ERROR: ld.so"), "{}", run.report());
    assert_enforced_full(&sim, &run);
}

#[test]
fn cuda_bindings_client_is_enforced_without_preload() {
    let sim = sim("dropin-bindings");
    let ledger = ledger("bindings");
    let mut cmd = dropin_command(&sim, venv_python(), &ledger);
    cmd.arg(client_source("bindings_client.py"));
    let run = sim.run_cmd(&mut cmd);
    assert_enforced_full(&sim, &run);
}

#[test]
fn dropin_never_loads_itself_as_the_driver() {
    let sim = sim("dropin-self");
    let ledger = ledger("self");
    for real in [
        common::dropin_dir().join("libcuda.so.1"),
        common::dropin_dir().join("libcuda.so"),
        profile_dir().join("libgpuslice_cuda.so"),
    ] {
        let mut cmd = dropin_command(&sim, compile(&DLOPEN), &ledger);
        cmd.env("GPUSLICE_REAL_LIBCUDA", &real).arg("devices");
        let run = sim.run_cmd(&mut cmd);
        assert!(run.status.success(), "{}", run.report());
        assert_eq!(
            run.get("init"),
            "3",
            "cuInit is CUDA_ERROR_NOT_INITIALIZED when the driver is the drop-in itself\n{}",
            run.report()
        );
        assert!(
            run.stderr.contains("GPUSLICE_REAL_LIBCUDA"),
            "a clear error names the variable\n{}",
            run.report()
        );
    }
    // Without the variable, the drop-in (first on the path, answering to libcuda.so.1) skips itself
    // and searches the standard locations, where this machine has no driver.
    let mut cmd = dropin_command(&sim, compile(&DLOPEN), &ledger);
    cmd.env_remove("GPUSLICE_REAL_LIBCUDA").arg("devices");
    let run = sim.run_cmd(&mut cmd);
    assert!(run.status.success(), "{}", run.report());
    assert_eq!(run.get("init"), "3", "{}", run.report());
    // Said once, however many calls the program makes, each of which fails.
    assert_eq!(
        run.stderr.matches("no real libcuda.so.1 found").count(),
        1,
        "{}",
        run.report()
    );
    // Also when the program resolves its entry points through cuGetProcAddress, as NVIDIA's
    // cuda-bindings do: each resolves, and each call answers CUDA_ERROR_NOT_INITIALIZED, which the
    // program can name (the functions are not missing: the driver is).
    let script = "from cuda.bindings import driver as d\n\
        for i, call in enumerate((lambda: d.cuInit(0), d.cuDriverGetVersion, d.cuDeviceGetCount)):\n\
        \x20   print(f'call{i}={int(call()[0])}')\n\
        err, name = d.cuGetErrorName(d.CUresult(3))\n\
        print(f'name_rc={int(err)}\\nname={name.decode()}')\n";
    let mut cmd = dropin_command(&sim, venv_python(), &ledger);
    cmd.env_remove("GPUSLICE_REAL_LIBCUDA").args(["-c", script]);
    let run = sim.run_cmd(&mut cmd);
    assert!(run.status.success(), "{}", run.report());
    for call in ["call0", "call1", "call2"] {
        assert_eq!(run.get(call), "3", "{}", run.report());
    }
    assert_eq!(run.get("name_rc"), "0", "{}", run.report());
    assert_eq!(
        run.get("name"),
        "CUDA_ERROR_NOT_INITIALIZED",
        "{}",
        run.report()
    );
    assert_eq!(
        run.stderr.matches("no real libcuda.so.1 found").count(),
        1,
        "{}",
        run.report()
    );
}

/// (base names, hooked exported symbols) of the driver table.
fn driver_table() -> (BTreeSet<String>, BTreeSet<String>) {
    let table = std::fs::read_to_string(root().join("src/api/driver_entry_points.tsv")).unwrap();
    let mut bases = BTreeSet::new();
    let mut hooked = BTreeSet::new();
    for l in table
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let f: Vec<&str> = l.split('\t').collect();
        if f[4] == "func" && f[5] == "1" && f[2] != "0" {
            bases.insert(f[1].to_owned());
        }
        if f[6] != "-" && f[6] != "call" {
            hooked.insert(f[0].to_owned());
        }
    }
    (bases, hooked)
}

#[test]
fn real_driver_answers_through_dropin_and_preload() {
    let (bases, hooked) = driver_table();
    let mut input = String::new();
    for b in &bases {
        for v in [3000, 11030, 12000, 12020, 13000] {
            for flags in [0, 2] {
                input.push_str(&format!("{b}\t{v}\t{flags}\n"));
            }
        }
    }
    let sim = sim("dropin-real");
    let client = compile(&PROCADDRESS);
    let nvidia = nvidia_driver_dir();
    let ledger = ledger("real");
    let run_with = |cmd: &mut Command| {
        // With the owner of each answer, and cuInit / cuDriverGetVersion first.
        cmd.args(["owners", "init"]);
        let child = sim.spawn(cmd);
        let run = feed(child, &input, "procaddress");
        assert!(run.status.success(), "{}", run.report());
        assert_eq!(run.get("done"), "1", "{}", run.report());
        run
    };
    let oracle = run_with(&mut sim.command_with_driver(&client, &nvidia));
    let mut through_dropin = dropin_command(&sim, &client, &ledger);
    through_dropin
        .env("LD_LIBRARY_PATH", common::dropin_dir())
        .env("GPUSLICE_REAL_LIBCUDA", nvidia.join("libcuda.so.1"));
    let mut preloaded = sim.command_with_driver(&client, &nvidia);
    preloaded
        .env("LD_PRELOAD", libgpuslice())
        .env("GPUSLICE_MEMORY_LIMIT", "1GiB")
        .env("GPUSLICE_LEDGER", &ledger);
    for (what, cmd) in [
        ("drop-in", &mut through_dropin),
        ("preload", &mut preloaded),
    ] {
        let run = run_with(cmd);
        assert_eq!(
            run.get("init"),
            "100",
            "{what}: CUDA_ERROR_NO_DEVICE\n{}",
            run.report()
        );
        assert_eq!(run.get("init"), oracle.get("init"));
        assert_eq!(run.get("version"), oracle.get("version"), "{what}");
        assert_eq!(run.get("version_rc"), oracle.get("version_rc"), "{what}");
        let lines = |r: &Run| -> Vec<String> {
            r.stdout
                .lines()
                .filter(|l| l.contains(" | v1 "))
                .map(str::to_owned)
                .collect()
        };
        let (want, got) = (lines(&oracle), lines(&run));
        assert_eq!(want.len(), got.len(), "{what}");
        let mut hooks_seen = 0;
        for (w, g) in want.iter().zip(&got) {
            // Same code, status and symbol as the real driver; the owner is gpuslice exactly for the
            // hooked versioned entry points.
            let w_parts: Vec<&str> = w.split_whitespace().collect();
            let g_parts: Vec<&str> = g.split_whitespace().collect();
            assert_eq!(w_parts.len(), g_parts.len(), "{what}:\n{w}\n{g}");
            for (i, (a, b)) in w_parts.iter().zip(&g_parts).enumerate() {
                let is_owner = matches!(*b, "gpuslice" | "driver") && i > 0;
                if !is_owner {
                    assert_eq!(a, b, "{what}: answers differ\nreal: {w}\ngot:  {g}");
                    continue;
                }
                let sym = g_parts[i - 1];
                let want_owner = if hooked.contains(sym) {
                    "gpuslice"
                } else {
                    "driver"
                };
                assert_eq!(
                    *b, want_owner,
                    "{what}: {sym} handed out by the wrong library\n{g}"
                );
                hooks_seen += usize::from(*b == "gpuslice");
            }
        }
        assert!(hooks_seen > 100, "{what}: only {hooks_seen} hooked answers");
    }
}

#[test]
fn nvml_shows_the_quota_through_the_dropin() {
    let sim = sim("dropin-nvml");
    let ledger = ledger("nvml");
    // A CUDA program holding 256 MiB through the drop-in creates the tenant's ledger.
    let mut holder = dropin_command(&sim, compile(&DLOPEN), &ledger);
    holder.args(["hold", "256", "100"]);
    let mut child = sim.spawn(&mut holder);
    wait_for_key(&mut child, "ready");
    let mut cmd = dropin_command(&sim, venv_python(), &ledger);
    cmd.arg(client_source("nvml_client.py"));
    let run = sim.run_cmd(&mut cmd);
    drop(child.stdin.take());
    let held = finish(child, "hold");
    held.assert_success();
    run.assert_success();
    assert_eq!(run.get_u64("device0_mem_total"), QUOTA, "{}", run.report());
    assert_eq!(run.get_u64("device0_mem2_total"), QUOTA, "{}", run.report());
    assert_eq!(
        run.get_u64("device0_mem_used"),
        CONTEXT_RESERVE + MODULE + 256 * MIB,
        "{}",
        run.report()
    );

    // Over NVIDIA's real NVML (no driver on this machine): the real library's own error.
    let mut cmd = sim.command_with_driver(venv_python(), &common::dropin_dir());
    cmd.env(
        "GPUSLICE_REAL_NVML",
        nvidia_driver_dir().join("libnvidia-ml.so.1"),
    )
    .env("GPUSLICE_MEMORY_LIMIT", "1GiB")
    .env("GPUSLICE_LEDGER", &ledger)
    .args([
        "-c",
        "import pynvml\ntry:\n    pynvml.nvmlInit()\n    print('init=0')\nexcept pynvml.NVMLError as e:\n    print(f'init={e.value}')\n",
    ]);
    let run = sim.run_cmd(&mut cmd);
    run.assert_success();
    assert_eq!(
        run.get("init"),
        "9",
        "NVML_ERROR_DRIVER_NOT_LOADED\n{}",
        run.report()
    );
}

#[test]
fn preload_plus_dropin_counts_once() {
    // The same quota lets exactly as much through with both as with one of them.
    let sim = sim("dropin-mixed");
    let ledger = ledger("mixed");
    let mut cmd = dropin_command(&sim, compile(&DLOPEN), &ledger);
    cmd.env("LD_PRELOAD", libgpuslice()).arg("full");
    let run = sim.run_cmd(&mut cmd);
    assert_enforced_full(&sim, &run);

    // Held memory: the ledger shows exactly what the client holds (context + 256 MiB), once.
    let ledger = self::ledger("mixed-hold");
    let mut holder = dropin_command(&sim, compile(&DLOPEN), &ledger);
    holder
        .env("LD_PRELOAD", libgpuslice())
        .args(["hold", "256", "100"]);
    let mut child = sim.spawn(&mut holder);
    wait_for_key(&mut child, "ready");
    let status = sim
        .command(common::gpuslice_bin())
        .args(["status", "--json", "--ledger"])
        .arg(&ledger)
        .output()
        .unwrap();
    let stat = sim.stat();
    drop(child.stdin.take());
    finish(child, "hold").assert_success();
    assert!(status.status.success());
    let json = parse_json(&String::from_utf8_lossy(&status.stdout)).unwrap();
    assert_eq!(
        json.u64("memory.devices.0.used"),
        CONTEXT_RESERVE + MODULE + 256 * MIB,
        "ledger: {json}"
    );
    assert_eq!(
        stat.u64("devices.0.used"),
        SIMGPU_CONTEXT + MODULE + 256 * MIB,
        "simgpu: {stat}"
    );
}
