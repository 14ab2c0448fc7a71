//! The aliases borrowed from HAMi and MPS, each read into gpuslice's setting with an info note.

use super::{
    describe, effect, format_bytes, parse_percent, parse_size, per_device, quoted, Builder,
    PerDevice, Units, MAX_ALIAS_INDEX,
};

/// The values of `<prefix>0` .. `<prefix>63` that are set. Names are built without `format!`: this
/// runs in every process at start-up.
pub(super) fn indexed_aliases(
    env: &dyn Fn(&str) -> Option<String>,
    prefix: &str,
) -> Vec<(u32, String)> {
    let mut name = String::with_capacity(prefix.len() + 2);
    (0..MAX_ALIAS_INDEX)
        .filter_map(|i| {
            name.clear();
            name.push_str(prefix);
            if i >= 10 {
                name.push(char::from(b'0' + (i / 10) as u8));
            }
            name.push(char::from(b'0' + (i % 10) as u8));
            env(&name).map(|v| (i, v))
        })
        .collect()
}

/// HAMi's other variables, each read with an info note (`GPUSLICE_*` wins over every one of them).
impl Builder {
    /// `CUDA_TASK_PRIORITY`: HAMi's 0 is high priority, 1 (its default) normal.
    pub(super) fn hami_priority(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Option<(String, String)> {
        let v = env("CUDA_TASK_PRIORITY")?;
        let src = quoted("CUDA_TASK_PRIORITY", &v);
        let ours = match v.trim() {
            "0" => "high",
            "1" => "normal",
            _ => "(invalid)",
        };
        if ours != "(invalid)" {
            self.notes.push(format!(
                "{src} read as priority {ours} (HAMi alias of GPUSLICE_PRIORITY; 0 is high, 1 normal)"
            ));
        }
        // An invalid value reaches the priority parser, which names it.
        Some((format!("{src} (HAMi: 0 or 1)"), ours.to_string()))
    }

    /// `LIBCUDA_LOG_LEVEL`: HAMi's 0 errors only, 1 and 2 warnings, 3 info, 4 debug.
    pub(super) fn hami_log_level(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Option<String> {
        let v = env("LIBCUDA_LOG_LEVEL")?;
        let ours = match v.trim() {
            "0" => "error",
            "1" | "2" => "warn",
            "3" => "info",
            "4" => "debug",
            _ => {
                let msg = format!(
                    "{}: unknown HAMi log level (expected 0 to 4)",
                    quoted("LIBCUDA_LOG_LEVEL", &v)
                );
                self.effects.insert(msg.clone(), effect::LOG);
                self.errors.push(msg);
                return None;
            }
        };
        self.notes.push(format!(
            "{} read as log level {ours} (HAMi alias of GPUSLICE_LOG)",
            quoted("LIBCUDA_LOG_LEVEL", &v)
        ));
        Some(ours.to_string())
    }

    /// `CUDA_DEVICE_MEMORY_SHARED_CACHE`: where HAMi keeps its shared region; our ledger goes there.
    pub(super) fn hami_ledger(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Option<(String, String)> {
        let v = env("CUDA_DEVICE_MEMORY_SHARED_CACHE")?;
        let src = quoted("CUDA_DEVICE_MEMORY_SHARED_CACHE", &v);
        self.notes.push(format!(
            "{src} read as the ledger path (HAMi alias of GPUSLICE_LEDGER)"
        ));
        Some((src, v))
    }

    /// `GPU_CORE_UTILIZATION_POLICY`: `disable` ignores HAMi's `CUDA_DEVICE_SM_LIMIT*`; `default` and
    /// `force` keep it (a gpuslice cap is always enforced, which is HAMi's `force`).
    pub(super) fn hami_core_policy_applies(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> bool {
        let Some(v) = env("GPU_CORE_UTILIZATION_POLICY") else {
            return true;
        };
        let src = quoted("GPU_CORE_UTILIZATION_POLICY", &v);
        match v.trim().to_ascii_lowercase().as_str() {
            "disable" => {
                self.notes.push(format!(
                    "{src}: CUDA_DEVICE_SM_LIMIT* ignored (HAMi's switch; GPUSLICE_COMPUTE_LIMIT still applies)"
                ));
                false
            }
            "force" | "default" | "" => {
                self.notes.push(format!(
                    "{src} read as: CUDA_DEVICE_SM_LIMIT* is a compute cap enforced whenever the tenant runs (HAMi's force)"
                ));
                true
            }
            _ => {
                self.notes.push(format!(
                    "{src}: unknown value read as default (expected default, force or disable)"
                ));
                true
            }
        }
    }
}

impl Builder {
    /// Memory limit from `GPUSLICE_MEMORY_LIMIT` or its aliases; `None` if the environment sets none.
    pub(super) fn memory_from_env(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Option<PerDevice<u64>> {
        let hami_all = env("CUDA_DEVICE_MEMORY_LIMIT");
        let hami_each = indexed_aliases(env, "CUDA_DEVICE_MEMORY_LIMIT_");
        let mps = env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
        let hami_set = hami_all.is_some() || !hami_each.is_empty();

        if let Some(v) = env("GPUSLICE_MEMORY_LIMIT") {
            if hami_set || mps.is_some() {
                self.notes.push(
                    "GPUSLICE_MEMORY_LIMIT is set: ignoring CUDA_DEVICE_MEMORY_LIMIT* and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(),
                );
            }
            let src = quoted("GPUSLICE_MEMORY_LIMIT", &v);
            return Some(per_device(&src, &v, |s| parse_size(s, Units::Gpuslice)));
        }
        if hami_set {
            if mps.is_some() {
                self.notes.push(
                    "CUDA_DEVICE_MEMORY_LIMIT is set: ignoring CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
                        .into(),
                );
            }
            let mut out = PerDevice::default();
            if let Some(v) = hami_all {
                let src = quoted("CUDA_DEVICE_MEMORY_LIMIT", &v);
                out = per_device(&src, &v, |s| parse_size(s, Units::Hami));
                self.notes.push(format!(
                    "{src} read as the memory limit {} (HAMi alias of GPUSLICE_MEMORY_LIMIT; lower-case k/m/g mean KiB/MiB/GiB)",
                    describe(&out)
                ));
            }
            for (i, v) in hami_each {
                let src = quoted(&format!("CUDA_DEVICE_MEMORY_LIMIT_{i}"), &v);
                let r = parse_size(&v, Units::Hami).map_err(|e| format!("{src}: {e}"));
                if let Ok(n) = &r {
                    self.notes.push(format!(
                        "{src} read as the memory limit {} for device {i} (HAMi alias; lower-case k/m/g mean KiB/MiB/GiB)",
                        format_bytes(*n)
                    ));
                }
                out.by_index.insert(i, r);
            }
            return Some(out);
        }
        if let Some(v) = mps {
            let src = quoted("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", &v);
            let out = per_device(&src, &v, |s| parse_size(s, Units::Mps));
            self.notes.push(format!(
                "{src} read as the memory limit {} (MPS alias of GPUSLICE_MEMORY_LIMIT; MPS's MB/GB mean MiB/GiB)",
                describe(&out)
            ));
            return Some(out);
        }
        None
    }

    pub(super) fn compute_limit(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
        file: Option<(String, String)>,
    ) -> PerDevice<u8> {
        let hami_all = env("CUDA_DEVICE_SM_LIMIT");
        let hami_each = indexed_aliases(env, "CUDA_DEVICE_SM_LIMIT_");
        let mps = env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
        let alias_set = hami_all.is_some() || !hami_each.is_empty() || mps.is_some();
        let hami_set = hami_all.is_some() || !hami_each.is_empty();
        let (hami_all, hami_each) = if hami_set && !self.hami_core_policy_applies(env) {
            (None, Vec::new())
        } else {
            (hami_all, hami_each)
        };
        if let Some(v) = env("GPUSLICE_COMPUTE_LIMIT") {
            if alias_set {
                self.notes.push("GPUSLICE_COMPUTE_LIMIT is set: ignoring CUDA_DEVICE_SM_LIMIT* and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into());
            }
            let src = quoted("GPUSLICE_COMPUTE_LIMIT", &v);
            return per_device(&src, &v, parse_percent);
        }
        // HAMi treats 0 (and 100) as "no limit".
        let hami = |me: &mut Self, name: &str, v: &str, what: &str| -> Option<Result<u8, String>> {
            let src = quoted(name, v);
            if v.trim() == "0" {
                me.notes.push(format!(
                    "{src} read as no compute cap for {what} (HAMi alias; 0 means unlimited)"
                ));
                return None;
            }
            let r = parse_percent(v).map_err(|e| format!("{src}: {e}"));
            if let Ok(p) = &r {
                me.notes.push(format!(
                    "{src} read as a compute cap of {p}% for {what} (HAMi alias of GPUSLICE_COMPUTE_LIMIT)"
                ));
            }
            Some(r)
        };
        if hami_all.is_some() || !hami_each.is_empty() {
            let mut out = PerDevice::default();
            if let Some(v) = hami_all {
                out.all = hami(self, "CUDA_DEVICE_SM_LIMIT", &v, "every device");
            }
            for (i, v) in hami_each {
                let name = format!("CUDA_DEVICE_SM_LIMIT_{i}");
                if let Some(r) = hami(self, &name, &v, &format!("device {i}")) {
                    out.by_index.insert(i, r);
                }
            }
            return out;
        }
        if let Some(v) = mps {
            let src = quoted("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", &v);
            let r = parse_percent(&v).map_err(|e| format!("{src}: {e}"));
            if let Ok(p) = &r {
                self.notes.push(format!(
                    "{src} read as a compute cap of {p}% for every device (MPS alias of GPUSLICE_COMPUTE_LIMIT)"
                ));
            }
            return PerDevice {
                all: Some(r),
                ..PerDevice::default()
            };
        }
        match file {
            Some((v, src)) => per_device(&src, &v, parse_percent),
            None => PerDevice::default(),
        }
    }
}
