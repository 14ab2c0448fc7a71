//! `gpuslice tenant create` on bad input: a clear error naming the value, and no half-created tenant
//! (no directory, no temporary left, no device-ledger entry, no CDI spec).

mod support;

use support::*;

fn leftovers(scene: &Scene) -> Vec<String> {
    let mut out = Vec::new();
    for dir in [scene.state.join("tenants"), scene.cdi.clone()] {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            out.extend(
                entries
                    .filter_map(|e| e.ok())
                    .map(|e| e.path().display().to_string()),
            );
        }
    }
    out.sort();
    out
}

/// Tenant names in the device ledgers, as `gpuslice status --json` shows them.
fn device_tenants(scene: &Scene) -> Vec<String> {
    let r = run(scene
        .command(gpuslice_bin())
        .args(["status", "--json"])
        .env("GPUSLICE_DEVICE_DIR", scene.state.join("devices"))
        .env("GPUSLICE_LEDGER_DIR", scene.dir.join("none")));
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap_or_default();
    let mut names: Vec<String> = doc["compute"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|row| row["tenant"].as_str().map(String::from))
        .collect();
    names.sort();
    names
}

#[test]
fn bad_input_leaves_nothing_behind() {
    let scene = Scene::new(
        "bad",
        &[("SIMGPU_DEVICES", "2"), ("SIMGPU_MEMORY", "16GiB")],
    );
    scene
        .gpuslice(&["tenant", "create", "ok", "--memory", "1GiB"])
        .assert_success();
    let before = leftovers(&scene);

    let cases: [(&[&str], &str); 8] = [
        (&["--memory", "1GiB", "--gpu", "7"], "--gpu 7: no such GPU"),
        (
            &[
                "--memory",
                "1GiB",
                "--gpu",
                "GPU-00000000-0000-0000-0000-000000000000",
            ],
            "no such GPU",
        ),
        (&["--memory", "17GiB"], "larger than GPU"),
        (&["--memory", "4 GB"], "--memory \"4 GB\""),
        (&["--memory", "1GiB", "--share", "0"], "--share 0"),
        (&["--memory", "1GiB", "--limit", "101"], "--limit 101"),
        (
            &["--memory", "1GiB", "--priority", "urgent"],
            "--priority \"urgent\"",
        ),
        (&["--memory", "0"], "--memory 0"),
    ];
    for (args, message) in cases {
        let mut all = vec!["tenant", "create", "t9"];
        all.extend_from_slice(args);
        let r = scene.gpuslice(&all);
        r.assert_failure();
        assert!(
            r.stderr.contains(message),
            "want {message:?}: {}",
            r.report()
        );
        assert_eq!(leftovers(&scene), before, "{}", r.report());
    }
    let r = scene.gpuslice(&["tenant", "create", "ok", "--memory", "2GiB"]);
    r.assert_failure();
    assert!(r.stderr.contains("already exists"), "{}", r.report());
    // A library that is not installed: the spec would not start a container.
    let r = run(scene
        .command(gpuslice_bin())
        .args(["tenant", "create", "t9", "--memory", "1GiB", "--state-dir"])
        .arg(&scene.state)
        .arg("--cdi-dir")
        .arg(&scene.cdi)
        .args(["--library", "/nonexistent/libgpuslice.so"]));
    r.assert_failure();
    assert!(
        r.stderr
            .contains("/nonexistent/libgpuslice.so does not exist"),
        "{}",
        r.report()
    );
    assert_eq!(leftovers(&scene), before, "{}", r.report());
    assert_eq!(device_tenants(&scene), vec!["ok", "ok"]);
    let r = scene.gpuslice(&["tenant", "create", "../x", "--memory", "1GiB"]);
    r.assert_failure();
    assert!(r.stderr.contains("tenant name \"../x\""), "{}", r.report());
    assert_eq!(leftovers(&scene), before);
    assert_eq!(device_tenants(&scene), vec!["ok", "ok"]);

    // Not root.
    let mut cmd = scene.command("setpriv");
    cmd.args([
        "--reuid=1001",
        "--regid=1001",
        "--clear-groups",
        "--inh-caps=-all",
    ])
    .arg(gpuslice_bin())
    .args(["tenant", "create", "t9", "--memory", "1GiB", "--state-dir"])
    .arg(&scene.state);
    let r = run(&mut cmd);
    r.assert_failure();
    assert!(r.stderr.contains("must be run as root"), "{}", r.report());
}

/// A state directory on a full, then a read-only, filesystem (private tmpfs mounts in a mount
/// namespace of their own).
#[test]
fn full_or_read_only_state_directory() {
    let scene = Scene::new("fs", &[("SIMGPU_MEMORY", "16GiB")]);
    // Make simgpu's state first (as root, outside the small filesystem).
    scene.gpuslice(&["tenant", "list"]).assert_success();
    let mnt = scene.dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let script = format!(
        "set -u\n\
         mount -t tmpfs -o size=48k gpuslice-full '{m}'\n\
         \"$0\" tenant create t1 --memory 1GiB --state-dir '{m}/state' --cdi-dir '{m}/cdi' --library \"$1\"\n\
         echo full_rc=$?\n\
         ls -A '{m}/state/tenants' | sed 's/^/full_left=/'\n\
         umount '{m}'\n\
         mount -t tmpfs -o size=16m gpuslice-ro '{m}'\n\
         mkdir -p '{m}/state'\n\
         mount -o remount,ro '{m}'\n\
         \"$0\" tenant create t1 --memory 1GiB --state-dir '{m}/state' --cdi-dir '{m}/cdi' --library \"$1\"\n\
         echo ro_rc=$?\n\
         ls -A '{m}/state' | sed 's/^/ro_left=/'\n",
        m = mnt.display()
    );
    let mut cmd = scene.command("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .arg(gpuslice_bin())
        .arg(library());
    let r = run(&mut cmd);
    r.assert_success();
    assert_eq!(r.get("full_rc"), "2", "{}", r.report());
    assert!(
        r.stderr.to_lowercase().contains("no space left") && r.stderr.contains("not created"),
        "{}",
        r.report()
    );
    assert!(!r.stdout.contains("full_left="), "{}", r.report());
    assert_eq!(r.get("ro_rc"), "2", "{}", r.report());
    assert!(r.stderr.contains("Read-only file system"), "{}", r.report());
    assert!(!r.stdout.contains("ro_left="), "{}", r.report());
}
