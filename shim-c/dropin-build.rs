// Shared by the build scripts of the drop-in libraries (shim-c/dropin-cuda, shim-c/dropin-nvml), which
// `include!` it: expands one API table (src/api/*.tsv) into
//   $OUT_DIR/trampolines.S  one exported trampoline per function gpuslice does not hook, and the data
//                           symbols (`cudbg*`), for x86_64 and aarch64;
//   $OUT_DIR/names.rs       the trampolines' names, by index, for the Rust resolver;
//   $OUT_DIR/exports.map    a version script exporting every name of the table (rustc's own exports
//                           only Rust items) plus gpuslice's probe symbol.
// Hooked entry points are not trampolines: their Rust hooks (from the gpuslice rlib) are exported.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

include!("../src/api/tsv_table.rs");

struct Entry {
    symbol: String,
    data: bool,
    hooked: bool,
}

/// Reads a table: `symbol_col`, the `kind` column (`func`/`data`) and the `hook` column.
fn read_table(path: &Path) -> Vec<Entry> {
    Table::read(&path.display().to_string())
        .rows()
        .map(|r| {
            let hook = r.get("hook");
            Entry {
                symbol: r.get("symbol").to_owned(),
                data: r.get("kind") == "data",
                hooked: hook != "-" && hook != "call",
            }
        })
        .collect()
}

/// Size of a data symbol: NVIDIA's driver exports 4- and 8-byte flags and one 4 KiB path buffer.
fn data_size(symbol: &str) -> usize {
    if symbol.ends_with("Path") {
        4096
    } else {
        8
    }
}

fn trampolines_x86_64(funcs: &[&Entry], out: &mut String) {
    // Slot i holds the resolved address of trampoline i (0 until resolved). A plain 8-byte load/store is
    // atomic on x86_64 and stores are release-ordered, so the fast path is one load and an indirect jump.
    for (i, e) in funcs.iter().enumerate() {
        let s = &e.symbol;
        writeln!(
            out,
            "    .globl {s}\n    .type {s},@function\n    .p2align 4\n{s}:\n    movq .Lslots+{off}(%rip), %r11\n    testq %r11, %r11\n    jz 1f\n    jmp *%r11\n1:  movl ${i}, %r11d\n    jmp .Lresolve\n    .size {s}, .-{s}",
            off = 8 * i
        )
        .unwrap();
    }
    // Saves every argument register (integer, vector, %rax = vector count for varargs), asks the resolver,
    // stores the slot, restores, and jumps: arguments reach the real function untouched.
    out.push_str(
        "    .p2align 4
.Lresolve:
    pushq %rbp
    movq %rsp, %rbp
    pushq %rdi
    pushq %rsi
    pushq %rdx
    pushq %rcx
    pushq %r8
    pushq %r9
    pushq %rax
    pushq %r11
    subq $128, %rsp
    movdqu %xmm0, 0(%rsp)
    movdqu %xmm1, 16(%rsp)
    movdqu %xmm2, 32(%rsp)
    movdqu %xmm3, 48(%rsp)
    movdqu %xmm4, 64(%rsp)
    movdqu %xmm5, 80(%rsp)
    movdqu %xmm6, 96(%rsp)
    movdqu %xmm7, 112(%rsp)
    movl %r11d, %edi
    call gpuslice_dropin_resolve
    movq 128(%rsp), %r11
    leaq .Lslots(%rip), %rcx
    movq %rax, (%rcx,%r11,8)
    movq %rax, %r11
    movdqu 0(%rsp), %xmm0
    movdqu 16(%rsp), %xmm1
    movdqu 32(%rsp), %xmm2
    movdqu 48(%rsp), %xmm3
    movdqu 64(%rsp), %xmm4
    movdqu 80(%rsp), %xmm5
    movdqu 96(%rsp), %xmm6
    movdqu 112(%rsp), %xmm7
    addq $136, %rsp
    popq %rax
    popq %r9
    popq %r8
    popq %rcx
    popq %rdx
    popq %rsi
    popq %rdi
    popq %rbp
    jmp *%r11
",
    );
}

