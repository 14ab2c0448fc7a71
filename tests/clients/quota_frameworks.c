/* What frameworks ask the driver at start-up and when memory runs short, made in the same calls and
 * the same order (as their CUDA runtime calls reach the driver), so docs/FRAMEWORKS.md's claims are
 * checked on simgpu under a quota (tests/memory_frameworks.rs). Prints `key=value` lines.
 *
 * Modes (argv[1]):
 *   xla FRACTION          JAX/XLA preallocation: FRACTION x total in one allocation
 *   vllm UTIL MODEL_MIB   vLLM: refuse to start if free < UTIL x total; load the model; give the KV
 *                         cache UTIL x total - what is in use, in one allocation
 *   torch                 PyTorch's caching allocator: 2 MiB-rounded blocks until out of memory, then
 *                         free the cache and retry once
 *   torch_expandable      expandable_segments: reserve address space, map 2 MiB physical pages
 *                         (cuMemCreate + cuMemMap + cuMemSetAccess) until refused
 *   torch_async           backend:cudaMallocAsync: the device's default pool with a release threshold
 *                         of UINT64_MAX; blocks until refused; on refusal synchronise, trim to 0, retry
 *   tf                    TensorFlow without allow_growth: the free memory less what it leaves the
 *                         system (MinSystemMemory: 225 MiB when less than 2 GiB is free; 1536 MiB
 *                         on a compute capability 8 device otherwise) in one allocation
 */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1024ull * 1024ull)
#include "check.h"

static CUdevice dev;

/* cudaSetDevice / the runtime's first call: the device's primary context, current. */
static void runtime_init(void) {
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
}

static void mem_info(const char *tag, size_t *free_b, size_t *total_b) {
    CHECK(cuMemGetInfo(free_b, total_b));
    printf("%s_free=%zu\n%s_total=%zu\n", tag, *free_b, tag, *total_b);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    size_t free_b, total_b;
    runtime_init();
    if (strcmp(mode, "xla") == 0 && argc > 2) {
        double fraction = atof(argv[2]);
        mem_info("start", &free_b, &total_b);
        CUdeviceptr p;
        CUresult rc = cuMemAlloc(&p, (size_t)(fraction * (double)total_b));
        printf("prealloc_rc=%d\n", (int)rc);
    } else if (strcmp(mode, "vllm") == 0 && argc > 3) {
        double util = atof(argv[2]);
        size_t model = (size_t)strtoull(argv[3], 0, 10) * MIB;
        mem_info("start", &free_b, &total_b);
        size_t requested = (size_t)(util * (double)total_b);
        if (free_b < requested) {
            printf("refused_to_start=1\n");
            return 0;
        }
        printf("refused_to_start=0\n");
        CUdeviceptr weights, kv;
        CHECK(cuMemAlloc(&weights, model));
        mem_info("loaded", &free_b, &total_b);
        size_t in_use = total_b - free_b;
        size_t kv_bytes = requested > in_use ? requested - in_use : 0;
        printf("kv_bytes=%zu\n", kv_bytes);
        printf("kv_rc=%d\n", (int)cuMemAlloc(&kv, kv_bytes));
    } else if (strcmp(mode, "torch") == 0) {
        CUdeviceptr blocks[4096];
        int n = 0;
        /* Large blocks rounded to 2 MiB, as the caching allocator does: 20 MiB segments. */
        while (n < 4096 && cuMemAlloc(&blocks[n], 20 * MIB) == CUDA_SUCCESS) n++;
        printf("segments=%d\n", n);
        /* Out of memory: the cache holds half the segments freed by the program: release them. */
        for (int i = 0; i < n; i += 2) CHECK(cuMemFree(blocks[i]));
        CUdeviceptr retry;
        printf("retry_rc=%d\n", (int)cuMemAlloc(&retry, 20 * MIB));
        mem_info("end", &free_b, &total_b);
    } else if (strcmp(mode, "torch_expandable") == 0) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev;
        size_t granularity = 0;
        CHECK(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
        mem_info("start", &free_b, &total_b);
        size_t reserve = total_b; /* the segment's address range: the whole (visible) device */
        CUdeviceptr base;
        CHECK(cuMemAddressReserve(&base, reserve, 0, 0, 0));
        CUmemAccessDesc access;
        memset(&access, 0, sizeof access);
        access.location = prop.location;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        size_t mapped = 0;
        for (;;) {
            CUmemGenericAllocationHandle h;
            if (mapped + granularity > reserve || cuMemCreate(&h, granularity, &prop, 0) != CUDA_SUCCESS) break;
            CHECK(cuMemMap(base + mapped, granularity, 0, h, 0));
            CHECK(cuMemSetAccess(base + mapped, granularity, &access, 1));
            CHECK(cuMemRelease(h));
            mapped += granularity;
        }
        printf("granularity=%zu\nmapped=%zu\n", granularity, mapped);
        mem_info("end", &free_b, &total_b);
    } else if (strcmp(mode, "torch_async") == 0) {
        CUmemoryPool pool;
        CUstream s;
        CHECK(cuDeviceGetDefaultMemPool(&pool, dev));
        cuuint64_t threshold = UINT64_MAX;
        CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
        CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CUdeviceptr blocks[1024];
        int n = 0;
        while (n < 1024 && cuMemAllocAsync(&blocks[n], 32 * MIB, s) == CUDA_SUCCESS) n++;
        printf("blocks=%d\n", n);
        /* The program frees half; a larger request fails; PyTorch synchronises, trims, retries. */
        for (int i = 0; i < n; i += 2) CHECK(cuMemFreeAsync(blocks[i], s));
        CUdeviceptr big;
        CUresult first = cuMemAllocAsync(&big, 64 * MIB, s);
        printf("first_rc=%d\n", (int)first);
        if (first != CUDA_SUCCESS) {
            CHECK(cuCtxSynchronize());
            CHECK(cuMemPoolTrimTo(pool, 0));
            printf("retry_rc=%d\n", (int)cuMemAllocAsync(&big, 64 * MIB, s));
        }
        CHECK(cuStreamSynchronize(s));
        mem_info("end", &free_b, &total_b);
    } else if (strcmp(mode, "tf") == 0) {
        mem_info("start", &free_b, &total_b);
        size_t system = free_b < (2048 * MIB) ? 225 * MIB : 1536 * MIB;
        CUdeviceptr p;
        printf("region_rc=%d\n", (int)cuMemAlloc(&p, free_b > system ? free_b - system : free_b));
        mem_info("end", &free_b, &total_b);
    } else {
        printf("error=usage\n");
        return 2;
    }
    printf("done=1\n");
    return 0;
}
