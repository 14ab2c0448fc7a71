//! Tenants created by the node (`gpuslice tenant ...`) on simgpu, their programs run as other uids in
//! their own mount and PID namespaces with the CDI spec's mounts and groups. The judges are the
//! programs' own results (allocated bytes, driver errors) and simgpu's busy counters.

mod support;

use std::path::Path;
use support::*;

fn workload(scene: &Scene, tenant: &str, uid: u32, args: &[&str]) -> std::process::Command {
    scene.in_container(tenant, uid, &workload_bin(), args)
}

#[test]
fn two_uids_share_a_gpu_under_node_policies() {
    let scene = Scene::new("uids", &[("SIMGPU_MEMORY", "16GiB")]);
    scene
        .gpuslice(&[
            "tenant", "create", "t1", "--memory", "3GiB", "--share", "30",
        ])
        .assert_success();
    scene
        .gpuslice(&[
            "tenant", "create", "t2", "--memory", "5GiB", "--share", "70",
        ])
        .assert_success();

    // Both quotas hold for programs of other uids; the program sees its quota as the GPU's size.
    // Its context is charged what the driver spent on it, measured from inside its PID namespace.
    for (tenant, uid, quota) in [("t1", 1001, 3 * GIB), ("t2", 1002, 5 * GIB)] {
        let r = run(&mut workload(&scene, tenant, uid, &["--chunk", "2"]));
        r.assert_success();
        assert_eq!(r.get_u64("total"), quota, "{}", r.report());
        assert_context_charged_as_spent(&r, quota);
        assert_eq!(
            r.get("outcome"),
            "CUDA_ERROR_OUT_OF_MEMORY",
            "{}",
            r.report()
        );
    }

    // `gpuslice doctor` in the container reports the node's policy and active enforcement.
    let r = run(&mut scene.in_container("t1", 1001, &gpuslice_bin(), &["doctor"]));
    assert!(
        r.status.success()
            && r.stdout
                .contains("node policy: /run/gpuslice/tenant/policy.toml")
            && r.stdout.contains("enforcement: ACTIVE"),
        "{}",
        r.report()
    );

    // The environment cannot raise the quota, name another ledger or policy, or escape the device
    // ledgers; each ignored setting gets a warning (default log level). It can lower the quota.
    let mut cmd = workload(&scene, "t1", 1001, &["--chunk", "2"]);
    let elsewhere = scene.dir.join("elsewhere");
    cmd.env("GPUSLICE_MEMORY_LIMIT", "100GiB")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "100g")
        .env("GPUSLICE_TENANT", "free")
        .env("GPUSLICE_LEDGER", elsewhere.join("free.ledger"))
        .env("GPUSLICE_DEVICE_DIR", &elsewhere)
        .env("GPUSLICE_POLICY", elsewhere.join("policy.toml"))
        .env("GPUSLICE_CONTEXT_RESERVE", "0");
    let r = run(&mut cmd);
    r.assert_success();
    assert_context_charged_as_spent(&r, 3 * GIB);
    assert!(
        r.stderr.contains(
            "GPUSLICE_TENANT, GPUSLICE_LEDGER, GPUSLICE_LEDGER_DIR, GPUSLICE_DEVICE_DIR ignored"
        ) && r.stderr.contains("memory limit 100 GiB ignored")
            && r.stderr
                .contains("GPUSLICE_CONTEXT_RESERVE below the default ignored"),
        "{}",
        r.report()
    );
    assert!(!elsewhere.exists(), "nothing may be created elsewhere");
    let mut cmd = workload(&scene, "t1", 1001, &["--chunk", "2"]);
    cmd.env("GPUSLICE_MEMORY_LIMIT", "1GiB");
    let r = run(&mut cmd);
    assert_context_charged_as_spent(&r, GIB);

    // `gpuslice set` by the tenant is refused with a clear message and changes nothing.
    let r =
        run(&mut scene.in_container("t1", 1001, &gpuslice_bin(), &["set", "--memory", "100GiB"]));
    r.assert_failure();
    assert!(
        r.stderr.contains("created by the node") && r.stderr.contains("only root"),
        "{}",
        r.report()
    );

    // Every file the tenant can open for writing: its ledger and the device ledgers, nothing else;
    // the other tenant's ledger cannot even be read.
    let t2_ledger = scene.state.join("tenants/t2/t2.ledger");
    let probe = format!(
        "for f in $(find /run/gpuslice '{state}' -type f 2>/dev/null | sort); do \
           if (exec 3>>\"$f\") 2>/dev/null; then echo \"writable=$f\"; fi; done; \
         if cat '{t2}' >/dev/null 2>&1; then echo read_t2=yes; else echo read_t2=no; fi",
        state = scene.state.display(),
        t2 = t2_ledger.display()
    );
    let r = run(&mut scene.in_container("t1", 1001, Path::new("/bin/sh"), &["-c", &probe]));
    r.assert_success();
    let writable: Vec<&str> = r
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("writable="))
        .collect();
    assert!(!writable.is_empty(), "{}", r.report());
    for f in &writable {
        assert!(
            f.ends_with("/t1.ledger") || f.ends_with(".dev"),
            "the tenant can write {f}: {}",
            r.report()
        );
        assert!(!f.contains("/t2/"), "{}", r.report());
    }
    assert!(r.stdout.contains("read_t2=no"), "{}", r.report());

    // Writing its ledger's limit field (which it can) does not raise what it may allocate: the
    // policy bounds it. (Done here through the library's own API, which is what such a write is.)
    let t1_ledger = scene.state.join("tenants/t1/t1.ledger");
    {
        let l = gpuslice::ledger::Ledger::open_existing(&t1_ledger).unwrap();
        for d in l.snapshot().devices {
            l.set_limit(d.index, gpuslice::ledger::UNLIMITED).unwrap();
        }
    }
    let r = run(&mut workload(&scene, "t1", 1001, &["--chunk", "2"]));
    assert_eq!(r.get_u64("total"), 3 * GIB, "{}", r.report());
    assert_context_charged_as_spent(&r, 3 * GIB);
    let policy = std::fs::read_to_string(scene.state.join("tenants/t1/policy.toml")).unwrap();
    assert!(policy.contains("memory = 3221225472"), "{policy}");

    // Compute: both keep the GPU busy at once; simgpu's counters show the 70% tenant clearly ahead
    // (the precise split is a benchmark figure: docs/BENCHMARKS.md).
    let (b1, b2) = (scene.busy("t1"), scene.busy("t2"));
    // The library's compute client: 2 ms kernels, 8 queued, for 6 s from a common start.
    let client = compute_client(&scene.dir);
    let start = start_in(1500).to_string();
    let spin = ["spin", start.as_str(), "6000", "2000"];
    let mut a = scene.in_container("t1", 1001, &client, &spin);
    let mut b = scene.in_container("t2", 1002, &client, &spin);
    let (ca, cb) = (
        a.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
        b.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let ra = Run::new("t1 spin".into(), ca.wait_with_output().unwrap());
    let rb = Run::new("t2 spin".into(), cb.wait_with_output().unwrap());
    ra.assert_success();
    rb.assert_success();
    let (d1, d2) = (scene.busy("t1") - b1, scene.busy("t2") - b2);
    let t2_percent = d2 as f64 * 100.0 / (d1 + d2).max(1) as f64;
    println!("node-compute: t1 (share 30, uid 1001) {d1} ns, t2 (share 70, uid 1002) {d2} ns: t2 got {t2_percent:.1}%");
    assert!(
        (55.0..=85.0).contains(&t2_percent),
        "t2 (share 70) got {t2_percent:.1}% of the busy time\n{}\n{}",
        ra.report(),
        rb.report()
    );

    // Root on the node can change a node tenant: the policy follows, and so do new processes.
    let state = scene.state.display().to_string();
    scene
        .gpuslice(&[
            "set",
            "--tenant",
            "t2",
            "--state-dir",
            &state,
            "--memory",
            "6GiB",
        ])
        .assert_success();
    let policy = std::fs::read_to_string(scene.state.join("tenants/t2/policy.toml")).unwrap();
    assert!(
        policy.contains(&format!("memory = {}", 6 * GIB)),
        "{policy}"
    );
    let r = run(&mut workload(&scene, "t2", 1002, &["--chunk", "2"]));
    assert_context_charged_as_spent(&r, 6 * GIB);
    let r = scene.gpuslice(&["status", "--tenant", "t2", "--state-dir", &state, "--json"]);
    r.assert_success();
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc["memory"]["tenant"], "t2", "{}", r.stdout);
    assert!(doc["compute"]
        .as_array()
        .unwrap()
        .iter()
        .any(|row| row["tenant"] == "t2" && row["share"] == 70));

    // Delete: refused while a process of the tenant lives, done once it is gone.
    let mut holder = workload(
        &scene,
        "t1",
        1001,
        &["--chunk", "256", "--max", "256", "--hold-ms", "4000"],
    );
    let child = holder
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The holder has its ledger slot once it printed its first line.
    let mut out = child;
    {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(out.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("total="), "{line}");
    }
    let r = scene.gpuslice(&["tenant", "delete", "t1"]);
    r.assert_failure();
    assert!(r.stderr.contains("live process"), "{}", r.report());
    assert!(out.wait().unwrap().success());
    scene.gpuslice(&["tenant", "delete", "t1"]).assert_success();
    assert!(!scene.state.join("tenants/t1").exists());
    assert!(!scene.cdi.join("gpuslice.io-tenant-t1.json").exists());
    let r = scene.gpuslice(&["tenant", "list", "--json"]);
    r.assert_success();
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let names: Vec<&str> = doc["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["t2"], "{}", r.stdout);
}