fn trampolines_aarch64(funcs: &[&Entry], out: &mut String) {
    // x16/x17 are the intra-procedure-call scratch registers: free to use in a veneer.
    for (i, e) in funcs.iter().enumerate() {
        let s = &e.symbol;
        writeln!(
            out,
            "    .globl {s}\n    .type {s},%function\n    .p2align 4\n{s}:\n    adrp x16, .Lslots+{off}\n    ldr x17, [x16, :lo12:.Lslots+{off}]\n    cbz x17, 1f\n    br x17\n1:  mov x16, #{i}\n    b .Lresolve\n    .size {s}, .-{s}",
            off = 8 * i
        )
        .unwrap();
    }
    out.push_str(
        "    .p2align 4
.Lresolve:
    stp x29, x30, [sp, #-224]!
    mov x29, sp
    stp x0, x1, [sp, #16]
    stp x2, x3, [sp, #32]
    stp x4, x5, [sp, #48]
    stp x6, x7, [sp, #64]
    stp x8, x16, [sp, #80]
    stp q0, q1, [sp, #96]
    stp q2, q3, [sp, #128]
    stp q4, q5, [sp, #160]
    stp q6, q7, [sp, #192]
    mov w0, w16
    bl gpuslice_dropin_resolve
    ldr x16, [sp, #88]
    adrp x17, .Lslots
    add x17, x17, :lo12:.Lslots
    add x17, x17, x16, lsl #3
    stlr x0, [x17]
    mov x17, x0
    ldp q6, q7, [sp, #192]
    ldp q4, q5, [sp, #160]
    ldp q2, q3, [sp, #128]
    ldp q0, q1, [sp, #96]
    ldp x8, x16, [sp, #80]
    ldp x6, x7, [sp, #64]
    ldp x4, x5, [sp, #48]
    ldp x2, x3, [sp, #32]
    ldp x0, x1, [sp, #16]
    ldp x29, x30, [sp], #224
    br x17
",
    );
}

/// Generates the trampolines, names and export map for one table.
fn generate(table: &str) {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap();
    println!("cargo:rerun-if-changed=../dropin-build.rs");
    let entries = read_table(&manifest.join("../..").join(table));
    let funcs: Vec<&Entry> = entries.iter().filter(|e| !e.data && !e.hooked).collect();

    let mut asm = String::from(
        // The resolver is hidden: both drop-ins define it, and each library's trampolines must call
        // their own, not the first one in the global scope (libcuda's, when it is linked).
        "/* Generated by shim-c/dropin-build.rs from the API table: do not edit. */\n    .hidden gpuslice_dropin_resolve\n    .text\n",
    );
    match arch.as_str() {
        "x86_64" => trampolines_x86_64(&funcs, &mut asm),
        "aarch64" => trampolines_aarch64(&funcs, &mut asm),
        other => panic!("drop-in trampolines are written for x86_64 and aarch64, not {other}"),
    }
    writeln!(
        asm,
        "    .bss\n    .p2align 3\n.Lslots:\n    .zero {}",
        8 * funcs.len().max(1)
    )
    .unwrap();
    // Data symbols: the driver's debugger-interface variables, exported under their names so programs
    // and tools that look them up find them (a debugger attaches to the real driver's copies).
    asm.push_str("    .data\n");
    for e in entries.iter().filter(|e| e.data) {
        let s = &e.symbol;
        let size = data_size(s);
        writeln!(asm, "    .globl {s}\n    .type {s},%object\n    .p2align 3\n{s}:\n    .zero {size}\n    .size {s}, {size}").unwrap();
    }
    asm.push_str("    .section .note.GNU-stack,\"\",%progbits\n");
    let asm_path = out_dir.join("trampolines.S");
    std::fs::write(&asm_path, asm).unwrap();
    // Nothing in Rust refers to the trampolines: link the whole archive, or the linker drops them.
    cc::Build::new()
        .file(&asm_path)
        .cargo_metadata(false)
        .compile("gpuslice_trampolines");
    println!("cargo:rustc-link-search=native={}", out_dir.display());
    println!("cargo:rustc-link-lib=static:+whole-archive=gpuslice_trampolines");

    let mut names = String::from(
        "/// The trampolines' exported names, by index (generated from the API table).\n",
    );
    writeln!(
        names,
        "pub static NAMES: [&std::ffi::CStr; {}] = [",
        funcs.len()
    )
    .unwrap();
    for e in &funcs {
        writeln!(names, "    c{:?},", e.symbol).unwrap();
    }
    names.push_str("];\n");
    std::fs::write(out_dir.join("names.rs"), names).unwrap();

    let mut map =
        String::from("{ global:\n    gpuslice_dlsym_hook;\n    gpuslice_dropin_library;\n");
    for e in &entries {
        writeln!(map, "    {};", e.symbol).unwrap();
    }
    map.push_str("};\n");
    let map_path = out_dir.join("exports.map");
    std::fs::write(&map_path, map).unwrap();
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map_path.display()
    );
}
