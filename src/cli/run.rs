//! `gpuslice run`: the environment of a tenant, `LD_PRELOAD`, then exec.

use super::Args;
use crate::config::{parse_size, Units};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

/// Where libgpuslice.so is: `GPUSLICE_LIBRARY`, beside this executable, or the install locations.
pub(crate) fn library_path() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("GPUSLICE_LIBRARY") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate this executable: {e}"))?;
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    let candidates = [
        dir.join("libgpuslice.so"),
        dir.join("../lib/gpuslice/libgpuslice.so"),
        dir.join("../lib/libgpuslice.so"),
        PathBuf::from("/usr/lib/gpuslice/libgpuslice.so"),
    ];
    candidates
        .iter()
        .find(|p| p.exists())
        .map(|p| p.canonicalize().unwrap_or_else(|_| p.clone()))
        .ok_or_else(|| {
            format!(
                "libgpuslice.so not found beside {} (set GPUSLICE_LIBRARY)",
                exe.display()
            )
        })
}

pub(crate) fn run(args: &[String]) -> Result<i32, String> {
    let a = Args::parse(
        args,
        &["memory", "tenant", "ledger", "share", "limit", "priority"],
    )?;
    a.only(&["memory", "tenant", "ledger", "share", "limit", "priority"])?;
    let Some((program, program_args)) = a.rest.split_first() else {
        return Err("run: no command given (gpuslice run --memory 4GiB -- CMD ARGS...)".into());
    };
    let library = library_path()?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(program_args);
    if let Some(m) = a.value("memory") {
        parse_size(m, Units::Gpuslice).map_err(|e| format!("--memory {m:?}: {e}"))?;
        cmd.env("GPUSLICE_MEMORY_LIMIT", m);
    }
    for (flag, var) in [
        ("tenant", "GPUSLICE_TENANT"),
        ("ledger", "GPUSLICE_LEDGER"),
        ("share", "GPUSLICE_COMPUTE_SHARE"),
        ("limit", "GPUSLICE_COMPUTE_LIMIT"),
        ("priority", "GPUSLICE_PRIORITY"),
    ] {
        if let Some(v) = a.value(flag) {
            cmd.env(var, v);
        }
    }
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(existing) if !existing.is_empty() => format!("{}:{existing}", library.display()),
        _ => library.display().to_string(),
    };
    cmd.env("LD_PRELOAD", preload);
    // exec: the program replaces us, so its exit status and signals are the caller's to see.
    let err = cmd.exec();
    Err(format!("cannot run {program:?}: {err}"))
}
