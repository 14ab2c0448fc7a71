//! A hostile node tenant and the device ledger it shares with the other tenants of its GPU (root:61000
//! 0660: every tenant's container has the group, the arbitration needs it). What docs/SECURITY.md
//! ("Tenants created by the node") says, checked: the tenant can rewrite the share, cap and class
//! words of every tenant in the device ledger, but the arbitration takes them from root's compute
//! policy beside it (`<GPU-UUID>.policy`), which the tenant can neither change, remove nor replace:
//! judged by simgpu's busy counters, the rewrite changes nothing, and root's `gpuslice set` still
//! changes a share live. It cannot remove, replace or add a file in the device directory, nor reach
//! another tenant's memory quota, which stays exact even after it overwrote the whole device ledger
//! with random bytes.

mod support;

use gpuslice_state::compute::device::DeviceLedger;
use gpuslice_state::compute::shm::{Layout, TenantEntry};
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use support::*;

/// Byte offset of tenant entry `t`'s field at `field` (an offset within `TenantEntry`).
fn tenant_field(t: usize, field: usize) -> usize {
    offset_of!(Layout, tenants) + t * size_of::<TenantEntry>() + field
}

/// Shell that writes the 32-bit little-endian `value` at `offset` of `file` without truncating it.
fn poke(file: &str, offset: usize, value: u32) -> String {
    let bytes: String = value
        .to_le_bytes()
        .iter()
        .map(|b| format!("\\{b:03o}"))
        .collect();
    format!(
        "printf '{bytes}' | dd of='{file}' bs=1 seek={offset} conv=notrunc status=none && echo poked={offset}\n"
    )
}

struct Compute {
    share: u32,
    cap: u32,
    high: bool,
}

/// Tenant `name`'s compute settings as the arbitration reads them (sanitised, as it uses them).
fn compute(ledger: &Path, name: &str) -> Option<Compute> {
    let l = DeviceLedger::open_readonly(ledger).ok()?;
    let t = l.find_tenant(name)?;
    let v = l.view(t);
    Some(Compute {
        share: v.share,
        cap: v.cap,
        high: v.high,
    })
}

fn device_ledger(scene: &Scene) -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir(scene.state.join("devices"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "dev"))
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found.remove(0)
}

/// Runs the library's compute client as t1 (uid 1001) and t2 (uid 1002) at once, spinning for
/// `ms` from a common start; returns their children (stdout/stderr piped).
fn spin_both(scene: &Scene, client: &Path, ms: u64) -> [std::process::Child; 2] {
    let start = start_in(1500).to_string();
    let ms = ms.to_string();
    let spin = ["spin", start.as_str(), ms.as_str(), "2000"];
    [("t1", 1001), ("t2", 1002)].map(|(t, uid)| {
        scene
            .in_container(t, uid, client, &spin)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    })
}

fn finish(children: [std::process::Child; 2]) {
    for (i, c) in children.into_iter().enumerate() {
        let r = Run::new(format!("t{} spin", i + 1), c.wait_with_output().unwrap());
        r.assert_success();
    }
}

/// t1's percentage of the busy time both groups gained since `before`.
fn t1_percent(scene: &Scene, before: (u64, u64)) -> (f64, u64, u64) {
    let (d1, d2) = (scene.busy("t1") - before.0, scene.busy("t2") - before.1);
    (d1 as f64 * 100.0 / (d1 + d2).max(1) as f64, d1, d2)
}

