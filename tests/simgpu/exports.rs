//! Shared by simgpu's build scripts (`#[path]`-included): expands an entry-point table into a
//! library's exports. Every function the table lists is exported; the ones implemented by hand in
//! `src/` (a line `pub unsafe extern "C" fn NAME` or `pub extern "C" fn NAME`) are picked up by
//! name, every other one becomes a stub whose body is `stub_body` (it answers "not supported").

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

include!("../../src/api/tsv_table.rs");

/// One row of the table: the exported name, and whether it is data rather than a function.
pub struct Symbol {
    pub name: String,
    pub data: bool,
}

/// The rows of a `.tsv` table (`symbol_col`, and `kind_col` holding `func`/`data` if there is one).
pub fn table(path: &str) -> Vec<Symbol> {
    Table::read(path)
        .rows()
        .map(|r| Symbol {
            name: r.get("symbol").to_owned(),
            data: r.get("kind") == "data",
        })
        .collect()
}

/// Names starting with `prefix` of the `extern "C"` functions implemented in `src/` (every `.rs`
/// file, in subdirectories too).
fn implemented(prefix: &str) -> BTreeSet<String> {
    println!("cargo:rerun-if-changed=src");
    let mut names = BTreeSet::new();
    let mut dirs = vec![std::path::PathBuf::from("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                implemented_in(&path, prefix, &mut names);
            }
        }
    }
    names
}

/// Adds to `names` those starting with `prefix` of the `extern "C"` functions defined in `path`.
fn implemented_in(path: &Path, prefix: &str, names: &mut BTreeSet<String>) {
    for line in std::fs::read_to_string(path).unwrap().lines() {
        let line = line.trim_start();
        for head in ["pub unsafe extern \"C\" fn ", "pub extern \"C\" fn "] {
            if let Some(rest) = line.strip_prefix(head) {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if name.starts_with(prefix) {
                    names.insert(name);
                }
            }
        }
    }
}

/// Writes `$OUT_DIR/exports.rs`: the stubs, the data words, and (with `address_table`) `EXPORTS`, the
/// sorted name -> address table of every exported function.
pub fn generate(symbols: &[Symbol], prefix: &str, stub_body: &str, address_table: bool) {
    let implemented = implemented(prefix);
    let mut out = String::new();
    let mut functions = Vec::new();
    for s in symbols {
        let name = &s.name;
        if s.data {
            // Exported words (the driver's debugger interface): present so the export list matches.
            writeln!(out, "#[no_mangle]\npub static {name}: [u64; 1] = [0];").unwrap();
            continue;
        }
        functions.push(name.clone());
        if !implemented.contains(name) {
            let body = stub_body.replace("NAME", name);
            writeln!(
                out,
                "#[no_mangle]\npub extern \"C\" fn {name}() -> u32 {{ {body} }}"
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
    if address_table {
        out.push_str("\n/// Address of every exported function, by exported name (sorted).\n");
        out.push_str("pub static EXPORTS: &[Export] = &[\n");
        functions.sort();
        for f in &functions {
            writeln!(out, "    Export({f:?}, {f} as *const ()),").unwrap();
        }
        out.push_str("];\n");
    }
    std::fs::write(
        Path::new(&std::env::var("OUT_DIR").unwrap()).join("exports.rs"),
        out,
    )
    .unwrap();
}
