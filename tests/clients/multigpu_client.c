/* Multi-device client (tests/simgpu_multigpu.rs): an unmodified CUDA program linked with -lcuda.
 * Prints key=value lines; on a failed call, error=... and exit 1.
 *
 * Modes:
 *   rank DEVICE TAG PARTICIPANTS ITERS US
 *       one rank of a collective on DEVICE (its primary context): ITERS times, a `spin` kernel of US
 *       then a `barrier` kernel (tag TAG, PARTICIPANTS ranks), then cuStreamSynchronize; like a
 *       tensor-parallel server doing compute then an NCCL all-reduce. Prints ready=1 first, then
 *       iterations=, wall_ns= (its loop) and start_ns=/end_ns= (CLOCK_REALTIME around the loop).
 *   teardown reset|destroy|release
 *       a stream and an event (recorded after a queued kernel) in a context, then the context is
 *       destroyed (cuDevicePrimaryCtxReset / cuCtxDestroy / the last cuDevicePrimaryCtxRelease);
 *       prints each later call's result code: stream_query, stream_sync, event_query, event_sync,
 *       launch, ctx_sync, and for a primary context retain_again / release_after (what
 *       cuDevicePrimaryCtxRetain and cuDevicePrimaryCtxRelease answer afterwards).
 *   capture CAPTURE_MODE self|other CALLER_MODE CALL
 *       a thread captures a stream in CAPTURE_MODE (global, thread_local, relaxed); meanwhile the
 *       capturing thread itself (self) or another thread (other), in CALLER_MODE (global,
 *       thread_local, relaxed, or default: no cuThreadExchangeStreamCaptureMode), makes CALL on
 *       objects outside the capture: event_query / event_sync (an event recorded before the
 *       capture on another stream), stream_query / stream_sync (that other stream), ctx_sync,
 *       mem_alloc (cuMemAlloc + cuMemFree). Prints call=, capture_launch= (a launch into the
 *       capture after the call), end= (cuStreamEndCapture), graph_null=, and graph_launch= when a
 *       graph was captured.
 *   graphmem MIB
 *       graph memory nodes: graphs capturing cuMemAllocAsync of MIB MiB (with and without the
 *       matching cuMemFreeAsync), one built with cuGraphAddMemAllocNode/cuGraphAddMemFreeNode, and
 *       one too large for the device; prints the device memory in use (cuMemGetInfo) and
 *       CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT after each step, and each call's result.
 *   streams DEVICE NSTREAMS N US
 *       N `spin` kernels of US on each of NSTREAMS non-blocking streams of one context (issued round
 *       robin, so they can overlap), then cuCtxSynchronize; prints wall_ns.
 *
 * Kernel parameter layouts (simgpu recognises kernels by name):
 *   spin_kernel(uint64_t microseconds)
 *   barrier_kernel(uint64_t tag, uint64_t participants)
 */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"

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
    uint64_t t1 = now_ns();
    printf("iterations=%ld\nwall_ns=%llu\nstart_ns=%llu\nend_ns=%llu\n", iters,
           (unsigned long long)(t1 - t0), (unsigned long long)t0, (unsigned long long)t1);
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

static int capture_mode(const char *name) {
    if (strcmp(name, "global") == 0)
        return CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (strcmp(name, "thread_local") == 0)
        return CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    if (strcmp(name, "relaxed") == 0)
        return CU_STREAM_CAPTURE_MODE_RELAXED;
    return -1;
}

struct call_args {
    CUcontext ctx;
    int mode; /* -1: leave the thread's mode alone */
    const char *call;
    CUevent before;
    CUstream other;
    int rc;
};

static void *make_call(void *p) {
    struct call_args *a = p;
    CHECK(cuCtxSetCurrent(a->ctx));
    if (a->mode >= 0) {
        CUstreamCaptureMode m = (CUstreamCaptureMode)a->mode;
        CHECK(cuThreadExchangeStreamCaptureMode(&m));
    }
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (strcmp(a->call, "event_query") == 0)
        rc = cuEventQuery(a->before);
    else if (strcmp(a->call, "event_sync") == 0)
        rc = cuEventSynchronize(a->before);
    else if (strcmp(a->call, "stream_query") == 0)
        rc = cuStreamQuery(a->other);
    else if (strcmp(a->call, "stream_sync") == 0)
        rc = cuStreamSynchronize(a->other);
    else if (strcmp(a->call, "ctx_sync") == 0)
        rc = cuCtxSynchronize();
    else if (strcmp(a->call, "mem_alloc") == 0) {
        CUdeviceptr d;
        rc = cuMemAlloc(&d, 1 << 20);
        if (rc == CUDA_SUCCESS)
            rc = cuMemFree(d);
    }
    if (rc == CUDA_ERROR_NOT_READY)
        rc = CUDA_SUCCESS;
    a->rc = (int)rc;
    return NULL;
}

