/*
 * The libc names libgpuslice.so interposes -- dlsym, dlvsym, dlopen -- as jumps to the C interposers
 * of interpose.c (gpuslice_interposed_*). Linked into the preloaded library alone (build.rs passes
 * this object to the cdylib's link), never into the gpuslice rlib the command line and the node tools
 * link: see interpose.c.
 *
 * A jump, not a call: the interposer, and glibc's dlsym/dlopen after it, see the caller's return
 * address (RTLD_NEXT and the caller's RUNPATH keep their meaning). An object of its own rather than
 * the linker's --defsym, which zig's linker (the glibc-versioned release build, scripts/build-release)
 * does not take.
 */
#if defined(__x86_64__)
#define GPUSLICE_JUMP(target) jmp target
#elif defined(__aarch64__)
#define GPUSLICE_JUMP(target) b target
#else
#error "interpose-names.S is written for x86_64 and aarch64"
#endif

#define GPUSLICE_NAME(name)                 \
    .globl name;                            \
    .type name, %function;                  \
    .p2align 4;                             \
name:                                       \
    GPUSLICE_JUMP(gpuslice_interposed_##name); \
    .size name, .-name

    .text
GPUSLICE_NAME(dlsym)
GPUSLICE_NAME(dlvsym)
GPUSLICE_NAME(dlopen)

    .section .note.GNU-stack,"",%progbits
