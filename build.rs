//! Builds the C stub (`shim-c/`) into libgpuslice.so and expands the `hook` column of the API tables
//! (`src/api/*.tsv`) into the hook registry: one slot for each hooked entry point's real function, and the
//! name -> hook address map used by `cuGetProcAddress` and `dlsym` interposition. A hook marked in the
//! table without its Rust function (or the reverse) fails to compile.

use std::fmt::Write as _;
use std::path::Path;

struct Hooked {
    symbol: String,
    group: String,
    library: &'static str,
}

fn hooked(path: &str, symbol_col: usize, hook_col: usize, library: &'static str) -> Vec<Hooked> {
    println!("cargo:rerun-if-changed={path}");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split('\t').collect::<Vec<_>>())
        .filter(|c| c[hook_col] != "-")
        .map(|c| Hooked {
            symbol: c[symbol_col].to_owned(),
            group: c[hook_col].to_owned(),
            library,
        })
        .collect()
}

fn main() {
    let out_dir = std::env::var("OUT_DIR").unwrap();

    // The interposer is compiled optimised whatever the profile: its forwarding path must be a tail call.
    println!("cargo:rerun-if-changed=shim-c/interpose.c");
    cc::Build::new()
        .file("shim-c/interpose.c")
        .opt_level(2)
        .flag("-fno-omit-frame-pointer")
        .flag("-foptimize-sibling-calls")
        .warnings(true)
        .extra_warnings(true)
        .compile("gpuslice_interpose");
    // The C interposers are named `gpuslice_interposed_*` in the object, which the rlib carries into
    // every program that links gpuslice (the command line, the node tools): there a definition named
    // `dlsym` would take over the program's own lookups. Only the preloaded library defines the libc
    // names (`shim-c/interpose-names.S`: one jump each, an object passed to the cdylib's link alone), and
    // exports them (rustc's version script exports only Rust items).
    println!("cargo:rerun-if-changed=shim-c/interpose-names.S");
    let names = cc::Build::new()
        .file("shim-c/interpose-names.S")
        .cargo_metadata(false)
        .compile_intermediates();
    for object in names {
        println!("cargo:rustc-cdylib-link-arg={}", object.display());
    }
    let exports = Path::new(&out_dir).join("c-exports.map");
    std::fs::write(&exports, "{ global: dlsym; dlvsym; dlopen; };\n").unwrap();
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        exports.display()
    );

    let mut hooks = hooked("src/api/driver_entry_points.tsv", 0, 6, "Cuda");
    hooks.extend(hooked("src/api/nvml_entry_points.tsv", 0, 3, "Nvml"));

    let mut out = String::new();
    out.push_str("/// Every hooked entry point: the index of its real-function slot.\n");
    out.push_str("#[allow(non_camel_case_types)]\n#[derive(Clone, Copy, Debug, PartialEq, Eq)]\n#[repr(usize)]\n");
    out.push_str("pub enum Real {\n");
    for h in &hooks {
        writeln!(out, "    {},", h.symbol).unwrap();
    }
    out.push_str("}\n\n");
    writeln!(out, "pub const HOOKED_COUNT: usize = {};\n", hooks.len()).unwrap();
    out.push_str("/// (exported name, library that holds the real function), indexed by `Real`.\n");
    out.push_str("pub static HOOKED: [(&std::ffi::CStr, Library); HOOKED_COUNT] = [\n");
    for h in &hooks {
        writeln!(out, "    (c{:?}, Library::{}),", h.symbol, h.library).unwrap();
    }
    out.push_str("];\n\n");
    out.push_str(
        "/// The real-function slot and the hook for a hooked entry point's exact exported name.\n",
    );
    out.push_str(
        "pub fn hooked_entry(symbol: &[u8]) -> Option<(Real, *const ())> {\n    match symbol {\n",
    );
    for h in hooks.iter().filter(|h| h.group != "call") {
        writeln!(
            out,
            "        b{:?} => Some((Real::{}, crate::hooks::{}::{} as *const ())),",
            h.symbol, h.symbol, h.group, h.symbol
        )
        .unwrap();
    }
    out.push_str("        _ => None,\n    }\n}\n");
    std::fs::write(Path::new(&out_dir).join("hook_table.rs"), out).unwrap();
}
