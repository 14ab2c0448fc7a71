//! Every view of memory agrees with the charge: cuMemGetInfo, cuDeviceTotalMem and NVML's memory
//! info after each step, and NVML shows a tenant its quota and its own processes only, also on an
//! overcommitted card. Judged by simgpu's own counters through tests/clients/quota_overhead.c and
//! NVIDIA's nvidia-ml-py, in preload, drop-in and mixed deployments.

use gpuslice_testkit as common;

use common::memory::*;
use common::*;

/// Every view agrees with the others and with the charge after each step, and the charge moves by
/// what simgpu spends at each step; another tenant's process and usage are never shown.
fn views_agree(deploy: Deploy) {
    let dir = scratch("views");
    let sim = sim("overhead-views");
    // A neighbour tenant holding memory on the same GPU.
    let mut neighbour = sim.spawn(&mut client(&sim, deploy, &dir, "other", &["hold"]));
    wait_for_key(&mut neighbour, "ready");
    let run = sim.run_cmd(&mut client(
        &sim,
        deploy,
        &dir,
        "views",
        &["steps", "10", "64", "2048"],
    ));
    finish(neighbour, "neighbour").assert_success();
    run.assert_success();
    let kv = run.kv();
    let report = run.report();
    let mut used_before = 0;
    // What each step costs the device by simgpu's model (signed).
    let stack = (2048 - 1024) * THREADS as i64;
    let costs: [i64; 10] = [
        SIM_CONTEXT as i64,
        256 * MIB as i64,
        10 * MIB as i64,
        56 * MIB as i64,
        stack,
        -256 * MIB as i64,
        -10 * MIB as i64,
        -56 * MIB as i64,
        -stack,
        0,
    ];
    for (i, cost) in costs.iter().enumerate() {
        let s = format!("s{i}");
        let total = step(&kv, &s, "total");
        let free = step(&kv, &s, "free");
        let used = step(&kv, &s, "nvml_used");
        assert_eq!(total, QUOTA, "{deploy:?} {s}: cuMemGetInfo total\n{report}");
        assert_eq!(
            step(&kv, &s, "device_total"),
            QUOTA,
            "{s}: cuDeviceTotalMem\n{report}"
        );
        assert_eq!(
            step(&kv, &s, "nvml_total"),
            QUOTA,
            "{s}: NVML total\n{report}"
        );
        // The legacy 32-bit entry points show the same (a 1 GiB quota fits in 32 bits).
        for (legacy, current) in [
            ("free_v1", free),
            ("total_v1", QUOTA),
            ("device_total_v1", QUOTA),
        ] {
            assert_eq!(
                step(&kv, &s, legacy),
                current,
                "{deploy:?} {s}: {legacy}\n{report}"
            );
        }
        assert_eq!(
            free + used,
            total,
            "{deploy:?} {s}: free + used = total\n{report}"
        );
        assert_eq!(step(&kv, &s, "nvml_free"), free, "{s}: NVML free\n{report}");
        assert_eq!(
            step(&kv, &s, "nvml2_total"),
            QUOTA,
            "{s}: NVML v2 total\n{report}"
        );
        assert_eq!(
            step(&kv, &s, "nvml2_used"),
            used,
            "{s}: NVML v2 used\n{report}"
        );
        assert_eq!(
            step(&kv, &s, "nvml2_free"),
            free,
            "{s}: NVML v2 free\n{report}"
        );
        assert_eq!(
            step(&kv, &s, "nvml2_reserved"),
            0,
            "{s}: NVML v2 reserved\n{report}"
        );
        for list in ["procs1", "procs2", "procs3"] {
            assert_eq!(
                step(&kv, &s, &format!("{list}_rc")),
                0,
                "{s} {list}\n{report}"
            );
            assert_eq!(
                step(&kv, &s, &format!("{list}_count")),
                1,
                "{deploy:?} {s}: {list} shows the tenant's one process, not its neighbour\n{report}"
            );
            assert_eq!(
                step(&kv, &s, &format!("{list}_mine")),
                used,
                "{s} {list}\n{report}"
            );
        }
        if i < 9 {
            let moved = used as i64 - used_before as i64;
            assert!(
                moved.abs_diff(*cost) <= GRANULE,
                "{deploy:?} {s}: the charge moved by {moved}, simgpu spent {cost}\n{report}"
            );
        }
        used_before = used;
    }
    assert_eq!(
        step(&kv, "s9", "free"),
        0,
        "{deploy:?}: filled to the quota\n{report}"
    );
    assert!(
        group_peak_on(&sim.stat(), "views", 0) <= QUOTA,
        "{deploy:?}\n{report}"
    );
}

