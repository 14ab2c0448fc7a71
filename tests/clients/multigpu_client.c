/* Multi-device client (tests/simgpu_multigpu.rs): an unmodified CUDA program linked with -lcuda.
 * Prints key=value lines; on a failed call, error=... and exit 1.
 *
 * Modes:
 *   rank DEVICE TAG PARTICIPANTS ITERS US
 *       one rank of a collective on DEVICE (its primary context): ITERS times, a `spin` kernel of US
 *       then a `barrier` kernel (tag TAG, PARTICIPANTS ranks), then cuStreamSynchronize; like a
 *       tensor-parallel server doing compute then an NCCL all-reduce. Prints ready=1 first.
 *   teardown reset|destroy|release
 *       a stream and an event (recorded after a queued kernel) in a context, then the context is
 *       destroyed (cuDevicePrimaryCtxReset / cuCtxDestroy / the last cuDevicePrimaryCtxRelease);
 *       prints each later call's result code: stream_query, stream_sync, event_query, event_sync,
 *       launch, ctx_sync, and for a primary context retain_again / release_after (what
 *       cuDevicePrimaryCtxRetain and cuDevicePrimaryCtxRelease answer afterwards).
 *   streams DEVICE NSTREAMS N US
 *       N `spin` kernels of US on each of NSTREAMS non-blocking streams of one context (issued round
 *       robin, so they can overlap), then cuCtxSynchronize; prints wall_ns.
 *
 * Kernel parameter layouts (simgpu recognises kernels by name):
 *   spin_kernel(uint64_t microseconds)
 *   barrier_kernel(uint64_t tag, uint64_t participants)
 */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(call)                                                                            \
    do {                                                                                       \
        CUresult rc_ = (call);                                                                 \
        if (rc_ != CUDA_SUCCESS) {                                                             \
            printf("error=%s rc=%d line=%d\n", #call, (int)rc_, __LINE__);                     \
            fflush(stdout);                                                                    \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static const char module_image[] = "simgpu test module: any bytes";
static CUfunction spin, barrier;

static void setup(int device) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, device));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, module_image));
    CHECK(cuModuleGetFunction(&spin, mod, "spin_kernel"));
    CHECK(cuModuleGetFunction(&barrier, mod, "barrier_kernel"));
}

static void launch_spin(CUstream s, uint64_t us) {
    void *params[] = {&us};
    CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
}

static void launch_barrier(CUstream s, uint64_t tag, uint64_t participants) {
    void *params[] = {&tag, &participants};
    CHECK(cuLaunchKernel(barrier, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
}

static int mode_rank(int device, uint64_t tag, uint64_t participants, long iters, uint64_t us) {
    CUstream s;
    setup(device);
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    printf("ready=1\n");
    fflush(stdout);
    uint64_t t0 = now_ns();
    for (long i = 0; i < iters; i++) {
        launch_spin(s, us);
        launch_barrier(s, tag, participants);
        CHECK(cuStreamSynchronize(s));
    }
    printf("iterations=%ld\nwall_ns=%llu\n", iters, (unsigned long long)(now_ns() - t0));
    return 0;
}

enum { MAX_STREAMS = 16 };

static int mode_streams(int device, int nstreams, long n, uint64_t us) {
    CUstream s[MAX_STREAMS];
    if (nstreams < 1 || nstreams > MAX_STREAMS) {
        printf("error=bad stream count %d\n", nstreams);
        return 1;
    }
    setup(device);
    for (int i = 0; i < nstreams; i++)
        CHECK(cuStreamCreate(&s[i], CU_STREAM_NON_BLOCKING));
    CHECK(cuCtxSynchronize());
    uint64_t t0 = now_ns();
    for (long k = 0; k < n; k++)
        for (int i = 0; i < nstreams; i++)
            launch_spin(s[i], us);
    CHECK(cuCtxSynchronize());
    printf("kernels=%ld\nwall_ns=%llu\n", n * nstreams, (unsigned long long)(now_ns() - t0));
    return 0;
}

static int mode_teardown(const char *how) {
    CUdevice dev;
    CUcontext ctx;
    CUstream s;
    CUevent e;
    if (strcmp(how, "destroy") == 0) {
        CUmodule mod;
        CHECK(cuInit(0));
        CHECK(cuDeviceGet(&dev, 0));
        CHECK(cuCtxCreate(&ctx, 0, dev));
        CHECK(cuModuleLoadData(&mod, module_image));
        CHECK(cuModuleGetFunction(&spin, mod, "spin_kernel"));
    } else {
        setup(0);
        CHECK(cuDeviceGet(&dev, 0));
        CHECK(cuCtxGetCurrent(&ctx));
    }
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    launch_spin(s, 2000);
    CHECK(cuEventRecord(e, s));
    if (strcmp(how, "reset") == 0)
        printf("teardown=%d\n", (int)cuDevicePrimaryCtxReset(dev));
    else if (strcmp(how, "destroy") == 0)
        printf("teardown=%d\n", (int)cuCtxDestroy(ctx));
    else
        printf("teardown=%d\n", (int)cuDevicePrimaryCtxRelease(dev));
    printf("stream_query=%d\n", (int)cuStreamQuery(s));
    printf("stream_sync=%d\n", (int)cuStreamSynchronize(s));
    printf("event_query=%d\n", (int)cuEventQuery(e));
    printf("event_sync=%d\n", (int)cuEventSynchronize(e));
    uint64_t us = 1;
    void *params[] = {&us};
    printf("launch=%d\n", (int)cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
    printf("ctx_sync=%d\n", (int)cuCtxSynchronize());
    if (strcmp(how, "destroy") != 0) {
        CUcontext again;
        printf("retain_again=%d\n", (int)cuDevicePrimaryCtxRetain(&again, dev));
        printf("same_handle=%d\n", again == ctx);
        printf("release_after=%d\n", (int)cuDevicePrimaryCtxRelease(dev));
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "rank") == 0 && argc == 7)
        return mode_rank(atoi(argv[2]), strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10),
                         atol(argv[5]), strtoull(argv[6], NULL, 10));
    if (strcmp(mode, "teardown") == 0 && argc == 3)
        return mode_teardown(argv[2]);
    if (strcmp(mode, "streams") == 0 && argc == 6)
        return mode_streams(atoi(argv[2]), atoi(argv[3]), atol(argv[4]),
                            strtoull(argv[5], NULL, 10));
    fprintf(stderr,
            "usage: %s [rank DEVICE TAG PARTICIPANTS ITERS US | streams DEVICE NSTREAMS N US | "
            "teardown reset|destroy|release]\n",
            argv[0]);
    return 2;
}
