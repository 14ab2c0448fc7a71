//! Every setting in one table: its sources in precedence order (gpuslice's variable, then HAMi's
//! and MPS's aliases, then the quota file), who reads it, and its scope. The documentation's table
//! (docs/CONFIGURATION.md, checked by a test) and `gpuslice doctor`'s "settings" report are derived
//! from it; a test checks that the loader reacts to every variable listed here.
//!
//! The loader (`load.rs`) walks this table: for each row it finds the first tier of sources that is
//! set (`GPUSLICE_*`, then HAMi's, then MPS's variables, then the quota file's keys) and hands what
//! it found to the row's reader (`readers.rs`), which parses it into the setting's field of
//! [`crate::config::Config`]; lower tiers that are set too are reported as ignored. A new setting is
//! one row here, its reader and its field; the docs test then says what to paste into
//! docs/CONFIGURATION.md.

use super::readers::{self, Read};
pub use super::source::Source;

/// How far a setting reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// One value per device (a bare value, an index or a UUID list).
    PerDevice,
    /// The tenant: fixed by whoever creates its ledger (joiners obey the ledger).
    Tenant,
    /// This process only.
    Process,
}

/// Which part of gpuslice reads the setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    /// `config::load` (everything in [`crate::config::Config`]).
    Config,
    /// The node policy loader (`config::policy`).
    Policy,
    /// The driver finder (`driver`).
    Driver,
}

/// One setting.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub name: &'static str,
    /// First set wins.
    pub sources: &'static [Source],
    pub scope: Scope,
    pub reader: Reader,
    /// What it holds, for the docs table.
    pub value: &'static str,
    /// How `config::load` stores what it found (`None`: read by another part, see `reader`, or
    /// read before the others, like the quota file that is itself a source).
    read: Option<Read>,
}

impl Spec {
    /// The loader's reader for this setting.
    pub(super) fn read(&self) -> Option<Read> {
        self.read
    }
}

/// The quota file's top-level keys, in the table's order.
pub fn file_keys() -> impl Iterator<Item = &'static str> {
    SETTINGS
        .iter()
        .flat_map(|s| s.sources)
        .filter_map(|src| match *src {
            Source::File(k) if k != DEVICES_TABLE => Some(k),
            _ => None,
        })
}

/// The quota file's per-device table, written as a source.
pub const DEVICES_TABLE: &str = "[devices]";

use Source::{Env, File, Hami, Mps};