in_every_deployment!(
    views_agree:
    views_agree_preloaded,
    views_agree_dropin,
    views_agree_mixed
);

/// NVML's per-process views show the tenant's own processes only: two tenants run kernels on one
/// GPU; each one's NVML lists (compute processes, process utilisation) name its process, never the
/// other's, which the driver's own answer (no shim) does list.
#[test]
fn nvml_process_views_show_only_the_tenants_processes() {
    let dir = scratch("nvml-procs");
    let sim = sim("overhead-nvml-procs");
    let (holders, pids) = holders_of_a_and_b(&sim, Deploy::Preload, &dir);
    // Each holder ran a kernel before printing its pid: samples since time 0 include both.
    let script = "import pynvml as nv\nnv.nvmlInit()\nh = nv.nvmlDeviceGetHandleByIndex(0)\n\
        print('procs=' + ','.join(str(p.pid) for p in nv.nvmlDeviceGetComputeRunningProcesses(h)))\n\
        try:\n    samples = nv.nvmlDeviceGetProcessUtilization(h, 0)\nexcept nv.NVMLError:\n    samples = []\n\
        print('util=' + ','.join(str(s.pid) for s in samples))\n";
    let view = |tenant: Option<&str>| {
        let args = ["-c", script];
        let mut py = match tenant {
            Some(t) => tenant_command(venv_python(), &sim, Deploy::Preload, &dir, t, &args),
            None => {
                let mut cmd = sim.command(venv_python());
                cmd.args(args);
                cmd
            }
        };
        let run = sim.run_cmd(&mut py);
        run.assert_success();
        let list = |k: &str| -> Vec<String> {
            run.get(k)
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        };
        (list("procs"), list("util"), run.report())
    };
    let (procs, util, report) = view(None);
    for pid in &pids {
        assert!(procs.contains(pid), "the driver lists {pid}\n{report}");
        assert!(util.contains(pid), "the driver samples {pid}\n{report}");
    }
    for (i, tenant) in ["a", "b"].iter().enumerate() {
        let (procs, util, report) = view(Some(tenant));
        assert_eq!(
            procs,
            [pids[i].clone()],
            "tenant {tenant}'s process list\n{report}"
        );
        assert_eq!(
            util,
            [pids[i].clone()],
            "tenant {tenant}'s utilisation samples\n{report}"
        );
    }
    for h in holders {
        finish(h, "holder").assert_success();
    }
}

