//! Attacks on the node by its tenants and local users, each performed as described in
//! docs/SECURITY.md ("What an attacker can and cannot do"): links planted where root writes, a
//! rename-exchange race while root creates tenants, a user's `policy.toml` beside a ledger, a
//! container's root without capabilities, a `tenant create` killed at every point, a tenant that
//! fills the state filesystem or makes another's stale tenant look alive. Each test passes only
//! when the attack fails: no file outside the state directory changed, policies unchanged.

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::*;

/// A file outside the state directory, its bytes, owner and mode, to compare after an attack.
struct Victim {
    path: PathBuf,
    before: (Vec<u8>, u32, u32, u32),
}

impl Victim {
    fn new(dir: &Path, name: &str) -> Victim {
        let path = dir.join(name);
        std::fs::write(&path, "root's own file\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let before = Self::state(&path);
        Victim { path, before }
    }
    fn state(path: &Path) -> (Vec<u8>, u32, u32, u32) {
        let m = std::fs::symlink_metadata(path).unwrap();
        (
            std::fs::read(path).unwrap(),
            m.uid(),
            m.gid(),
            m.mode() & 0o7777,
        )
    }
    fn assert_untouched(&self, what: &str) {
        assert_eq!(
            Self::state(&self.path),
            self.before,
            "{what}: {} was changed",
            self.path.display()
        );
    }
}

fn uuid_of(scene: &Scene) -> String {
    let mut devs: Vec<String> = std::fs::read_dir(scene.state.join("devices"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".dev").map(str::to_string))
        .collect();
    devs.sort();
    devs.into_iter().next().expect("a device ledger")
}

/// `script` run by `sh` as the container's root (uid 0) without any capability (empty bounding
/// set, so exec gives none back), in its own mount and PID namespaces holding the tenant's CDI
/// mounts, with the spec's groups: the default for a container without user namespaces.
fn as_container_root(scene: &Scene, tenant: &str, script: &str) -> Run {
    let spec = scene.spec(tenant);
    let edits = &spec["devices"][0]["containerEdits"];
    let gids: Vec<String> = edits["additionalGids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_u64().unwrap().to_string())
        .collect();
    let mut setup = String::from(
        "set -e\nmount -t tmpfs -o mode=0755 gpuslice-run /run\nmkdir -p /run/gpuslice/tenant /run/gpuslice/devices\n",
    );
    for m in edits["mounts"].as_array().unwrap() {
        let container = m["containerPath"].as_str().unwrap();
        if !container.starts_with("/run/gpuslice/") {
            continue;
        }
        let host = m["hostPath"].as_str().unwrap();
        setup.push_str(&format!("mount --bind '{host}' '{container}'\n"));
        if m["options"].as_array().unwrap().iter().any(|o| o == "ro") {
            setup.push_str(&format!(
                "mount -o remount,bind,ro,nosuid,nodev '{container}'\n"
            ));
        }
    }
    setup.push_str(&format!(
        "exec setpriv --reuid=0 --regid=0 --groups={} --inh-caps=-all --bounding-set=-all -- sh -c \"$1\"\n",
        gids.join(",")
    ));
    let mut cmd = scene.command("unshare");
    cmd.args(["--mount", "--pid", "--fork", "--propagation", "private"])
        .args(["sh", "-c", &setup, "container", script]);
    run(&mut cmd)
}

fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>, u32)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().filter_map(|e| e.ok()) {
            let p = e.path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                todo.push(p.clone());
                out.push((p, Vec::new(), m.mode()));
            } else if m.is_file()
                && !p
                    .extension()
                    .is_some_and(|x| x == "ledger" || x == "dev" || x == "tally")
            {
                out.push((p.clone(), std::fs::read(&p).unwrap(), m.mode()));
            } else {
                out.push((p, Vec::new(), m.mode()));
            }
        }
    }
    out.sort();
    out
}

