//! Reading the quota file (`GPUSLICE_QUOTA_FILE`, default `/etc/gpuslice/quota.toml`).

use super::builder::{quoted, Builder, FileSettings};
use super::{file, parse_size, per_device, table, Units, MAX_QUOTA_FILE};
use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

impl Builder {
    pub(super) fn read_quota_file(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
        default: &Path,
    ) -> FileSettings {
        let (path, explicit) = match env("GPUSLICE_QUOTA_FILE") {
            Some(p) if p.trim().is_empty() => {
                self.fail_all(format!(
                    "{}: empty path (expected the path of a quota file)",
                    quoted("GPUSLICE_QUOTA_FILE", &p)
                ));
                return FileSettings::default();
            }
            Some(p) => (PathBuf::from(p), true),
            None => (default.to_path_buf(), false),
        };
        // Opened once, then checked and read through the descriptor: an absent default file costs
        // one failed `open` at start-up. Non-blocking, so that a FIFO at the path is refused below
        // instead of waiting for a writer.
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path);
        let file = match opened {
            Err(e) if !explicit && e.kind() == std::io::ErrorKind::NotFound => {
                return FileSettings::default()
            }
            Err(e) => {
                self.fail_all(format!("quota file {}: {e}", path.display()));
                return FileSettings::default();
            }
            Ok(f) => f,
        };
        let regular = file
            .metadata()
            .is_ok_and(|m| m.is_file() && m.len() <= MAX_QUOTA_FILE);
        if !regular {
            self.fail_all(format!(
                "quota file {}: not a regular file of at most {MAX_QUOTA_FILE} bytes",
                path.display()
            ));
            return FileSettings::default();
        }
        let mut text = String::new();
        if let Err(e) = file.take(MAX_QUOTA_FILE).read_to_string(&mut text) {
            self.fail_all(format!("quota file {}: {e}", path.display()));
            return FileSettings::default();
        }
        let (entries, syntax) = file::parse(&path, &text);
        for e in syntax {
            self.fail_all(e);
        }
        let mut out = FileSettings {
            path: Some(path.clone()),
            ..FileSettings::default()
        };
        for e in entries {
            let value = e.value.as_text();
            let src = format!("{}:{}: {}={value:?}", path.display(), e.line, e.key);
            match (e.table.as_str(), e.key.as_str()) {
                ("", key) if table::file_keys().any(|k| k == key) => {
                    out.top.insert(e.key.clone(), (value, src));
                }
                ("devices", key) => {
                    out.has_devices_table = true;
                    let item = format!("{key}={value}");
                    let one = per_device(&src, &item, |v| parse_size(v, Units::Gpuslice));
                    if let Some(p) = one.poison {
                        self.fail_all(p);
                    }
                    out.memory.by_index.extend(one.by_index);
                    out.memory.by_uuid.extend(one.by_uuid);
                }
                ("", key) => self.fail_all(format!(
                    "{}:{}: unknown key \"{key}\" (expected {} or a [devices] table)",
                    path.display(),
                    e.line,
                    table::file_keys().collect::<Vec<_>>().join(", ")
                )),
                (table, _) => self.fail_all(format!(
                    "{}:{}: unknown table [{table}] (expected [devices])",
                    path.display(),
                    e.line
                )),
            }
        }
        if let Some((v, src)) = out.top.get("memory_limit") {
            let all = per_device(src, v, |v| parse_size(v, Units::Gpuslice));
            out.memory.all = all.all;
            out.memory.poison = all.poison;
            // `memory_limit = "0=2GiB"` also works; the [devices] table wins over it per device.
            for (k, v) in all.by_index {
                out.memory.by_index.entry(k).or_insert(v);
            }
            for (k, v) in all.by_uuid {
                out.memory.by_uuid.entry(k).or_insert(v);
            }
        }
        out
    }
}
