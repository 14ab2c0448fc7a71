//! `gpuslice set` for compute writes a tenant's settings under the device ledger's arbitration lock:
//! while another process holds the lock (and keeps it fresh), the change waits; once released, it
//! lands, and the slot `set` held for the lock is free again.

mod common;

use common::*;
use gpuslice::scheduling::device::{now_ns, path_for, DeviceLedger};
use std::sync::atomic::Ordering::{Acquire, Release};
use std::time::{Duration, Instant};

#[test]
fn set_waits_for_the_arbitration_lock() {
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
    // Hold the lock (fresh, so it is not taken over as stale) for a while: nothing changes.
    let held = Instant::now();
    while held.elapsed() < Duration::from_millis(500) {
        holder.layout().header.lock_ns.store(now_ns(), Release);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(share(), 50, "gpuslice set wrote while the lock was held");
    }
    drop(guard);
    let out = set.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(share(), 30);
    // Only our own slot is in use afterwards.
    let l = holder.layout();
    let busy: Vec<usize> = (0..l.slots.len())
        .filter(|&i| l.slots[i].state.load(Acquire) != 0)
        .collect();
    assert_eq!(busy, vec![slot]);
    let _ = std::fs::remove_dir_all(&dir);
}
