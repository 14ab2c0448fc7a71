/* Driver overhead under a quota: contexts, module code and context limits take device memory the
 * program never asked cuMemAlloc for. Prints `key=value` lines that tests/memory_*.rs judge
 * against simgpu's own counters. Every view of memory is printed after each step: cuMemGetInfo,
 * cuDeviceTotalMem (and their legacy 32-bit entry points), NVML's memory info (v1 and v2) and its process lists (v1, v2, v3), NVML being
 * reached by dlopen + dlsym as monitoring libraries do.
 *
 * Modes (argv[1]):
 *   steps MODULE_MIB HEAP_MIB STACK_BYTES   context, alloc 256 MiB, load a module of MODULE_MIB MiB,
 *                                           raise the malloc heap and the stack limit, then undo each
 *                                           in turn; views after every step; then fill in 2 MiB chunks
 *   hold [MODULE_MIB HEAP_MIB STACK_BYTES]  context (and a module and limits), ready=1, wait for a line;
 *                                           fill; views; wait for EOF
 *   async ROUNDS                            context, then ROUNDS times: cuMemAllocAsync 64 MiB blocks
 *                                           until refused, free them, synchronise
 *   limits [s|h|f]BYTES...                  context, then the stack size (s), malloc heap (h) or
 *                                           printf FIFO (f) set to each value in turn, views after
 *                                           each; limits_set=1, wait for a line; fill in 2 MiB chunks
 *   mixedasync MIB...                       context, then for each MIB: cuMemAllocAsync blocks of
 *                                           MIB until refused, freed on the stream unsynchronised
 *   graph MIB [captured]                    a graph with a memory node of MIB (allocated when the
 *                                           graph is launched; made by capturing cuMemAllocAsync with
 *                                           `captured`), launched; views
 *   second                                  alloc 256 MiB, then a context on device 1 too; ready=1,
 *                                           wait for EOF
 *   modules ROOM_MIB FILE...                context, the quota filled but ROOM_MIB; then each image
 *                                           FILE loaded from memory (cuModuleLoadData), from the file
 *                                           (cuModuleLoad) and as a library (cuLibraryLoadData), its
 *                                           kernel `saxpy` looked up in each (a library's: its
 *                                           cuLibraryGetKernel, then cuKernelGetFunction), each unloaded when
 *                                           loaded: loadN_PATH_rc, loadN_PATH_lookup_rc (PATH: data,
 *                                           file, library); views after each as loadN
 *   mix SEED STEPS KINDS                    the primary context, then STEPS random steps (seeded) of
 *                                           the KINDS given by digits: 0-3 allocate 1-16 MiB, 4-5
 *                                           free one, 6 load a 1-20 MiB PTX module, 7 unload one,
 *                                           8 set the malloc heap, 9 the stack size; exits holding
 *                                           what it holds; refused=N
 *   heapfit ROOM_MIB HEAP_MIB               context, the quota filled but ROOM_MIB; the malloc heap
 *                                           set to HEAP_MIB: heap_rc
 *   views                                   context; views
 *   pendingfree [destroyed]                 context; 600 MiB from the device's pool on stream 2,
 *                                           freed there behind a 1 s kernel; then 300 MiB on
 *                                           stream 1 (second_rc=); views. destroyed: stream 2
 *                                           destroyed, the context synchronised, then 300 MiB on
 *                                           stream 1, asked again once if refused (after_destroyed_rc=)
 *   pooldestroy                             context; 600 MiB from a pool created, the pool
 *                                           destroyed, cuMemAlloc 600 MiB (after_destroy_rc=);
 *                                           the block freed, synchronised, again (after_free_rc=)
 *   tiny ROOM_MIB                           context, the quota filled but ROOM_MIB; then 1-byte
 *                                           cuMemAlloc until refused (tiny=), views
 *   leave MIB [wait]                        context (with `wait`: ready=1, then wait for a line),
 *                                           MIB allocated, exit without freeing
 *   reused MIB                              a context created on device 0 is made current in a
 *                                           second thread, which allocates and frees MIB there; the
 *                                           context is destroyed and one created on device 1 (a
 *                                           driver may give it the old handle: same_handle=), which
 *                                           the second thread makes current and allocates MIB in;
 *                                           then cuMemGetInfo on device 1 (free1=) and device 0
 *                                           (free0=, its primary context)
 *   torn HOW                                a context (HOW = destroy: created; reset, release,
 *                                           rereset: the primary one), 64 MiB each from cuMemAlloc,
 *                                           cuMemAllocManaged, cuMemAllocPitch, cuArrayCreate and
 *                                           cuMemAllocAsync (the device's pool), never freed; the context torn down (cuCtxDestroy,
 *                                           cuDevicePrimaryCtxReset, the last
 *                                           cuDevicePrimaryCtxRelease) and a new one set up; free
 *                                           (cuMemGetInfo) before=, held=, after=; then fill.
 *                                           rereset: reset, which keeps the reference; retained
 *                                           again (two references), the same allocations in the
 *                                           context re-created; released once (kept=, the context
 *                                           still there), then again, the last reference
 *   churn MIB PERIOD_MS                     context; then for ever: MIB allocated every PERIOD_MS and
 *                                           held, all freed when one is refused; churning=1 after
 *                                           the first (a neighbour streaming its weights in)
 *   peerpool                                primary contexts on devices 0 and 1, device 0's current;
 *                                           64 MiB blocks from a pool created on device 1 until
 *                                           refused (at most 32), then one from device 1's default
 *                                           pool; cuMemGetInfo on each device
 */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024ull * 1024ull)

