//! `gpuslice --version` names the commit it was built from: `GPUSLICE_COMMIT` when set (a build from
//! a source archive), else `git rev-parse` of the checkout, else "unknown commit" (not a git checkout,
//! or no git).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=GPUSLICE_COMMIT");
    let commit = match std::env::var("GPUSLICE_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_owned(),
        _ => {
            // Rebuilt when HEAD moves: HEAD itself, the branch it names, and packed refs (the files
            // that exist; a missing one would make cargo rerun this every build).
            let mut watch = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
            if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
                watch.push(branch);
            }
            for name in watch {
                if let Some(path) = git(&["rev-parse", "--git-path", &name]) {
                    let path = std::path::Path::new(&path);
                    let path = if path.is_relative() {
                        std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap())
                            .join(path)
                    } else {
                        path.to_path_buf()
                    };
                    if path.exists() {
                        println!("cargo:rerun-if-changed={}", path.display());
                    }
                }
            }
            match (
                git(&["rev-parse", "--short=12", "HEAD"]),
                git(&["log", "-1", "--format=%cs", "HEAD"]),
            ) {
                (Some(hash), Some(date)) => format!("{hash} {date}"),
                (Some(hash), None) => hash,
                _ => "unknown commit".to_owned(),
            }
        }
    };
    println!("cargo:rustc-env=GPUSLICE_COMMIT={commit}");
}
