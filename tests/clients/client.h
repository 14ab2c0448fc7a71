/* The body shared by linked.c (calls the driver directly, linked with -lcuda) and dlopen.c (resolves
 * every function with dlopen/dlsym, as cudarc and numba do). Each includes this after defining
 * BIND_ALL(), which fills the table `A` below. Everything is printed as `key=value` lines that the
 * Rust integration tests (tests/simgpu_clients.rs, tests/simgpu_sharing.rs) assert on.
 *
 * Modes (argv[1]):
 *   full                         every step of a typical CUDA program, then allocate until OOM
 *   devices                      cuInit, then count, name and UUID of every visible device
 *                                (when cuInit fails: the return codes of cuDriverGetVersion,
 *                                cuDeviceGetCount twice and cuMemGetInfo)
 *   spin START_NS MS KERNEL_US   from CLOCK_REALTIME START_NS, launch `spin` kernels back to back
 *                                for MS milliseconds, keeping a few queued; print the interval
 *   async N KERNEL_US            N launches: time spent launching vs. synchronizing
 *   hold MIB KERNEL_US           allocate MIB, print ready=1, run kernels until stdin closes, then
 *                                exit WITHOUT freeing (the driver must reclaim a dead process's memory)
 *   threadexit                   a thread makes the primary context current and ends; a destructor
 *                                of its thread-specific data (run as the thread exits, after its
 *                                thread-local storage is gone) asks for the current context and the
 *                                memory info, as libraries releasing their contexts then do (prints
 *                                same_context= get_rc= info_rc=)
 */
#include <pthread.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The driver functions every mode uses: X(field, exported symbol of the CUDA 12 ABI). The field
 * type is taken from the header's own declaration, so a wrong signature fails to compile. */
#define API_LIST(X)                                        \
    X(cuInit, "cuInit")                                    \
    X(cuDriverGetVersion, "cuDriverGetVersion")            \
    X(cuGetErrorName, "cuGetErrorName")                    \
    X(cuDeviceGetCount, "cuDeviceGetCount")                \
    X(cuDeviceGet, "cuDeviceGet")                          \
    X(cuDeviceGetName, "cuDeviceGetName")                  \
    X(cuDeviceGetUuid, "cuDeviceGetUuid")                  \
    X(cuDeviceTotalMem, "cuDeviceTotalMem_v2")             \
    X(cuDeviceGetAttribute, "cuDeviceGetAttribute")        \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") \
    X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2") \
    X(cuCtxSetCurrent, "cuCtxSetCurrent")                  \
    X(cuCtxGetCurrent, "cuCtxGetCurrent")                  \
    X(cuMemGetInfo, "cuMemGetInfo_v2")                     \
    X(cuMemAlloc, "cuMemAlloc_v2")                         \
    X(cuMemFree, "cuMemFree_v2")                           \
    X(cuMemcpyHtoD, "cuMemcpyHtoD_v2")                     \
    X(cuMemcpyDtoH, "cuMemcpyDtoH_v2")                     \
    X(cuMemsetD8, "cuMemsetD8_v2")                         \
    X(cuModuleLoadData, "cuModuleLoadData")                \
    X(cuModuleGetFunction, "cuModuleGetFunction")          \
    X(cuModuleUnload, "cuModuleUnload")                    \
    X(cuStreamCreate, "cuStreamCreate")                    \
    X(cuStreamDestroy, "cuStreamDestroy_v2")               \
    X(cuStreamSynchronize, "cuStreamSynchronize")          \
    X(cuLaunchKernel, "cuLaunchKernel")                    \
    X(cuEventCreate, "cuEventCreate")                      \
    X(cuEventRecord, "cuEventRecord")                      \
    X(cuEventSynchronize, "cuEventSynchronize")            \
    X(cuEventElapsedTime, "cuEventElapsedTime")            \
    X(cuEventDestroy, "cuEventDestroy_v2")

#define API_FIELD(f, s) __typeof__(&f) p_##f;
static struct {
    API_LIST(API_FIELD)
} A;

static const char *err_name(CUresult rc) {
    const char *name = NULL;
    if (A.p_cuGetErrorName == NULL || A.p_cuGetErrorName(rc, &name) != CUDA_SUCCESS || name == NULL)
        return "?";
    return name;
}

