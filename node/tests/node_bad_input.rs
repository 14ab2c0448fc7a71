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
    .arg(scene.reachable_program(&gpuslice_bin()))
    .args(["tenant", "create", "t9", "--memory", "1GiB", "--state-dir"])
    .arg(&scene.state);
    let r = run(&mut cmd);
    r.assert_failure();
    assert!(r.stderr.contains("must be run as root"), "{}", r.report());
}

/// A state directory on a full, then a read-only, filesystem (private tmpfs mounts in a mount
/// namespace of their own), each at several stages of `tenant create`: a clear error naming the
/// path, and the filesystem afterwards as before (but for the node's empty skeleton: `<state>`,
/// `tenants/` and `devices/`, which holds no tenant).
#[test]
fn full_or_read_only_state_directory() {
    let scene = Scene::new("fs", &[("SIMGPU_MEMORY", "16GiB")]);
    // Make simgpu's state first (as root, outside the small filesystem).
    scene.gpuslice(&["tenant", "list"]).assert_success();
    let mnt = scene.dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    // Room for the tenant's policy (a page) and its ledger, and one page more: not for the device
    // ledger (5 pages). Taken from the ledger's layout, which grows with it.
    let ledger_pages = std::mem::size_of::<gpuslice_state::ledger::Layout>().div_ceil(4096);
    let device_case_kib = (ledger_pages + 2) * 4;
    // `case NAME`: what the tmpfs holds before and after one `tenant create`, and its exit status.
    let script = format!(
        "set -u\n\
         m='{m}'\n\
         create() {{ \"$GPUSLICE\" tenant create \"$1\" --memory 1GiB --state-dir \"$2\" --cdi-dir \"$3\" --library \"$LIBRARY\"; }}\n\
         listing() {{ find \"$m\" -mindepth 1 \\( -path \"$m/state\" -o -path \"$m/state/tenants\" \
                      -o -path \"$m/state/devices\" -o -path \"$m/state/.node.lock\" \\) -o \\( -type d -printf '%p|' \\) -o -printf '%p %s|' ; }}\n\
         case_() {{ name=$1; shift; before=$(listing); \"$@\"; echo \"${{name}}_rc=$?\"; \
                    [ \"$before\" = \"$(listing)\" ] && echo \"${{name}}_unchanged=yes\" || echo \"${{name}}_unchanged=no: $before => $(listing)\"; }}\n\
         # 1. Too small for anything but the first files.\n\
         mount -t tmpfs -o size=48k gpuslice-full \"$m\"\n\
         case_ tiny create t1 \"$m/state\" \"$m/cdi\"\n\
         umount \"$m\"\n\
         # 2. Room for the tenant's policy and ledger, not the device ledger.\n\
         mount -t tmpfs -o size={device_case_kib}k gpuslice-full \"$m\"\n\
         case_ device create t1 \"$m/state\" \"$m/cdi\"\n\
         umount \"$m\"\n\
         # 3. The state is fine, the CDI directory is full: the published tenant is taken back.\n\
         mount -t tmpfs -o size=4k,mode=0755 gpuslice-full \"$m\"\n\
         head -c 4096 /dev/zero > \"$m/filler\"\n\
         case_ cdi create t1 \"$STATE\" \"$m\"\n\
         umount \"$m\"\n\
         # 4. Read-only, empty.\n\
         mount -t tmpfs -o size=16m gpuslice-ro \"$m\"\n\
         mkdir -p \"$m/state\"\n\
         mount -o remount,ro \"$m\"\n\
         case_ ro create t1 \"$m/state\" \"$m/cdi\"\n\
         umount \"$m\"\n\
         # 5. Read-only, holding a tenant already.\n\
         mount -t tmpfs -o size=16m gpuslice-ro \"$m\"\n\
         create t0 \"$m/state\" \"$m/cdi\" >/dev/null && echo t0_created=yes\n\
         mount -o remount,ro \"$m\"\n\
         case_ rotenant create t1 \"$m/state\" \"$m/cdi\"\n\
         umount \"$m\"\n",
        m = mnt.display(),
    );
    let mut cmd = scene.command("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env("GPUSLICE", gpuslice_bin())
        .env("LIBRARY", library())
        .env("STATE", &scene.state);
    let r = run(&mut cmd);
    r.assert_success();
    let lines: Vec<&str> = r.stderr.lines().collect();
    // Each failing create prints one `gpuslice: ...` line, in the order of the cases.
    let errors: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("gpuslice: "))
        .collect();
    assert_eq!(errors.len(), 5, "{}", r.report());
    let m = mnt.display().to_string();
    let expect: [(&str, &str, &[&str]); 5] = [
        (
            "tiny",
            "no space left",
            &["tenant \"t1\" not created", "/state/tenants/"],
        ),
        (
            "device",
            "no space left",
            &["tenant \"t1\" not created", "/state/devices/GPU-"],
        ),
        (
            "cdi",
            "No space left on device",
            &["tenant \"t1\" not created", &m],
        ),
        (
            "ro",
            "Read-only file system",
            &[&format!("{m}/state/tenants")],
        ),
        ("rotenant", "Read-only file system", &[&m]),
    ];
    for (i, (case, why, names)) in expect.iter().enumerate() {
        assert_eq!(r.get(&format!("{case}_rc")), "2", "{case}: {}", r.report());
        assert_eq!(
            r.get(&format!("{case}_unchanged")),
            "yes",
            "{case}: {}",
            r.report()
        );
        // Nothing here but the scene's own directory is in /dev/shm: a hint pointing there
        // would send the reader astray.
        let hints = errors[i].replace(&scene.dir.display().to_string(), "<scene>");
        assert!(
            errors[i].contains(why)
                && names.iter().all(|n| errors[i].contains(n))
                && !hints.contains("/dev/shm"),
            "{case}: want {why:?} and {names:?} in {:?}",
            errors[i]
        );
    }
    assert_eq!(r.get("t0_created"), "yes", "{}", r.report());
    // The full CDI directory's case: nothing of t1 in the (roomy) state directory either.
    assert!(!scene.state.join("tenants/t1").exists());
    assert_eq!(device_tenants(&scene), Vec::<String>::new());
}