/// Finding 2: the container's root (host uid 0, no capabilities) can change no policy, plant no
/// file where root writes, and change no mode; its ledger and its GPU's device ledger stay
/// writable to it (its programs need them).
#[test]
fn container_root_cannot_change_policies_or_plant_files() {
    let scene = Scene::new("croot", &[("SIMGPU_MEMORY", "16GiB")]);
    scene
        .gpuslice(&[
            "tenant", "create", "t1", "--memory", "3GiB", "--share", "30",
        ])
        .assert_success();
    scene
        .gpuslice(&[
            "tenant", "create", "t2", "--memory", "3GiB", "--share", "70",
        ])
        .assert_success();
    let uuid = uuid_of(&scene);
    let before = files_under(&scene.state);
    let attacks = [
        // Rewrite the GPU's compute policy (share 30 → 98.6% before), or the tenant's policy.
        format!("printf 'x' > /run/gpuslice/devices/{uuid}.policy"),
        format!("rm -f /run/gpuslice/devices/{uuid}.policy"),
        format!("mv /run/gpuslice/devices/{uuid}.policy /run/gpuslice/devices/x"),
        "printf 'share = 100' > /run/gpuslice/tenant/policy.toml".into(),
        "chmod 0666 /run/gpuslice/tenant/policy.toml".into(),
        format!("chmod 0666 /run/gpuslice/devices/{uuid}.policy"),
        // Plant names and links where root writes.
        "touch /run/gpuslice/devices/GPU-00000000-0000-0000-0000-000000000001.dev".into(),
        "ln -s /etc/passwd /run/gpuslice/devices/.gs-planted.tmp".into(),
        "ln -s /etc/passwd /run/gpuslice/tenant/.policy.toml.1.tmp".into(),
        "mkdir /run/gpuslice/tenant/sub".into(),
        "chmod 0777 /run/gpuslice/devices".into(),
        "chmod 0777 /run/gpuslice/tenant".into(),
        "chown 1000 /run/gpuslice/tenant".into(),
        // Take the mounts away.
        "umount /run/gpuslice/tenant/policy.toml".into(),
        "mount -o remount,rw /run/gpuslice/tenant".into(),
    ];
    for a in &attacks {
        let r = as_container_root(&scene, "t1", a);
        assert!(
            !r.status.success(),
            "container root could `{a}`:\n{}",
            r.report()
        );
    }
    assert_eq!(
        files_under(&scene.state),
        before,
        "the state directory changed"
    );
    // What the tenant must write stays writable to it.
    let r = as_container_root(
        &scene,
        "t1",
        &format!("test -w /run/gpuslice/tenant/t1.ledger && test -w /run/gpuslice/devices/{uuid}.dev && test -r /run/gpuslice/devices/{uuid}.policy"),
    );
    r.assert_success();
    // And a program of the tenant, as another uid, still runs under its quota.
    let r = run(&mut scene.in_container("t1", 1001, &workload_bin(), &["--chunk", "2"]));
    r.assert_success();
    assert_context_charged_as_spent(&r, 3 * GIB);
}

