//! The `gpuslice` command line. Each subcommand is a module; arguments are parsed by hand (a handful of
//! flags does not need a parser crate in a tool whose library is preloaded everywhere).

mod compute;
mod demo;
mod doctor;
mod run;
mod status;

use std::path::PathBuf;

const USAGE: &str = "\
gpuslice: GPU sharing for unmodified CUDA programs

usage:
  gpuslice run [--memory SIZE] [--tenant NAME] [--ledger PATH] -- CMD [ARGS...]
      run CMD with libgpuslice.so preloaded and the given quota (exit code and signals pass through)
  gpuslice status [--tenant NAME | --ledger PATH] [--json]
      per device: limit, used, peak; processes and their usage (read-only)
  gpuslice set --memory SIZE [--device GPU-UUID|INDEX] [--tenant NAME | --ledger PATH]
      change a running tenant's limit; applies to its next allocation
  gpuslice set [--share PCT] [--limit PCT|none] [--priority high|normal] [--tenant NAME] [--device GPU-UUID]
      change a tenant's compute share, cap or priority in the device ledgers (GPUSLICE_DEVICE_DIR)
  gpuslice status --compute [--device GPU-UUID] [--json]
      per device and tenant: share, cap, priority, achieved share (last ~15 s), time spent waiting
  gpuslice doctor
      is the quota enforced for CUDA programs started here, how, and what is misconfigured (exit 1 if not)
  gpuslice demo
      two tenants share one GPU (simulated by simgpu when no NVIDIA driver is present)

SIZE: 4GiB, 4096MiB, 4G, 1.5GiB or bytes. Environment: see docs/CONFIGURATION.md.";

/// Parsed `--flag value` pairs and positional words, up to a `--`.
pub(crate) struct Args {
    flags: Vec<(String, Option<String>)>,
    pub rest: Vec<String>,
}

impl Args {
    /// `valued`: flags that take a value.
    fn parse(args: &[String], valued: &[&str]) -> Result<Args, String> {
        let mut flags = Vec::new();
        let mut rest = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "--" {
                rest.extend(it.by_ref().cloned());
                break;
            }
            if let Some(name) = a.strip_prefix("--") {
                let (name, inline) = match name.split_once('=') {
                    Some((n, v)) => (n, Some(v.to_owned())),
                    None => (name, None),
                };
                if valued.contains(&name) {
                    let value = match inline {
                        Some(v) => v,
                        None => it
                            .next()
                            .cloned()
                            .ok_or_else(|| format!("--{name} needs a value"))?,
                    };
                    flags.push((name.to_owned(), Some(value)));
                } else {
                    flags.push((name.to_owned(), None));
                }
            } else {
                rest.push(a.clone());
                rest.extend(it.by_ref().cloned());
                break;
            }
        }
        Ok(Args { flags, rest })
    }
    fn value(&self, name: &str) -> Option<&str> {
        self.flags
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
    }
    fn has(&self, name: &str) -> bool {
        self.flags.iter().any(|(n, _)| n == name)
    }
    /// Rejects flags the subcommand does not know.
    fn only(&self, known: &[&str]) -> Result<(), String> {
        match self
            .flags
            .iter()
            .find(|(n, _)| !known.contains(&n.as_str()))
        {
            Some((n, _)) => Err(format!("unknown option --{n}")),
            None => Ok(()),
        }
    }
}

/// The ledger a subcommand works on: `--ledger`, else the tenant's default, else the configuration's.
pub(crate) fn ledger_path(args: &Args) -> PathBuf {
    if let Some(p) = args.value("ledger") {
        return PathBuf::from(p);
    }
    if let Some(t) = args.value("tenant") {
        return PathBuf::from(crate::config::DEFAULT_LEDGER_DIR).join(format!("{t}.ledger"));
    }
    crate::config::load().ledger_path
}

/// Runs the command line; returns the process exit code.
pub fn main(args: Vec<String>) -> i32 {
    let Some((cmd, rest)) = args.split_first() else {
        eprintln!("{USAGE}");
        return 2;
    };
    let result = match cmd.as_str() {
        "run" => run::run(rest),
        "status" if rest.iter().any(|a| a == "--compute") => {
            let rest: Vec<String> = rest.iter().filter(|a| *a != "--compute").cloned().collect();
            compute::status(&rest)
        }
        "status" => status::status(rest).inspect(|_| {
            // The compute section, when device ledgers exist (shares in use on this machine).
            let text = compute::status_text(&[], rest.iter().any(|a| a == "--json"));
            if !text.is_empty() && text != "[]" {
                println!("{text}");
            }
        }),
        "set" if compute::wants(rest) => compute::set(rest),
        "set" => status::set(rest),
        "demo" => demo::demo(rest),
        "doctor" => doctor::doctor(rest),
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            Ok(0)
        }
        other => Err(format!("unknown command {other:?}\n\n{USAGE}")),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("gpuslice: {message}");
            2
        }
    }
}
