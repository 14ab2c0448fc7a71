//! The node policy's precedence and HAMi's other variables (`policy.rs`, `load_with_policy`).

use super::*;
use std::collections::HashMap;
use std::path::Path;

const GIB: u64 = 1 << 30;
const UUID_A: &str = "GPU-1b2c3d4e-0000-1111-2222-333344445555";

fn cfg_with_policy(vars: &[(&str, &str)], policy_file: &Path) -> Config {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    load_with_policy(
        &|k| map.get(k).cloned(),
        Path::new("/nonexistent/gpuslice/quota.toml"),
        policy_file,
    )
}

fn cfg(vars: &[(&str, &str)]) -> Config {
    cfg_with_policy(vars, Path::new("/nonexistent/gpuslice/policy.toml"))
}

#[test]
fn hami_aliases_each_with_a_note() {
    let c = cfg(&[
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/vgpu/a.cache"),
        ("CUDA_TASK_PRIORITY", "0"),
        ("LIBCUDA_LOG_LEVEL", "3"),
        ("CUDA_DEVICE_SM_LIMIT", "40"),
        ("GPU_CORE_UTILIZATION_POLICY", "force"),
    ]);
    assert_eq!(c.ledger_path, PathBuf::from("/tmp/vgpu/a.cache"));
    assert_eq!(c.priority, Setting::Value(Priority::High));
    assert_eq!(c.log_level, LogLevel::Info);
    assert_eq!(c.compute_limit_for(0, UUID_A), Setting::Value(40));
    for alias in [
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        "CUDA_TASK_PRIORITY",
        "LIBCUDA_LOG_LEVEL",
        "GPU_CORE_UTILIZATION_POLICY",
    ] {
        assert!(
            c.notes.iter().any(|n| n.starts_with(alias)),
            "{alias}: {:?}",
            c.notes
        );
    }
    assert!(c.errors.is_empty(), "{:?}", c.errors);

    let c = cfg(&[
        ("CUDA_DEVICE_SM_LIMIT", "40"),
        ("GPU_CORE_UTILIZATION_POLICY", "disable"),
        ("CUDA_TASK_PRIORITY", "1"),
        ("LIBCUDA_LOG_LEVEL", "0"),
    ]);
    assert_eq!(c.compute_limit_for(0, UUID_A), Setting::Unset);
    assert_eq!(c.priority, Setting::Value(Priority::Normal));
    assert_eq!(c.log_level, LogLevel::Error);

    // gpuslice's own variables win.
    let c = cfg(&[
        ("GPUSLICE_LEDGER", "/dev/shm/x/own.ledger"),
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/vgpu/a.cache"),
        ("GPUSLICE_PRIORITY", "normal"),
        ("CUDA_TASK_PRIORITY", "0"),
        ("GPUSLICE_LOG", "debug"),
        ("LIBCUDA_LOG_LEVEL", "0"),
    ]);
    assert_eq!(c.ledger_path, PathBuf::from("/dev/shm/x/own.ledger"));
    assert_eq!(c.priority, Setting::Value(Priority::Normal));
    assert_eq!(c.log_level, LogLevel::Debug);

    // Bad values are named.
    let c = cfg(&[("CUDA_TASK_PRIORITY", "5"), ("LIBCUDA_LOG_LEVEL", "9")]);
    assert!(
        matches!(c.priority, Setting::Invalid(ref e) if e.contains("CUDA_TASK_PRIORITY=\"5\""))
    );
    assert!(
        c.errors
            .iter()
            .any(|e| e.contains("LIBCUDA_LOG_LEVEL=\"9\"")),
        "{:?}",
        c.errors
    );
}

#[test]
fn a_node_policy_is_only_ever_lowered() {
    let dir = std::env::temp_dir().join(format!("gpuslice-node-cfg-{}", std::process::id()));
    let tenant_dir = dir.join("state/tenants/t1");
    std::fs::create_dir_all(&tenant_dir).unwrap();
    let policy = tenant_dir.join("policy.toml");
    std::fs::write(
        &policy,
        format!("name = \"t1\"\nmemory = {}\nshare = 30\nlimit = 50\npriority = \"normal\"\ngpus = [\"{UUID_A}\"]\n", 2 * GIB),
    )
    .unwrap();
    let p = policy.to_str().unwrap();
    let mut c = cfg(&[
        ("GPUSLICE_POLICY", p),
        ("GPUSLICE_TENANT", "other"),
        ("GPUSLICE_MEMORY_LIMIT", "8GiB"),
        ("GPUSLICE_COMPUTE_SHARE", "90"),
        ("GPUSLICE_COMPUTE_LIMIT", "80"),
        ("GPUSLICE_PRIORITY", "high"),
    ]);
    assert_eq!(c.tenant, "t1");
    assert_eq!(c.ledger_path, tenant_dir.join("t1.ledger"));
    // The node's ledger is not a default one: per-user placement leaves it alone.
    c.place_default_ledger();
    assert_eq!(c.ledger_path, tenant_dir.join("t1.ledger"));
    assert_eq!(c.memory_ceiling(0, UUID_A), Some(2 * GIB));
    assert_eq!(
        c.memory_ceiling(1, "GPU-00000000-0000-0000-0000-000000000000"),
        Some(0)
    );
    assert_eq!(c.compute_share_for(0, UUID_A), Setting::Value(30));
    assert_eq!(c.compute_limit_for(0, UUID_A), Setting::Value(50));
    assert_eq!(c.priority, Setting::Value(Priority::Normal));
    assert_eq!(c.warnings.len(), 5, "{:?}", c.warnings);

    let c = cfg(&[
        ("GPUSLICE_POLICY", p),
        ("GPUSLICE_MEMORY_LIMIT", "1GiB"),
        ("GPUSLICE_COMPUTE_SHARE", "10"),
        ("CUDA_DEVICE_SM_LIMIT", "20"),
    ]);
    assert_eq!(c.memory_ceiling(0, UUID_A), Some(GIB));
    assert_eq!(c.compute_share_for(0, UUID_A), Setting::Value(10));
    assert_eq!(c.compute_limit_for(0, UUID_A), Setting::Value(20));

    // The fixed in-container file wins over GPUSLICE_POLICY, and a broken policy refuses everything.
    let fixed = dir.join("fixed.toml");
    std::fs::write(&fixed, "name = \"t1\"\nmemory = 1\n").unwrap();
    let c = cfg_with_policy(&[("GPUSLICE_POLICY", p)], &fixed);
    assert!(
        matches!(c.memory_limit_for(0, UUID_A), Limit::Invalid(ref e) if e.contains("no share"))
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
