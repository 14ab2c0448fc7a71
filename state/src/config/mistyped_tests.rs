use super::super::{effect, load_listed, Config, Limit, Setting};
use std::path::Path;

const UUID: &str = "GPU-1b2c3d4e-0000-1111-2222-333344445555";

fn cfg(vars: &[(&str, &str)]) -> Config {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    load_listed(
        &vars,
        Path::new("/nonexistent/gpuslice/quota.toml"),
        Path::new("/nonexistent/gpuslice/policy.toml"),
    )
}

/// The one line about `var`: among the errors (with what it does) or the warnings.
fn line_about(c: &Config, var: &str) -> String {
    let quoted = format!("{var}=");
    let all: Vec<String> = c
        .error_lines()
        .into_iter()
        .chain(c.warnings.clone())
        .collect();
    let found: Vec<&String> = all.iter().filter(|l| l.contains(&quoted)).collect();
    assert_eq!(found.len(), 1, "one line about {var}: {all:#?}");
    found[0].clone()
}

/// A near miss of the compute cap, unset otherwise, is the compute cap with an unreadable value:
/// the same setting and effect as `GPUSLICE_COMPUTE_LIMIT=banana`.
#[test]
fn a_compute_cap_typo_fails_closed_as_a_bad_cap() {
    let bad = cfg(&[("GPUSLICE_COMPUTE_LIMIT", "banana")]);
    assert!(matches!(
        bad.compute_limit_for(0, UUID),
        Setting::Invalid(_)
    ));
    for typo in [
        "GPUSLICE_COMPUTE_CAP",
        "GPUSLICE_COMPUTE_LIMT",
        "GPUSLICE_LIMIT_COMPUTE",
    ] {
        let c = cfg(&[(typo, "30")]);
        let Setting::Invalid(why) = c.compute_limit_for(0, UUID) else {
            panic!("{typo}: {:?}", c.compute_limit_for(0, UUID));
        };
        assert!(
            why.starts_with(&format!(
                "{typo}=\"30\": unknown variable (did you mean GPUSLICE_COMPUTE_LIMIT?)"
            )),
            "{why}"
        );
        assert_eq!(c.effect_of(&why), effect::COMPUTE);
        assert_eq!(c.effect_of(&why), bad.effect_of(&bad.errors[0]));
        assert_eq!(line_about(&c, typo), format!("{why}; {}", effect::COMPUTE));
        assert!(c.is_configured() && c.warnings.is_empty() && c.unknown.is_empty());
        // Nothing else changes: memory is not limited.
        assert_eq!(c.memory_limit_for(0, UUID), Limit::Unlimited);
    }
}

/// A near miss of the memory limit refuses allocations, as `GPUSLICE_MEMORY_LIMIT=banana` does;
/// a lower-case spelling is a near miss too.
#[test]
fn a_memory_limit_typo_fails_closed_as_a_bad_limit() {
    let bad = cfg(&[("GPUSLICE_MEMORY_LIMIT", "banana")]);
    assert!(matches!(bad.memory_limit_for(0, UUID), Limit::Invalid(_)));
    for typo in [
        "GPUSLICE_MEMORY_LIMT",
        "GPUSLICE_LIMIT_MEMORY",
        "gpuslice_memory_limit",
        "GPUSLICE_MEMORY",
    ] {
        let c = cfg(&[(typo, "4GiB")]);
        let Limit::Invalid(why) = c.memory_limit_for(3, UUID) else {
            panic!("{typo}: {:?}", c.memory_limit_for(3, UUID));
        };
        assert!(why.contains("did you mean GPUSLICE_MEMORY_LIMIT?"), "{why}");
        assert_eq!(c.default_memory_limit(), Limit::Invalid(why.clone()));
        assert_eq!(c.effect_of(&why), bad.effect_of(&bad.errors[0]));
        assert_eq!(line_about(&c, typo), format!("{why}; {}", effect::MEMORY));
        assert_eq!(c.compute_limit_for(0, UUID), Setting::Unset);
    }
}

/// A near miss of the quota file is an explicit quota file that cannot be read: every device.
#[test]
fn a_quota_file_typo_fails_closed_as_an_unreadable_quota_file() {
    let bad = cfg(&[("GPUSLICE_QUOTA_FILE", "/nonexistent/team.toml")]);
    let c = cfg(&[("GPUSLICE_QUOTAFILE", "/etc/gpuslice/team.toml")]);
    let Limit::Invalid(why) = c.memory_limit_for(0, UUID) else {
        panic!("{:?}", c.memory_limit_for(0, UUID));
    };
    assert!(why.contains("did you mean GPUSLICE_QUOTA_FILE?"), "{why}");
    assert_eq!(c.effect_of(&why), effect::EVERYTHING);
    assert_eq!(c.effect_of(&why), bad.effect_of(&bad.errors[0]));
    assert!(matches!(c.compute_limit_for(0, UUID), Setting::Invalid(_)));
}

