//! CDI: the specs `gpuslice tenant create` and `gpuslice cdi generate` write are accepted by the CDI
//! project's JSON schema (node/tests/data/cdi-schema, validated with Python's `jsonschema`), use the
//! lowest cdiVersion their fields need, and mount what the library needs; the library is installed
//! so a running container's copy is never overwritten.

mod support;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use support::*;

const VALIDATE: &str = r#"
import json, pathlib, sys
from jsonschema import Draft7Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7
d = pathlib.Path(sys.argv[1])
schema = json.loads((d / "schema.json").read_text())
defs = Resource.from_contents(json.loads((d / "defs.json").read_text()), default_specification=DRAFT7)
validator = Draft7Validator(schema, registry=Registry().with_resource("defs.json", defs))
for f in sys.argv[2:]:
    errors = sorted(validator.iter_errors(json.loads(pathlib.Path(f).read_text())), key=str)
    print(f"{f}: " + ("valid" if not errors else "INVALID " + "; ".join(e.message for e in errors)))
"#;

fn validate(files: &[&Path]) -> Run {
    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/cdi-schema");
    let mut cmd = std::process::Command::new(venv_python());
    cmd.args(["-c", VALIDATE]).arg(schema).args(files);
    run(&mut cmd)
}

#[test]
fn specs_validate_and_mount_what_the_library_needs() {
    let scene = Scene::new("cdi", &[("SIMGPU_MEMORY", "16GiB")]);
    let libdir = scene.dir.join("lib");
    let r = run(scene
        .command(gpuslice_bin())
        .args(["install-library"])
        .arg(library())
        .arg("--dir")
        .arg(&libdir));
    r.assert_success();
    let first = std::path::PathBuf::from(r.stdout.trim());
    let link = libdir.join("libgpuslice.so");
    assert_eq!(std::fs::canonicalize(&link).unwrap(), first);

    create_tenant(&scene, &link, &["t1", "--memory", "2GiB", "--share", "30"]);
    let node_spec = scene.dir.join("node.json");
    let mut cmd = scene.command(gpuslice_bin());
    cmd.args(["cdi", "generate", "--output"])
        .arg(&node_spec)
        .arg("--state-dir")
        .arg(&scene.state)
        .arg("--library")
        .arg(&link);
    run(&mut cmd).assert_success();
    let tenant_spec = scene.cdi.join("gpuslice.io-tenant-t1.json");
    // Without the groups (for runtimes older than CDI 0.7.0): the lowest version, 0.3.0.
    create_tenant(
        &scene,
        &link,
        &["t2", "--memory", "1GiB", "--cdi-without-groups"],
    );
    let old_runtime_spec = scene.cdi.join("gpuslice.io-tenant-t2.json");
    assert_eq!(scene.spec("t2")["cdiVersion"], "0.3.0");
    assert!(scene.spec("t2")["devices"][0]["containerEdits"]
        .get("additionalGids")
        .is_none());

    // A spec the schema must refuse, so a validator that accepts everything fails this test.
    let broken = scene.dir.join("broken.json");
    std::fs::write(
        &broken,
        r#"{"cdiVersion": "0.7.0", "devices": [{"name": "x"}]}"#,
    )
    .unwrap();
    let r = validate(&[&tenant_spec, &node_spec, &old_runtime_spec, &broken]);
    r.assert_success();
    assert!(
        r.stdout
            .contains(&format!("{}: valid", old_runtime_spec.display())),
        "{}",
        r.report()
    );
    assert!(
        r.stdout
            .contains(&format!("{}: valid", tenant_spec.display()))
            && r.stdout
                .contains(&format!("{}: valid", node_spec.display()))
            && r.stdout.contains(&format!("{}: INVALID", broken.display())),
        "{}",
        r.report()
    );

    let spec = scene.spec("t1");
    // additionalGids is a 0.7.0 field; nothing newer is used.
    assert_eq!(spec["cdiVersion"], "0.7.0");
    assert_eq!(spec["kind"], "gpuslice.io/tenant");
    assert_eq!(spec["devices"][0]["name"], "t1");
    let edits = &spec["devices"][0]["containerEdits"];
    let mounts: Vec<(String, String, bool)> = edits["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["hostPath"].as_str().unwrap().to_string(),
                m["containerPath"].as_str().unwrap().to_string(),
                m["options"].as_array().unwrap().iter().any(|o| o == "ro"),
            )
        })
        .collect();
    let find = |c: &str| {
        mounts
            .iter()
            .find(|m| m.1 == c)
            .unwrap_or_else(|| panic!("no mount at {c}: {mounts:?}"))
            .clone()
    };
    let t1_dir = scene.state.join("tenants/t1");
    assert_eq!(
        find("/usr/lib/gpuslice/libgpuslice.so"),
        (
            first.display().to_string(),
            "/usr/lib/gpuslice/libgpuslice.so".into(),
            true
        )
    );
    let preload = find("/etc/ld.so.preload");
    assert!(preload.2);
    assert_eq!(
        std::fs::read_to_string(&preload.0).unwrap(),
        "/usr/lib/gpuslice/libgpuslice.so\n"
    );
    assert_eq!(find("/run/gpuslice/tenant").0, t1_dir.display().to_string());
    // The directories are read-only (root writes there); the ledgers are writable, one mount each.
    assert!(
        find("/run/gpuslice/tenant").2,
        "the tenant's directory is mounted read-only"
    );
    let ledger = find("/run/gpuslice/tenant/t1.ledger");
    assert!(!ledger.2, "the ledger must be writable");
    assert_eq!(ledger.0, t1_dir.join("t1.ledger").display().to_string());
    assert!(
        find("/run/gpuslice/devices").2,
        "the device directory is read-only"
    );
    let dev = mounts
        .iter()
        .find(|m| m.1.starts_with("/run/gpuslice/devices/") && m.1.ends_with(".dev"))
        .expect("a device ledger mount");
    assert!(!dev.2, "the device ledger must be writable");
    let policy = find("/run/gpuslice/tenant/policy.toml");
    assert!(policy.2, "the policy is mounted read-only");
    assert_eq!(policy.0, t1_dir.join("policy.toml").display().to_string());
    assert_eq!(
        find("/run/gpuslice/devices").0,
        scene.state.join("devices").display().to_string()
    );
    let gid = std::fs::metadata(&t1_dir).unwrap().gid();
    assert_eq!(edits["additionalGids"], serde_json::json!([gid, 61000]));

    // A new install leaves the running containers' file as it was and repoints the symlink.
    let before = std::fs::read(&first).unwrap();
    let inode = std::fs::metadata(&first).unwrap().ino();
    let changed = scene.dir.join("libgpuslice-new.so");
    let mut bytes = before.clone();
    bytes.extend_from_slice(b"new build");
    std::fs::write(&changed, &bytes).unwrap();
    let r = run(scene
        .command(gpuslice_bin())
        .args(["install-library"])
        .arg(&changed)
        .arg("--dir")
        .arg(&libdir));
    r.assert_success();
    let second = std::path::PathBuf::from(r.stdout.trim());
    assert_ne!(second, first);
    assert_eq!(std::fs::read(&first).unwrap(), before);
    assert_eq!(std::fs::metadata(&first).unwrap().ino(), inode);
    assert_eq!(std::fs::canonicalize(&link).unwrap(), second);
    assert_eq!(std::fs::read(&second).unwrap(), bytes);
}

/// `gpuslice tenant create ARGS` in the scene's node, naming `library` in its CDI spec.
fn create_tenant(scene: &Scene, library: &Path, args: &[&str]) {
    let mut cmd = scene.command(gpuslice_bin());
    cmd.args(["tenant", "create"])
        .args(args)
        .arg("--state-dir")
        .arg(&scene.state)
        .arg("--cdi-dir")
        .arg(&scene.cdi)
        .arg("--library")
        .arg(library);
    run(&mut cmd).assert_success();
}
