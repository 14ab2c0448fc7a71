//! Builds the C stub (`shim-c/`) into libgpuslice.so and expands the `hook` column of the API tables
//! (`src/api/*.tsv`) into the hook registry: one slot for each hooked entry point's real function, and the
//! name -> hook address map used by `cuGetProcAddress` and `dlsym` interposition. A hook marked in the
//! table without its Rust function (or the reverse) fails to compile.

use std::fmt::Write as _;
use std::path::Path;

include!("src/api/tsv_table.rs");

#[path = "shim-c/static_unwinder.rs"]
mod static_unwinder;

struct Hooked {
    symbol: String,
    group: String,
    library: &'static str,
    /// The C parameter list (the table's `signature` column).
    signature: String,
}

fn hooked(path: &str, library: &'static str) -> Vec<Hooked> {
    Table::read(path)
        .rows()
        .filter(|r| r.get("hook") != "-")
        .map(|r| Hooked {
            symbol: r.get("symbol").to_owned(),
            group: r.get("hook").to_owned(),
            library,
            signature: r.get("signature").to_owned(),
        })
        .collect()
}

/// The Rust type of a C type named in a signature (without pointers and `const`). Every type of a
/// hooked or called entry point is listed: a new one stops the build here, naming it, rather than
/// being guessed. Enumerations are 32-bit integers (the C ABI passes them as `int`), signed or not as
/// the code compares them with the API's constants.
fn rust_type(c: &str) -> &'static str {
    match c {
        "void" => "c_void",
        "char" => "c_char",
        "int" => "c_int",
        "unsigned int" => "c_uint",
        "unsigned long long" | "cuuint64_t" => "u64",
        "size_t" => "usize",
        "float" => "f32",
        "CUdevice" | "CUdevice_v1" => "CUdevice",
        "CUdeviceptr" | "CUdeviceptr_v2" => "CUdeviceptr",
        // 32-bit device pointers of the entry points that predate `_v2` (cuda.h: `unsigned int`).
        "CUdeviceptr_v1" => "c_uint",
        "CUmemGenericAllocationHandle" | "CUmemGenericAllocationHandle_v1" => {
            "CUmemGenericAllocationHandle"
        }
        "CUcontext" => "CUcontext",
        "CUstream" => "CUstream",
        "CUevent" => "CUevent",
        "CUmodule" => "CUmodule",
        "CUfunction" => "CUfunction",
        "CUlibrary" => "CUlibrary",
        "CUkernel" => "CUkernel",
        "CUgraph" => "CUgraph",
        "CUgraphExec" => "CUgraphExec",
        "CUgraphNode" => "CUgraphNode",
        "CUmemoryPool" => "CUmemoryPool",
        "CUarray" => "CUarray",
        "CUmipmappedArray" => "CUmipmappedArray",
        "CUgreenCtx" => "CUgreenCtx",
        "CUuuid" => "CUuuid",
        "CUipcMemHandle_v1" => "CUipcMemHandle",
        "CUexecAffinityParam" => "CUexecAffinityParam",
        "CUctxCreateParams" => "CUctxCreateParams",
        "CUlaunchConfig" => "CUlaunchConfig",
        "CUmemAllocationProp_v1" => "CUmemAllocationProp",
        "CUmemPoolProps_v1" => "CUmemPoolProps",
        "CUDA_ARRAY_DESCRIPTOR_v2" => "CUDA_ARRAY_DESCRIPTOR",
        "CUDA_ARRAY3D_DESCRIPTOR_v2" => "CUDA_ARRAY3D_DESCRIPTOR",
        "CUDA_ARRAY_DESCRIPTOR_v1" => "CUDA_ARRAY_DESCRIPTOR_v1",
        "CUDA_ARRAY3D_DESCRIPTOR_v1" => "CUDA_ARRAY3D_DESCRIPTOR_v1",
        "CUDA_LAUNCH_PARAMS_v1" => "CUDA_LAUNCH_PARAMS",
        "CUDA_MEM_ALLOC_NODE_PARAMS" => "CUDA_MEM_ALLOC_NODE_PARAMS",
        // Read by the driver only; gpuslice passes them through untouched.
        "CUDA_GRAPH_INSTANTIATE_PARAMS" => "c_void",
        // Read by the driver only (capture begins): passed through untouched.
        "CUgraphEdgeData" | "CUstreamCigCaptureParams" => "c_void",
        // A function pointer the driver calls; passed through untouched.
        "CUgraphRecaptureCallback" => "*mut c_void",
        // `struct CUdevResourceDesc_st *`: a handle, passed through.
        "CUdevResourceDesc" => "*mut c_void",
        "CUstreamCaptureStatus" | "CUstreamCaptureMode" | "CUpointer_attribute"
        | "CUgraphNodeType" => "c_uint",
        "CUlimit"
        | "CUdevice_attribute"
        | "CUfunction_attribute"
        | "CUmemPool_attribute"
        | "CUgraphMem_attribute"
        | "CUmemAllocationGranularity_flags"
        | "CUmoduleLoadingMode"
        | "CUjit_option"
        | "CUlibraryOption"
        | "CUdriverProcAddressQueryResult" => "c_int",
        "nvmlDevice_t" => "nvmlDevice_t",
        "nvmlMemory_t" => "nvmlMemory_t",
        "nvmlMemory_v2_t" => "nvmlMemory_v2_t",
        "nvmlProcessInfo_t" | "nvmlProcessInfo_v2_t" => "nvmlProcessInfo_t",
        "nvmlProcessInfo_v1_t" => "nvmlProcessInfo_v1_t",
        "nvmlProcessDetailList_t" => "nvmlProcessDetailList_t",
        "nvmlProcessUtilizationSample_t" => "nvmlProcessUtilizationSample_t",
        "nvmlProcessesUtilizationInfo_t" => "nvmlProcessesUtilizationInfo_t",
        "nvmlAccountingStats_t" => "nvmlAccountingStats_t",
        other => panic!(
            "build.rs: no Rust type for the C type {other:?} of a hooked entry point; add it to rust_type"
        ),
    }
}