/// Finding 1: links planted at every temporary name root's old writer used (its pid in the name),
/// at the final names, and in the CDI directory: `tenant create`, `set` and `delete` replace or
/// ignore them and never write, truncate or chmod what they name.
#[test]
fn root_never_writes_through_planted_links() {
    let scene = Scene::new("links", &[("SIMGPU_MEMORY", "16GiB")]);
    scene
        .gpuslice(&[
            "tenant", "create", "t1", "--memory", "2GiB", "--share", "20",
        ])
        .assert_success();
    let victim = Victim::new(&scene.dir, "victim");
    let uuid = uuid_of(&scene);
    let devices = scene.state.join("devices");
    let t1 = scene.state.join("tenants/t1");
    let first = std::process::id();
    // Names of the old writer (`.<name>.<pid>.tmp`) for the next 1,500 pids, in every directory
    // root writes into, and the final names themselves.
    for pid in first..first + 1500 {
        for (dir, name) in [
            (&devices, format!(".{uuid}.policy.{pid}.tmp")),
            (&t1, format!(".policy.toml.{pid}.tmp")),
            (&scene.cdi, format!(".gpuslice.io-tenant-t2.json.{pid}.tmp")),
        ] {
            let _ = std::os::unix::fs::symlink(&victim.path, dir.join(name));
        }
    }
    std::os::unix::fs::symlink(&victim.path, scene.cdi.join("gpuslice.io-tenant-t2.json")).unwrap();
    let started = Instant::now();
    scene
        .gpuslice(&[
            "tenant", "create", "t2", "--memory", "2GiB", "--share", "20",
        ])
        .assert_success();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "tenant create took {:?}",
        started.elapsed()
    );
    run(scene
        .command(gpuslice_bin())
        .args(["set", "--state-dir"])
        .arg(&scene.state)
        .args(["--tenant", "t1", "--share", "25"]))
    .assert_success();
    scene.gpuslice(&["tenant", "delete", "t2"]).assert_success();
    victim.assert_untouched("create/set/delete with planted links");
    // The compute policy and the spec are files of their own, not the links.
    let m = std::fs::symlink_metadata(devices.join(format!("{uuid}.policy"))).unwrap();
    assert!(m.is_file() && m.mode() & 0o7777 == 0o644);
    let p = std::fs::read_to_string(t1.join("policy.toml")).unwrap();
    assert!(p.contains("share = 25"), "{p}");
}

/// Finding 3: while `tenant create` runs, a loop exchanges the device ledger with a link to a host
/// file (`renameat2(RENAME_EXCHANGE)`): root changes owner and mode only on what it opened without
/// following a link, so the host file keeps its owner and mode. Every create answers in time.
#[test]
fn a_rename_exchange_race_never_redirects_chown_or_chmod() {
    let scene = Scene::new("exchange", &[("SIMGPU_MEMORY", "16GiB")]);
    scene
        .gpuslice(&["tenant", "create", "t0", "--memory", "1GiB", "--share", "5"])
        .assert_success();
    let victim = Victim::new(&scene.dir, "victim");
    let uuid = uuid_of(&scene);
    let devices = scene.state.join("devices");
    let link = devices.join("swap");
    std::os::unix::fs::symlink(&victim.path, &link).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let racer = {
        let stop = stop.clone();
        let a = std::ffi::CString::new(
            devices
                .join(format!("{uuid}.dev"))
                .into_os_string()
                .into_encoded_bytes(),
        )
        .unwrap();
        let b = std::ffi::CString::new(link.clone().into_os_string().into_encoded_bytes()).unwrap();
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // SAFETY: two valid NUL-terminated paths.
                let rc = unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        a.as_ptr(),
                        libc::AT_FDCWD,
                        b.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    )
                };
                swaps += u64::from(rc == 0);
            }
            swaps
        })
    };
    for i in 1..=5 {
        let started = Instant::now();
        let name = format!("t{i}");
        let r = scene.gpuslice(&[
            "tenant", "create", &name, "--memory", "1GiB", "--share", "5",
        ]);
        // It may fail (the device ledger is a link half the time); it must answer, and not hurt.
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "tenant create took {:?}\n{}",
            started.elapsed(),
            r.report()
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps = racer.join().unwrap();
    assert!(swaps > 100, "the race loop ran only {swaps} exchanges");
    victim.assert_untouched("tenant create during a rename-exchange race");
}

