//! Expands the NVML entry-point table (`src/api/nvml_entry_points.tsv`) into simgpu's exports: every
//! symbol the table lists is exported. Functions implemented by hand in `src/*.rs`
//! (`pub unsafe extern "C" fn nvmlXxx` / `pub extern "C" fn nvmlXxx`) are picked up by name; every
//! other one becomes a stub that returns NVML_ERROR_NOT_SUPPORTED and logs once.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let table = "../../../src/api/nvml_entry_points.tsv";
    println!("cargo:rerun-if-changed={table}");
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");

    let mut implemented = BTreeSet::new();
    for entry in std::fs::read_dir("src").unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            for line in text.lines() {
                let line = line.trim_start();
                for prefix in ["pub unsafe extern \"C\" fn ", "pub extern \"C\" fn "] {
                    if let Some(rest) = line.strip_prefix(prefix) {
                        let name: String = rest
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        if name.starts_with("nvml") {
                            implemented.insert(name);
                        }
                    }
                }
            }
        }
    }

    let text = std::fs::read_to_string(table).unwrap();
    let mut out = String::new();
    let mut functions = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let cols: Vec<&str> = line.split('\t').collect();
        let (symbol, kind) = (cols[0], cols[1]);
        assert_eq!(
            kind, "func",
            "{symbol}: only functions are expected in the NVML table"
        );
        functions.push(symbol.to_owned());
        if !implemented.contains(symbol) {
            writeln!(
                out,
                "#[no_mangle]\npub extern \"C\" fn {symbol}() -> u32 {{ crate::not_supported({symbol:?}) }}"
            )
            .unwrap();
        }
    }
    for name in &implemented {
        assert!(
            functions.contains(name),
            "{name} is implemented but not in the NVML entry-point table"
        );
    }
    std::fs::write(
        Path::new(&std::env::var("OUT_DIR").unwrap()).join("exports.rs"),
        out,
    )
    .unwrap();
}