#include "check.h"
#include "ptx.h"

/* The NVML declarations this client needs (nvml.h's layouts). */
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
typedef void *nvmlDevice_t;
static struct {
    int (*init)(void);
    int (*by_index)(unsigned int, nvmlDevice_t *);
    int (*mem)(nvmlDevice_t, nvmlMemory_t *);
    int (*mem2)(nvmlDevice_t, nvmlMemory_v2_t *);
    int (*procs1)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_v1_t *);
    int (*procs2)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
    int (*procs3)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
    nvmlDevice_t dev;
} N;

static void nvml_open(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h) { printf("error=no libnvidia-ml.so.1\n"); exit(1); }
    *(void **)&N.init = dlsym(h, "nvmlInit_v2");
    *(void **)&N.by_index = dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&N.mem = dlsym(h, "nvmlDeviceGetMemoryInfo");
    *(void **)&N.mem2 = dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
    *(void **)&N.procs1 = dlsym(h, "nvmlDeviceGetComputeRunningProcesses");
    *(void **)&N.procs2 = dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v2");
    *(void **)&N.procs3 = dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
    int rc_init = N.init(), rc_index = N.by_index(0, &N.dev);
    if (rc_init != 0 || rc_index != 0) {
        printf("error=nvml init %d %d\n", rc_init, rc_index);
        exit(1);
    }
}

/* Sum and count of a process list, and this process's line. */
#define LIST(fn, type, tag, step)                                                           \
    do {                                                                                    \
        type infos[64];                                                                     \
        unsigned int n = 64;                                                                \
        int rc = fn(N.dev, &n, infos);                                                      \
        unsigned long long mine = 0, sum = 0;                                               \
        for (unsigned int i = 0; rc == 0 && i < n; i++) {                                   \
            sum += infos[i].usedGpuMemory;                                                  \
            if (infos[i].pid == (unsigned int)getpid()) mine = infos[i].usedGpuMemory;      \
        }                                                                                   \
        printf("%s_%s_rc=%d\n%s_%s_count=%u\n%s_%s_mine=%llu\n%s_%s_sum=%llu\n", step, tag, \
               rc, step, tag, n, step, tag, mine, step, tag, sum);                          \
    } while (0)

/* The legacy 32-bit entry points (cuda.h maps the names to _v2), found as a binary built against
 * CUDA < 3.2 finds them: by their unversioned names in the process's global scope. */
typedef CUresult (*mem_get_info_v1_t)(unsigned int *, unsigned int *);
typedef CUresult (*total_mem_v1_t)(unsigned int *, CUdevice);