/// Finding 1 (local user): a user who puts a `policy.toml` beside their own ledger, and links
/// where root would write, gets nothing written by root's `gpuslice set --ledger`.
#[test]
fn a_users_policy_beside_a_ledger_is_not_the_nodes() {
    let scene = Scene::new("userpolicy", &[("SIMGPU_MEMORY", "16GiB")]);
    let victim = Victim::new(&scene.dir, "ld.so.preload");
    // The user's directory, laid out like a node's state directory.
    let home = scene.dir.join("home");
    let tdir = home.join("tenants/x");
    std::fs::create_dir_all(&tdir).unwrap();
    std::os::unix::fs::symlink(&scene.dir, home.join("devices")).unwrap();
    std::fs::write(
        tdir.join("policy.toml"),
        "name = \"x\"\nmemory = 1073741824\nshare = 10\n",
    )
    .unwrap();
    std::fs::write(tdir.join("x.ledger"), "").unwrap();
    for pid in std::process::id()..std::process::id() + 500 {
        let _ =
            std::os::unix::fs::symlink(&victim.path, tdir.join(format!(".policy.toml.{pid}.tmp")));
    }
    for p in [&home, &home.join("tenants"), &tdir] {
        std::os::unix::fs::chown(p, Some(1001), Some(1001)).unwrap();
    }
    for e in std::fs::read_dir(&tdir).unwrap() {
        std::os::unix::fs::lchown(e.unwrap().path(), Some(1001), Some(1001)).unwrap();
    }
    let policy_before = std::fs::read(tdir.join("policy.toml")).unwrap();
    let r = run(scene
        .command(gpuslice_bin())
        .args(["set", "--ledger"])
        .arg(tdir.join("x.ledger"))
        .args(["--memory", "2GiB"]));
    assert!(!r.status.success(), "{}", r.report());
    assert!(
        r.stderr.contains("is not a node tenant's ledger"),
        "{}",
        r.report()
    );
    victim.assert_untouched("root's set beside a user's policy.toml");
    assert_eq!(
        std::fs::read(tdir.join("policy.toml")).unwrap(),
        policy_before
    );
    assert!(!scene.dir.join(format!("{}.policy", "x")).exists());
}

