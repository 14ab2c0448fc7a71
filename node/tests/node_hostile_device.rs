//! A hostile node tenant and the device ledger it shares with the other tenants of its GPU (root:61000
//! 0660: every tenant's container has the group, the arbitration needs it). What docs/SECURITY.md
//! ("Tenants created by the node") says, checked: the tenant can rewrite the compute settings of
//! every tenant of the GPU, and they stay so until root sets them again; it cannot remove, replace
//! or add a file in the device directory, nor reach another tenant's memory quota, which stays exact
//! even after it overwrote the whole device ledger with random bytes.

mod support;

use gpuslice::scheduling::device::DeviceLedger;
use gpuslice::scheduling::shm::{Layout, TenantEntry};
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
    let inside = format!(
        "/run/gpuslice/devices/{}",
        ledger.file_name().unwrap().to_string_lossy()
    );
    let (i1, i2) = {
        let l = DeviceLedger::open_readonly(&ledger).unwrap();
        (l.find_tenant("t1").unwrap(), l.find_tenant("t2").unwrap())
    };
    let policy1 = std::fs::read(scene.state.join("tenants/t1/policy.toml")).unwrap();

    // t2, as uid 1002 in its container, tries the file system, then rewrites the settings.
    let script = format!(
        "rm -f '{f}' 2>/dev/null; [ -e '{f}' ] && echo removed=no || echo removed=yes\n\
         mv '{f}' /run/gpuslice/devices/x 2>/dev/null && echo renamed=yes || echo renamed=no\n\
         (: > /run/gpuslice/devices/planted.dev) 2>/dev/null && echo created=yes || echo created=no\n\
         {own_share}{own_priority}{other_share}{other_cap}",
        f = inside,
        own_share = poke(&inside, tenant_field(i2, offset_of!(TenantEntry, share)), 10_000),
        own_priority = poke(&inside, tenant_field(i2, offset_of!(TenantEntry, priority)), 1),
        other_share = poke(&inside, tenant_field(i1, offset_of!(TenantEntry, share)), 1),
        other_cap = poke(&inside, tenant_field(i1, offset_of!(TenantEntry, cap)), 1),
    );
    let r = run(&mut scene.in_container("t2", 1002, Path::new("/bin/sh"), &["-c", &script]));
    r.assert_success();
    assert_eq!(r.get("removed"), "no", "{}", r.report());
    assert_eq!(r.get("renamed"), "no", "{}", r.report());
    assert_eq!(r.get("created"), "no", "{}", r.report());
    assert_eq!(r.stdout.matches("poked=").count(), 4, "{}", r.report());

    // Not protected: the arbitration now reads t2 as high priority with share 10000 (its bound),
    // t1 with share 1 and a 1% cap; a process of t1 joining does not put its policy back.
    let client = compute_client(&scene.dir);
    let start = start_in(300).to_string();
    let r = run(&mut scene.in_container(
        "t1",
        1001,
        &client,
        &["spin", start.as_str(), "300", "2000"],
    ));
    r.assert_success();
    // It took part in the arbitration: device time was charged to t1 in the ledger.
    let charged = DeviceLedger::open_readonly(&ledger)
        .unwrap()
        .layout()
        .tenants[i1]
        .charged_ns
        .load(std::sync::atomic::Ordering::Acquire);
    assert!(charged > 0, "{}", r.report());
    let (c1, c2) = (
        compute(&ledger, "t1").unwrap(),
        compute(&ledger, "t2").unwrap(),
    );
    assert_eq!((c1.share, c1.cap, c1.high), (1, 1, false));
    assert_eq!((c2.share, c2.cap, c2.high), (10_000, 0, true));
    // Root on the node puts them back (policy and device ledger).
    let state = scene.state.display().to_string();
    for (t, share) in [("t1", "30"), ("t2", "70")] {
        scene
            .gpuslice(&[
                "set",
                "--tenant",
                t,
                "--state-dir",
                &state,
                "--share",
                share,
                "--limit",
                "none",
                "--priority",
                "normal",
            ])
            .assert_success();
    }
    let (c1, c2) = (
        compute(&ledger, "t1").unwrap(),
        compute(&ledger, "t2").unwrap(),
    );
    assert_eq!((c1.share, c1.cap, c1.high), (30, 0, false));
    assert_eq!((c2.share, c2.cap, c2.high), (70, 0, false));

    // Protected: memory. t2 overwrites the whole device ledger with random bytes; t1 still gets
    // exactly its quota (and its launches still run: compute fails open).
    let size = std::fs::metadata(&ledger).unwrap().len();
    let scribble = format!(
        "head -c {size} /dev/urandom | dd of='{inside}' bs={size} count=1 conv=notrunc status=none && echo scribbled=yes"
    );
    let r = run(&mut scene.in_container("t2", 1002, Path::new("/bin/sh"), &["-c", &scribble]));
    assert_eq!(r.get("scribbled"), "yes", "{}", r.report());
    assert_eq!(std::fs::metadata(&ledger).unwrap().len(), size);
    let mut cmd = scene.in_container("t1", 1001, &workload_bin(), &["--chunk", "2"]);
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
        "t1",
        1001,
        &client,
        &["spin", start.as_str(), "300", "2000"],
    ))
    .assert_success();
    assert_eq!(
        std::fs::read(scene.state.join("tenants/t1/policy.toml")).unwrap(),
        policy1
    );
}