#[test]
fn hostile_tenant_writing_the_device_ledger() {
    let scene = Scene::new("hostile", &[("SIMGPU_MEMORY", "16GiB")]);
    for (name, share) in [("t1", "30"), ("t2", "70")] {
        scene
            .gpuslice(&[
                "tenant", "create", name, "--memory", "3GiB", "--share", share,
            ])
            .assert_success();
    }
    let ledger = device_ledger(&scene);
    let file_name = ledger.file_name().unwrap().to_string_lossy().into_owned();
    let inside = format!("/run/gpuslice/devices/{file_name}");
    let policy_inside = inside.replace(".dev", ".policy");
    let (i1, i2) = {
        let l = DeviceLedger::open_readonly(&ledger).unwrap();
        (l.find_tenant("t1").unwrap(), l.find_tenant("t2").unwrap())
    };

    // t1 (share 30), as uid 1001 in its container, tries the file system, then rewrites the
    // settings in the device ledger: its own share 10000 and the high class, t2's share 1 and a
    // 1% cap.
    let script = format!(
        "rm -f '{f}' 2>/dev/null; [ -e '{f}' ] && echo removed=no || echo removed=yes\n\
         mv '{f}' /run/gpuslice/devices/x 2>/dev/null && echo renamed=yes || echo renamed=no\n\
         (: > /run/gpuslice/devices/planted.dev) 2>/dev/null && echo created=yes || echo created=no\n\
         rm -f '{p}' 2>/dev/null; [ -e '{p}' ] && echo policy_removed=no || echo policy_removed=yes\n\
         mv '{p}' /run/gpuslice/devices/y 2>/dev/null && echo policy_renamed=yes || echo policy_renamed=no\n\
         (: > '{p}') 2>/dev/null && echo policy_written=yes || echo policy_written=no\n\
         {own_share}{own_priority}{other_share}{other_cap}",
        f = inside,
        p = policy_inside,
        own_share = poke(&inside, tenant_field(i1, offset_of!(TenantEntry, share)), 10_000),
        own_priority = poke(&inside, tenant_field(i1, offset_of!(TenantEntry, priority)), 1),
        other_share = poke(&inside, tenant_field(i2, offset_of!(TenantEntry, share)), 1),
        other_cap = poke(&inside, tenant_field(i2, offset_of!(TenantEntry, cap)), 1),
    );
    let r = run(&mut scene.in_container("t1", 1001, Path::new("/bin/sh"), &["-c", &script]));
    r.assert_success();
    for (key, want) in [
        ("removed", "no"),
        ("renamed", "no"),
        ("created", "no"),
        ("policy_removed", "no"),
        ("policy_renamed", "no"),
        ("policy_written", "no"),
    ] {
        assert_eq!(r.get(key), want, "{key}\n{}", r.report());
    }
    assert_eq!(r.stdout.matches("poked=").count(), 4, "{}", r.report());

    // Both keep the GPU busy at once. Unprotected, t1 (high class, share 10000) would take nearly
    // all of the busy time and t2 (capped at 1%) almost none; with root's policy obeyed t1 stays
    // near its 30% (the precise split is a benchmark figure; the bound is generous).
    let client = compute_client(&scene.dir);
    let before = (scene.busy("t1"), scene.busy("t2"));
    finish(spin_both(&scene, &client, 4000));
    let (p1, d1, d2) = t1_percent(&scene, before);
    println!("hostile: t1 (share 30, wrote itself 10000/high, t2 1/cap 1) {d1} ns, t2 (share 70) {d2} ns: t1 got {p1:.1}%");
    assert!(d1 > 0 && d2 > 0, "t1 {d1} ns, t2 {d2} ns");
    assert!(
        p1 < 50.0,
        "t1 (share 30) got {p1:.1}% of the busy time after rewriting the device ledger"
    );
    // The rewritten words are still in the ledger (nothing put them back): the policy decided.
    {
        let l = DeviceLedger::open_readonly(&ledger).unwrap();
        let t = &l.layout().tenants;
        use std::sync::atomic::Ordering::Acquire;
        assert_eq!(t[i1].share.load(Acquire), 10_000);
        assert_eq!(t[i1].priority.load(Acquire), 1);
        assert_eq!(t[i2].cap.load(Acquire), 1);
    }
    // What the arbitration reads (and `gpuslice status` shows): root's values.
    let (c1, c2) = (
        compute(&ledger, "t1").unwrap(),
        compute(&ledger, "t2").unwrap(),
    );
    assert_eq!((c1.share, c1.cap, c1.high), (30, 0, false));
    assert_eq!((c2.share, c2.cap, c2.high), (70, 0, false));
    // The policy file is root's, readable, nobody else's to write.
    let meta = std::fs::metadata(ledger.with_extension("policy")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o644));

    // Root changes the shares while both run: t1 100, t2 10. The running processes follow (they
    // re-read the policy within a sweep): t1 now gets most of the busy time.
    let state = scene.state.display().to_string();
    let set = |t: &str, share: &str| {
        scene
            .gpuslice(&[
                "set",
                "--tenant",
                t,
                "--state-dir",
                &state,
                "--share",
                share,
            ])
            .assert_success();
    };
    let children = spin_both(&scene, &client, 12_000);
    // Both running (each has device time) before root's change.
    let started = (scene.busy("t1"), scene.busy("t2"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while scene.busy("t1") == started.0 || scene.busy("t2") == started.1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the clients did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    set("t1", "100");
    set("t2", "10");
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let before = (scene.busy("t1"), scene.busy("t2"));
    std::thread::sleep(std::time::Duration::from_millis(3000));
    let (p1, d1, d2) = t1_percent(&scene, before);
    finish(children);
    println!("hostile: after root's set (t1 100, t2 10): t1 {d1} ns, t2 {d2} ns: t1 got {p1:.1}%");
    assert!(d2 > 0, "t2 {d2} ns");
    assert!(
        p1 > 65.0,
        "t1 (share 100 beside 10) got {p1:.1}% of the busy time after root's set"
    );
    let c1 = compute(&ledger, "t1").unwrap();
    assert_eq!((c1.share, c1.cap, c1.high), (100, 0, false));

    let policy1 = std::fs::read(scene.state.join("tenants/t1/policy.toml")).unwrap();

    // Protected: memory. t1 overwrites the whole device ledger with random bytes; t2 still gets
    // exactly its quota (and its launches still run: compute fails open).
    let size = std::fs::metadata(&ledger).unwrap().len();
    let scribble = format!(
        "head -c {size} /dev/urandom | dd of='{inside}' bs={size} count=1 conv=notrunc status=none && echo scribbled=yes"
    );
    let r = run(&mut scene.in_container("t1", 1001, Path::new("/bin/sh"), &["-c", &scribble]));
    assert_eq!(r.get("scribbled"), "yes", "{}", r.report());
    assert_eq!(std::fs::metadata(&ledger).unwrap().len(), size);
    let mut cmd = scene.in_container("t2", 1002, &workload_bin(), &["--chunk", "2"]);
    let r = run(&mut cmd);
    assert_eq!(r.get_u64("total"), 3 * GIB, "{}", r.report());
    assert_context_charged_as_spent(&r, 3 * GIB);
    assert_eq!(
        r.get("outcome"),
        "CUDA_ERROR_OUT_OF_MEMORY",
        "{}",
        r.report()
    );
    let start = start_in(300).to_string();
    run(&mut scene.in_container(
        "t2",
        1002,
        &client,
        &["spin", start.as_str(), "300", "2000"],
    ))
    .assert_success();
    assert_eq!(
        std::fs::read(scene.state.join("tenants/t1/policy.toml")).unwrap(),
        policy1
    );
}
