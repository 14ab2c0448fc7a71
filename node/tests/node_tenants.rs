//! Tenants created by the node (`gpuslice tenant ...`) on simgpu, their programs run as other uids in
//! their own mount and PID namespaces with the CDI spec's mounts and groups. The judges are the
//! programs' own results (allocated bytes, driver errors) and simgpu's busy counters.

mod support;

use std::io::Write;
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

    // Every file the tenant can open for writing: its ledger, the device ledgers and their per-tenant
    // counters, nothing else;
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
            f.ends_with("/t1.ledger") || f.ends_with(".dev") || f.ends_with(".tally"),
            "the tenant can write {f}: {}",
            r.report()
        );
        assert!(!f.contains("/t2/"), "{}", r.report());
    }
    assert!(r.stdout.contains("read_t2=no"), "{}", r.report());

    // Writing its ledger's limit field (which it can) does not raise what it may allocate: the
    // policy bounds it. (Done here through the library's own API, which is what such a write is.)
    let t1_ledger = scene.state.join("tenants/t1/t1.ledger");
    let denied = |ledger: &Path| -> u64 {
        let l = gpuslice_state::ledger::Ledger::open_readonly(ledger).unwrap();
        l.snapshot().devices.iter().map(|d| d.denied).sum()
    };
    {
        let l = gpuslice_state::ledger::Ledger::open_existing(&t1_ledger).unwrap();
        for d in l.snapshot().devices {
            l.set_limit(d.index, gpuslice_state::ledger::UNLIMITED)
                .unwrap();
        }
    }
    let denied_before = denied(&t1_ledger);
    let r = run(&mut workload(&scene, "t1", 1001, &["--chunk", "2"]));
    assert_eq!(r.get_u64("total"), 3 * GIB, "{}", r.report());
    // The refusal at the policy's ceiling counts as denied, as one at the ledger's limit does.
    assert!(denied(&t1_ledger) > denied_before, "{}", r.report());
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
    // Without --tenant: every node tenant with the exporter's figures, and each tenant's own
    // hand-overs (counted through the per-tenant counters' file the spec mounts beside the ledger).
    let r = scene.gpuslice(&["status", "--state-dir", &state, "--json"]);
    r.assert_success();
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let node = doc["node_tenants"].as_array().expect(&r.stdout);
    for t in ["t1", "t2"] {
        assert!(node.iter().any(|n| n["tenant"] == t), "{t}: {}", r.stdout);
    }
    let t2 = node.iter().find(|n| n["tenant"] == "t2").unwrap();
    assert_eq!(t2["devices"][0]["limit"], 6 * GIB, "{}", r.stdout);
    // Its workload above exited: what it still holds is shown as exited (part of `used`).
    let (used, exited) = (
        t2["devices"][0]["used"].as_u64(),
        t2["devices"][0]["exited"].as_u64(),
    );
    assert!(exited.is_some() && exited <= used, "{}", r.stdout);
    assert_eq!(t2["processes"], 0, "{}", r.stdout);
    for t in ["t1", "t2"] {
        let row = doc["compute"]
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row["tenant"] == t)
            .unwrap_or_else(|| panic!("{t}: {}", r.stdout));
        assert!(
            row["handovers"].as_u64().is_some_and(|n| n > 0),
            "{t} spun beside the other: {}",
            r.stdout
        );
    }

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

/// Whether another process holds the `flock` lock on `path` (a GPU's measurement lock).
fn locked_by_another(path: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    // SAFETY: flock on a descriptor this function owns; LOCK_NB never blocks.
    let taken = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    // Closing `file` drops the lock if it was taken.
    !taken
}

