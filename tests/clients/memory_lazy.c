/* Driver memory spent where the driver spends it: a lazily loaded library's code at its kernel's
 * first launch or cuKernelGetFunction. Prints `key=value` lines that tests/memory_lazy.rs judges
 * against simgpu's own counters. Never asks cuMemGetInfo (which reconciles the charge with what the
 * driver holds): the charge judged is what the operations themselves were charged.
 *
 * Modes (argv[1]):
 *   firstlaunch ROOM_MIB LIB_MIB   a context; the quota filled but ROOM_MIB (`-`: nothing filled);
 *                                  two libraries of a LIB_MIB MiB PTX kernel `touch` loaded
 *                                  (cuLibraryLoadData) and their kernels got (cuLibraryGetKernel):
 *                                  got=1, wait for a line; the first kernel launched twice as a
 *                                  function (launch1_rc, launch2_rc), the second's function asked
 *                                  (getfn_rc) and launched (launch3_rc); synchronised: done=1, wait
 *                                  for a line
 *   contexts LIB_MIB               a context; a library of a LIB_MIB MiB PTX kernel `touch` loaded
 *                                  and its kernel got: got=1, wait for a line; the kernel launched
 *                                  twice in the first context (launch1_rc, launch2_rc),
 *                                  synchronised: one=1, wait for a line; a second context created
 *                                  and made current, the kernel launched twice there (launch3_rc,
 *                                  launch4_rc), then again in the first (launch5_rc), synchronised:
 *                                  two=1, wait for a line; the second context destroyed:
 *                                  destroyed=1, wait for a line
 *   lmem ROOM_MIB LOCAL_BYTES      a context; the quota filled but ROOM_MIB (`-`: nothing filled);
 *                                  a module (cuModuleLoadData) whose kernel `touch` has a local
 *                                  frame of LOCAL_BYTES per thread: loaded=1, wait for a line; the
 *                                  kernel launched twice (launch1_rc, launch2_rc), synchronised,
 *                                  the stack limit read (stack=): done=1, wait for a line
 *   lmemctx SMALL LARGE            a context; a library (cuLibraryLoadData) whose kernels `small`
 *                                  and `large` have local frames of SMALL and LARGE bytes per
 *                                  thread, their kernels got: got=1, wait for a line; `small`
 *                                  launched in the context (launch1_rc): one=1, wait for a line;
 *                                  the device's primary context retained and made current, the
 *                                  function of `small` there asked (cuKernelGetFunction, getfn_rc)
 *                                  and the kernel launched twice (launch2_rc, launch3_rc): two=1, wait for
 *                                  a line; `large` launched there (launch4_rc), then `small`
 *                                  (launch5_rc): large=1, wait for a line; back in the first
 *                                  context, `small` launched again (launch6_rc): again=1, wait for
 *                                  a line; the primary context released (its last reference:
 *                                  destroyed): released=1, wait for a line. Each step synchronised.
 *   many N MOD_MIB                 a context; N modules of a MOD_MIB MiB PTX kernel `touch` loaded
 *                                  (cuModuleLoadData) and their kernels looked up
 *                                  (cuModuleGetFunction), kept: loaded=COUNT (up to the first
 *                                  failure, whose codes are load_rc, lookup_rc), wait for a line;
 *                                  all unloaded: unloaded=1, wait for a line
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB (1024ull * 1024ull)

#include "check.h"
#include "ptx.h"

static void wait_line(void) {
    char line[64];
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) exit(0);
}

/* Fills the quota in 2 MiB chunks, then gives back exactly `mib` MiB of room. */
static void leave_room(unsigned long long mib) {
    static CUdeviceptr chunks[1 << 14];
    int n = 0;
    while (n < (int)(sizeof chunks / sizeof *chunks) && cuMemAlloc(&chunks[n], 2 * MIB) == CUDA_SUCCESS) n++;
    for (unsigned long long freed = 0; freed < mib && n > 0; freed += 2) CHECK(cuMemFree(chunks[--n]));
}