/* A failed step ends the client: the test prints stdout/stderr, which name the call. */
#define CHECK(call)                                                                        \
    do {                                                                                   \
        CUresult rc_ = (call);                                                             \
        if (rc_ != CUDA_SUCCESS) {                                                         \
            printf("error=%s rc=%d name=%s line=%d\n", #call, (int)rc_, err_name(rc_), __LINE__); \
            fflush(stdout);                                                                \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static uint64_t now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void format_uuid(const CUuuid *u, char out[64]) {
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, 64,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
             b[13], b[14], b[15]);
}

/* Any bytes are a module image for simgpu; the function name is what matters. */
static const char module_image[] = "simgpu test module: any bytes";

struct setup {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction spin;
    CUstream stream;
};

static void setup(struct setup *s) {
    CHECK(A.p_cuInit(0));
    CHECK(A.p_cuDeviceGet(&s->dev, 0));
    CHECK(A.p_cuDevicePrimaryCtxRetain(&s->ctx, s->dev));
    CHECK(A.p_cuCtxSetCurrent(s->ctx));
    CHECK(A.p_cuModuleLoadData(&s->mod, module_image));
    CHECK(A.p_cuModuleGetFunction(&s->spin, s->mod, "spin_kernel"));
    CHECK(A.p_cuStreamCreate(&s->stream, CU_STREAM_NON_BLOCKING));
}

static CUresult launch_spin(struct setup *s, uint64_t us) {
    void *params[] = {&us};
    return A.p_cuLaunchKernel(s->spin, 1, 1, 1, 1, 1, 1, 0, s->stream, params, NULL);
}

static int mode_devices(void) {
    CUresult rc = A.p_cuInit(0);
    printf("init=%d\n", (int)rc);
    if (rc != CUDA_SUCCESS) {
        /* A program that goes on calling after a failure (each call fails the same way). */
        int version = 0, count = 0;
        size_t free_bytes = 0, total_bytes = 0;
        printf("version_rc=%d\n", (int)A.p_cuDriverGetVersion(&version));
        printf("count_rc=%d\n", (int)A.p_cuDeviceGetCount(&count));
        printf("count_again_rc=%d\n", (int)A.p_cuDeviceGetCount(&count));
        printf("info_rc=%d\n", (int)A.p_cuMemGetInfo(&free_bytes, &total_bytes));
        return 0;
    }
    int count = -1;
    CHECK(A.p_cuDeviceGetCount(&count));
    printf("device_count=%d\n", count);
    for (int i = 0; i < count; i++) {
        CUdevice dev;
        char name[256];
        CUuuid uuid;
        char text[64];
        CHECK(A.p_cuDeviceGet(&dev, i));
        CHECK(A.p_cuDeviceGetName(name, sizeof name, dev));
        CHECK(A.p_cuDeviceGetUuid(&uuid, dev));
        format_uuid(&uuid, text);
        printf("device%d_name=%s\ndevice%d_uuid=%s\n", i, name, i, text);
    }
    return 0;
}

static int mode_full(void) {
    int version = 0;
    CHECK(A.p_cuDriverGetVersion(&version));
    printf("driver_version=%d\n", version);
    CHECK(A.p_cuInit(0));
    int count = 0;
    CHECK(A.p_cuDeviceGetCount(&count));
    printf("device_count=%d\n", count);

    CUdevice dev;
    char name[256];
    CUuuid uuid;
    char uuid_text[64];
    size_t total = 0;
    int major = -1, minor = -1;
    CHECK(A.p_cuDeviceGet(&dev, 0));
    CHECK(A.p_cuDeviceGetName(name, sizeof name, dev));
    CHECK(A.p_cuDeviceGetUuid(&uuid, dev));
    format_uuid(&uuid, uuid_text);
    CHECK(A.p_cuDeviceTotalMem(&total, dev));
    CHECK(A.p_cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CHECK(A.p_cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    printf("device_name=%s\ndevice_uuid=%s\ntotal_mem=%zu\ncompute_capability=%d.%d\n", name,
           uuid_text, total, major, minor);

    CUcontext ctx = NULL, current = NULL;
    CHECK(A.p_cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(A.p_cuCtxSetCurrent(ctx));
    CHECK(A.p_cuCtxGetCurrent(&current));
    printf("ctx_current=%d\n", current == ctx && ctx != NULL);
    size_t free_mem = 0, total_mem = 0;
    CHECK(A.p_cuMemGetInfo(&free_mem, &total_mem));
    printf("mem_info_free=%zu\nmem_info_total=%zu\n", free_mem, total_mem);

    /* Round trip: a 1 MiB pattern to the device and back. */
    const size_t n = 1 << 20;
    unsigned char *host = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n; i++)
        host[i] = (unsigned char)(i * 7 + (i >> 11));
    CUdeviceptr buf = 0;
    CHECK(A.p_cuMemAlloc(&buf, n));
    printf("alloc_nonnull=%d\n", buf != 0);
    CHECK(A.p_cuMemcpyHtoD(buf, host, n));
    memset(back, 0, n);
    CHECK(A.p_cuMemcpyDtoH(back, buf, n));
    printf("roundtrip_equal=%d\n", memcmp(host, back, n) == 0);
    CHECK(A.p_cuMemsetD8(buf, 0xA5, n));
    CHECK(A.p_cuMemcpyDtoH(back, buf, n));
    int memset_ok = 1;
    for (size_t i = 0; i < n; i++)
        memset_ok &= back[i] == 0xA5;
    printf("memset_equal=%d\n", memset_ok);

    /* A 2000 us kernel between two events on a stream. */
    CUmodule mod;
    CUfunction spin;
    CUstream stream;
    CUevent start, stop;
    CHECK(A.p_cuModuleLoadData(&mod, module_image));
    CHECK(A.p_cuModuleGetFunction(&spin, mod, "spin_kernel"));
    CHECK(A.p_cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CHECK(A.p_cuEventCreate(&start, CU_EVENT_DEFAULT));
    CHECK(A.p_cuEventCreate(&stop, CU_EVENT_DEFAULT));
    uint64_t us = 2000;
    void *params[] = {&us};
    CHECK(A.p_cuEventRecord(start, stream));
    CHECK(A.p_cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL));
    CHECK(A.p_cuEventRecord(stop, stream));
    CHECK(A.p_cuStreamSynchronize(stream));
    CHECK(A.p_cuEventSynchronize(stop));
    float ms = 0;
    CHECK(A.p_cuEventElapsedTime(&ms, start, stop));
    printf("kernel_elapsed_ms=%.3f\n", ms);
    CHECK(A.p_cuEventDestroy(start));
    CHECK(A.p_cuEventDestroy(stop));
    CHECK(A.p_cuStreamDestroy(stream));
    CHECK(A.p_cuModuleUnload(mod));
    CHECK(A.p_cuMemFree(buf));
    free(host);
    free(back);

    /* Allocate 64 MiB at a time until the device is full. */
    enum { MAX_CHUNKS = 4096 };
    static CUdeviceptr chunks[MAX_CHUNKS];
    int got = 0;
    CUresult rc = CUDA_SUCCESS;
    while (got < MAX_CHUNKS) {
        rc = A.p_cuMemAlloc(&chunks[got], 64u << 20);
        if (rc != CUDA_SUCCESS)
            break;
        got++;
    }
    printf("oom_allocs=%d\noom_rc=%d\n", got, (int)rc);
    for (int i = 0; i < got; i++)
        CHECK(A.p_cuMemFree(chunks[i]));
    CHECK(A.p_cuMemGetInfo(&free_mem, &total_mem));
    printf("mem_info_free_after=%zu\n", free_mem);
    CHECK(A.p_cuDevicePrimaryCtxRelease(dev));
    printf("done=1\n");
    return 0;
}

static int mode_spin(uint64_t start_ns, uint64_t duration_ms, uint64_t kernel_us) {
    struct setup s;
    setup(&s);
    enum { RING = 4 };
    CUevent ring[RING];
    for (int i = 0; i < RING; i++)
        CHECK(A.p_cuEventCreate(&ring[i], CU_EVENT_DEFAULT));
    while (now_ns(CLOCK_REALTIME) < start_ns)
        usleep(200);
    uint64_t t0 = now_ns(CLOCK_REALTIME), end = t0 + duration_ms * 1000000ull;
    long launches = 0;
    /* Keep RING-1 kernels queued: the device never waits on this process. */
    while (now_ns(CLOCK_REALTIME) < end) {
        CHECK(launch_spin(&s, kernel_us));
        CHECK(A.p_cuEventRecord(ring[launches % RING], s.stream));
        launches++;
        if (launches >= RING - 1)
            CHECK(A.p_cuEventSynchronize(ring[(launches - (RING - 1)) % RING]));
    }
    CHECK(A.p_cuStreamSynchronize(s.stream));
    uint64_t t1 = now_ns(CLOCK_REALTIME);
    printf("start_ns=%llu\nend_ns=%llu\nlaunches=%ld\n", (unsigned long long)t0,
           (unsigned long long)t1, launches);
    return 0;
}

static int mode_async(int n, uint64_t kernel_us) {
    struct setup s;
    setup(&s);
    CHECK(A.p_cuStreamSynchronize(s.stream));
    uint64_t t0 = now_ns(CLOCK_MONOTONIC);
    for (int i = 0; i < n; i++)
        CHECK(launch_spin(&s, kernel_us));
    uint64_t t1 = now_ns(CLOCK_MONOTONIC);
    CHECK(A.p_cuStreamSynchronize(s.stream));
    uint64_t t2 = now_ns(CLOCK_MONOTONIC);
    printf("launch_us=%llu\nsync_us=%llu\n", (unsigned long long)(t1 - t0) / 1000,
           (unsigned long long)(t2 - t1) / 1000);
    return 0;
}

static int mode_hold(size_t mib, uint64_t kernel_us) {
    struct setup s;
    setup(&s);
    CUdeviceptr buf;
    CHECK(A.p_cuMemAlloc(&buf, mib << 20));
    /* One kernel has run before the holder says it is ready. */
    CHECK(launch_spin(&s, kernel_us));
    CHECK(A.p_cuStreamSynchronize(s.stream));
    printf("ready=1\npid=%d\n", (int)getpid());
    fflush(stdout);
    /* Keep RING-1 kernels queued, as in mode_spin: the device is never idle waiting for us. */
    enum { RING = 4 };
    CUevent ring[RING];
    for (int i = 0; i < RING; i++)
        CHECK(A.p_cuEventCreate(&ring[i], CU_EVENT_DEFAULT));
    for (long k = 0;; k++) {
        CHECK(launch_spin(&s, kernel_us));
        CHECK(A.p_cuEventRecord(ring[k % RING], s.stream));
        if (k >= RING - 1)
            CHECK(A.p_cuEventSynchronize(ring[(k - (RING - 1)) % RING]));
        struct pollfd p = {.fd = 0, .events = POLLIN};
        if (poll(&p, 1, 0) > 0) {
            char c;
            if (read(0, &c, 1) <= 0)
                break;
        }
    }
    fflush(stdout);
    _exit(0);
}

static CUcontext exit_ctx;
static int exit_get_rc = -1, exit_info_rc = -1;

static void at_thread_exit(void *unused) {
    (void)unused;
    size_t free_bytes, total_bytes;
    exit_get_rc = (int)A.p_cuCtxGetCurrent(&exit_ctx);
    exit_info_rc = (int)A.p_cuMemGetInfo(&free_bytes, &total_bytes);
}

static void *exiting_thread(void *ctx) {
    pthread_key_t key;
    if (pthread_key_create(&key, at_thread_exit) != 0 || pthread_setspecific(key, ctx) != 0)
        return NULL;
    CHECK(A.p_cuCtxSetCurrent((CUcontext)ctx));
    size_t free_bytes, total_bytes;
    CHECK(A.p_cuMemGetInfo(&free_bytes, &total_bytes));
    return NULL;
}

static int mode_threadexit(void) {
    CUdevice dev;
    CUcontext ctx;
    CHECK(A.p_cuInit(0));
    CHECK(A.p_cuDeviceGet(&dev, 0));
    CHECK(A.p_cuDevicePrimaryCtxRetain(&ctx, dev));
    pthread_t t;
    if (pthread_create(&t, NULL, exiting_thread, ctx) != 0 || pthread_join(t, NULL) != 0)
        return 1;
    printf("same_context=%d\nget_rc=%d\ninfo_rc=%d\n", exit_ctx == ctx, exit_get_rc, exit_info_rc);
    return 0;
}

static void bind_all(void);

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    bind_all();
    const char *mode = argc > 1 ? argv[1] : "full";
    if (strcmp(mode, "full") == 0)
        return mode_full();
    if (strcmp(mode, "devices") == 0)
        return mode_devices();
    if (strcmp(mode, "spin") == 0 && argc == 5)
        return mode_spin(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10),
                         strtoull(argv[4], NULL, 10));
    if (strcmp(mode, "async") == 0 && argc == 4)
        return mode_async(atoi(argv[2]), strtoull(argv[3], NULL, 10));
    if (strcmp(mode, "hold") == 0 && argc == 4)
        return mode_hold(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10));
    if (strcmp(mode, "threadexit") == 0)
        return mode_threadexit();
    fprintf(stderr,
            "usage: %s [full | devices | spin START_NS MS US | async N US | hold MIB US | threadexit]\n",
            argv[0]);
    return 2;
}