/// `program args` of `tenant` as `uid` in its container, its stdin and output piped.
fn spawn_in(
    scene: &Scene,
    tenant: &str,
    uid: u32,
    program: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> std::process::Child {
    use std::process::Stdio;
    let mut cmd = scene.in_container(tenant, uid, program, args);
    cmd.envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {program:?} as {tenant}: {e}"))
}

/// The node's tenants of a GPU measure what the driver spends for them under one lock: the GPU's
/// `<devices>/<GPU-UUID>.measure`, which `tenant create` makes (root:61000 0640: a tenant cannot
/// create files in the device directory, and `flock` needs only read access). t1's first context
/// takes a second to create, measured under that lock; t2's, started while t1 holds it and as slow,
/// waits for it. Both run in PID namespaces of their own, so they measure from the device's used
/// memory, where each would see the other's context appear if their measurements overlapped: each
/// is charged what simgpu spent on its context, and the rest of its quota is usable.
#[test]
fn tenants_of_one_gpu_measure_under_one_lock() {
    const QUOTA: u64 = 2 * GIB;
    let scene = Scene::new("measure", &[("SIMGPU_MEMORY", "16GiB")]);
    for t in ["t1", "t2"] {
        scene
            .gpuslice(&["tenant", "create", t, "--memory", "2GiB"])
            .assert_success();
    }
    // One lock per GPU, made by the node for its tenants' groups.
    let devices = scene.state.join("devices");
    let names: Vec<String> = std::fs::read_dir(&devices)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let gpus: Vec<&str> = names
        .iter()
        .filter_map(|n| n.strip_suffix(".dev"))
        .collect();
    assert!(!gpus.is_empty(), "no device ledger in {names:?}");
    let locks: Vec<std::path::PathBuf> = gpus
        .iter()
        .map(|uuid| devices.join(format!("{uuid}.measure")))
        .collect();
    for lock in &locks {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::symlink_metadata(lock)
            .unwrap_or_else(|e| panic!("{}: {e} (in {names:?})", lock.display()));
        assert!(
            meta.is_file()
                && meta.uid() == 0
                && meta.gid() == 61000
                && meta.mode() & 0o7777 == 0o640,
            "{}: uid {} gid {} mode {:o}",
            lock.display(),
            meta.uid(),
            meta.gid(),
            meta.mode()
        );
    }

    let client = overhead_client(&scene.dir);
    let slow = [("SIMGPU_CONTEXT_CREATE_US", "1000000")];
    let mut first = spawn_in(&scene, "t1", 1001, &client, &["hold"], &slow);
    // Wait until t1 holds its GPU's lock, measuring its context (a minute at most).
    let waiting = std::time::Instant::now();
    while !locks.iter().any(|l| locked_by_another(l)) {
        if let Some(status) = first.try_wait().unwrap() {
            panic!("t1's client ended ({status}) before it measured its context");
        }
        if waiting.elapsed() > std::time::Duration::from_secs(60) {
            first.kill().unwrap();
            let run = finish(first, "t1 holder");
            panic!(
                "t1's client never held a measurement lock in {} while creating its context\n{}",
                devices.display(),
                run.report()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let mut second = spawn_in(&scene, "t2", 1002, &client, &["hold"], &slow);
    wait_for_key(&mut first, "ready");
    wait_for_key(&mut second, "ready");

    // Each context charged simgpu's cost: the rest of each quota is usable, and no more.
    for (name, mut child) in [("t1", first), ("t2", second)] {
        child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        let fill: u64 = wait_for_key(&mut child, "fill_bytes")["fill_bytes"]
            .parse()
            .unwrap();
        let run = finish(child, name);
        run.assert_success();
        assert!(
            fill <= QUOTA - SIM_CONTEXT && fill + GRANULE >= QUOTA - SIM_CONTEXT,
            "{name}: {fill} allocated under a {QUOTA}-byte quota: its context must be charged \
             simgpu's {SIM_CONTEXT} bytes, one granule at most apart\n{}",
            run.report()
        );
        assert!(
            !run.stderr.contains("stayed locked")
                && !run.stderr.contains("without the device lock"),
            "{name} measured under the lock\n{}",
            run.report()
        );
    }
}

/// The command line is not a tenant: its NVML lookups reach the driver, never gpuslice's hooks
/// (which the gpuslice library it is built with also holds). A stale default ledger of root's with
/// a 1 GiB quota, in the default ledger directory, would make the hooked NVML report the GPU as
/// 1 GiB: `tenant create` sees simgpu's 16 GiB, and never opens that ledger.
#[test]
fn the_command_line_sees_the_device_not_a_default_ledger() {
    let scene = Scene::new("cli-nvml", &[("SIMGPU_MEMORY", "16GiB")]);
    // A program of the default tenant under a 1 GiB quota leaves its ledger behind.
    let r = run(scene
        .command(workload_bin())
        .args(["--chunk", "256", "--max", "256"])
        .env("LD_PRELOAD", library())
        .env("GPUSLICE_MEMORY_LIMIT", "1GiB"));
    r.assert_success();
    assert_eq!(r.get_u64("total"), GIB, "{}", r.report());
    let ledger = scene.dir.join("default-ledgers/uid-0/default.ledger");
    let before = std::fs::read(&ledger).unwrap_or_else(|e| panic!("{}: {e}", ledger.display()));

    let watch = OpenWatch::new(&ledger);
    let r = scene.gpuslice(&["tenant", "create", "t1", "--memory", "4GiB"]);
    r.assert_success();
    let r = scene.gpuslice(&["tenant", "create", "t2", "--memory", "17GiB"]);
    r.assert_failure();
    assert!(
        r.stderr.contains("larger than GPU 0") && r.stderr.contains("(16 GiB)"),
        "the GPU's own size in the refusal\n{}",
        r.report()
    );
    assert_eq!(
        watch.opens(),
        0,
        "the command line opened {}",
        ledger.display()
    );
    assert!(
        std::fs::read(&ledger).unwrap() == before,
        "{} changed",
        ledger.display()
    );
}

/// Counts the opens of one file (inotify `IN_OPEN`) from its creation on.
struct OpenWatch(std::os::fd::OwnedFd);

impl OpenWatch {
    fn new(path: &Path) -> OpenWatch {
        use std::os::fd::FromRawFd;
        use std::os::unix::ffi::OsStrExt;
        let name = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: inotify_init1 takes flags only.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(
            fd >= 0,
            "inotify_init1: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: fd is a new descriptor this function owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        use std::os::fd::AsRawFd;
        // SAFETY: a valid inotify descriptor and a NUL-terminated path.
        let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), name.as_ptr(), libc::IN_OPEN) };
        assert!(
            wd >= 0,
            "inotify_add_watch {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
        OpenWatch(fd)
    }

    /// Opens seen so far.
    fn opens(&self) -> usize {
        use std::os::fd::AsRawFd;
        let mut n = 0;
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: reads into a buffer this function owns, of its length.
            let got = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if got <= 0 {
                return n;
            }
            let mut at = 0;
            while at + std::mem::size_of::<libc::inotify_event>() <= got as usize {
                // SAFETY: the kernel wrote whole events; read_unaligned copes with the byte buffer.
                let event: libc::inotify_event =
                    unsafe { std::ptr::read_unaligned(buf.as_ptr().add(at).cast()) };
                if event.mask & libc::IN_OPEN != 0 {
                    n += 1;
                }
                at += std::mem::size_of::<libc::inotify_event>() + event.len as usize;
            }
        }
    }
}

/// A clone other users cannot traverse (under `/root`, or in a home directory made 0700): the
/// programs the tests run as other uids still load the library, simgpu and the workspace's programs,
/// from copies they can reach. The build tree's parent is made a 0700 tmpfs in a private mount
/// namespace (the tree bound back inside it, so root sees it where it was), a uid is checked to be
/// unable to open the library there, and `two_uids_share_a_gpu_under_node_policies` runs from it.
#[test]
fn tenants_run_from_a_tree_other_uids_cannot_traverse() {
    let tree = root();
    let parent = tree.parent().expect("the tree has a parent").to_path_buf();
    let tmp = std::env::temp_dir();
    if parent == Path::new("/") || tmp.starts_with(&parent) {
        eprintln!(
            "skipped: the tree's parent {} is / or holds the temporary directory {} (the scenes' \
             directories), so it cannot be made untraversable here",
            parent.display(),
            tmp.display()
        );
        return;
    }
    let hold = tmp.join(format!("gpuslice-tree-{}", std::process::id()));
    std::fs::create_dir_all(&hold).unwrap();
    let script = "set -e\n\
        mount --bind \"$TREE\" \"$HOLD\"\n\
        mount -t tmpfs -o mode=0700 gpuslice-0700 \"$PARENT\"\n\
        mkdir -p \"$TREE\"\n\
        mount --bind \"$HOLD\" \"$TREE\"\n\
        if setpriv --reuid=1001 --regid=1001 --clear-groups -- cat \"$LIB\" >/dev/null 2>&1; then\n\
          echo \"uid 1001 can still read $LIB\"; exit 99\n\
        fi\n\
        exec \"$@\"\n";
    let r = run(std::process::Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "tree",
        ])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "two_uids_share_a_gpu_under_node_policies",
            "--test-threads",
            "1",
        ])
        .env("TREE", &tree)
        .env("HOLD", &hold)
        .env("PARENT", &parent)
        .env("LIB", library()));
    let _ = std::fs::remove_dir(&hold);
    r.assert_success();
    assert!(r.stdout.contains("1 passed"), "{}", r.report());
}