static int mode_capture(const char *cap, const char *who, const char *caller_mode,
                        const char *call) {
    CUstream s, other;
    CUevent before;
    CUcontext ctx;
    CUgraph g = NULL;
    setup(0);
    CHECK(cuCtxGetCurrent(&ctx));
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    CHECK(cuEventCreate(&before, CU_EVENT_DISABLE_TIMING));
    launch_spin(other, 1000);
    CHECK(cuEventRecord(before, other));
    CHECK(cuStreamBeginCapture(s, (CUstreamCaptureMode)capture_mode(cap)));
    launch_spin(s, 10);
    struct call_args a = {ctx, capture_mode(caller_mode), call, before, other, -1};
    if (strcmp(who, "self") == 0) {
        int saved = -1;
        if (a.mode >= 0) {
            CUstreamCaptureMode m = (CUstreamCaptureMode)a.mode;
            CHECK(cuThreadExchangeStreamCaptureMode(&m));
            saved = (int)m;
            a.mode = -1;
        }
        make_call(&a);
        if (saved >= 0) {
            CUstreamCaptureMode m = (CUstreamCaptureMode)saved;
            CHECK(cuThreadExchangeStreamCaptureMode(&m));
        }
    } else {
        pthread_t t;
        pthread_create(&t, NULL, make_call, &a);
        pthread_join(t, NULL);
    }
    uint64_t us = 10;
    void *params[] = {&us};
    printf("call=%d\n", a.rc);
    printf("capture_launch=%d\n", (int)cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
    printf("end=%d\n", (int)cuStreamEndCapture(s, &g));
    printf("graph_null=%d\n", g == NULL);
    if (g != NULL) {
        CUgraphExec e;
        CHECK(cuGraphInstantiate(&e, g, 0));
        CHECK(cuGraphLaunch(e, s));
        printf("graph_launch=%d\n", (int)cuStreamSynchronize(s));
    }
    return 0;
}

static CUdevice dev0;

static void print_mem(const char *step) {
    size_t free_b, total_b;
    cuuint64_t graph_used = 0, graph_reserved = 0;
    CHECK(cuMemGetInfo(&free_b, &total_b));
    CHECK(cuDeviceGetGraphMemAttribute(dev0, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &graph_used));
    CHECK(cuDeviceGetGraphMemAttribute(dev0, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &graph_reserved));
    printf("%s_used_mib=%llu\n%s_graph_mib=%llu\n%s_reserved_mib=%llu\n", step,
           (unsigned long long)((total_b - free_b) >> 20), step,
           (unsigned long long)(graph_used >> 20), step, (unsigned long long)(graph_reserved >> 20));
}

/* Captures on `s`: alloc MIB, a kernel, and (if `free_in_graph`) the free. */
static CUgraph capture_alloc(CUstream s, size_t bytes, int free_in_graph, CUdeviceptr *p) {
    CUgraph g;
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuMemAllocAsync(p, bytes, s));
    launch_spin(s, 10);
    if (free_in_graph)
        CHECK(cuMemFreeAsync(*p, s));
    CHECK(cuStreamEndCapture(s, &g));
    return g;
}

