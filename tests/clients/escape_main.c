/* A program not linked against CUDA that reaches the driver the ways docs/SECURITY.md lists:
 *   escape_main deepbind LIB N MIB   dlopen(LIB, RTLD_NOW | RTLD_DEEPBIND) (LIB is linked -lcuda)
 *   escape_main path DRIVER N MIB    dlopen(DRIVER) by absolute path, dlsym of the driver functions
 * Each allocates N chunks of MIB MiB and prints granted=<how many succeeded>. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int by_path(const char *driver, unsigned n, unsigned long mib) {
    void *h = dlopen(driver, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        printf("error=dlopen %s\n", dlerror());
        return -1;
    }
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(h, "cuInit");
    CUresult (*get)(CUdevice *, int) = (CUresult(*)(CUdevice *, int))dlsym(h, "cuDeviceGet");
    CUresult (*retain)(CUcontext *, CUdevice) =
        (CUresult(*)(CUcontext *, CUdevice))dlsym(h, "cuDevicePrimaryCtxRetain");
    CUresult (*set)(CUcontext) = (CUresult(*)(CUcontext))dlsym(h, "cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))dlsym(h, "cuMemAlloc_v2");
    if (!init || !get || !retain || !set || !alloc)
        return -1;
    CUdevice dev;
    CUcontext ctx;
    if (init(0) || get(&dev, 0) || retain(&ctx, dev) || set(ctx))
        return -1;
    int granted = 0;
    for (unsigned i = 0; i < n; i++) {
        CUdeviceptr p;
        if (alloc(&p, mib << 20) == CUDA_SUCCESS)
            granted++;
    }
    return granted;
}

int main(int argc, char **argv) {
    if (argc != 5)
        return 2;
    unsigned n = (unsigned)strtoul(argv[3], NULL, 10);
    unsigned long mib = strtoul(argv[4], NULL, 10);
    int granted = -1;
    if (strcmp(argv[1], "deepbind") == 0) {
        void *h = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
        if (h == NULL) {
            printf("error=dlopen %s\n", dlerror());
            return 1;
        }
        int (*allocate)(unsigned, unsigned long) =
            (int (*)(unsigned, unsigned long))dlsym(h, "escape_allocate");
        granted = allocate ? allocate(n, mib) : -1;
    } else if (strcmp(argv[1], "path") == 0) {
        granted = by_path(argv[2], n, mib);
    } else {
        return 2;
    }
    printf("granted=%d\n", granted);
    return 0;
}
