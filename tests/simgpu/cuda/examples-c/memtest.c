/* simgpu smoke test for init, devices, contexts, memory, copies and cuGetProcAddress.
 * Build: gcc -I target/nvidia/include/cu13 memtest.c -L<dir> -lcuda ; run with SIMGPU_MEMORY=1GiB. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(call, want)                                                                  \
    do {                                                                                   \
        CUresult r_ = (call);                                                              \
        if (r_ != (want)) {                                                                \
            const char *n_ = NULL;                                                         \
            cuGetErrorName(r_, &n_);                                                       \
            printf("FAIL %s:%d %s -> %d (%s), want %d\n", __FILE__, __LINE__, #call, r_,   \
                   n_ ? n_ : "?", (int)(want));                                            \
            failures++;                                                                    \
        }                                                                                  \
    } while (0)
#define OK(call) CHECK(call, CUDA_SUCCESS)

int main(void) {
    int v = 0, n = 0;
    CUdevice dev;
    CHECK(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    OK(cuDriverGetVersion(&v));
    CHECK(cuInit(1), CUDA_ERROR_INVALID_VALUE);
    OK(cuInit(0));
    OK(cuDeviceGetCount(&n));
    printf("driver %d, %d device(s)\n", v, n);
    OK(cuDeviceGet(&dev, 0));
    CHECK(cuDeviceGet(&dev, n), CUDA_ERROR_INVALID_DEVICE);
    char name[128], bus[32];
    OK(cuDeviceGetName(name, sizeof name, dev));
    OK(cuDeviceGetPCIBusId(bus, sizeof bus, dev));
    size_t total;
    OK(cuDeviceTotalMem(&total, dev));
    int major, minor, sms, pools, x;
    OK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    OK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    OK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    OK(cuDeviceGetAttribute(&pools, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev));
    CHECK(cuDeviceGetAttribute(&x, CU_DEVICE_ATTRIBUTE_MAX, dev), CUDA_ERROR_INVALID_VALUE);
    CUdevice again;
    OK(cuDeviceGetByPCIBusId(&again, bus));
    if (again != dev) { printf("FAIL by-bus-id\n"); failures++; }
    CUuuid uuid;
    OK(cuDeviceGetUuid(&uuid, dev));
    printf("%s %s cc %d.%d, %d SMs, %zu bytes, pools %d\n", name, bus, major, minor, sms, total, pools);

    /* No context yet. */
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, 16), CUDA_ERROR_INVALID_CONTEXT);

    CUcontext primary, ctx, cur;
    unsigned flags; int active;
    OK(cuDevicePrimaryCtxRetain(&primary, dev));
    OK(cuDevicePrimaryCtxGetState(dev, &flags, &active));
    if (!active) { printf("FAIL primary not active\n"); failures++; }
    OK(cuCtxSetCurrent(primary));
    OK(cuCtxGetCurrent(&cur));
    if (cur != primary) { printf("FAIL current\n"); failures++; }
    size_t free0, free1, tot;
    OK(cuMemGetInfo(&free0, &tot));

    OK(cuCtxCreate(&ctx, NULL, 0, dev)); /* v4 with NULL params */
    OK(cuMemGetInfo(&free1, &tot));
    printf("context costs %zu bytes\n", free0 - free1);
    OK(cuCtxDestroy(ctx));
    OK(cuCtxGetCurrent(&cur));
    if (cur != primary) { printf("FAIL current after destroy\n"); failures++; }

    /* Alloc, HtoD, DtoD, DtoH, memset. */
    enum { N = 1 << 20 };
    unsigned char *h = malloc(N), *back = malloc(N);
    for (int i = 0; i < N; i++) h[i] = (unsigned char)(i * 7);
    CUdeviceptr a, b;
    OK(cuMemAlloc(&a, N));
    OK(cuMemAlloc(&b, N));
    OK(cuMemcpyHtoD(a, h, N));
    OK(cuMemcpyDtoD(b, a, N));
    OK(cuMemcpyDtoH(back, b, N));
    if (memcmp(h, back, N)) { printf("FAIL round trip\n"); failures++; }
    CHECK(cuMemcpyHtoD(a + N - 8, h, 16), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemsetD32(a, 0xdeadbeef, N / 4));
    OK(cuMemcpyDtoH(back, a, 8));
    if (*(unsigned *)back != 0xdeadbeef) { printf("FAIL memset\n"); failures++; }
    CUdeviceptr base; size_t sz;
    OK(cuMemGetAddressRange(&base, &sz, a + 100));
    if (base != a || sz != N) { printf("FAIL address range\n"); failures++; }
    unsigned mt = 0;
    OK(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a + 5));
    if (mt != CU_MEMORYTYPE_DEVICE) { printf("FAIL pointer type\n"); failures++; }

    /* Async via pinned memory on a stream-less (legacy) path. */
    void *pinned;
    OK(cuMemAllocHost(&pinned, N));
    memset(pinned, 0x5a, N);
    OK(cuMemcpyHtoDAsync(a, pinned, N, 0));
    OK(cuMemcpyDtoHAsync(back, a, N, 0)); /* pageable: done on return */
    if (back[N - 1] != 0x5a) { printf("FAIL async copy\n"); failures++; }
    OK(cuMemFreeHost(pinned));

    /* 2D pitched. */
    CUdeviceptr p2; size_t pitch;
    OK(cuMemAllocPitch(&p2, &pitch, 100, 10, 4));
    if (pitch != 512) { printf("FAIL pitch %zu\n", pitch); failures++; }
    CUDA_MEMCPY2D c = {0};
    c.srcMemoryType = CU_MEMORYTYPE_HOST; c.srcHost = h; c.srcPitch = 100;
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE; c.dstDevice = p2; c.dstPitch = pitch;
    c.WidthInBytes = 100; c.Height = 10;
    OK(cuMemcpy2D(&c));
    OK(cuMemcpyDtoH(back, p2 + 3 * pitch, 100));
    if (memcmp(back, h + 300, 100)) { printf("FAIL 2D\n"); failures++; }
    OK(cuMemFree(p2));

    /* Frees. */
    OK(cuMemFree(b));
    CHECK(cuMemFree(b), CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemFree(a + 1), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemFree(0));
    OK(cuMemFree(a));

    /* Pools: freed memory stays reserved until synchronize. */
    CUmemoryPool pool;
    OK(cuDeviceGetDefaultMemPool(&pool, dev));
    CUdeviceptr q;
    OK(cuMemGetInfo(&free0, &tot));
    OK(cuMemAllocAsync(&q, 64 << 20, 0));
    OK(cuMemFreeAsync(q, 0));
    cuuint64_t reserved = 0;
    (void)cuStreamQuery(0); /* the free may still be pending: NOT_READY is fine */
    OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
    OK(cuCtxSynchronize());
    OK(cuMemGetInfo(&free1, &tot));
    printf("pool reserved %llu before sync, free delta after sync %lld\n", (unsigned long long)reserved,
           (long long)free0 - (long long)free1);

    /* VMM. */
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t gran;
    OK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemGenericAllocationHandle mh;
    CHECK(cuMemCreate(&mh, gran + 1, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemCreate(&mh, gran, &prop, 0));
    CUdeviceptr va;
    OK(cuMemAddressReserve(&va, 2 * gran, 0, 0, 0));
    OK(cuMemMap(va, gran, 0, mh, 0));
    OK(cuMemMap(va + gran, gran, 0, mh, 0)); /* alias */
    CUmemAccessDesc acc = {0};
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = dev;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    OK(cuMemSetAccess(va, 2 * gran, &acc, 1));
    OK(cuMemsetD8(va, 0x11, 64));
    OK(cuMemcpyDtoH(back, va + gran, 64));
    if (back[63] != 0x11) { printf("FAIL VMM alias\n"); failures++; }
    OK(cuMemRelease(mh));
    OK(cuMemUnmap(va, 2 * gran));
    OK(cuMemAddressFree(va, 2 * gran));

    /* Allocate until out of memory; then free everything. */
    CUdeviceptr chunks[4096]; int k = 0;
    CUresult r;
    while (k < 4096 && (r = cuMemAlloc(&chunks[k], 64 << 20)) == CUDA_SUCCESS) k++;
    if (r != CUDA_ERROR_OUT_OF_MEMORY) { printf("FAIL: alloc loop ended with %d\n", r); failures++; }
    OK(cuMemGetInfo(&free1, &tot));
    printf("allocated %d x 64 MiB until OOM; free now %zu of %zu\n", k, free1, tot);
    while (k > 0) OK(cuMemFree(chunks[--k]));

    /* cuGetProcAddress. */
    void *fn = (void *)1;
    CUdriverProcAddressQueryResult st;
    OK(cuGetProcAddress("cuMemAlloc", &fn, 12000, 0, &st));
    if (fn != (void *)cuMemAlloc_v2 || st != CU_GET_PROC_ADDRESS_SUCCESS) { printf("FAIL gpa\n"); failures++; }
    OK(cuGetProcAddress("cuNope", &fn, 12000, 0, &st));
    if (fn != NULL || st != CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND) { printf("FAIL gpa not found\n"); failures++; }
    OK(cuGetProcAddress("cuMemAlloc", &fn, 1000, 0, &st));
    if (st != CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT) { printf("FAIL gpa version\n"); failures++; }
    CHECK(cuGetProcAddress("cuMemAlloc", &fn, 12000, 4, &st), CUDA_ERROR_INVALID_VALUE);
    const char *s;
    OK(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s));
    CHECK(cuGetErrorName((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);

    OK(cuDevicePrimaryCtxRelease(dev));
    printf(failures ? "FAILED (%d)\n" : "ALL OK\n", failures);
    return failures != 0;
}
