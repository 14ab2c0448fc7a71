use super::super::table::{self, Source};
use super::*;
use std::path::{Path, PathBuf};

/// The known names are the table's variables and the other parts' ones, in that order, no more.
#[test]
fn known_names_are_the_tables() {
    let settings = table::SETTINGS.iter().flat_map(|s| s.sources);
    let own = settings.filter_map(|src| match *src {
        Source::Env(v) => Some(v),
        _ => None,
    });
    let all: Vec<&str> = own
        .chain(table::OTHER_VARIABLES.iter().map(|(name, _)| *name))
        .collect();
    assert_eq!(KNOWN, all.as_slice());
    assert!(all.iter().all(|k| is_known(k)));
}

#[test]
fn near_misses_name_the_setting_meant() {
    for (typo, meant) in [
        // The compute cap under its other name (and HAMi's word for it).
        ("GPUSLICE_COMPUTE_CAP", "GPUSLICE_COMPUTE_LIMIT"),
        ("GPUSLICE_SM_LIMIT", "GPUSLICE_COMPUTE_LIMIT"),
        ("GPUSLICE_COMPUTE_MAX", "GPUSLICE_COMPUTE_LIMIT"),
        // Words reordered, a letter left out, swapped, doubled, a word shortened or added.
        ("GPUSLICE_LIMIT_MEMORY", "GPUSLICE_MEMORY_LIMIT"),
        ("GPUSLICE_MEMORY_LIMT", "GPUSLICE_MEMORY_LIMIT"),
        ("GPUSLICE_MEMROY_LIMIT", "GPUSLICE_MEMORY_LIMIT"),
        ("GPUSLICE_MEM_LIMIT", "GPUSLICE_MEMORY_LIMIT"),
        ("GPUSLICE_MEMORY_QUOTA", "GPUSLICE_MEMORY_LIMIT"),
        ("GPUSLICE_GPU_MEMORY_LIMIT", "GPUSLICE_MEMORY_LIMIT"),
        ("GPUSLICE_MEMORY-LIMIT", "GPUSLICE_MEMORY_LIMIT"),
        ("gpuslice_memory_limit", "GPUSLICE_MEMORY_LIMIT"),
        ("GPUSLICE_COMPUTE_SHARES", "GPUSLICE_COMPUTE_SHARE"),
        ("GPUSLICE_QUOTAFILE", "GPUSLICE_QUOTA_FILE"),
        ("GPUSLICE_QUOTA_FILE_PATH", "GPUSLICE_QUOTA_FILE"),
        ("GPUSLICE_LOGG", "GPUSLICE_LOG"),
        ("GPUSLICE_LOG_LEVEL", "GPUSLICE_LOG"),
        ("GPUSLICE_PRIO", "GPUSLICE_PRIORITY"),
        ("GPUSLICE_TENNANT", "GPUSLICE_TENANT"),
        ("GPUSLICE_LEDGER_DIRECTORY", "GPUSLICE_LEDGER_DIR"),
        ("GPUSLICE_CONTEXT_RESERVED", "GPUSLICE_CONTEXT_RESERVE"),
        ("GPUSLICE_REAL_LIBCUDA_PATH", "GPUSLICE_REAL_LIBCUDA"),
        ("GPUSLICE_LIBRARY_PATH", "GPUSLICE_LIBRARY"),
        // A word fewer.
        ("GPUSLICE_MEMORY", "GPUSLICE_MEMORY_LIMIT"),
        ("GPUSLICE_MEM", "GPUSLICE_MEMORY_LIMIT"),
        ("GPUSLICE_SHARE", "GPUSLICE_COMPUTE_SHARE"),
    ] {
        assert!(!is_known(typo), "{typo}");
        assert_eq!(closest(typo), vec![meant], "{typo}");
    }
}

#[test]
fn names_far_from_every_setting_have_no_closest() {
    for name in [
        "GPUSLICE_FOO",
        "GPUSLICE_XYZZY",
        "GPUSLICE_WORKERS",
        "GPUSLICE_",
        "GPUSLICE_BUILD_TIMESTAMP",
        "GPUSLICE_CUDA_DEVICE_MEMORY_LIMIT_0",
    ] {
        assert_eq!(closest(name), Vec::<&str>::new(), "{name}");
    }
}

