//! What a release of the `gpuslice` command promises besides its subcommands: `--version` names the
//! commit it was built from, `gpuslice completions SHELL` prints a completion script for each shell,
//! and sizes in Kubernetes' spelling (`4Gi`) are accepted where the command parses sizes.

use gpuslice_testkit as common;

use common::*;
use std::process::Command;

fn gpuslice(args: &[&str]) -> Run {
    run_command(clean_command(gpuslice_bin()).args(args))
}

#[test]
fn version_names_the_commit() {
    let r = gpuslice(&["--version"]);
    r.assert_success();
    let version = r.stdout.trim();
    assert!(
        version.starts_with(&format!("gpuslice {} (", env!("CARGO_PKG_VERSION"))),
        "{}",
        r.report()
    );
    // The checkout's commit, as cli/build.rs reads it (or its fallback outside a git checkout).
    let head = Command::new("git")
        .arg("-C")
        .arg(root())
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match (std::env::var("GPUSLICE_COMMIT"), head) {
        (Ok(c), _) if !c.trim().is_empty() => assert!(version.contains(c.trim()), "{version}"),
        (_, Some(head)) => assert!(
            version.contains(&format!("({head} ")),
            "--version should name HEAD {head}: {version}"
        ),
        _ => assert!(version.ends_with("(unknown commit)"), "{version}"),
    }
}

#[test]
fn completions_for_each_shell() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef gpuslice"),
        ("fish", "complete -c gpuslice"),
    ] {
        let r = gpuslice(&["completions", shell]);
        r.assert_success();
        assert!(
            r.stdout.contains(marker),
            "{shell}: no {marker:?}\n{}",
            r.report()
        );
        // Subcommands and their options (fish spells `--memory` as `-l memory`) are in it.
        for word in ["device-plugin", "install-library", "memory"] {
            assert!(r.stdout.contains(word), "{shell}: no {word:?}");
        }
    }
    let r = gpuslice(&["completions", "tcsh"]);
    r.assert_failure();
    assert!(r.stderr.contains("tcsh"), "{}", r.report());
}

#[test]
fn kubernetes_sizes_on_the_command_line() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli-release-{}", std::process::id()));
    let ledger = dir.join("absent.ledger");
    let ledger = ledger.to_str().unwrap();
    // A size the parser refuses is named as such...
    let r = gpuslice(&["set", "--memory", "4Gx", "--ledger", ledger]);
    r.assert_failure();
    assert!(
        r.stderr.contains("--memory \"4Gx\": unknown unit \"Gx\""),
        "{}",
        r.report()
    );
    // ...`4Gi` is not: the command goes on to the ledger, which does not exist.
    for size in ["4Gi", "512Mi", "1Ti"] {
        let r = gpuslice(&["set", "--memory", size, "--ledger", ledger]);
        r.assert_failure();
        assert!(!r.stderr.contains("--memory"), "{size}: {}", r.report());
        assert!(r.stderr.contains("absent.ledger"), "{size}: {}", r.report());
    }
}