/// NVML shows a tenant its quota and its own processes only, also before any of its processes has
/// charged anything (a monitoring tool started first: no ledger yet), and even the number of
/// utilisation samples it is told to make room for counts its own processes only.
fn nvml_never_shows_another_tenant(deploy: Deploy) {
    let dir = scratch("nvml-fresh");
    let sim = sim("overhead-nvml-fresh");
    // A neighbour tenant on the GPU with memory and a kernel run (a utilisation sample).
    let mut neighbour = sim.spawn(&mut client_of(
        &LINKED_CU12,
        &sim,
        deploy,
        &dir,
        "neighbour",
        &["hold", "64", "500"],
    ));
    wait_for_key(&mut neighbour, "pid");
    let ledger = dir.join("fresh.ledger");
    let fresh = nvml_view(&sim, deploy, &dir, "fresh");
    let report = fresh.report();
    for (key, want) in [
        ("total", QUOTA),
        ("used", 0),
        ("free", QUOTA),
        ("total2", QUOTA),
        ("reserved2", 0),
        ("used2", 0),
        ("free2", QUOTA),
    ] {
        assert_eq!(
            fresh.get_u64(key),
            want,
            "{deploy:?}: {key} of a tenant with nothing charged\n{report}"
        );
    }
    assert_eq!(fresh.get("procs"), "", "{deploy:?}: process list\n{report}");
    assert_eq!(fresh.get("util"), "", "{deploy:?}: samples\n{report}");
    assert_eq!(fresh.get("utilinfo"), "", "{deploy:?}: samples\n{report}");
    // NVML_ERROR_NOT_FOUND: no sample of the tenant's processes, as a driver with none answers.
    for query in ["util_query", "utilinfo_query"] {
        assert_eq!(
            (
                fresh.get_u64(&format!("{query}_rc")),
                fresh.get_u64(&format!("{query}_count"))
            ),
            (6, 0),
            "{deploy:?}: the sample count ({query})\n{report}"
        );
    }
    // Accounting mode and confidential computing are off (the driver's default): the driver's
    // NVML_ERROR_NOT_SUPPORTED stands.
    for key in ["acct_rc", "stats_rc", "cc_rc"] {
        assert_eq!(fresh.get_u64(key), 3, "{deploy:?}: {key}\n{report}");
    }
    assert!(
        !ledger.exists(),
        "{deploy:?}: asking NVML created the tenant's ledger"
    );

    // A tenant with a process of its own is told of exactly one sample.
    let mut mine = sim.spawn(&mut client_of(
        &LINKED_CU12,
        &sim,
        deploy,
        &dir,
        "mine",
        &["hold", "64", "500"],
    ));
    let my_pid = wait_for_key(&mut mine, "pid")["pid"].clone();
    let view = nvml_view(&sim, deploy, &dir, "mine");
    let report = view.report();
    for query in ["util_query", "utilinfo_query"] {
        assert_eq!(
            (
                view.get_u64(&format!("{query}_rc")),
                view.get_u64(&format!("{query}_count"))
            ),
            (7, 1),
            "{deploy:?}: the count query ({query}: NVML_ERROR_INSUFFICIENT_SIZE, room for one sample)\n{report}"
        );
    }
    assert_eq!(view.get("util"), my_pid, "{deploy:?}: samples\n{report}");
    assert_eq!(
        view.get("utilinfo"),
        my_pid,
        "{deploy:?}: samples\n{report}"
    );
    let procs = view.get("procs");
    assert!(
        procs.starts_with(&format!("{my_pid}:")) && !procs.contains(','),
        "{deploy:?}: process list\n{report}"
    );
    finish(mine, "mine").assert_success();
    finish(neighbour, "neighbour").assert_success();
}

in_every_deployment!(
    nvml_never_shows_another_tenant:
    nvml_never_shows_another_tenant_preloaded,
    nvml_never_shows_another_tenant_dropin,
    nvml_never_shows_another_tenant_mixed
);

/// A card fuller than the quotas promise (a neighbour holds more than the rest of the card leaves
/// the tenant's quota): NVML shows the tenant only what it can get as free, and what the card holds
/// back as `_v2`'s reserved and, as NVIDIA documents for the v1 struct, inside v1's used: total =
/// used + free (v1) = reserved + used + free (v2).
#[test]
fn nvml_views_of_an_overcommitted_card_add_up() {
    let dir = scratch("nvml-overcommit");
    let sim = Sim::new("overhead-nvml-overcommit").env("SIMGPU_MEMORY", "2GiB");
    let mut cmd = client_of(
        &LINKED_CU12,
        &sim,
        Deploy::Preload,
        &dir,
        "neighbour",
        &["hold", "1200", "500"],
    );
    let mut neighbour = sim.spawn(cmd.env("GPUSLICE_MEMORY_LIMIT", "2GiB"));
    let pid = wait_for_key(&mut neighbour, "pid")["pid"].clone();
    let card_free = 2 * GIB - process_used_on(&sim.stat(), &pid, 0);
    assert!(card_free < QUOTA, "the card has {card_free} free");
    for deploy in [Deploy::Preload, Deploy::Dropin, Deploy::Mixed] {
        let view = nvml_view(&sim, deploy, &dir, "views");
        let report = view.report();
        let reserved = QUOTA - card_free;
        for (key, want) in [
            ("total", QUOTA),
            ("free", card_free),
            ("used", reserved),
            ("total2", QUOTA),
            ("reserved2", reserved),
            ("used2", 0),
            ("free2", card_free),
        ] {
            assert_eq!(view.get_u64(key), want, "{deploy:?}: {key}\n{report}");
        }
    }
    finish(neighbour, "neighbour").assert_success();
}