/// Finding 14: `tenant create` killed at every point of its run. After the next create (which
/// takes back what the killed ones left): every published tenant has its CDI spec, no temporary
/// directory or file is left, no group is held by anything but a published tenant, and the device
/// ledger lists exactly the published tenants.
#[test]
fn a_killed_tenant_create_leaves_nothing_half_done() {
    let scene = Scene::new("killed", &[("SIMGPU_MEMORY", "16GiB")]);
    let create = |name: &str| {
        let mut cmd = scene.command(gpuslice_bin());
        cmd.args([
            "tenant", "create", name, "--memory", "64MiB", "--share", "1",
        ])
        .arg("--state-dir")
        .arg(&scene.state)
        .arg("--cdi-dir")
        .arg(&scene.cdi)
        .arg("--library")
        .arg(library())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
        cmd
    };
    // How long one create takes here, now: the kills are spread over it.
    let started = Instant::now();
    assert!(create("probe").status().unwrap().success());
    let took = started.elapsed();
    let n = 30u32;
    for i in 0..n {
        let mut child = create(&format!("k{i}")).spawn().unwrap();
        std::thread::sleep(took * i / n);
        let _ = child.kill();
        let _ = child.wait();
    }
    let started = Instant::now();
    assert!(create("last").status().unwrap().success());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "recovering took {:?}",
        started.elapsed()
    );
    let tenants: Vec<String> = std::fs::read_dir(scene.state.join("tenants"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let mut gids = std::collections::BTreeSet::new();
    for t in &tenants {
        assert!(!t.starts_with('.'), "left behind: tenants/{t}");
        assert!(
            scene
                .cdi
                .join(format!("gpuslice.io-tenant-{t}.json"))
                .is_file(),
            "tenant {t} published without its CDI spec"
        );
        let gid = std::fs::metadata(scene.state.join("tenants").join(t))
            .unwrap()
            .gid();
        assert!(gids.insert(gid), "group {gid} given twice");
    }
    for dir in [&scene.cdi, &scene.state, &scene.state.join("devices")] {
        for e in std::fs::read_dir(dir).unwrap() {
            let n = e.unwrap().file_name().into_string().unwrap();
            assert!(
                !n.ends_with(".tmp"),
                "stray temporary {}/{n}",
                dir.display()
            );
            if let Some(t) = n
                .strip_prefix("gpuslice.io-tenant-")
                .and_then(|r| r.strip_suffix(".json"))
            {
                assert!(tenants.iter().any(|x| x == t), "spec without a tenant: {n}");
            }
        }
    }
    let uuid = uuid_of(&scene);
    let l = gpuslice_state::compute::device::DeviceLedger::open_readonly(
        &scene.state.join("devices").join(format!("{uuid}.dev")),
    )
    .unwrap();
    let listed = l
        .layout()
        .tenants
        .iter()
        .filter(|t| t.state.load(std::sync::atomic::Ordering::Acquire) != 0)
        .count();
    assert_eq!(
        listed,
        tenants.len(),
        "device ledger entries vs tenants {tenants:?}"
    );
}

/// Finding 12 and issue 26 item 5: a GPU holds as many tenants as its device ledger has entries
/// for (32; its compute policy holds 64); one more is refused at creation with a clear error (before:
/// silently given share 1). Quotas past the card's memory and shares past 100% are refused unless
/// `--overcommit`.
#[test]
fn creation_refuses_what_a_gpu_cannot_keep() {
    let scene = Scene::new("limits", &[("SIMGPU_MEMORY", "16GiB")]);
    scene
        .gpuslice(&[
            "tenant", "create", "a", "--memory", "10GiB", "--share", "60",
        ])
        .assert_success();
    let r = scene.gpuslice(&["tenant", "create", "b", "--memory", "7GiB", "--share", "10"]);
    assert!(
        !r.status.success()
            && r.stderr.contains("would promise 17 GiB of its 16 GiB")
            && r.stderr.contains("--overcommit"),
        "{}",
        r.report()
    );
    let r = scene.gpuslice(&["tenant", "create", "b", "--memory", "1GiB", "--share", "50"]);
    assert!(
        !r.status.success() && r.stderr.contains("sum to 110%"),
        "{}",
        r.report()
    );
    scene
        .gpuslice(&[
            "tenant",
            "create",
            "b",
            "--memory",
            "7GiB",
            "--share",
            "50",
            "--overcommit",
        ])
        .assert_success();
    scene.gpuslice(&["tenant", "delete", "a"]).assert_success();
    scene.gpuslice(&["tenant", "delete", "b"]).assert_success();
    let max = gpuslice_state::compute::MAX_TENANTS;
    for i in 0..max {
        scene
            .gpuslice(&[
                "tenant",
                "create",
                &format!("n{i}"),
                "--memory",
                "64MiB",
                "--share",
                "1",
            ])
            .assert_success();
    }
    let r = scene.gpuslice(&[
        "tenant", "create", "extra", "--memory", "64MiB", "--share", "1",
    ]);
    assert!(
        !r.status.success() && r.stderr.contains(&format!("already has {max} tenants")),
        "{}",
        r.report()
    );
    assert!(!scene.state.join("tenants/extra").exists());
}

/// Finding 13: another tenant holds a device-ledger slot claiming a stale tenant's entry (it can:
/// every tenant of a GPU writes its device ledger). The stale tenant is still seen as stale
/// (liveness is read from OFD locks in its own memory ledger) and root's delete removes it.
#[test]
fn another_tenant_cannot_make_a_stale_tenant_look_alive() {
    let scene = Scene::new("stale", &[("SIMGPU_MEMORY", "16GiB")]);
    scene
        .gpuslice(&[
            "tenant", "create", "gone", "--memory", "1GiB", "--share", "10",
        ])
        .assert_success();
    let uuid = uuid_of(&scene);
    let path = scene.state.join("devices").join(format!("{uuid}.dev"));
    let l = gpuslice_state::compute::device::DeviceLedger::open(&path, &uuid, false).unwrap();
    let t = l.find_tenant("gone").expect("its entry");
    // A live slot (its lock held by this process) naming the stale tenant.
    let _slot = l.claim_slot(t).expect("a slot");
    let r = scene.gpuslice(&["tenant", "list", "--json"]);
    r.assert_success();
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["tenants"][0]["processes"], 0, "{}", r.report());
    scene
        .gpuslice(&["tenant", "delete", "gone"])
        .assert_success();
    assert!(!scene.state.join("tenants/gone").exists());
}

