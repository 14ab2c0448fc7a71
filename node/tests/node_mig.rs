//! Node tenants on MIG instances: `gpuslice tenant create --gpu MIG-<uuid>` sizes the tenant against
//! the instance's memory, and a program of the tenant on that instance (`CUDA_VISIBLE_DEVICES` naming
//! it, as a device plugin hands MIG devices out) is held to the quota, its context charged what the
//! driver spent on it, measured on the instance from inside its PID namespace. Judged on simgpu in
//! MIG mode (`SIMGPU_MIG`) by the program's own results and simgpu's counters.

mod support;

use support::*;

/// simgpu's UUID of GPU 0's MIG instance 1 (`simgpu_core::mig::instance_uuid`).
const INSTANCE1: &str = "MIG-53494d47-4d49-4000-8000-000000000001";

#[test]
fn a_node_tenant_on_a_mig_instance_is_held_to_its_quota() {
    let scene = Scene::new(
        "mig",
        &[("SIMGPU_MEMORY", "80GiB"), ("SIMGPU_MIG", "0:10GiB,20GiB")],
    );
    // The instance's memory is the card's: 25 GiB does not fit its 20 GiB.
    let r = scene.gpuslice(&[
        "tenant", "create", "big", "--memory", "25GiB", "--gpu", INSTANCE1,
    ]);
    r.assert_failure();
    assert!(
        r.stderr.contains("larger than GPU 0:1") && r.stderr.contains("(20 GiB)"),
        "the instance's own size in the refusal\n{}",
        r.report()
    );
    scene
        .gpuslice(&[
            "tenant", "create", "m", "--memory", "4GiB", "--gpu", INSTANCE1,
        ])
        .assert_success();
    let listed = scene.gpuslice(&["tenant", "list"]);
    listed.assert_success();
    assert!(listed.stdout.contains(INSTANCE1), "{}", listed.report());

    let mut cmd = scene.in_container("m", 1001, &workload_bin(), &["--chunk", "2"]);
    cmd.env("CUDA_VISIBLE_DEVICES", INSTANCE1);
    let r = run(&mut cmd);
    r.assert_success();
    assert_eq!(r.get_u64("total"), 4 * GIB, "{}", r.report());
    assert_context_charged_as_spent(&r, 4 * GIB);
    assert_eq!(
        r.get("outcome"),
        "CUDA_ERROR_OUT_OF_MEMORY",
        "{}",
        r.report()
    );
}