static int mode_graphmem(unsigned long long mib) {
    CUstream s;
    CUdeviceptr p;
    CUgraphExec e;
    size_t bytes = (size_t)mib << 20;
    setup(0);
    CHECK(cuDeviceGet(&dev0, 0));
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    print_mem("start");

    /* 1. Allocated and freed inside the graph. */
    CUgraph g = capture_alloc(s, bytes, 1, &p);
    printf("captured_ptr_nonzero=%d\n", p != 0);
    print_mem("captured");
    CHECK(cuGraphInstantiate(&e, g, 0));
    printf("launch1=%d\n", (int)cuGraphLaunch(e, s));
    CHECK(cuStreamSynchronize(s));
    print_mem("freed_in_graph");
    cuuint64_t high = 0;
    CHECK(cuDeviceGetGraphMemAttribute(dev0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &high));
    printf("graph_high_mib=%llu\n", (unsigned long long)(high >> 20));
    /* Freed graph memory stays cached in the device's graph memory pool until trimmed. */
    printf("trim1=%d\n", (int)cuDeviceGraphMemTrim(dev0));
    print_mem("trimmed");

    /* 2. Not freed in the graph: held after the launch, until freed; no relaunch meanwhile. */
    g = capture_alloc(s, bytes, 0, &p);
    CHECK(cuGraphInstantiate(&e, g, 0));
    printf("launch2=%d\n", (int)cuGraphLaunch(e, s));
    CHECK(cuStreamSynchronize(s));
    print_mem("escaped");
    printf("relaunch_unfreed=%d\n", (int)cuGraphLaunch(e, s));
    CHECK(cuMemFreeAsync(p, s));
    CHECK(cuStreamSynchronize(s));
    print_mem("freed_after");
    printf("relaunch_freed=%d\n", (int)cuGraphLaunch(e, s));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuMemFree(p));
    print_mem("freed_sync");
    CHECK(cuDeviceGraphMemTrim(dev0));
    print_mem("freed_trimmed");

    /* 3. AUTO_FREE_ON_LAUNCH: relaunching frees the previous launch's allocation first. */
    g = capture_alloc(s, bytes, 0, &p);
    CHECK(cuGraphInstantiateWithFlags(&e, g, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH));
    printf("auto1=%d\n", (int)cuGraphLaunch(e, s));
    printf("auto2=%d\n", (int)cuGraphLaunch(e, s));
    CHECK(cuStreamSynchronize(s));
    print_mem("auto");
    CHECK(cuMemFree(p));
    CHECK(cuDeviceGraphMemTrim(dev0));

    /* 4. Built node by node. */
    CUgraphNode an, fn_;
    CUDA_MEM_ALLOC_NODE_PARAMS ap;
    memset(&ap, 0, sizeof ap);
    ap.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    ap.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    ap.poolProps.location.id = 0;
    ap.bytesize = bytes;
    CHECK(cuGraphCreate(&g, 0));
    printf("add_alloc=%d\n", (int)cuGraphAddMemAllocNode(&an, g, NULL, 0, &ap));
    printf("built_ptr_nonzero=%d\n", ap.dptr != 0);
    printf("add_free=%d\n", (int)cuGraphAddMemFreeNode(&fn_, g, &an, 1, ap.dptr));
    printf("add_free_twice=%d\n", (int)cuGraphAddMemFreeNode(&fn_, g, &an, 1, ap.dptr));
    printf("add_free_unknown=%d\n", (int)cuGraphAddMemFreeNode(&fn_, g, &an, 1, ap.dptr + 64));
    CHECK(cuGraphInstantiate(&e, g, 0));
    /* "at most one executable graph in existence for that graph at a time" */
    CUgraphExec second;
    printf("instantiate_twice=%d\n", (int)cuGraphInstantiate(&second, g, 0));
    printf("launch_built=%d\n", (int)cuGraphLaunch(e, s));
    CHECK(cuStreamSynchronize(s));
    print_mem("built");
    CHECK(cuDeviceGraphMemTrim(dev0));
    CHECK(cuGraphExecDestroy(e));
    printf("instantiate_after_destroy=%d\n", (int)cuGraphInstantiate(&e, g, 0));

    /* 5. Larger than the device: capturing works (no memory yet), launching does not. */
    size_t total_b, free_b;
    CHECK(cuMemGetInfo(&free_b, &total_b));
    CUgraph big;
    CUdeviceptr bp;
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    printf("capture_big=%d\n", (int)cuMemAllocAsync(&bp, total_b + ((size_t)1 << 20), s));
    printf("end_big=%d\n", (int)cuStreamEndCapture(s, &big));
    CHECK(cuGraphInstantiate(&e, big, 0));
    printf("launch_big=%d\n", (int)cuGraphLaunch(e, s));
    print_mem("big");
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "rank") == 0 && argc == 7)
        return mode_rank(atoi(argv[2]), strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10),
                         atol(argv[5]), strtoull(argv[6], NULL, 10));
    if (strcmp(mode, "capture") == 0 && argc == 6)
        return mode_capture(argv[2], argv[3], argv[4], argv[5]);
    if (strcmp(mode, "graphmem") == 0 && argc == 3)
        return mode_graphmem(strtoull(argv[2], NULL, 10));
    if (strcmp(mode, "teardown") == 0 && argc == 3)
        return mode_teardown(argv[2]);
    if (strcmp(mode, "streams") == 0 && argc == 6)
        return mode_streams(atoi(argv[2]), atoi(argv[3]), atol(argv[4]),
                            strtoull(argv[5], NULL, 10));
    fprintf(stderr,
            "usage: %s [rank DEVICE TAG PARTICIPANTS ITERS US | streams DEVICE NSTREAMS N US | "
            "teardown reset|destroy|release | capture MODE self|other MODE CALL | graphmem MIB]\n",
            argv[0]);
    return 2;
}