/// Finding 9: a tenant grows the files it can write (its ledger, its GPU's device ledger) to fill
/// the state filesystem; the node's next create or delete cuts them back to their size, and the
/// tenant's delete gives everything back.
#[test]
fn a_tenant_cannot_keep_the_state_filesystem_full() {
    let scene = Scene::new("fill", &[("SIMGPU_MEMORY", "16GiB")]);
    scene
        .gpuslice(&[
            "tenant", "create", "t1", "--memory", "1GiB", "--share", "10",
        ])
        .assert_success();
    let uuid = uuid_of(&scene);
    let ledger = scene.state.join("tenants/t1/t1.ledger");
    let device = scene.state.join("devices").join(format!("{uuid}.dev"));
    let sizes = || {
        (
            std::fs::metadata(&ledger).unwrap().len(),
            std::fs::metadata(&device).unwrap().len(),
        )
    };
    let before = sizes();
    let r = run(&mut scene.in_container(
        "t1",
        1001,
        Path::new("/bin/sh"),
        &[
            "-c",
            &format!("dd if=/dev/zero of=/run/gpuslice/tenant/t1.ledger bs=1M count=16 seek=64 conv=notrunc status=none && dd if=/dev/zero of=/run/gpuslice/devices/{uuid}.dev bs=1M count=16 seek=64 conv=notrunc status=none"),
        ],
    ));
    r.assert_success();
    let grown = sizes();
    assert!(grown.0 > before.0 + (60 << 20) && grown.1 > before.1 + (60 << 20));
    scene
        .gpuslice(&[
            "tenant", "create", "t2", "--memory", "1GiB", "--share", "10",
        ])
        .assert_success();
    assert_eq!(sizes(), before, "the node cut the grown files back");
    let blocks = std::fs::metadata(&ledger).unwrap().blocks() * 512;
    assert!(
        blocks <= before.0 + (1 << 20),
        "{blocks} bytes still in use"
    );
}

/// Finding 11: `gpuslice run --memory 1GiB` never joins a ledger that has a larger limit.
#[test]
fn run_refuses_a_ledger_with_a_larger_limit() {
    let scene = Scene::new("runjoin", &[("SIMGPU_MEMORY", "16GiB")]);
    let path = scene.dir.join("big.ledger");
    let opts = gpuslice_state::ledger::LedgerOptions {
        tenant: "big".into(),
        default_limit: gpuslice_state::config::Limit::Bytes(8 * GIB),
        devices: Vec::new(),
        group: None,
    };
    let _l = gpuslice_state::ledger::Ledger::open(&path, &opts).unwrap();
    let r = run(scene
        .command(gpuslice_bin())
        .args(["run", "--memory", "1GiB", "--ledger"])
        .arg(&path)
        .args(["--", "true"]));
    assert!(!r.status.success(), "{}", r.report());
    assert!(
        r.stderr.contains("already exists with a larger limit") && r.stderr.contains("8 GiB"),
        "{}",
        r.report()
    );
    // The same or a larger --memory joins.
    run(scene
        .command(gpuslice_bin())
        .args(["run", "--memory", "8GiB", "--ledger"])
        .arg(&path)
        .args(["--", "true"]))
    .assert_success();
}