/// `const CUmemPoolProps_v1 *props` -> `props: *const CUmemPoolProps` (the name is the C one; an
/// unnamed parameter gets `a<i>`).
fn rust_parameter(c: &str, i: usize) -> String {
    let c = c.trim();
    let pointers = c.matches('*').count();
    let words: Vec<&str> = c
        .split(|ch: char| ch.is_whitespace() || ch == '*')
        .filter(|w| !w.is_empty())
        .collect();
    let is_const = words.first() == Some(&"const");
    let words: Vec<&str> = words.into_iter().filter(|w| *w != "const").collect();
    // The last word is the parameter's name unless the type alone is written (`void **`).
    let (ty_words, name) = match words.split_last() {
        Some((last, rest))
            if !rest.is_empty() && !matches!(*last, "int" | "char" | "long" | "float") =>
        {
            (rest.to_vec(), (*last).to_owned())
        }
        _ => (words.clone(), format!("a{i}")),
    };
    let mut ty = rust_type(&ty_words.join(" ")).to_owned();
    for level in 0..pointers {
        // `const` binds to the pointee: only the innermost pointer is `*const`.
        let kind = if is_const && level == 0 {
            "*const"
        } else {
            "*mut"
        };
        ty = format!("{kind} {ty}");
    }
    format!("{}: {ty}", rust_name(&name))
}

/// A C parameter name as a Rust identifier (keywords get a trailing underscore).
fn rust_name(name: &str) -> String {
    match name {
        "type" | "ref" | "fn" | "mod" | "move" | "loop" | "match" | "use" | "impl" | "in" => {
            format!("{name}_")
        }
        n => n.to_owned(),
    }
}

/// `real::NAME`: the typed call to each hooked or called entry point's real function, its parameter
/// types taken from the table's `signature` column (NVIDIA's prototype) and nowhere else.
fn real_declarations(hooks: &[Hooked]) -> String {
    let mut out = String::new();
    for (library, ret, missing) in [
        ("Cuda", "CUresult", "Err(CUerror::NOT_INITIALIZED)"),
        (
            "Nvml",
            "NvmlReturn",
            "Err(gpuslice_api::NvmlError::UNINITIALIZED)",
        ),
    ] {
        writeln!(
            out,
            "real_fns! {{
    ret = {ret}, missing = {missing};"
        )
        .unwrap();
        for h in hooks.iter().filter(|h| h.library == library) {
            let parameters: Vec<String> = if h.signature.trim() == "void" {
                Vec::new()
            } else {
                h.signature
                    .split(',')
                    .enumerate()
                    .map(|(i, p)| rust_parameter(p, i))
                    .collect()
            };
            writeln!(out, "    fn {}({});", h.symbol, parameters.join(", ")).unwrap();
        }
        out.push_str(
            "}
",
        );
    }
    out
}

fn main() {
    let out_dir = std::env::var("OUT_DIR").unwrap();
    // The unwinder linked in, not `libgcc_s.so.1` loaded beside (shim-c/static_unwinder.rs).
    static_unwinder::link();

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
    // The library's references to the functions it defines itself (its hooks, whose addresses
    // `cuGetProcAddress` and the NVML views hand out; the interposed libc names) are bound at link
    // time, as a preloaded library's are found first anyway: no symbol lookup each at load (start-up
    // time, docs/BENCHMARKS.md). `-Bsymbolic`, not `-Bsymbolic-functions`, which the glibc 2.28
    // release build's linker (`zig cc`, scripts/build-release) refuses: the library exports no
    // data, so the two bind the same references.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    // Everything the library exports, whole, and nothing else: `zig cc` (the glibc 2.28 release
    // build's linker driver) keeps only the last `--version-script` of a command line, which drops
    // rustc's (the Rust exports and `local: *`); the library then exported all its 2,500 internal
    // functions, and kept every libc import they make (178 symbol lookups at load instead of 104).
    // GNU ld merges the two scripts to the same set. The exports: the hooks (`cu*`, `nvml*`), the
    // interposed loader functions, and gpuslice's own entry points (`gpuslice_dlsym_hook`,
    // `gpuslice_rebind`, and the drop-in libraries' `gpuslice_dropin_library`, which `gpuslice
    // doctor` looks for: the drop-ins link this library's link arguments too, and under `zig cc`
    // this script is the one they keep; a pattern, since libgpuslice.so does not define it and a
    // linker may refuse a named symbol that is not defined).
    let exports = Path::new(&out_dir).join("c-exports.map");
    std::fs::write(
        &exports,
        "{ global: dlsym; dlvsym; dlopen; cu*; nvml*; gpuslice_dlsym_hook; gpuslice_rebind; gpuslice_dropin_*; local: *; };\n",
    )
    .unwrap();
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        exports.display()
    );

    let mut hooks = hooked("src/api/driver_entry_points.tsv", "Cuda");
    hooks.extend(hooked("src/api/nvml_entry_points.tsv", "Nvml"));
    std::fs::write(
        Path::new(&out_dir).join("real_declarations.rs"),
        real_declarations(&hooks),
    )
    .unwrap();

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
