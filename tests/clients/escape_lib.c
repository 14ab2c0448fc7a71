/* A library linked against the driver (-lcuda), for escape_main.c to dlopen with RTLD_DEEPBIND:
 * allocates `n` chunks of `mib` MiB and reports how many the driver granted. */
#include <cuda.h>
#include <stdio.h>

int escape_allocate(unsigned n, unsigned long mib) {
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        return -1;
    int granted = 0;
    for (unsigned i = 0; i < n; i++) {
        CUdeviceptr p;
        if (cuMemAlloc(&p, mib << 20) == CUDA_SUCCESS)
            granted++;
    }
    return granted;
}