static void views(const char *step) {
    size_t free_b = 0, total_b = 0, dev_total = 0;
    CHECK(cuMemGetInfo(&free_b, &total_b));
    CHECK(cuDeviceTotalMem(&dev_total, 0));
    void *global = dlopen(NULL, RTLD_NOW);
    mem_get_info_v1_t mem_get_info_v1 = (mem_get_info_v1_t)dlsym(global, "cuMemGetInfo");
    total_mem_v1_t total_mem_v1 = (total_mem_v1_t)dlsym(global, "cuDeviceTotalMem");
    unsigned int free_v1 = 0, total_v1 = 0, dev_total_v1 = 0;
    if (!mem_get_info_v1 || !total_mem_v1) { printf("error=no legacy entry points\n"); exit(1); }
    CHECK(mem_get_info_v1(&free_v1, &total_v1));
    CHECK(total_mem_v1(&dev_total_v1, 0));
    printf("%s_free_v1=%u\n%s_total_v1=%u\n%s_device_total_v1=%u\n", step, free_v1, step, total_v1,
           step, dev_total_v1);
    nvmlMemory_t m = {0};
    nvmlMemory_v2_t m2 = {0};
    m2.version = (unsigned int)sizeof(nvmlMemory_v2_t) | (2u << 24);
    int rc1 = N.mem(N.dev, &m), rc2 = N.mem2(N.dev, &m2);
    printf("%s_free=%zu\n%s_total=%zu\n%s_device_total=%zu\n", step, free_b, step, total_b, step,
           dev_total);
    printf("%s_nvml_rc=%d\n%s_nvml_total=%llu\n%s_nvml_used=%llu\n%s_nvml_free=%llu\n", step, rc1,
           step, m.total, step, m.used, step, m.free);
    printf("%s_nvml2_rc=%d\n%s_nvml2_total=%llu\n%s_nvml2_reserved=%llu\n%s_nvml2_used=%llu\n"
           "%s_nvml2_free=%llu\n",
           step, rc2, step, m2.total, step, m2.reserved, step, m2.used, step, m2.free);
    LIST(N.procs1, nvmlProcessInfo_v1_t, "procs1", step);
    LIST(N.procs2, nvmlProcessInfo_t, "procs2", step);
    LIST(N.procs3, nvmlProcessInfo_t, "procs3", step);
    fflush(stdout);
}

/* Allocates 2 MiB chunks until refused; returns the bytes allocated (kept). */
static unsigned long long fill(void) {
    unsigned long long total = 0;
    CUdeviceptr p;
    while (cuMemAlloc(&p, 2 * MIB) == CUDA_SUCCESS) total += 2 * MIB;
    return total;
}

/* Fills the quota in 2 MiB chunks, then gives back exactly `mib` MiB of room. */
static void leave_room(unsigned long long mib) {
    static CUdeviceptr chunks[1 << 14];
    int n = 0;
    while (n < (int)(sizeof chunks / sizeof *chunks) && cuMemAlloc(&chunks[n], 2 * MIB) == CUDA_SUCCESS) n++;
    for (unsigned long long freed = 0; freed < mib && n > 0; freed += 2) CHECK(cuMemFree(chunks[--n]));
    CUdeviceptr odd;
    if (mib % 2) CHECK(cuMemAlloc(&odd, MIB));
}

/* `torn`: 64 MiB from each allocation path, in the current context, never freed. */
static void torn_allocate(void) {
    size_t pitch;
    CUdeviceptr p;
    CUarray array;
    CUDA_ARRAY_DESCRIPTOR desc = {.Width = 4096, .Height = 4096, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    CHECK(cuMemAlloc(&p, 64 * MIB));
    CHECK(cuMemAllocManaged(&p, 64 * MIB, CU_MEM_ATTACH_GLOBAL));
    CHECK(cuMemAllocPitch(&p, &pitch, 4 * MIB, 16, 16));
    CHECK(cuArrayCreate(&array, &desc));
    CHECK(cuMemAllocAsync(&p, 64 * MIB, NULL));
    CHECK(cuStreamSynchronize(NULL));
}

static int mode_torn(const char *how) {
    CUdevice dev;
    CUcontext ctx;
    size_t before, held, kept, after, total;
    int destroy = strcmp(how, "destroy") == 0;
    CHECK(cuDeviceGet(&dev, 0));
    if (destroy)
        CHECK(cuCtxCreate(&ctx, 0, dev));
    else
        CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuMemGetInfo(&before, &total));
    torn_allocate();
    CHECK(cuMemGetInfo(&held, &total));
    if (destroy) {
        CHECK(cuCtxDestroy(ctx));
        CHECK(cuCtxCreate(&ctx, 0, dev));
    } else if (strcmp(how, "rereset") == 0) {
        CHECK(cuDevicePrimaryCtxReset(dev));
        CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
        CHECK(cuCtxSetCurrent(ctx));
        torn_allocate();
        CHECK(cuDevicePrimaryCtxRelease(dev));
        CHECK(cuMemGetInfo(&kept, &total));
        printf("kept=%zu\n", kept);
        CHECK(cuDevicePrimaryCtxRelease(dev));
        CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
        CHECK(cuCtxSetCurrent(ctx));
    } else {
        if (strcmp(how, "reset") == 0)
            CHECK(cuDevicePrimaryCtxReset(dev));
        else
            CHECK(cuDevicePrimaryCtxRelease(dev));
        CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
        CHECK(cuCtxSetCurrent(ctx));
    }
    CHECK(cuMemGetInfo(&after, &total));
    printf("before=%zu\nheld=%zu\nafter=%zu\n", before, held, after);
    printf("fill_bytes=%llu\n", fill());
    return 0;
}

/* `reused`: the second thread's steps, each begun when the main thread lets it. */
static pthread_barrier_t reused_step;
static CUcontext reused_ctx;
static size_t reused_mib;

