//! `gpuslice set` for compute writes a tenant's settings under the device ledger's arbitration lock,
//! and never waits on it past its bound (docs/COMPUTE.md): a tenant that holds the lock and keeps
//! re-stamping it cannot hold root's change back. `set` takes no process slot.

use gpuslice_testkit as common;

use common::*;
use gpuslice::scheduling::device::{now_ns, path_for, DeviceLedger};
use std::sync::atomic::Ordering::{Acquire, Release};
use std::time::{Duration, Instant};

#[test]
fn set_is_not_held_back_by_a_live_lock_holder() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli-set-compute-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let uuid = "GPU-1b2c3d4e-0000-1111-2222-333344445555";
    let path = path_for(&dir, uuid);
    let holder = DeviceLedger::open(&path, uuid, true).unwrap();
    let slot = holder.claim_slot(0).unwrap();
    let t = {
        let g = holder.lock(slot);
        holder
            .find_or_add_tenant(&g, gpuslice::scheduling::TenantId(1), "a", 50, 0, false)
            .unwrap()
    };
    let share = || holder.layout().tenants[t].share.load(Acquire);

    let guard = holder.lock(slot);
    let set = std::process::Command::new(gpuslice_bin())
        .args(["set", "--tenant", "a", "--share", "30", "--device-dir"])
        .arg(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Hold the lock and keep it fresh, as a tenant freezing arbitration would: the change still
    // lands, well within 2 s (the bound is milliseconds; the margin is for a busy machine).
    let held = Instant::now();
    while share() != 30 {
        holder.layout().header.lock_ns.store(now_ns(), Release);
        std::thread::sleep(Duration::from_millis(5));
        assert!(
            held.elapsed() < Duration::from_secs(10),
            "gpuslice set waited on a live lock holder"
        );
    }
    let landed = held.elapsed();
    drop(guard);
    let out = set.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(share(), 30);
    assert!(landed < Duration::from_secs(2), "set took {landed:?}");
    // Only our own slot is in use afterwards.
    let l = holder.layout();
    let busy: Vec<usize> = (0..l.slots.len())
        .filter(|&i| l.slots[i].state.load(Acquire) != 0)
        .collect();
    assert_eq!(busy, vec![slot]);
    let _ = std::fs::remove_dir_all(&dir);
}
