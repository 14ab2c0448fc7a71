//! One reader per setting of [`super::table::SETTINGS`]: it gets the first tier of the setting's
//! sources that is set (all from one kind: gpuslice's variable, HAMi's or MPS's aliases, or the quota
//! file's keys) and stores the parsed value in its field of the [`Builder`]. Every message names the
//! value and its source (`Found::label`). An alias that is read leaves an info note saying how.
//! Returning `false` declines the tier: the loader hands the next one.

use super::builder::{quoted, Builder, Found, Tier};
use super::per_device::{describe, per_device};
use super::source::Source;
use super::{effect, format_bytes, parse_percent, parse_size, LogLevel, PerDevice, Priority};
use super::{Setting, Units};
use std::path::PathBuf;

/// A setting's reader.
pub(super) type Read = fn(&mut Builder, &Tier) -> bool;

/// A per-device list in gpuslice's syntax, from `found`.
fn list<T: Clone>(found: &Found, parse: impl Fn(&str) -> Result<T, String>) -> PerDevice<T> {
    per_device(&found.label, &found.value, parse)
}

/// Memory limit: `GPUSLICE_MEMORY_LIMIT` > HAMi's (`CUDA_DEVICE_MEMORY_LIMIT`, `_<i>`: lower-case
/// k/m/g are KiB/MiB/GiB) > MPS's (MB/GB are MiB/GiB) > the file's `memory_limit` and `[devices]`.
pub(super) fn memory_limit(b: &mut Builder, tier: &Tier) -> bool {
    let Some(first) = tier.first() else {
        return false;
    };
    b.cfg.memory_source = first.label.clone();
    b.cfg.memory = match first.source {
        Source::Hami(_) => {
            let mut out = PerDevice::default();
            for f in tier.found {
                match f.index {
                    None => {
                        out = list(f, |s| parse_size(s, Units::Hami));
                        b.note(format!(
                            "{} read as the memory limit {} (HAMi alias of GPUSLICE_MEMORY_LIMIT; lower-case k/m/g mean KiB/MiB/GiB)",
                            f.label,
                            describe(&out)
                        ));
                    }
                    Some(i) => {
                        let r = parse_size(&f.value, Units::Hami)
                            .map_err(|e| format!("{}: {e}", f.label));
                        if let Ok(n) = &r {
                            b.note(format!(
                                "{} read as the memory limit {} for device {i} (HAMi alias; lower-case k/m/g mean KiB/MiB/GiB)",
                                f.label,
                                format_bytes(*n)
                            ));
                        }
                        out.by_index.insert(i, r);
                    }
                }
            }
            out
        }
        Source::Mps(_) => {
            let out = list(first, |s| parse_size(s, Units::Mps));
            b.note(format!(
                "{} read as the memory limit {} (MPS alias of GPUSLICE_MEMORY_LIMIT; MPS's MB/GB mean MiB/GiB)",
                first.label,
                describe(&out)
            ));
            out
        }
        // The quota file's `memory_limit` and `[devices]`, merged when the file was read.
        Source::File(_) => b.file.memory.clone(),
        Source::Env(_) => list(first, |s| parse_size(s, Units::Gpuslice)),
    };
    true
}

/// Compute share: `GPUSLICE_COMPUTE_SHARE` > the file's `compute_share`.
pub(super) fn compute_share(b: &mut Builder, tier: &Tier) -> bool {
    let Some(f) = tier.first() else {
        return false;
    };
    b.cfg.compute_share = list(f, parse_percent);
    true
}

