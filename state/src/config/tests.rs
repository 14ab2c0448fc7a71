use super::*;
use std::collections::HashMap;
use std::path::Path;

const GIB: u64 = 1 << 30;
const UUID_A: &str = "GPU-1b2c3d4e-0000-1111-2222-333344445555";
const UUID_B: &str = "GPU-99999999-0000-1111-2222-333344445555";

fn cfg(vars: &[(&str, &str)]) -> Config {
    cfg_with_file(vars, Path::new("/nonexistent/gpuslice/quota.toml"))
}

fn cfg_with_file(vars: &[(&str, &str)], default_file: &Path) -> Config {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    load_from(&|k| map.get(k).cloned(), default_file)
}

/// The default ledger path of `tenant` for this user (before the filesystem is looked at).
fn default_path(tenant: &str) -> PathBuf {
    let uid = crate::slotfile::sys::geteuid();
    PathBuf::from(format!("/dev/shm/gpuslice/uid-{uid}/{tenant}.ledger"))
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpuslice-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn nothing_configured() {
    let c = cfg(&[]);
    assert!(!c.is_configured());
    assert_eq!(c.memory_limit_for(0, UUID_A), Limit::Unlimited);
    assert_eq!(c.tenant, "default");
    assert_eq!(c.ledger_path, default_path("default"));
    assert_eq!(c.log_level, LogLevel::Warn);
    assert_eq!(c.context_reserve, None);
    assert!(c.errors.is_empty() && c.notes.is_empty());
}

#[test]
fn bare_limit_applies_everywhere() {
    let c = cfg(&[("GPUSLICE_MEMORY_LIMIT", "4GiB")]);
    assert!(c.is_configured());
    assert_eq!(c.memory_limit_for(0, UUID_A), Limit::Bytes(4 * GIB));
    assert_eq!(c.memory_limit_for(7, UUID_B), Limit::Bytes(4 * GIB));
    assert_eq!(c.default_memory_limit(), Limit::Bytes(4 * GIB));
}

#[test]
fn per_device_limits() {
    let v = format!(
        "0=4GiB,1=2GiB,{}=1G",
        UUID_A.to_uppercase().replace("GPU-", "gpu-")
    );
    let c = cfg(&[("GPUSLICE_MEMORY_LIMIT", &v)]);
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    assert_eq!(c.memory_limit_for(0, UUID_B), Limit::Bytes(4 * GIB));
    assert_eq!(c.memory_limit_for(1, UUID_B), Limit::Bytes(2 * GIB));
    // The UUID key wins over the index key.
    assert_eq!(c.memory_limit_for(0, UUID_A), Limit::Bytes(GIB));
    assert_eq!(c.memory_limit_for(2, UUID_B), Limit::Unlimited);
    assert_eq!(c.default_memory_limit(), Limit::Unlimited);

    let c = cfg(&[("GPUSLICE_MEMORY_LIMIT", "1GiB,1=2GiB")]);
    assert_eq!(c.memory_limit_for(0, UUID_A), Limit::Bytes(GIB));
    assert_eq!(c.memory_limit_for(1, UUID_A), Limit::Bytes(2 * GIB));
}

#[test]
fn bad_values_fail_closed() {
    let c = cfg(&[("GPUSLICE_MEMORY_LIMIT", "4 GB")]);
    let msg = "GPUSLICE_MEMORY_LIMIT=\"4 GB\": unknown unit \"GB\" (expected B, KiB, MiB, GiB, TiB, Ki, Mi, Gi, Ti, K, M, G, T)";
    assert_eq!(c.memory_limit_for(0, UUID_A), Limit::Invalid(msg.into()));
    assert_eq!(c.errors, vec![msg.to_string()]);
    assert!(c.is_configured());

    // Only the device concerned is invalid.
    let c = cfg(&[("GPUSLICE_MEMORY_LIMIT", "0=4GiB,1=lots")]);
    assert_eq!(c.memory_limit_for(0, UUID_A), Limit::Bytes(4 * GIB));
    assert_eq!(
        c.memory_limit_for(1, UUID_A),
        Limit::Invalid("GPUSLICE_MEMORY_LIMIT=\"0=4GiB,1=lots\": device 1: not a number (expected a size such as 4GiB, 512MiB or 4294967296)".into())
    );

    // A key that names no device: every device is invalid.
    let c = cfg(&[("GPUSLICE_MEMORY_LIMIT", "0=4GiB,gpu0=1G")]);
    assert!(
        matches!(c.memory_limit_for(0, UUID_A), Limit::Invalid(m) if m.contains("bad device key \"gpu0\""))
    );
    assert!(matches!(c.memory_limit_for(5, UUID_B), Limit::Invalid(_)));

    // Limits that are not memory limits but concern every device.
    for (var, val) in [
        ("GPUSLICE_CONTEXT_RESERVE", "lots"),
        ("GPUSLICE_TENANT", "../etc"),
        ("GPUSLICE_LEDGER", "relative.ledger"),
        ("GPUSLICE_QUOTA_FILE", "/nonexistent/q.toml"),
    ] {
        let c = cfg(&[("GPUSLICE_MEMORY_LIMIT", "4GiB"), (var, val)]);
        let Limit::Invalid(m) = c.memory_limit_for(0, UUID_A) else {
            panic!("{var} did not fail closed");
        };
        assert!(m.contains(var) || m.contains("/nonexistent/q.toml"), "{m}");
        assert!(c.errors.contains(&m));
    }
}

#[test]
fn other_settings() {
    let c = cfg(&[
        ("GPUSLICE_TENANT", "team-a"),
        ("GPUSLICE_LOG", "debug"),
        ("GPUSLICE_CONTEXT_RESERVE", "300MiB"),
        ("GPUSLICE_COMPUTE_SHARE", "0=50,1=25"),
        ("GPUSLICE_COMPUTE_LIMIT", "80"),
        ("GPUSLICE_PRIORITY", "high"),
        ("GPUSLICE_LEDGER_GROUP", "gpu"),
    ]);
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    assert_eq!(c.tenant, "team-a");
    // A group-shared tenant's default ledger is in the group's directory.
    assert_eq!(
        c.ledger_path,
        PathBuf::from("/dev/shm/gpuslice/group-gpu/team-a.ledger")
    );
    assert_eq!(c.log_level, LogLevel::Debug);
    assert_eq!(c.context_reserve, Some(300 << 20));
    assert_eq!(c.compute_share_for(1, UUID_A), Setting::Value(25));
    assert_eq!(c.compute_share_for(2, UUID_A), Setting::Unset);
    assert_eq!(c.compute_limit_for(3, UUID_A), Setting::Value(80));
    assert_eq!(c.priority, Setting::Value(Priority::High));
    assert_eq!(c.ledger_group.as_deref(), Some("gpu"));

    let c = cfg(&[
        ("GPUSLICE_LOG", "loud"),
        ("GPUSLICE_PRIORITY", "urgent"),
        ("GPUSLICE_COMPUTE_SHARE", "150"),
    ]);
    assert_eq!(c.log_level, LogLevel::Warn);
    assert_eq!(
        c.errors,
        vec![
            "GPUSLICE_LOG=\"loud\": unknown log level (expected off, error, warn, info, debug, trace)".to_string(),
            "GPUSLICE_COMPUTE_SHARE=\"150\": out of range (expected a percentage from 1 to 100)".to_string(),
            "GPUSLICE_PRIORITY=\"urgent\": unknown priority (expected high or normal)".to_string(),
        ]
    );
    assert!(matches!(
        c.compute_share_for(0, UUID_A),
        Setting::Invalid(_)
    ));
}

#[test]
fn hami_aliases() {
    let c = cfg(&[
        ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_1", "512m"),
        ("CUDA_DEVICE_SM_LIMIT", "30"),
    ]);
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    assert_eq!(c.memory_limit_for(0, UUID_A), Limit::Bytes(4 * GIB));
    assert_eq!(c.memory_limit_for(1, UUID_A), Limit::Bytes(512 << 20));
    assert_eq!(c.compute_limit_for(0, UUID_A), Setting::Value(30));
    assert_eq!(
        c.notes,
        vec![
            "CUDA_DEVICE_MEMORY_LIMIT=\"4g\" read as the memory limit 4 GiB for every device (HAMi alias of GPUSLICE_MEMORY_LIMIT; lower-case k/m/g mean KiB/MiB/GiB)".to_string(),
            "CUDA_DEVICE_MEMORY_LIMIT_1=\"512m\" read as the memory limit 512 MiB for device 1 (HAMi alias; lower-case k/m/g mean KiB/MiB/GiB)".to_string(),
            "CUDA_DEVICE_SM_LIMIT=\"30\" read as a compute cap of 30% for every device (HAMi alias of GPUSLICE_COMPUTE_LIMIT)".to_string(),
        ]
    );
    // A bad alias value fails closed too, naming the alias.
    let c = cfg(&[("CUDA_DEVICE_MEMORY_LIMIT", "4x")]);
    assert!(
        matches!(c.memory_limit_for(0, UUID_A), Limit::Invalid(m) if m.starts_with("CUDA_DEVICE_MEMORY_LIMIT=\"4x\": unknown unit \"x\""))
    );
}

#[test]
fn mps_aliases() {
    let c = cfg(&[
        ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=1G,1=512MB"),
        ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25"),
    ]);
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    assert_eq!(c.memory_limit_for(0, UUID_A), Limit::Bytes(GIB));
    assert_eq!(c.memory_limit_for(1, UUID_A), Limit::Bytes(512 << 20));
    assert_eq!(c.memory_limit_for(2, UUID_A), Limit::Unlimited);
    assert_eq!(c.compute_limit_for(4, UUID_A), Setting::Value(25));
    assert_eq!(c.notes.len(), 2);
    assert!(
        c.notes[0].contains("MPS's MB/GB mean MiB/GiB"),
        "{}",
        c.notes[0]
    );
    assert!(c.notes[0].contains("1 GiB for device 0, 512 MiB for device 1"));
}

#[test]
fn gpuslice_wins_over_aliases() {
    let c = cfg(&[
        ("GPUSLICE_MEMORY_LIMIT", "2GiB"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
        ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=8G"),
        ("GPUSLICE_COMPUTE_LIMIT", "50"),
        ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25"),
    ]);
    assert_eq!(c.memory_limit_for(0, UUID_A), Limit::Bytes(2 * GIB));
    assert_eq!(c.compute_limit_for(0, UUID_A), Setting::Value(50));
    assert_eq!(c.notes.len(), 2, "{:?}", c.notes);
    assert!(c.notes[0].starts_with("GPUSLICE_MEMORY_LIMIT is set: ignoring"));
}

const FILE: &str = r#"# gpuslice quota
tenant = "team-a"
memory_limit = "4GiB"
compute_share = 40
priority = "normal"
[devices]
"1" = "2GiB"
"GPU-1b2c3d4e-0000-1111-2222-333344445555" = "8GiB"
"#;

#[test]
fn quota_file() {
    let f = temp_file("good.toml", FILE);
    // The default path is read when it exists, with a scrubbed environment.
    let c = cfg_with_file(&[], &f);
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    assert!(c.is_configured());
    assert_eq!(c.quota_file.as_deref(), Some(f.as_path()));
    assert_eq!(c.tenant, "team-a");
    assert_eq!(c.ledger_path, default_path("team-a"));
    assert_eq!(c.memory_limit_for(0, UUID_B), Limit::Bytes(4 * GIB));
    assert_eq!(c.memory_limit_for(1, UUID_B), Limit::Bytes(2 * GIB));
    assert_eq!(c.memory_limit_for(1, UUID_A), Limit::Bytes(8 * GIB));
    assert_eq!(c.compute_share_for(0, UUID_A), Setting::Value(40));
    assert_eq!(c.priority, Setting::Value(Priority::Normal));

    // GPUSLICE_QUOTA_FILE names it explicitly.
    let c = cfg(&[("GPUSLICE_QUOTA_FILE", f.to_str().unwrap())]);
    assert_eq!(c.memory_limit_for(1, UUID_B), Limit::Bytes(2 * GIB));
}

/// A quota file that is not a small regular file (a directory, a FIFO, one over the size bound)
/// fails closed, named; a FIFO is refused at once, without waiting for a writer.
#[test]
fn quota_file_not_regular() {
    let dir = temp_file("placeholder", "").parent().unwrap().to_path_buf();
    let fifo = dir.join("fifo.toml");
    let _ = std::fs::remove_file(&fifo);
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let big = temp_file("big.toml", &"#".repeat(MAX_QUOTA_FILE as usize + 1));
    for path in [dir.clone(), fifo.clone(), big] {
        for c in [
            cfg_with_file(&[], &path),
            cfg(&[("GPUSLICE_QUOTA_FILE", path.to_str().unwrap())]),
        ] {
            let Limit::Invalid(m) = c.memory_limit_for(0, UUID_A) else {
                panic!("{} did not fail closed", path.display());
            };
            assert!(m.contains("not a regular file"), "{m}");
        }
    }
    std::fs::remove_file(&fifo).unwrap();
}

#[test]
fn environment_over_file() {
    let f = temp_file("prec.toml", FILE);
    let c = cfg_with_file(
        &[
            ("GPUSLICE_MEMORY_LIMIT", "1GiB"),
            ("GPUSLICE_TENANT", "team-b"),
            ("GPUSLICE_LEDGER", "/tmp/x.ledger"),
        ],
        &f,
    );
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    // The environment's memory limit replaces memory_limit and [devices] altogether.
    assert_eq!(c.memory_limit_for(1, UUID_A), Limit::Bytes(GIB));
    assert_eq!(c.tenant, "team-b");
    assert_eq!(c.ledger_path, PathBuf::from("/tmp/x.ledger"));
    assert_eq!(c.compute_share_for(0, UUID_A), Setting::Value(40));

    let f = temp_file("prec2.toml", "tenant = \"a\"\nledger = \"/x/a.ledger\"\n");
    assert_eq!(
        cfg_with_file(&[], &f).ledger_path,
        PathBuf::from("/x/a.ledger")
    );
    let c = cfg_with_file(&[("GPUSLICE_TENANT", "b")], &f);
    assert_eq!(c.ledger_path, default_path("b"));
}

#[test]
fn bad_file_names_file_and_line() {
    let text = "tenant = \"t\"\nmemory_limit = \"4 GB\"\n[devices]\n\"0\" = \"1x\"\n";
    let f = temp_file("bad-value.toml", text);
    let c = cfg_with_file(&[], &f);
    let fp = f.display();
    let m_all = format!("{fp}:2: memory_limit=\"4 GB\": unknown unit \"GB\" (expected B, KiB, MiB, GiB, TiB, Ki, Mi, Gi, Ti, K, M, G, T)");
    let m_0 = format!("{fp}:4: 0=\"1x\": device 0: unknown unit \"x\" (expected B, KiB, MiB, GiB, TiB, Ki, Mi, Gi, Ti, K, M, G, T)");
    assert_eq!(c.memory_limit_for(0, UUID_A), Limit::Invalid(m_0.clone()));
    assert_eq!(c.memory_limit_for(1, UUID_A), Limit::Invalid(m_all.clone()));
    assert!(
        c.errors.contains(&m_all) && c.errors.contains(&m_0),
        "{:?}",
        c.errors
    );

    // A syntax error or an unknown key concerns every device.
    let f = temp_file(
        "bad-syntax.toml",
        "memory_limit = \"4GiB\"\nmemory_limt = \"1GiB\"\n",
    );
    let c = cfg_with_file(&[], &f);
    let want = format!("{}:2: unknown key \"memory_limt\"", f.display());
    assert!(matches!(c.memory_limit_for(0, UUID_A), Limit::Invalid(m) if m.starts_with(&want)));
    let f = temp_file("bad-syntax2.toml", "memory_limit = 4GiB\n");
    let c = cfg_with_file(&[], &f);
    let want = format!(
        "{}:1: unquoted value \"4GiB\" (expected a \"string\" such as \"4GiB\", or a non-negative integer)",
        f.display()
    );
    assert_eq!(c.memory_limit_for(3, UUID_B), Limit::Invalid(want));
    // Syntax errors are not hidden by an environment limit.
    let c = cfg_with_file(&[("GPUSLICE_MEMORY_LIMIT", "1GiB")], &f);
    assert!(matches!(c.memory_limit_for(0, UUID_A), Limit::Invalid(_)));
}

#[test]
fn uuids() {
    assert_eq!(
        canonical_uuid("gpu-1B2C3D4E000011112222333344445555").as_deref(),
        Some(UUID_A)
    );
    assert_eq!(canonical_uuid("GPU-123"), None);
    assert_eq!(canonical_uuid("1b2c3d4e-0000-1111-2222-333344445555"), None);
    let b = uuid_bytes(UUID_A).unwrap();
    assert_eq!(b[0], 0x1b);
    assert_eq!(b[15], 0x55);
}

/// Thousands of generated values for every variable and quota file: no panic, and a value that is
/// not accepted is reported with the variable's name (or the file's `path:line`) and the value.
#[test]
fn fuzz_generated_settings() {
    let atoms = [
        "",
        ",",
        "=",
        "0",
        "1",
        "64",
        "4GiB",
        "1.5GiB",
        "-1",
        "1e3",
        "GPU-",
        "MIG-1",
        "0=1GiB",
        "GPU-1b2c3d4e-0000-1111-2222-333344445555",
        "high",
        "50%",
        "0x10",
        " ",
        "\u{0}",
        "é",
        "99999999999999999999",
        "KiB",
        "=1G",
        "1=",
        ",,",
        "\"",
        "[devices]",
        "#",
    ];
    let vars = [
        "GPUSLICE_MEMORY_LIMIT",
        "GPUSLICE_COMPUTE_SHARE",
        "GPUSLICE_COMPUTE_LIMIT",
        "GPUSLICE_PRIORITY",
        "GPUSLICE_TENANT",
        "GPUSLICE_LEDGER",
        "GPUSLICE_CONTEXT_RESERVE",
        "CUDA_DEVICE_MEMORY_LIMIT",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    ];
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let dir = std::env::temp_dir().join(format!("gpuslice-config-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("quota.toml");
    for round in 0..3000 {
        let n = 1 + next() as usize % 3;
        let value: String = (0..n)
            .map(|_| atoms[next() as usize % atoms.len()])
            .collect::<Vec<_>>()
            .join(if next() % 2 == 0 { "," } else { "" });
        let var = vars[round % vars.len()];
        let use_file = round % 3 == 0;
        if use_file {
            let key = [
                "memory_limit",
                "tenant",
                "compute_share",
                "priority",
                "bogus",
            ][next() as usize % 5];
            std::fs::write(&file, format!("{key} = \"{value}\"\n[devices]\n{value}\n")).unwrap();
        }
        let env = |k: &str| match k {
            "GPUSLICE_QUOTA_FILE" if use_file => Some(file.display().to_string()),
            k if k == var && !use_file => Some(value.clone()),
            _ => None,
        };
        let cfg = crate::config::load_from(&env, Path::new("/nonexistent"));
        for e in &cfg.errors {
            let named = if use_file {
                e.contains(&file.display().to_string())
            } else {
                e.contains(var)
            };
            assert!(
                named,
                "round {round}: {var}={value:?}: error without its source: {e}"
            );
        }
        // Memory that is set but unusable fails closed: never silently unlimited.
        if !use_file && var == "GPUSLICE_MEMORY_LIMIT" && !value.trim().is_empty() {
            assert!(
                cfg.memory.is_set(),
                "round {round}: {value:?} read as no limit"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn each_error_says_what_it_does() {
    let c = cfg(&[
        ("GPUSLICE_MEMORY_LIMIT", "lots"),
        ("GPUSLICE_COMPUTE_SHARE", "0"),
        ("GPUSLICE_PRIORITY", "urgent"),
        ("GPUSLICE_LOG", "loud"),
    ]);
    let effect = |var: &str| {
        let e = c
            .errors
            .iter()
            .find(|e| e.starts_with(var))
            .unwrap_or_else(|| panic!("no error for {var}: {:?}", c.errors));
        c.effect_of(e)
    };
    assert_eq!(effect("GPUSLICE_MEMORY_LIMIT="), effect::MEMORY);
    assert_eq!(effect("GPUSLICE_COMPUTE_SHARE="), effect::COMPUTE);
    assert_eq!(effect("GPUSLICE_PRIORITY="), effect::PRIORITY);
    assert_eq!(effect("GPUSLICE_LOG="), effect::LOG);
    let c = cfg(&[
        ("GPUSLICE_TENANT", "../x"),
        ("GPUSLICE_MEMORY_LIMIT", "1GiB"),
    ]);
    assert_eq!(c.effect_of(&c.errors[0]), effect::EVERYTHING);
    assert!(c.error_lines()[0].ends_with(effect::EVERYTHING));
}
