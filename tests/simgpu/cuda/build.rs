//! Expands the driver entry-point table (`src/api/driver_entry_points.tsv`) into simgpu's exports:
//! every symbol the table lists is exported, so a client finds exactly the names a real driver has.
//! Functions implemented by hand in `src/*.rs` (`pub unsafe extern "C" fn cuXxx`) are picked up by name;
//! every other one becomes a stub that returns CUDA_ERROR_NOT_SUPPORTED and logs once. The generated
//! `exports.rs` also holds the name -> address table that cuGetProcAddress and dlsym-style lookups use.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let table = "../../../src/api/driver_entry_points.tsv";
    println!("cargo:rerun-if-changed={table}");
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    // As NVIDIA links libcuda.so.1 (DT_SYMBOLIC): the library's own references, such as the addresses
    // cuGetProcAddress hands out, bind to its own functions, never to a preloaded library's.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");

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
                        if name.starts_with("cu") {
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
        let (symbol, kind) = (cols[0], cols[4]);
        if kind == "data" {
            // The debugger's exported words: present so the export list matches, never read.
            writeln!(out, "#[no_mangle]\npub static {symbol}: [u64; 1] = [0];").unwrap();
            continue;
        }
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
            "{name} is implemented but not in the entry-point table"
        );
    }
    out.push_str("\n/// Address of every exported driver function, by exported name (sorted).\n");
    out.push_str("pub static EXPORTS: &[Export] = &[\n");
    functions.sort();
    for f in &functions {
        writeln!(out, "    Export({f:?}, {f} as *const ()),").unwrap();
    }
    out.push_str("];\n");
    std::fs::write(
        Path::new(&std::env::var("OUT_DIR").unwrap()).join("exports.rs"),
        out,
    )
    .unwrap();
}