/// Compute cap: `GPUSLICE_COMPUTE_LIMIT` > HAMi's `CUDA_DEVICE_SM_LIMIT[_<i>]` (0 means none;
/// `GPU_CORE_UTILIZATION_POLICY=disable` ignores them) > MPS's `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` >
/// the file's `compute_limit`.
pub(super) fn compute_cap(b: &mut Builder, tier: &Tier) -> bool {
    let Some(first) = tier.first() else {
        return false;
    };
    b.cfg.compute_limit = match first.source {
        Source::Hami(_) => {
            if !hami_core_policy_applies(b, tier.env) {
                return false;
            }
            let mut out = PerDevice::default();
            for f in tier.found {
                let what = match f.index {
                    Some(i) => format!("device {i}"),
                    None => "every device".to_string(),
                };
                // HAMi treats 0 (and 100) as "no limit".
                if f.value.trim() == "0" {
                    b.note(format!(
                        "{} read as no compute cap for {what} (HAMi alias; 0 means unlimited)",
                        f.label
                    ));
                    continue;
                }
                let r = parse_percent(&f.value).map_err(|e| format!("{}: {e}", f.label));
                if let Ok(p) = &r {
                    b.note(format!(
                        "{} read as a compute cap of {p}% for {what} (HAMi alias of GPUSLICE_COMPUTE_LIMIT)",
                        f.label
                    ));
                }
                match f.index {
                    Some(i) => {
                        out.by_index.insert(i, r);
                    }
                    None => out.all = Some(r),
                }
            }
            out
        }
        Source::Mps(_) => {
            let f = first;
            let r = parse_percent(&f.value).map_err(|e| format!("{}: {e}", f.label));
            if let Ok(p) = &r {
                b.note(format!(
                    "{} read as a compute cap of {p}% for every device (MPS alias of GPUSLICE_COMPUTE_LIMIT)",
                    f.label
                ));
            }
            PerDevice {
                all: Some(r),
                ..PerDevice::default()
            }
        }
        Source::Env(_) | Source::File(_) => list(first, parse_percent),
    };
    true
}

/// `GPU_CORE_UTILIZATION_POLICY`: `disable` ignores HAMi's `CUDA_DEVICE_SM_LIMIT*`; `default` and
/// `force` keep it (a gpuslice cap is always enforced, which is HAMi's `force`).
fn hami_core_policy_applies(b: &mut Builder, env: &dyn Fn(&str) -> Option<String>) -> bool {
    let Some(v) = env("GPU_CORE_UTILIZATION_POLICY") else {
        return true;
    };
    let src = quoted("GPU_CORE_UTILIZATION_POLICY", &v);
    let (applies, how) = match v.trim().to_ascii_lowercase().as_str() {
        "disable" => (false, ": CUDA_DEVICE_SM_LIMIT* ignored (HAMi's switch; GPUSLICE_COMPUTE_LIMIT still applies)"),
        "force" | "default" | "" => (true, " read as: CUDA_DEVICE_SM_LIMIT* is a compute cap enforced whenever the tenant runs (HAMi's force)"),
        _ => (true, ": unknown value read as default (expected default, force or disable)"),
    };
    b.note(format!("{src}{how}"));
    applies
}

/// Priority: `GPUSLICE_PRIORITY` > HAMi's `CUDA_TASK_PRIORITY` (0 high, 1 normal) > the file's
/// `priority`.
pub(super) fn priority(b: &mut Builder, tier: &Tier) -> bool {
    let Some(f) = tier.first() else {
        return false;
    };
    let (src, value) = match f.source {
        Source::Hami(_) => {
            let ours = match f.value.trim() {
                "0" => "high",
                "1" => "normal",
                // Reaches the parser below, which names it.
                _ => "(invalid)",
            };
            if ours != "(invalid)" {
                b.note(format!(
                    "{} read as priority {ours} (HAMi alias of GPUSLICE_PRIORITY; 0 is high, 1 normal)",
                    f.label
                ));
            }
            (format!("{} (HAMi: 0 or 1)", f.label), ours)
        }
        _ => (f.label.clone(), f.value.trim()),
    };
    b.cfg.priority = match value {
        "high" => Setting::Value(Priority::High),
        "normal" => Setting::Value(Priority::Normal),
        _ => Setting::Invalid(format!("{src}: unknown priority (expected high or normal)")),
    };
    true
}

/// Tenant: `GPUSLICE_TENANT` > the file's `tenant`.
pub(super) fn tenant(b: &mut Builder, tier: &Tier) -> bool {
    let Some(f) = tier.first() else {
        return false;
    };
    match check_tenant(&f.value) {
        Ok(()) => b.tenant = Some(f.value.clone()),
        Err(e) => b.fail_all(format!("{}: {e}", f.label)),
    }
    true
}

pub(super) fn check_tenant(t: &str) -> Result<(), String> {
    let ok = !t.is_empty()
        && t.len() <= 64
        && !t.starts_with('.')
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err("bad tenant name (expected 1 to 64 of A-Z a-z 0-9 . _ -, not starting with .)".into())
    }
}

