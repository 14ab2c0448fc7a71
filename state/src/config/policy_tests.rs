//! The node policy's unit tests.

use super::*;

const U: &str = "GPU-1b2c3d4e-0000-1111-2222-333344445555";

#[test]
fn reads_what_the_node_writes() {
    let text = format!(
        "name = \"t1\"\nmemory = 3221225472\nshare = 30\nlimit = 0\npriority = \"high\"\ngpus = [\"{U}\"]\ncreated = \"cli\"\n\n[kubernetes]\nnamespace = \"default\"\npod = \"p\"\ncontainer = \"c\"\n"
    );
    let p = NodePolicy {
        path: "/s/tenants/t1/policy.toml".into(),
        device_dir: device_dir_for(Path::new("/s/tenants/t1/policy.toml"), false),
        policy: Policy::parse(Path::new("/s/tenants/t1/policy.toml"), &text).unwrap(),
    };
    assert_eq!(p.name, "t1");
    assert_eq!(p.memory, 3 << 30);
    assert_eq!((p.share, p.limit, p.priority), (30, 0, Priority::High));
    assert_eq!(p.gpus, vec![U.to_string()]);
    assert_eq!(p.memory_on(U), 3 << 30);
    assert_eq!(p.memory_on("GPU-00000000-0000-0000-0000-000000000000"), 0);
    assert_eq!(p.ledger_path(), Path::new("/s/tenants/t1/t1.ledger"));
    assert_eq!(p.device_dir, Path::new("/s/devices"));
    assert_eq!(
        device_dir_for(Path::new(POLICY_FILE), true),
        Path::new(CONTAINER_DEVICE_DIR)
    );
    assert_eq!(p.created, Created::Cli);
    let k = p.kubernetes.clone().unwrap();
    assert_eq!((k.namespace.as_str(), k.pod.as_str()), ("default", "p"));
    assert_eq!(
        Policy::parse(Path::new("/x"), &p.to_toml().unwrap()),
        Ok(p.policy.clone())
    );
}

#[test]
fn bad_policies_name_file_and_line() {
    let p = Path::new("/p.toml");
    let e = Policy::parse(p, "name = \"t\"\nmemory = 1\nshare = 0\n").unwrap_err();
    assert!(e.contains("/p.toml:3") && e.contains("share"), "{e}");
    let e = Policy::parse(p, "name = \"t\"\nmemory = 1\nshare = 5\nextra = 1\n").unwrap_err();
    assert!(e.contains("/p.toml:4") && e.contains("unknown key"), "{e}");
    let e = Policy::parse(p, "name = \"t\"\nmemory = 1\nshare = 5\ngpus = [x]\n").unwrap_err();
    assert!(e.contains("/p.toml:4"), "{e}");
    let e = Policy::parse(p, "name = \"t\"\nshare = 5\n").unwrap_err();
    assert!(e.contains("no memory"), "{e}");
}

#[test]
fn the_fixed_file_wins_over_the_variable() {
    let dir = std::env::temp_dir().join(format!("gpuslice-policy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fixed = dir.join("policy.toml");
    let env = |k: &str| (k == "GPUSLICE_POLICY").then(|| "/elsewhere/policy.toml".to_string());
    assert_eq!(
        locate(&env, &fixed),
        Some((PathBuf::from("/elsewhere/policy.toml"), false))
    );
    std::fs::write(&fixed, "").unwrap();
    assert_eq!(locate(&env, &fixed), Some((fixed.clone(), true)));
    std::fs::remove_dir_all(&dir).unwrap();
}