/* A PTX image whose kernels `small` and `large` have local frames of `small` and `large` bytes. */
static char *ptx_two(unsigned long long small, unsigned long long large) {
    char *s = malloc(1024);
    snprintf(s, 1024,
             ".version 7.0\n.target sm_80\n.address_size 64\n"
             ".visible .entry small(.param .u64 p)\n{\n.local .align 8 .b8 __local_depot0[%llu];\nret;\n}\n"
             ".visible .entry large(.param .u64 p)\n{\n.local .align 8 .b8 __local_depot1[%llu];\nret;\n}\n",
             small, large);
    return s;
}

static void launched(const char *key, CUfunction f, void **params) {
    printf("%s=%d\n", key, (int)cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, params, 0));
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("pid=%d\n", (int)getpid());
    const char *mode = argc > 1 ? argv[1] : "";
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuCtxCreate(&ctx, 0, dev));
    unsigned long long p = 0;
    void *params[] = {&p};
    if (strcmp(mode, "firstlaunch") == 0 && argc == 4) {
        if (strcmp(argv[2], "-") != 0) leave_room(strtoull(argv[2], 0, 10));
        char *ptx = ptx_image(strtoull(argv[3], 0, 10) * MIB, 0);
        CUlibrary lib1, lib2;
        CUkernel k1, k2;
        CHECK(cuLibraryLoadData(&lib1, ptx, 0, 0, 0, 0, 0, 0));
        CHECK(cuLibraryLoadData(&lib2, ptx, 0, 0, 0, 0, 0, 0));
        free(ptx);
        CHECK(cuLibraryGetKernel(&k1, lib1, "touch"));
        CHECK(cuLibraryGetKernel(&k2, lib2, "touch"));
        printf("got=1\n");
        wait_line();
        printf("launch1_rc=%d\n", (int)cuLaunchKernel((CUfunction)k1, 1, 1, 1, 1, 1, 1, 0, 0, params, 0));
        printf("launch2_rc=%d\n", (int)cuLaunchKernel((CUfunction)k1, 1, 1, 1, 1, 1, 1, 0, 0, params, 0));
        CUfunction f2;
        CUresult rc = cuKernelGetFunction(&f2, k2);
        printf("getfn_rc=%d\n", (int)rc);
        if (rc == CUDA_SUCCESS)
            printf("launch3_rc=%d\n", (int)cuLaunchKernel(f2, 1, 1, 1, 1, 1, 1, 0, 0, params, 0));
        CHECK(cuCtxSynchronize());
        printf("done=1\n");
        wait_line();
        return 0;
    }
    if (strcmp(mode, "contexts") == 0 && argc == 3) {
        char *ptx = ptx_image(strtoull(argv[2], 0, 10) * MIB, 0);
        CUlibrary lib;
        CUkernel k;
        CHECK(cuLibraryLoadData(&lib, ptx, 0, 0, 0, 0, 0, 0));
        free(ptx);
        CHECK(cuLibraryGetKernel(&k, lib, "touch"));
        printf("got=1\n");
        wait_line();
        printf("launch1_rc=%d\n", (int)cuLaunchKernel((CUfunction)k, 1, 1, 1, 1, 1, 1, 0, 0, params, 0));
        printf("launch2_rc=%d\n", (int)cuLaunchKernel((CUfunction)k, 1, 1, 1, 1, 1, 1, 0, 0, params, 0));
        CHECK(cuCtxSynchronize());
        printf("one=1\n");
        wait_line();
        CUcontext ctx2;
        CHECK(cuCtxCreate(&ctx2, 0, dev));
        printf("launch3_rc=%d\n", (int)cuLaunchKernel((CUfunction)k, 1, 1, 1, 1, 1, 1, 0, 0, params, 0));
        printf("launch4_rc=%d\n", (int)cuLaunchKernel((CUfunction)k, 1, 1, 1, 1, 1, 1, 0, 0, params, 0));
        CHECK(cuCtxSynchronize());
        CHECK(cuCtxSetCurrent(ctx));
        printf("launch5_rc=%d\n", (int)cuLaunchKernel((CUfunction)k, 1, 1, 1, 1, 1, 1, 0, 0, params, 0));
        CHECK(cuCtxSynchronize());
        printf("two=1\n");
        wait_line();
        CHECK(cuCtxDestroy(ctx2));
        printf("destroyed=1\n");
        wait_line();
        return 0;
    }
    if (strcmp(mode, "lmem") == 0 && argc == 4) {
        if (strcmp(argv[2], "-") != 0) leave_room(strtoull(argv[2], 0, 10));
        char *ptx = ptx_image(0, strtoull(argv[3], 0, 10));
        CUmodule mod;
        CUfunction f;
        CHECK(cuModuleLoadData(&mod, ptx));
        free(ptx);
        CHECK(cuModuleGetFunction(&f, mod, "touch"));
        printf("loaded=1\n");
        wait_line();
        printf("launch1_rc=%d\n", (int)cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, params, 0));
        printf("launch2_rc=%d\n", (int)cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, params, 0));
        CHECK(cuCtxSynchronize());
        size_t stack = 0;
        CHECK(cuCtxGetLimit(&stack, CU_LIMIT_STACK_SIZE));
        printf("stack=%zu\n", stack);
        printf("done=1\n");
        wait_line();
        return 0;
    }
    if (strcmp(mode, "many") == 0 && argc == 4) {
        int n = atoi(argv[2]), loaded = 0;
        char *ptx = ptx_image(strtoull(argv[3], 0, 10) * MIB, 0);
        CUmodule *mods = calloc(n > 0 ? n : 1, sizeof *mods);
        for (; loaded < n; loaded++) {
            CUfunction f;
            CUresult rc = cuModuleLoadData(&mods[loaded], ptx);
            if (rc != CUDA_SUCCESS) {
                printf("load_rc=%d\n", (int)rc);
                break;
            }
            rc = cuModuleGetFunction(&f, mods[loaded], "touch");
            if (rc != CUDA_SUCCESS) {
                printf("lookup_rc=%d\n", (int)rc);
                CHECK(cuModuleUnload(mods[loaded]));
                break;
            }
        }
        free(ptx);
        printf("loaded=%d\n", loaded);
        wait_line();
        for (int i = 0; i < loaded; i++) CHECK(cuModuleUnload(mods[i]));
        printf("unloaded=1\n");
        wait_line();
        return 0;
    }
    if (strcmp(mode, "lmemctx") == 0 && argc == 4) {
        char *ptx = ptx_two(strtoull(argv[2], 0, 10), strtoull(argv[3], 0, 10));
        CUlibrary lib;
        CUkernel small, large;
        CHECK(cuLibraryLoadData(&lib, ptx, 0, 0, 0, 0, 0, 0));
        free(ptx);
        CHECK(cuLibraryGetKernel(&small, lib, "small"));
        CHECK(cuLibraryGetKernel(&large, lib, "large"));
        printf("got=1\n");
        wait_line();
        launched("launch1_rc", (CUfunction)small, params);
        CHECK(cuCtxSynchronize());
        printf("one=1\n");
        wait_line();
        CUcontext primary;
        CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
        CHECK(cuCtxSetCurrent(primary));
        CUfunction small_fn;
        printf("getfn_rc=%d\n", (int)cuKernelGetFunction(&small_fn, small));
        launched("launch2_rc", (CUfunction)small, params);
        launched("launch3_rc", (CUfunction)small, params);
        CHECK(cuCtxSynchronize());
        printf("two=1\n");
        wait_line();
        launched("launch4_rc", (CUfunction)large, params);
        launched("launch5_rc", (CUfunction)small, params);
        CHECK(cuCtxSynchronize());
        printf("large=1\n");
        wait_line();
        CHECK(cuCtxSetCurrent(ctx));
        launched("launch6_rc", (CUfunction)small, params);
        CHECK(cuCtxSynchronize());
        printf("again=1\n");
        wait_line();
        CHECK(cuDevicePrimaryCtxRelease(dev));
        printf("released=1\n");
        wait_line();
        return 0;
    }
    fprintf(stderr, "usage: memory_lazy firstlaunch ROOM_MIB LIB_MIB | contexts LIB_MIB | lmem ROOM_MIB LOCAL_BYTES | lmemctx SMALL LARGE\n");
    return 2;
}
