//! `GPUSLICE_*` variables gpuslice does not know, found in the loader's one pass over the
//! environment: each is named once, with the closest known setting (`names.rs`) and what happens.
//!
//! A near miss of a setting that limits the tenant ([`FAIL_CLOSED_WHEN_MISTYPED`]), when that setting
//! is given by no source, is read as that setting with a value that cannot be read: it fails closed
//! exactly as `GPUSLICE_MEMORY_LIMIT=banana` does (an error line ending with what it does); equally
//! near two such limits, it is both (every device fails closed). Every other unknown variable is a
//! warning, and ignored.

use super::builder::{quoted, Builder};
use super::names;

/// The settings whose near misses fail closed, and why: a typo there would run the program less
/// limited than meant. `GPUSLICE_COMPUTE_SHARE` (a guarantee, the default share 10 applies),
/// `GPUSLICE_PRIORITY` (normal, as for a bad value), `GPUSLICE_CONTEXT_RESERVE` (contexts are then
/// measured, or charged 512 MiB) and the paths only warn: their typo limits no one less.
pub const FAIL_CLOSED_WHEN_MISTYPED: &[&str] = &[
    // Unset: no memory limit at all.
    "GPUSLICE_MEMORY_LIMIT",
    // Unset: no compute cap, the tenant takes every idle cycle.
    "GPUSLICE_COMPUTE_LIMIT",
    // Unset: the limits written in the file meant are not read.
    "GPUSLICE_QUOTA_FILE",
];

impl Builder {
    /// Names every variable of `unknown` (`(name, value)`), and fails closed for a near miss of an
    /// unset limit. Runs after every setting was read (so it knows which are set).
    pub(super) fn mistyped(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
        unknown: &[(&str, &str)],
    ) {
        for &(name, value) in unknown {
            let label = quoted(name, value);
            let near = names::closest(name);
            let meant = near.join(" or ");
            let limits: Vec<&str> = near
                .iter()
                .copied()
                .filter(|k| FAIL_CLOSED_WHEN_MISTYPED.contains(k))
                .filter(|k| self.given(k, env).is_none())
                .collect();
            if !limits.is_empty() {
                let (setting, each) = match limits.as_slice() {
                    [one] => (one.to_string(), format!("a {one}")),
                    more => (more.join(", "), "each of them with a value".into()),
                };
                let verb = if limits.len() == 1 { "is" } else { "are" };
                let msg = format!(
                    "{label}: unknown variable (did you mean {meant}?); a limit was meant and \
                     {setting} {verb} not set, so it is read as {each} that cannot be read"
                );
                match limits.as_slice() {
                    [one] => self.fail_closed(one, &label, msg),
                    // Equally close to two limits (`GPUSLICE_CAP`): both, which is every device.
                    _ => self.fail_all(msg),
                }
                continue;
            }
            let line = match near.first() {
                None => format!(
                    "{label}: unknown variable, ignored (gpuslice's variables: docs/CONFIGURATION.md)"
                ),
                Some(k) => match self.given(k, env) {
                    Some(from) if FAIL_CLOSED_WHEN_MISTYPED.contains(k) => format!(
                        "{label}: unknown variable (did you mean {meant}?), ignored: {from}"
                    ),
                    _ => format!("{label}: unknown variable (did you mean {meant}?), ignored"),
                },
            };
            self.cfg.warnings.push(line.clone());
            self.cfg.unknown.push(line);
        }
    }

    /// Where the limit setting `var` is given, when it is (by any of its sources).
    fn given(&self, var: &str, env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
        match var {
            "GPUSLICE_MEMORY_LIMIT" => self
                .cfg
                .memory
                .is_set()
                .then(|| format!("the memory limit is set ({})", self.cfg.memory_source)),
            "GPUSLICE_COMPUTE_LIMIT" => self
                .cfg
                .compute_limit
                .is_set()
                .then(|| "the compute cap is set".to_string()),
            "GPUSLICE_QUOTA_FILE" => {
                env(var).map(|v| format!("the quota file is set ({})", quoted(var, &v)))
            }
            _ => None,
        }
    }

    /// `setting` read as a value that cannot be read, `msg` saying why: what its reader does with a
    /// bad value (the per-device error for a limit, every device for the quota file).
    fn fail_closed(&mut self, setting: &str, label: &str, msg: String) {
        match setting {
            "GPUSLICE_MEMORY_LIMIT" => {
                self.cfg.memory.all = Some(Err(msg));
                self.cfg.memory_source = label.to_string();
            }
            "GPUSLICE_COMPUTE_LIMIT" => self.cfg.compute_limit.all = Some(Err(msg)),
            _ => self.fail_all(msg),
        }
    }
}

#[cfg(test)]
#[path = "mistyped_tests.rs"]
mod tests;