static void *reused_thread(void *unused) {
    (void)unused;
    CUdeviceptr p;
    pthread_barrier_wait(&reused_step);
    CHECK(cuCtxSetCurrent(reused_ctx));
    CHECK(cuMemAlloc(&p, reused_mib * MIB));
    CHECK(cuMemFree(p));
    pthread_barrier_wait(&reused_step);
    /* The context is destroyed and another created meanwhile. */
    pthread_barrier_wait(&reused_step);
    CHECK(cuCtxSetCurrent(reused_ctx));
    CHECK(cuMemAlloc(&p, reused_mib * MIB));
    pthread_barrier_wait(&reused_step);
    /* Measured meanwhile. */
    pthread_barrier_wait(&reused_step);
    CHECK(cuMemFree(p));
    return NULL;
}

static int mode_reused(size_t mib) {
    CUdevice dev0, dev1;
    CUcontext old, primary0;
    pthread_t t;
    size_t free1, free0, total;
    reused_mib = mib;
    CHECK(cuDeviceGet(&dev0, 0));
    CHECK(cuDeviceGet(&dev1, 1));
    CHECK(cuCtxCreate(&reused_ctx, 0, dev0));
    pthread_barrier_init(&reused_step, NULL, 2);
    pthread_create(&t, NULL, reused_thread, NULL);
    pthread_barrier_wait(&reused_step);
    pthread_barrier_wait(&reused_step);
    old = reused_ctx;
    CHECK(cuCtxDestroy(old));
    CHECK(cuCtxCreate(&reused_ctx, 0, dev1));
    printf("same_handle=%d\n", reused_ctx == old);
    pthread_barrier_wait(&reused_step);
    pthread_barrier_wait(&reused_step);
    CHECK(cuMemGetInfo(&free1, &total));
    CHECK(cuDevicePrimaryCtxRetain(&primary0, dev0));
    CHECK(cuCtxSetCurrent(primary0));
    CHECK(cuMemGetInfo(&free0, &total));
    printf("free1=%zu\nfree0=%zu\n", free1, free0);
    pthread_barrier_wait(&reused_step);
    pthread_join(t, NULL);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "steps";
    if (strcmp(mode, "torn") == 0 && argc == 3) {
        CHECK(cuInit(0));
        return mode_torn(argv[2]);
    }
    if (strcmp(mode, "reused") == 0 && argc == 3) {
        CHECK(cuInit(0));
        return mode_reused(strtoull(argv[2], NULL, 10));
    }
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    nvml_open();
    if (strcmp(mode, "peerstream") == 0) {
        /* NVIDIA: cuMemAllocAsync allocates from "the current mempool of the provided stream's
         * device"; here the stream is device 1's and the current context device 0's. */
        CUdevice dev1;
        CUcontext ctx0, ctx1;
        CUstream s1;
        CUdeviceptr blocks[64];
        size_t free0, total0, free1, total1;
        int n = 0;
        CHECK(cuDeviceGet(&dev1, 1));
        CHECK(cuDevicePrimaryCtxRetain(&ctx1, dev1));
        CHECK(cuCtxSetCurrent(ctx1));
        CHECK(cuStreamCreate(&s1, 0));
        CHECK(cuDevicePrimaryCtxRetain(&ctx0, dev));
        CHECK(cuCtxSetCurrent(ctx0));
        while (n < 64 && cuMemAllocAsync(&blocks[n], 64 * MIB, s1) == CUDA_SUCCESS) n++;
        CHECK(cuStreamSynchronize(s1));
        CHECK(cuMemGetInfo(&free0, &total0));
        CHECK(cuCtxSetCurrent(ctx1));
        CHECK(cuMemGetInfo(&free1, &total1));
        printf("pid=%d\nstream_blocks=%d\nused0=%zu\nused1=%zu\nready=1\n", (int)getpid(), n,
               total0 - free0, total1 - free1);
        fflush(stdout);
        char line[64];
        while (fgets(line, sizeof line, stdin)) {}
        return 0;
    }
    if (strcmp(mode, "peerpool") == 0) {
        /* NVIDIA: the pool "may be from a device different than that of the specified stream". */
        CUdevice dev1;
        CUcontext ctx0, ctx1;
        CUmemoryPool pool, default1;
        CUmemPoolProps props;
        CUstream s;
        CUdeviceptr blocks[32], extra;
        size_t free0, total0, free1, total1;
        int n = 0;
        CHECK(cuDeviceGet(&dev1, 1));
        CHECK(cuDevicePrimaryCtxRetain(&ctx1, dev1));
        CHECK(cuDevicePrimaryCtxRetain(&ctx0, dev));
        CHECK(cuCtxSetCurrent(ctx0));
        memset(&props, 0, sizeof props);
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = dev1;
        CHECK(cuMemPoolCreate(&pool, &props));
        CHECK(cuDeviceGetDefaultMemPool(&default1, dev1));
        CHECK(cuStreamCreate(&s, 0));
        while (n < 32 && cuMemAllocFromPoolAsync(&blocks[n], 64 * MIB, pool, s) == CUDA_SUCCESS) n++;
        printf("pid=%d\npool_blocks=%d\n", (int)getpid(), n);
        printf("default_rc=%d\n", (int)cuMemAllocFromPoolAsync(&extra, 64 * MIB, default1, s));
        CHECK(cuStreamSynchronize(s));
        CHECK(cuMemGetInfo(&free0, &total0));
        CHECK(cuCtxSetCurrent(ctx1));
        CHECK(cuMemGetInfo(&free1, &total1));
        printf("used0=%zu\nused1=%zu\nready=1\n", total0 - free0, total1 - free1);
        fflush(stdout);
        char line[64];
        while (fgets(line, sizeof line, stdin)) {}
        return 0;
    }
    if (strcmp(mode, "mix") == 0 && argc > 4) {
        srand((unsigned)atoi(argv[2]));
        int steps = atoi(argv[3]);
        const char *kinds = argv[4];
        CUcontext primary;
        if (cuDevicePrimaryCtxRetain(&primary, dev) != CUDA_SUCCESS) {
            printf("context_refused=1\n");
            return 0;
        }
        CHECK(cuCtxSetCurrent(primary));
        static CUdeviceptr held[4096];
        CUmodule mods[8];
        int n = 0, loaded = 0, refused = 0;
        for (int i = 0; i < steps; i++) {
            int op = rand() % 10;
            CUresult rc = CUDA_SUCCESS;
            if (!strchr(kinds, '0' + op)) continue;
            if (op < 4 && n < 4096) {
                rc = cuMemAlloc(&held[n], (size_t)(1 + rand() % 16) * MIB);
                if (rc == CUDA_SUCCESS) n++;
            } else if (op < 6 && n > 0) {
                int k = rand() % n;
                CHECK(cuMemFree(held[k]));
                held[k] = held[--n];
            } else if (op == 6 && loaded < 8) {
                char *ptx = ptx_image((1 + (unsigned long long)(rand() % 20)) * MIB, 0);
                rc = cuModuleLoadData(&mods[loaded], ptx);
                free(ptx);
                CUfunction touch;
                if (rc == CUDA_SUCCESS && (rc = cuModuleGetFunction(&touch, mods[loaded], "touch")) != CUDA_SUCCESS)
                    CHECK(cuModuleUnload(mods[loaded]));
                if (rc == CUDA_SUCCESS) loaded++;
            } else if (op == 7 && loaded > 0) {
                CHECK(cuModuleUnload(mods[--loaded]));
            } else if (op == 8) {
                rc = cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, (size_t)(8 + rand() % 64) * MIB);
            } else if (op == 9) {
                rc = cuCtxSetLimit(CU_LIMIT_STACK_SIZE, (size_t)(1024 + (rand() % 3) * 256));
            }
            if (rc == CUDA_ERROR_OUT_OF_MEMORY) refused++;
            else CHECK(rc);
        }
        printf("refused=%d\n", refused);
        return 0;
    }
    CHECK(cuCtxCreate(&ctx, 0, dev));
    printf("pid=%d\n", (int)getpid());
    if (strcmp(mode, "churn") == 0 && argc > 3) {
        size_t bytes = (size_t)(strtoull(argv[2], 0, 10) * MIB);
        long period_ms = atol(argv[3]);
        static CUdeviceptr held[4096];
        int n = 0;
        for (;;) {
            if (n < 4096 && cuMemAlloc(&held[n], bytes) == CUDA_SUCCESS) {
                if (n++ == 0) {
                    printf("churning=1\n");
                    fflush(stdout);
                }
            } else {
                while (n > 0) CHECK(cuMemFree(held[--n]));
            }
            struct timespec ts = {period_ms / 1000, (period_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    if (strcmp(mode, "views") == 0) {
        views("ctx");
        return 0;
    }
    if (strcmp(mode, "vmmsizes") == 0) {
        /* cuMemCreate's size must be a non-zero multiple of the minimum granularity (NVIDIA's
         * documentation): the driver's own error for the invalid ones, the quota's for the last. */
        CUmemAllocationProp prop;
        CUmemGenericAllocationHandle h;
        size_t g = 0;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev;
        CHECK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        printf("unaligned_rc=%d\n", (int)cuMemCreate(&h, g + 1, &prop, 0));
        printf("zero_rc=%d\n", (int)cuMemCreate(&h, 0, &prop, 0));
        printf("size_max_rc=%d\n", (int)cuMemCreate(&h, (size_t)-1, &prop, 0));
        printf("over_quota_rc=%d\n", (int)cuMemCreate(&h, 2048 * MIB, &prop, 0));
        printf("fits_rc=%d\n", (int)cuMemCreate(&h, g, &prop, 0));
        /* cuMemAllocPitch: ElementSizeBytes "may be 4, 8 or 16 bytes". */
        CUdeviceptr p;
        size_t pitch;
        printf("pitch_element_rc=%d\n", (int)cuMemAllocPitch(&p, &pitch, 4096, 4096, 3));
        printf("pitch_empty_rc=%d\n", (int)cuMemAllocPitch(&p, &pitch, 0, 4096, 4));
        return 0;
    }
    if (strcmp(mode, "steps") == 0 && argc > 4) {
        unsigned long long module_mib = strtoull(argv[2], 0, 10);
        unsigned long long heap_mib = strtoull(argv[3], 0, 10);
        size_t stack = (size_t)strtoull(argv[4], 0, 10);
        size_t heap0 = 0, stack0 = 0;
        CHECK(cuCtxGetLimit(&heap0, CU_LIMIT_MALLOC_HEAP_SIZE));
        CHECK(cuCtxGetLimit(&stack0, CU_LIMIT_STACK_SIZE));
        views("s0");
        CUdeviceptr a;
        CHECK(cuMemAlloc(&a, 256 * MIB));
        views("s1");
        char *ptx = ptx_image(module_mib * MIB, 0);
        CUmodule mod;
        CHECK(cuModuleLoadData(&mod, ptx));
        free(ptx);
        CUfunction touch;
        CHECK(cuModuleGetFunction(&touch, mod, "touch"));
        views("s2");
        CUresult heap_rc = cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, (size_t)(heap_mib * MIB));
        printf("heap_rc=%d\n", (int)heap_rc);
        views("s3");
        CUresult stack_rc = cuCtxSetLimit(CU_LIMIT_STACK_SIZE, stack);
        printf("stack_rc=%d\n", (int)stack_rc);
        views("s4");
        CHECK(cuMemFree(a));
        views("s5");
        CHECK(cuModuleUnload(mod));
        views("s6");
        CHECK(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, heap0));
        views("s7");
        CHECK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, stack0));
        views("s8");
        printf("fill_bytes=%llu\n", fill());
        views("s9");
    } else if (strcmp(mode, "modules") == 0 && argc > 3) {
        leave_room(strtoull(argv[2], 0, 10));
        for (int a = 3; a < argc; a++) {
            FILE *f = fopen(argv[a], "rb");
            if (!f) { fprintf(stderr, "cannot open %s\n", argv[a]); return 1; }
            fseek(f, 0, SEEK_END);
            long size = ftell(f);
            fseek(f, 0, SEEK_SET);
            char *image = calloc(1, (size_t)size + 1);
            if (fread(image, 1, (size_t)size, f) != (size_t)size) return 1;
            fclose(f);
            CUmodule mod;
            CUlibrary lib;
            CUfunction fn;
            CUkernel kernel;
            /* Each load, then its kernel's lookup (where a lazy driver loads the code). */
            CUresult rc = cuModuleLoadData(&mod, image);
            printf("load%d_data_rc=%d\n", a - 3, (int)rc);
            if (rc == CUDA_SUCCESS) {
                printf("load%d_data_lookup_rc=%d\n", a - 3, (int)cuModuleGetFunction(&fn, mod, "saxpy"));
                CHECK(cuModuleUnload(mod));
            }
            rc = cuModuleLoad(&mod, argv[a]);
            printf("load%d_file_rc=%d\n", a - 3, (int)rc);
            if (rc == CUDA_SUCCESS) {
                printf("load%d_file_lookup_rc=%d\n", a - 3, (int)cuModuleGetFunction(&fn, mod, "saxpy"));
                CHECK(cuModuleUnload(mod));
            }
            rc = cuLibraryLoadData(&lib, image, 0, 0, 0, 0, 0, 0);
            printf("load%d_library_rc=%d\n", a - 3, (int)rc);
            if (rc == CUDA_SUCCESS) {
                /* A library's kernel is loaded when a function is needed for the context. */
                rc = cuLibraryGetKernel(&kernel, lib, "saxpy");
                if (rc == CUDA_SUCCESS) rc = cuKernelGetFunction(&fn, kernel);
                printf("load%d_library_lookup_rc=%d\n", a - 3, (int)rc);
                CHECK(cuLibraryUnload(lib));
            }
            free(image);
            char step[32];
            snprintf(step, sizeof step, "load%d", a - 3);
            views(step);
        }
    } else if (strcmp(mode, "heapfit") == 0 && argc > 3) {
        leave_room(strtoull(argv[2], 0, 10));
        CUresult rc = cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, (size_t)(strtoull(argv[3], 0, 10) * MIB));
        printf("heap_rc=%d\n", (int)rc);
    } else if (strcmp(mode, "pendingfree") == 0) {
        /* A block freed on a stream still busy (simgpu's `spin` kernel: its parameter in
         * microseconds), then another allocated from the same pool on a second stream. */
        const char *ptx = ".version 7.0\n.target sm_80\n.address_size 64\n"
                          ".visible .entry spin(.param .u64 us)\n{ ret; }\n";
        CUmodule mod;
        CUfunction spin;
        CUstream s1, s2;
        CUdeviceptr a, b;
        unsigned long long us = 1000000;
        void *params[] = {&us};
        CHECK(cuModuleLoadData(&mod, ptx));
        CHECK(cuModuleGetFunction(&spin, mod, "spin"));
        CHECK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
        CHECK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
        CHECK(cuMemAllocAsync(&a, 600 * MIB, s2));
        CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s2, params, NULL));
        CHECK(cuMemFreeAsync(a, s2));
        if (argc > 2 && strcmp(argv[2], "destroyed") == 0) {
            /* The stream goes before its free has run; then everything has run. */
            CHECK(cuStreamDestroy(s2));
            CHECK(cuCtxSynchronize());
            CUresult first = cuMemAllocAsync(&b, 300 * MIB, s1);
            if (first != CUDA_SUCCESS) first = cuMemAllocAsync(&b, 300 * MIB, s1);
            printf("after_destroyed_rc=%d\n", (int)first);
            CHECK(cuCtxSynchronize());
            views("pendingfree");
            return 0;
        }
        CUresult rc = cuMemAllocAsync(&b, 300 * MIB, s1);
        printf("second_rc=%d\n", (int)rc);
        CHECK(cuCtxSynchronize());
        views("pendingfree");
    } else if (strcmp(mode, "pooldestroy") == 0) {
        /* NVIDIA: a pool destroyed with allocations outstanding is released "once there are no
         * more outstanding allocations". */
        CUmemPoolProps props;
        CUmemoryPool pool;
        CUstream s;
        CUdeviceptr block, p;
        memset(&props, 0, sizeof props);
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = dev;
        CHECK(cuMemPoolCreate(&pool, &props));
        CHECK(cuStreamCreate(&s, 0));
        CHECK(cuMemAllocFromPoolAsync(&block, 600 * MIB, pool, s));
        CHECK(cuStreamSynchronize(s));
        CHECK(cuMemPoolDestroy(pool));
        CUresult rc = cuMemAlloc(&p, 600 * MIB);
        printf("after_destroy_rc=%d\n", (int)rc);
        if (rc == CUDA_SUCCESS) CHECK(cuMemFree(p));
        CHECK(cuMemFreeAsync(block, s));
        CHECK(cuStreamSynchronize(s));
        rc = cuMemAlloc(&p, 600 * MIB);
        printf("after_free_rc=%d\n", (int)rc);
        views("pooldestroy");
    } else if (strcmp(mode, "tiny") == 0 && argc > 2) {
        leave_room(strtoull(argv[2], 0, 10));
        CUdeviceptr p;
        long n = 0;
        while (n < (1L << 21) && cuMemAlloc(&p, 1) == CUDA_SUCCESS) n++;
        printf("tiny=%ld\n", n);
        views("tiny");
    } else if (strcmp(mode, "leave") == 0 && argc > 2) {
        if (argc > 3) {
            char line[64];
            printf("ready=1\n");
            fflush(stdout);
            if (!fgets(line, sizeof line, stdin)) return 0;
        }
        CUdeviceptr p;
        CHECK(cuMemAlloc(&p, (size_t)(strtoull(argv[2], 0, 10) * MIB)));
        printf("left=1\n");
    } else if (strcmp(mode, "hold") == 0) {
        char line[64];
        if (argc > 4) {
            char *ptx = ptx_image(strtoull(argv[2], 0, 10) * MIB, 0);
            CUmodule mod;
            CHECK(cuModuleLoadData(&mod, ptx));
            free(ptx);
            CUfunction touch;
            CHECK(cuModuleGetFunction(&touch, mod, "touch"));
            CHECK(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, (size_t)(strtoull(argv[3], 0, 10) * MIB)));
            CHECK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, (size_t)strtoull(argv[4], 0, 10)));
        }
        printf("ready=1\n");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin)) return 0;
        printf("fill_bytes=%llu\n", fill());
        views("held");
        while (fgets(line, sizeof line, stdin)) {}
    } else if (strcmp(mode, "second") == 0) {
        char line[64];
        CUdevice dev1;
        CUcontext ctx1;
        CUdeviceptr a;
        CHECK(cuMemAlloc(&a, 256 * MIB));
        CHECK(cuDeviceGet(&dev1, 1));
        CHECK(cuCtxCreate(&ctx1, 0, dev1));
        printf("ready=1\n");
        fflush(stdout);
        while (fgets(line, sizeof line, stdin)) {}
    } else if (strcmp(mode, "async") == 0 && argc > 2) {
        int rounds = atoi(argv[2]);
        CUstream s;
        CHECK(cuStreamCreate(&s, 0));
        for (int r = 0; r < rounds; r++) {
            CUdeviceptr blocks[256];
            int n = 0;
            while (n < 256 && cuMemAllocAsync(&blocks[n], 64 * MIB, s) == CUDA_SUCCESS) n++;
            printf("round%d_blocks=%d\n", r, n);
            for (int i = 0; i < n; i++) CHECK(cuMemFreeAsync(blocks[i], s));
            CHECK(cuStreamSynchronize(s));
        }
        unsigned long long more = fill();
        printf("fill_after_bytes=%llu\n", more);
        views("async");
    } else if (strcmp(mode, "limits") == 0 && argc > 2) {
        /* Context limits set in turn (sBYTES: the stack size, hBYTES: the malloc heap, fBYTES: the
         * printf FIFO), views after each as limitN; then fill in 2 MiB chunks. */
        for (int a = 2; a < argc; a++) {
            CUlimit which = argv[a][0] == 's'   ? CU_LIMIT_STACK_SIZE
                            : argv[a][0] == 'h' ? CU_LIMIT_MALLOC_HEAP_SIZE
                                                : CU_LIMIT_PRINTF_FIFO_SIZE;
            char step[32];
            CHECK(cuCtxSetLimit(which, (size_t)strtoull(argv[a] + 1, 0, 10)));
            snprintf(step, sizeof step, "limit%d", a - 2);
            views(step);
        }
        char line[64];
        printf("pid=%d\nlimits_set=1\n", (int)getpid());
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin)) return 0;
        unsigned long long filled = fill();
        printf("fill_bytes=%llu\n", filled);
    } else if (strcmp(mode, "mixedasync") == 0 && argc > 2) {
        /* As a stream-ordered caching allocator (PyTorch's cudaMallocAsync backend): blocks of each
         * size in turn until refused, freed on the stream without synchronising, so that the next
         * size is served from the memory the pool already holds. */
        CUstream s;
        CHECK(cuStreamCreate(&s, 0));
        for (int a = 2; a < argc; a++) {
            unsigned long long mib = strtoull(argv[a], 0, 10);
            static CUdeviceptr blocks[1024];
            int n = 0;
            while (n < 1024 && cuMemAllocAsync(&blocks[n], mib * MIB, s) == CUDA_SUCCESS) n++;
            printf("blocks_%llu=%d\n", mib, n);
            for (int i = 0; i < n; i++) CHECK(cuMemFreeAsync(blocks[i], s));
        }
        CHECK(cuStreamSynchronize(s));
        views("mixedasync");
    } else if (strcmp(mode, "graph") == 0 && argc > 2) {
        CUstream s;
        CUgraph graph;
        CUgraphNode node;
        CUgraphExec exec;
        CUDA_MEM_ALLOC_NODE_PARAMS params;
        memset(&params, 0, sizeof params);
        params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        params.poolProps.location.id = dev;
        params.bytesize = (size_t)(strtoull(argv[2], 0, 10) * MIB);
        CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        views("before");
        if (argc > 3 && strcmp(argv[3], "captured") == 0) {
            /* The same node made by capturing a stream-ordered allocation. */
            CUdeviceptr p;
            CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
            CHECK(cuMemAllocAsync(&p, params.bytesize, s));
            CHECK(cuStreamEndCapture(s, &graph));
        } else {
            CHECK(cuGraphCreate(&graph, 0));
            CHECK(cuGraphAddMemAllocNode(&node, graph, NULL, 0, &params));
        }
        CHECK(cuGraphInstantiate(&exec, graph, 0));
        views("instantiated");
        CHECK(cuGraphLaunch(exec, s));
        CHECK(cuStreamSynchronize(s));
        views("launched");
    } else {
        printf("error=usage\n");
        return 2;
    }
    printf("done=1\n");
    return 0;
}
