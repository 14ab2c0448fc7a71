/* What a program learns from the driver before any device is there (NVIDIA's real driver on a machine
 * without a GPU): loads libcuda.so.1 with dlopen and prints, for each call, its return code, its output
 * and the symbol the function pointer belongs to (dladdr), as `key=value` lines. The test compares the
 * output with and without gpuslice preloaded: the hooks must answer exactly what the driver answers. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static const char *symbol_of(void *p) {
    Dl_info info;
    if (p == NULL)
        return "null";
    if (dladdr(p, &info) != 0 && info.dli_sname != NULL && info.dli_saddr == p)
        return info.dli_sname;
    return "unknown";
}

#define LOOKUP(var, name)                                                                          \
    __typeof__(&name) var = (__typeof__(&name))dlsym(h, #name);                                     \
    printf("sym.%s=%s\n", #name, symbol_of((void *)var));                                          \
    if (var == NULL)                                                                               \
        return 1;

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        printf("error=dlopen(libcuda.so.1): %s\n", dlerror());
        return 1;
    }
    LOOKUP(driverGetVersion, cuDriverGetVersion)
    LOOKUP(init, cuInit)
    LOOKUP(deviceGetCount, cuDeviceGetCount)
    LOOKUP(memGetInfo, cuMemGetInfo_v2)
    LOOKUP(memAlloc, cuMemAlloc_v2)
    LOOKUP(memFree, cuMemFree_v2)
    LOOKUP(deviceTotalMem, cuDeviceTotalMem_v2)
    LOOKUP(primaryRetain, cuDevicePrimaryCtxRetain)
    LOOKUP(ctxCreate, cuCtxCreate_v2)

    int version = -1;
    printf("driver_version.rc=%d\n", (int)driverGetVersion(&version));
    printf("driver_version=%d\n", version);
    printf("init.rc=%d\n", (int)init(0));
    int count = -1;
    printf("device_count.rc=%d\ndevice_count=%d\n", (int)deviceGetCount(&count), count);
    size_t free_b = 12345, total_b = 12345;
    printf("mem_get_info.rc=%d\nmem_get_info=%zu/%zu\n", (int)memGetInfo(&free_b, &total_b), free_b,
           total_b);
    CUdeviceptr p = 12345;
    printf("mem_alloc.rc=%d\nmem_alloc.ptr=%llu\n", (int)memAlloc(&p, 1 << 20),
           (unsigned long long)p);
    printf("mem_free.rc=%d\n", (int)memFree(0));
    size_t bytes = 12345;
    printf("total_mem.rc=%d\ntotal_mem=%zu\n", (int)deviceTotalMem(&bytes, 0), bytes);
    CUcontext ctx = NULL;
    printf("primary_retain.rc=%d\n", (int)primaryRetain(&ctx, 0));
    printf("ctx_create.rc=%d\n", (int)ctxCreate(&ctx, 0, 0));
    printf("done=1\n");
    return 0;
}