/// Ledger: `GPUSLICE_LEDGER` > HAMi's `CUDA_DEVICE_MEMORY_SHARED_CACHE` (where HAMi keeps its shared
/// region) > the file's `ledger`, which belongs to the file's tenant: a tenant named in the
/// environment uses its own default ledger.
pub(super) fn ledger(b: &mut Builder, tier: &Tier) -> bool {
    let Some(f) = tier.first() else {
        return false;
    };
    match f.source {
        Source::File(_) if (tier.env)("GPUSLICE_TENANT").is_some() => return false,
        Source::Hami(_) => b.note(format!(
            "{} read as the ledger path (HAMi alias of GPUSLICE_LEDGER)",
            f.label
        )),
        _ => {}
    }
    let v = &f.value;
    if v.is_empty() || !v.starts_with('/') || v.ends_with('/') {
        b.fail_all(format!(
            "{}: not an absolute file path (expected e.g. /dev/shm/gpuslice/team-a.ledger)",
            f.label
        ));
    } else {
        b.ledger = Some(PathBuf::from(v));
    }
    true
}

/// Ledger directory: `GPUSLICE_LEDGER_DIR`.
pub(super) fn ledger_dir(b: &mut Builder, tier: &Tier) -> bool {
    let Some(f) = tier.first() else {
        return false;
    };
    if f.value.starts_with('/') {
        b.ledger_dir = Some(PathBuf::from(&f.value));
    } else {
        b.fail_all(format!(
            "{}: not an absolute directory (expected e.g. /dev/shm/gpuslice)",
            f.label
        ));
    }
    true
}

/// Ledger group: `GPUSLICE_LEDGER_GROUP` > the file's `ledger_group`; empty means none.
pub(super) fn ledger_group(b: &mut Builder, tier: &Tier) -> bool {
    let Some(f) = tier.first() else {
        return false;
    };
    b.cfg.ledger_group = Some(f.value.clone()).filter(|g| !g.trim().is_empty());
    true
}

/// Context reserve: `GPUSLICE_CONTEXT_RESERVE`, a size.
pub(super) fn context_reserve(b: &mut Builder, tier: &Tier) -> bool {
    let Some(f) = tier.first() else {
        return false;
    };
    match parse_size(&f.value, Units::Gpuslice) {
        Ok(n) => b.cfg.context_reserve = Some(n),
        Err(e) => b.fail_all(format!("{}: {e}", f.label)),
    }
    true
}

/// Log level: `GPUSLICE_LOG` (empty: the default, warn) > HAMi's `LIBCUDA_LOG_LEVEL` (0 errors only,
/// 1 and 2 warnings, 3 info, 4 debug).
pub(super) fn log_level(b: &mut Builder, tier: &Tier) -> bool {
    let Some(f) = tier.first() else {
        return false;
    };
    let v = f.value.trim();
    if let Source::Hami(_) = f.source {
        let (ours, name) = match v {
            "0" => (LogLevel::Error, "error"),
            "1" | "2" => (LogLevel::Warn, "warn"),
            "3" => (LogLevel::Info, "info"),
            "4" => (LogLevel::Debug, "debug"),
            _ => {
                let msg = format!("{}: unknown HAMi log level (expected 0 to 4)", f.label);
                b.fail(msg, effect::LOG);
                return true;
            }
        };
        b.note(format!(
            "{} read as log level {name} (HAMi alias of GPUSLICE_LOG)",
            f.label
        ));
        b.cfg.log_level = ours;
    } else if !v.is_empty() {
        match LogLevel::parse(v) {
            Some(level) => b.cfg.log_level = level,
            None => b.fail(
                format!(
                    "{}: unknown log level (expected off, error, warn, info, debug, trace)",
                    f.label
                ),
                effect::LOG,
            ),
        }
    }
    true
}

/// Device-ledger directory: `GPUSLICE_DEVICE_DIR` (empty: the default; a node policy's wins).
pub(super) fn device_dir(b: &mut Builder, tier: &Tier) -> bool {
    let Some(f) = tier.first() else {
        return false;
    };
    b.device_dir = Some(PathBuf::from(&f.value)).filter(|_| !f.value.is_empty());
    true
}