/// Equally near two limits, neither set (`GPUSLICE_CAP`: the memory limit or the compute cap?): both
/// fail closed, which is every device, as a bad quota file does.
#[test]
fn a_typo_near_two_unset_limits_fails_closed_for_both() {
    let c = cfg(&[("GPUSLICE_CAP", "30")]);
    let Limit::Invalid(why) = c.memory_limit_for(0, UUID) else {
        panic!("{:?}", c.memory_limit_for(0, UUID));
    };
    assert_eq!(
        why,
        "GPUSLICE_CAP=\"30\": unknown variable (did you mean GPUSLICE_MEMORY_LIMIT or GPUSLICE_COMPUTE_LIMIT?); a limit was meant and GPUSLICE_MEMORY_LIMIT, GPUSLICE_COMPUTE_LIMIT are not set, so it is read as each of them with a value that cannot be read"
    );
    assert_eq!(c.effect_of(&why), effect::EVERYTHING);
    assert!(matches!(c.compute_limit_for(0, UUID), Setting::Invalid(_)));
    assert_eq!(c.errors, vec![why]);
    // With the memory limit set, only the compute cap is left to mean.
    let c = cfg(&[("GPUSLICE_MEMORY_LIMIT", "4GiB"), ("GPUSLICE_CAP", "30")]);
    assert_eq!(c.memory_limit_for(0, UUID), Limit::Bytes(4 << 30));
    assert!(matches!(c.compute_limit_for(0, UUID), Setting::Invalid(_)));
    assert_eq!(c.effect_of(&c.errors[0]), effect::COMPUTE);
}

/// When the limit meant is given anyway (by its variable, an alias or the quota file), the near miss
/// is a warning saying where the limit comes from, and the limit holds.
#[test]
fn a_typo_beside_the_setting_it_misspells_only_warns() {
    let c = cfg(&[
        ("GPUSLICE_MEMORY_LIMIT", "4GiB"),
        ("GPUSLICE_MEMORY_LIMT", "2GiB"),
    ]);
    assert_eq!(c.memory_limit_for(0, UUID), Limit::Bytes(4 << 30));
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    assert_eq!(
        c.unknown,
        vec!["GPUSLICE_MEMORY_LIMT=\"2GiB\": unknown variable (did you mean GPUSLICE_MEMORY_LIMIT?), ignored: the memory limit is set (GPUSLICE_MEMORY_LIMIT=\"4GiB\")"]
    );
    assert_eq!(c.warnings, c.unknown);
    let c = cfg(&[
        ("CUDA_DEVICE_SM_LIMIT", "40"),
        ("GPUSLICE_COMPUTE_CAP", "30"),
    ]);
    assert_eq!(c.compute_limit_for(0, UUID), Setting::Value(40));
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    assert!(
        c.unknown[0].ends_with("ignored: the compute cap is set"),
        "{:?}",
        c.unknown
    );
}

/// Near misses of settings that limit nothing (or whose absence limits no one less) are warnings,
/// each naming the setting meant; a name near none says so. Nothing fails.
#[test]
fn other_unknown_variables_only_warn() {
    let c = cfg(&[
        ("GPUSLICE_LOGG", "debug"),
        ("GPUSLICE_COMPUTE_SHARES", "50"),
        ("GPUSLICE_PRIO", "high"),
        ("GPUSLICE_CONTEXT_RESERVED", "0"),
        ("GPUSLICE_TENNANT", "team-a"),
        ("GPUSLICE_FOO", "1"),
        // Read by the command line, not the library: known, nothing said.
        ("GPUSLICE_LIBRARY", "/opt/gpuslice/libgpuslice.so"),
    ]);
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    assert!(!c.is_configured());
    assert_eq!(c.memory_limit_for(0, UUID), Limit::Unlimited);
    assert_eq!(c.tenant, "default");
    let want = [
        ("GPUSLICE_LOGG=\"debug\"", "GPUSLICE_LOG"),
        ("GPUSLICE_COMPUTE_SHARES=\"50\"", "GPUSLICE_COMPUTE_SHARE"),
        ("GPUSLICE_PRIO=\"high\"", "GPUSLICE_PRIORITY"),
        (
            "GPUSLICE_CONTEXT_RESERVED=\"0\"",
            "GPUSLICE_CONTEXT_RESERVE",
        ),
        ("GPUSLICE_TENNANT=\"team-a\"", "GPUSLICE_TENANT"),
    ];
    assert_eq!(c.unknown.len(), want.len() + 1, "{:#?}", c.unknown);
    for (line, (label, meant)) in c.unknown.iter().zip(want) {
        assert_eq!(
            line,
            &format!("{label}: unknown variable (did you mean {meant}?), ignored")
        );
    }
    assert_eq!(
        c.unknown.last().unwrap(),
        "GPUSLICE_FOO=\"1\": unknown variable, ignored (gpuslice's variables: docs/CONFIGURATION.md)"
    );
    assert_eq!(c.warnings, c.unknown);
}

/// Every known name, set, says nothing about unknown variables.
#[test]
fn known_names_say_nothing() {
    let vars: Vec<(&str, &str)> = super::names::known().map(|k| (k, "")).collect();
    let c = cfg(&vars);
    assert!(c.unknown.is_empty(), "{:?}", c.unknown);
    assert!(!c
        .error_lines()
        .iter()
        .any(|l| l.contains("unknown variable")));
}