#[test]
fn equally_close_settings_are_all_named() {
    // One word more than two settings: both are named.
    assert_eq!(
        closest("GPUSLICE_LEDGER_GROUP_DIR"),
        vec!["GPUSLICE_LEDGER_DIR", "GPUSLICE_LEDGER_GROUP"]
    );
    // One word fewer than two settings.
    assert_eq!(
        closest("GPUSLICE_CAP"),
        vec!["GPUSLICE_MEMORY_LIMIT", "GPUSLICE_COMPUTE_LIMIT"]
    );
}

#[test]
fn known_names_are_told_apart() {
    let all: Vec<&str> = known().collect();
    for k in &all {
        assert!(is_known(k) && is_gpuslice(k));
        assert!(k
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'));
        // No other known name reads as the same words (a typo of one would name both).
        for other in all.iter().filter(|o| *o != k) {
            for synonyms in [false, true] {
                let (a, b) = (Words::of(k, synonyms), Words::of(other, false));
                assert_ne!(score(&a, &b), Some(0), "{k} and {other}");
            }
        }
    }
    assert!(!is_known("GPUSLICE_memory_limit") && is_gpuslice("gpuslice_x"));
    assert!(!is_gpuslice("GPUSLIC") && !is_gpuslice("CUDA_VISIBLE_DEVICES"));
}

#[test]
fn distance_counts_edits_and_swaps() {
    assert_eq!(distance("LIMIT", "LIMIT"), 0);
    assert_eq!(distance("LIMT", "LIMIT"), 1);
    assert_eq!(distance("LIMTI", "LIMIT"), 1);
    assert_eq!(distance("", "LOG"), 3);
    assert_eq!(distance("CAP", "LIMIT"), 5);
    assert_eq!(
        distance("GPUSLICE_MEMORY_LIMIT", "GPUSLICE_LIMIT_MEMORY"),
        10
    );
    assert_eq!(distance(&"A".repeat(41), "A"), usize::MAX);
}

/// Every `GPUSLICE_*` name gpuslice reads or sets is known: the string literals of the Rust sources
/// that start with one (`"GPUSLICE_LEDGER"`, `"GPUSLICE_CONTEXT_RESERVE below ..."`), and every
/// `GPUSLICE_*` word of the scripts, CI and deployment files; the test kit's sources (which set
/// variables for the library) too. Tests (files named `*tests.rs` or under `tests/`) are left out:
/// they spell near misses on purpose.
#[test]
fn every_name_in_the_sources_is_known() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for dir in [
        "src",
        "state/src",
        "loader",
        "cli",
        "node/src",
        "observe/src",
        "shim-c",
        "scripts",
        "deploy",
        ".ci",
        "tests/kit/src",
    ] {
        walk(&root.join(dir), &mut files);
    }
    let mut seen = 0;
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy();
        let ext = f.extension().map(|e| e.to_string_lossy().into_owned());
        let rust = ext.as_deref() == Some("rs");
        if name.ends_with("tests.rs") || matches!(ext.as_deref(), Some("c" | "h" | "S")) {
            continue; // tests; C macro names (`GPUSLICE_HIDDEN`) are no variables
        }
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        let pattern = if rust { "\"GPUSLICE_" } else { "GPUSLICE_" };
        for (at, _) in text.match_indices(pattern) {
            let start = at + pattern.len() - "GPUSLICE_".len();
            let len = text[start..]
                .bytes()
                .take_while(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || *b == b'_')
                .count();
            let found = text[start..start + len].trim_end_matches('_');
            if found.len() <= "GPUSLICE".len() {
                continue; // the prefix itself
            }
            seen += 1;
            assert!(
                is_known(found),
                "{} names {found}, which config::names does not know: add it to table::SETTINGS or table::OTHER_VARIABLES",
                f.display()
            );
        }
    }
    assert!(seen > 50, "only {seen} names found: the walk is broken");
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if !matches!(
                e.file_name().to_str(),
                Some("tests" | "target" | "node_modules")
            ) {
                walk(&p, out);
            }
        } else {
            out.push(p);
        }
    }
}
