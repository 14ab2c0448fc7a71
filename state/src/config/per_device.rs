//! Per-device settings: the list syntax (`4GiB`, `0=4GiB,1=2GiB`, `GPU-<uuid>=4GiB`) and lookup.

use super::{format_bytes, Setting};
use std::collections::BTreeMap;

/// A setting that may differ per device. Lookup order: poison, UUID key, index key, `all`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PerDevice<T> {
    /// Applies to every device not listed.
    pub all: Option<Result<T, String>>,
    pub by_index: BTreeMap<u32, Result<T, String>>,
    pub by_uuid: BTreeMap<String, Result<T, String>>,
    /// An error that concerns every device (overrides everything else).
    pub poison: Option<String>,
}

impl<T> Default for PerDevice<T> {
    fn default() -> Self {
        PerDevice {
            all: None,
            by_index: BTreeMap::new(),
            by_uuid: BTreeMap::new(),
            poison: None,
        }
    }
}

impl<T: Clone> PerDevice<T> {
    /// Whether anything (even an invalid value) is set.
    pub fn is_set(&self) -> bool {
        self.all.is_some()
            || !self.by_index.is_empty()
            || !self.by_uuid.is_empty()
            || self.poison.is_some()
    }

    /// The setting for a device, `uuid` as reported by the driver (`GPU-...`).
    pub fn get(&self, index: u32, uuid: &str) -> Setting<T> {
        if let Some(p) = &self.poison {
            return Setting::Invalid(p.clone());
        }
        let found = self
            .by_uuid
            .get(&canonical_uuid(uuid).unwrap_or_else(|| uuid.to_string()))
            .or_else(|| self.by_index.get(&index))
            .or(self.all.as_ref());
        Self::to_setting(found)
    }

    /// The setting for a device listed neither by index nor by UUID.
    pub fn get_default(&self) -> Setting<T> {
        if let Some(p) = &self.poison {
            return Setting::Invalid(p.clone());
        }
        Self::to_setting(self.all.as_ref())
    }

    fn to_setting(found: Option<&Result<T, String>>) -> Setting<T> {
        match found {
            Some(Ok(v)) => Setting::Value(v.clone()),
            Some(Err(e)) => Setting::Invalid(e.clone()),
            None => Setting::Unset,
        }
    }

    pub(super) fn poison_with(&mut self, msg: &str) {
        if self.poison.is_none() {
            self.poison = Some(msg.to_string());
        }
    }
}

/// Canonical form of a GPU (or MIG) UUID: `GPU-` + lower-case 8-4-4-4-12 hex. `None` if `s` is not one.
pub fn canonical_uuid(s: &str) -> Option<String> {
    let s = s.trim();
    let prefix = s.get(..4)?;
    let prefix = if prefix.eq_ignore_ascii_case("GPU-") {
        "GPU-"
    } else if prefix.eq_ignore_ascii_case("MIG-") {
        "MIG-"
    } else {
        return None;
    };
    // One pass, one allocation: devices are keyed by this at start-up (limits, ledgers).
    let mut out = String::with_capacity(40);
    out.push_str(prefix);
    let mut digits = 0;
    for c in s[4..].chars().filter(|&c| c != '-') {
        if digits == 32 || !c.is_ascii_hexdigit() {
            return None;
        }
        if matches!(digits, 8 | 12 | 16 | 20) {
            out.push('-');
        }
        out.push(c.to_ascii_lowercase());
        digits += 1;
    }
    (digits == 32).then_some(out)
}

/// Parses a UUID string into its 16 bytes (`None` if it is not a `GPU-`/`MIG-` UUID).
pub fn uuid_bytes(s: &str) -> Option<[u8; 16]> {
    let c = canonical_uuid(s)?;
    let hex: Vec<u8> = c[4..].bytes().filter(|&b| b != b'-').collect();
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

/// Parses `4GiB`, `0=4GiB,1=2GiB`, `GPU-<uuid>=4GiB,2GiB`. `src` names the origin in messages.
pub(super) fn per_device<T: Clone>(
    src: &str,
    text: &str,
    parse: impl Fn(&str) -> Result<T, String>,
) -> PerDevice<T> {
    let mut out = PerDevice::default();
    if text.contains(',') && text.split(',').all(|item| item.trim().is_empty()) {
        // `,` or `,,`: a list of nothing must not read as "no limit".
        out.poison_with(&format!(
            "{src}: no value in the list (expected a size such as 4GiB or a list such as 0=4GiB,1=2GiB)"
        ));
        return out;
    }
    for item in text.split(',').map(str::trim) {
        if item.is_empty() && text.contains(',') {
            continue; // tolerate `0=1G,` and `0=1G,,1=2G`
        }
        match item.split_once('=') {
            None => {
                if out.all.is_some() {
                    out.poison_with(&format!("{src}: more than one value for all devices"));
                }
                out.all = Some(parse(item).map_err(|e| format!("{src}: {e}")));
            }
            Some((key, value)) => {
                let key = key.trim();
                let parsed = |what: &str| parse(value).map_err(|e| format!("{src}: {what}: {e}"));
                if !key.is_empty() && key.chars().all(|c| c.is_ascii_digit()) {
                    let Ok(i) = key.parse::<u32>() else {
                        out.poison_with(&format!("{src}: device index {key} out of range"));
                        continue;
                    };
                    let v = parsed(&format!("device {i}"));
                    if out.by_index.insert(i, v).is_some() {
                        out.poison_with(&format!("{src}: device {i} listed twice"));
                    }
                } else if let Some(u) = canonical_uuid(key) {
                    let v = parsed(&format!("device {u}"));
                    if out.by_uuid.insert(u.clone(), v).is_some() {
                        out.poison_with(&format!("{src}: device {u} listed twice"));
                    }
                } else {
                    out.poison_with(&format!(
                        "{src}: bad device key \"{key}\" (expected an index such as 0 or a UUID such as GPU-1b2c3d4e-0000-1111-2222-333344445555)"
                    ));
                }
            }
        }
    }
    out
}

/// Short description of a memory setting for notes: `4 GiB for every device`, `1 GiB for device 0, ...`.
pub(super) fn describe(p: &PerDevice<u64>) -> String {
    let show = |r: &Result<u64, String>| match r {
        Ok(n) => format_bytes(*n),
        Err(_) => "(invalid)".into(),
    };
    let mut parts = Vec::new();
    if let Some(a) = &p.all {
        parts.push(format!("{} for every device", show(a)));
    }
    for (i, r) in &p.by_index {
        parts.push(format!("{} for device {i}", show(r)));
    }
    for (u, r) in &p.by_uuid {
        parts.push(format!("{} for {u}", show(r)));
    }
    if p.poison.is_some() {
        parts.push("(invalid)".into());
    }
    parts.join(", ")
}