/// Every setting, in the order the docs list them (who the tenant is, then what it gets); the quota
/// file's keys are listed in this order too.
pub const SETTINGS: &[Spec] = &[
    Spec {
        name: "tenant",
        sources: &[Env("GPUSLICE_TENANT"), File("tenant")],
        scope: Scope::Process,
        reader: Reader::Config,
        value: "a name, `A-Za-z0-9._-`, at most 64",
        read: Some(readers::tenant),
    },
    Spec {
        name: "ledger",
        sources: &[
            Env("GPUSLICE_LEDGER"),
            Hami("CUDA_DEVICE_MEMORY_SHARED_CACHE"),
            File("ledger"),
        ],
        scope: Scope::Process,
        reader: Reader::Config,
        value: "an absolute file path",
        read: Some(readers::ledger),
    },
    Spec {
        name: "ledger directory",
        sources: &[Env("GPUSLICE_LEDGER_DIR")],
        scope: Scope::Process,
        reader: Reader::Config,
        value: "an absolute directory",
        read: Some(readers::ledger_dir),
    },
    Spec {
        name: "ledger group",
        sources: &[Env("GPUSLICE_LEDGER_GROUP"), File("ledger_group")],
        scope: Scope::Tenant,
        reader: Reader::Config,
        value: "a group name or gid",
        read: Some(readers::ledger_group),
    },
    Spec {
        name: "memory limit",
        sources: &[
            Env("GPUSLICE_MEMORY_LIMIT"),
            Hami("CUDA_DEVICE_MEMORY_LIMIT"),
            Hami("CUDA_DEVICE_MEMORY_LIMIT_<i>"),
            Mps("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
            File("memory_limit"),
            File(DEVICES_TABLE),
        ],
        scope: Scope::PerDevice,
        reader: Reader::Config,
        value: "a size, or a per-device list",
        read: Some(readers::memory_limit),
    },
    Spec {
        name: "compute share",
        sources: &[Env("GPUSLICE_COMPUTE_SHARE"), File("compute_share")],
        scope: Scope::PerDevice,
        reader: Reader::Config,
        value: "percent 1..100",
        read: Some(readers::compute_share),
    },
    Spec {
        name: "compute cap",
        sources: &[
            Env("GPUSLICE_COMPUTE_LIMIT"),
            Hami("CUDA_DEVICE_SM_LIMIT"),
            Hami("CUDA_DEVICE_SM_LIMIT_<i>"),
            Mps("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
            File("compute_limit"),
        ],
        scope: Scope::PerDevice,
        reader: Reader::Config,
        value: "percent 1..100",
        read: Some(readers::compute_cap),
    },
    Spec {
        name: "HAMi compute-cap policy",
        sources: &[Hami("GPU_CORE_UTILIZATION_POLICY")],
        scope: Scope::Process,
        reader: Reader::Config,
        value: "`default`, `force`, `disable` (ignores `CUDA_DEVICE_SM_LIMIT*`)",
        read: None,
    },
    Spec {
        name: "priority",
        sources: &[
            Env("GPUSLICE_PRIORITY"),
            Hami("CUDA_TASK_PRIORITY"),
            File("priority"),
        ],
        scope: Scope::Tenant,
        reader: Reader::Config,
        value: "`high` or `normal` (HAMi: 0 or 1)",
        read: Some(readers::priority),
    },
    Spec {
        name: "quota file",
        sources: &[Env("GPUSLICE_QUOTA_FILE")],
        scope: Scope::Process,
        reader: Reader::Config,
        value: "a path (default `/etc/gpuslice/quota.toml` when it exists)",
        read: None,
    },
    Spec {
        name: "context reserve",
        sources: &[Env("GPUSLICE_CONTEXT_RESERVE")],
        scope: Scope::Process,
        reader: Reader::Config,
        value: "a size",
        read: Some(readers::context_reserve),
    },
    Spec {
        name: "log level",
        sources: &[Env("GPUSLICE_LOG"), Hami("LIBCUDA_LOG_LEVEL")],
        scope: Scope::Process,
        reader: Reader::Config,
        value: "`off` .. `trace` (HAMi: 0 .. 4)",
        read: Some(readers::log_level),
    },
    Spec {
        name: "node policy",
        sources: &[Env("GPUSLICE_POLICY")],
        scope: Scope::Process,
        reader: Reader::Policy,
        value: "a path (when `/run/gpuslice/tenant/policy.toml` does not exist)",
        read: None,
    },
    Spec {
        name: "device ledger directory",
        sources: &[Env("GPUSLICE_DEVICE_DIR")],
        scope: Scope::Process,
        reader: Reader::Config,
        value: "a directory (default `<ledger dir>/devices`; a node policy's wins)",
        read: Some(readers::device_dir),
    },
    Spec {
        name: "real driver",
        sources: &[Env("GPUSLICE_REAL_LIBCUDA")],
        scope: Scope::Process,
        reader: Reader::Driver,
        value: "a path",
        read: None,
    },
    Spec {
        name: "real NVML",
        sources: &[Env("GPUSLICE_REAL_NVML")],
        scope: Scope::Process,
        reader: Reader::Driver,
        value: "a path",
        read: None,
    },
    Spec {
        name: "NVIDIA driver's files",
        sources: &[Env("GPUSLICE_NVIDIA_ROOT")],
        scope: Scope::Process,
        reader: Reader::Driver,
        value: "a directory standing for `/` where `proc/driver/nvidia` and `dev/nvidia-caps` are looked for (default `/`; tests: simgpu's `SIMGPU_NVIDIA_ROOT`)",
        read: None,
    },
];

/// `GPUSLICE_*` variables that are no setting of the library but are read by another part of
/// gpuslice (who reads them, for messages): the library knows them, so it does not call them
/// unknown (`names.rs`).
pub const OTHER_VARIABLES: &[(&str, &str)] = &[
    (
        "GPUSLICE_LIBRARY",
        "`gpuslice run` (where libgpuslice.so is)",
    ),
    ("GPUSLICE_SIMGPU", "`gpuslice demo` (simgpu's libraries)"),
    (
        "GPUSLICE_DEMO_SIMGPU",
        "`gpuslice demo` (simgpu even beside a driver)",
    ),
    ("GPUSLICE_COMMIT", "the build (`gpuslice --version`)"),
    ("GPUSLICE_RELEASE_PACKAGES", "scripts/build-release"),
    ("GPUSLICE_GLIBC_FLOOR", "scripts/check-glibc"),
    ("GPUSLICE_DEBIAN_MIRROR", "scripts/debian-rootfs"),
    ("GPUSLICE_OLD_SUITE", "scripts/old-glibc-test"),
];

/// The docs table (docs/CONFIGURATION.md, between its `settings-table` markers).
pub fn docs_table() -> String {
    let mut out = String::from(
        "| setting | sources, the first set wins | scope | value |\n|---|---|---|---|\n",
    );
    for s in SETTINGS {
        let sources: Vec<String> = s.sources.iter().map(|x| x.describe()).collect();
        let scope = match s.scope {
            Scope::PerDevice => "per device",
            Scope::Tenant => "tenant (its ledger's creator)",
            Scope::Process => "process",
        };
        out.push_str(&format!(
            "| {} | {} | {scope} | {} |\n",
            s.name,
            sources.join(" > "),
            s.value
        ));
    }
    out
}

/// For `gpuslice doctor`: per setting set anywhere, the source it comes from (the first set), with
/// `env` the environment and `file_keys` the quota file's top-level keys.
pub fn report(env: &dyn Fn(&str) -> Option<String>, file_keys: &[String]) -> Vec<String> {
    let mut lines = Vec::new();
    for s in SETTINGS {
        let found = s.sources.iter().find_map(|src| match *src {
            Source::File(k) => file_keys.iter().any(|f| f == k).then(|| src.describe()),
            other => {
                let var = other.variable()?;
                let value = match var.strip_suffix("_<i>") {
                    Some(prefix) => (0..64).find_map(|i| env(&format!("{prefix}_{i}"))),
                    None => env(var),
                };
                value.map(|v| format!("{}={v:?}", var.replace("_<i>", "_*")))
            }
        });
        if let Some(f) = found {
            lines.push(format!("{}: {f}", s.name));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The docs cannot drift from the table.
    #[test]
    fn configuration_doc_holds_the_generated_table() {
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/CONFIGURATION.md"),
        )
        .unwrap();
        let begin = "<!-- settings-table:begin (generated from state/src/config/table.rs) -->\n";
        let end = "<!-- settings-table:end -->";
        let (Some(a), Some(b)) = (doc.find(begin), doc.find(end)) else {
            panic!("docs/CONFIGURATION.md lacks the settings-table markers");
        };
        assert_eq!(
            &doc[a + begin.len()..b],
            docs_table(),
            "docs/CONFIGURATION.md's settings table differs from state/src/config/table.rs; paste:\n{}",
            docs_table()
        );
    }

    /// Every variable the table says the configuration reads changes what it loads.
    #[test]
    fn the_loader_reads_every_variable_of_the_table() {
        let load = |vars: &[(String, String)]| {
            let map: HashMap<String, String> = vars.iter().cloned().collect();
            let c = crate::config::load_with_policy(
                &|k| map.get(k).cloned(),
                std::path::Path::new("/nonexistent/quota.toml"),
                std::path::Path::new("/nonexistent/policy.toml"),
            );
            format!("{c:?}")
        };
        // A variable that only modifies another one is tried with that one set.
        let companion = |name: &str| match name {
            "GPU_CORE_UTILIZATION_POLICY" => {
                vec![("CUDA_DEVICE_SM_LIMIT".to_string(), "50".to_string())]
            }
            _ => vec![],
        };
        for s in SETTINGS.iter().filter(|s| s.reader == Reader::Config) {
            for v in s.sources.iter().filter_map(|x| x.variable()) {
                let name = v.replace("_<i>", "_0");
                let with = companion(&name);
                let base = load(&with);
                let changed = ["zz", "/x/y.ledger", "1", "disable"].iter().any(|value| {
                    let mut vars = with.clone();
                    vars.push((name.clone(), value.to_string()));
                    load(&vars) != base
                });
                assert!(
                    changed,
                    "{name} ({}) changes nothing the loader reads",
                    s.name
                );
            }
        }
    }
}
