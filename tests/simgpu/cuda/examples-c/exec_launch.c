/* simgpu: asynchronous launches, stream query/synchronize, events, legacy-stream ordering, host
 * callbacks, capture -> graph replay. Build: gcc -I target/nvidia/include/cu13 exec_launch.c -lcuda */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static int failures;
#define CHECK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { \
    const char *n_ = 0; cuGetErrorName(r_, &n_); \
    fprintf(stderr, "FAIL %s:%d %s -> %d %s\n", __FILE__, __LINE__, #call, r_, n_ ? n_ : "?"); exit(1); } } while (0)
#define EXPECT(cond, ...) do { if (!(cond)) { fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); failures++; } else { printf("ok   "); printf(__VA_ARGS__); printf("\n"); } } while (0)

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void CUDA_CB host_fn(void *p) { (*(int *)p)++; }
static CUstream cb_stream; static CUresult cb_status = (CUresult)-1;
static void CUDA_CB stream_cb(CUstream s, CUresult st, void *p) { cb_stream = s; cb_status = st; (*(int *)p)++; }

static void spin(CUfunction f, CUstream s, unsigned long long us) {
    void *args[] = { &us };
    CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
}

int main(void) {
    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction spinf, other;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    static const char image[] = "simgpu";
    CHECK(cuModuleLoadData(&mod, image));
    CHECK(cuModuleGetFunction(&spinf, mod, "spin"));
    CHECK(cuModuleGetFunction(&other, mod, "_Z6vecAddPfS_S_i"));
    CUfunction again; CHECK(cuModuleGetFunction(&again, mod, "spin"));
    EXPECT(again == spinf, "same name -> same function handle");
    const char *name; CHECK(cuFuncGetName(&name, spinf));
    EXPECT(name && name[0] == 's', "cuFuncGetName -> %s", name);

    /* invalid launches */
    EXPECT(cuLaunchKernel(spinf, 0, 1, 1, 1, 1, 1, 0, 0, NULL, NULL) == CUDA_ERROR_INVALID_VALUE, "grid 0 -> INVALID_VALUE");
    EXPECT(cuLaunchKernel(spinf, 1, 1, 1, 1025, 1, 1, 0, 0, NULL, NULL) == CUDA_ERROR_INVALID_VALUE, "block 1025 -> INVALID_VALUE");
    EXPECT(cuLaunchKernel(spinf, 1, 1, 1, 32, 32, 2, 0, 0, NULL, NULL) == CUDA_ERROR_INVALID_VALUE, "2048 threads -> INVALID_VALUE");
    EXPECT(cuLaunchKernel((CUfunction)0x1234, 1, 1, 1, 1, 1, 1, 0, 0, NULL, NULL) == CUDA_ERROR_INVALID_HANDLE, "bad function -> INVALID_HANDLE");

    /* 100 x 1000us launches return at once; synchronize takes ~100 ms */
    CUstream s; CHECK(cuStreamCreate(&s, CU_STREAM_DEFAULT));
    double t0 = now_ms();
    for (int i = 0; i < 100; i++) spin(spinf, s, 1000);
    double t1 = now_ms();
    EXPECT(cuStreamQuery(s) == CUDA_ERROR_NOT_READY, "cuStreamQuery NOT_READY while pending");
    CHECK(cuStreamSynchronize(s));
    double t2 = now_ms();
    EXPECT(t1 - t0 < 20, "100 launches returned in %.2f ms", t1 - t0);
    EXPECT(t2 - t0 > 99 && t2 - t0 < 130, "synchronize after %.2f ms (expect ~100)", t2 - t0);
    EXPECT(cuStreamQuery(s) == CUDA_SUCCESS, "cuStreamQuery SUCCESS when done");

    /* events */
    CUevent a, b, nt;
    CHECK(cuEventCreate(&a, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&b, CU_EVENT_BLOCKING_SYNC));
    CHECK(cuEventCreate(&nt, CU_EVENT_DISABLE_TIMING));
    float ms = -1;
    EXPECT(cuEventElapsedTime(&ms, a, b) == CUDA_ERROR_INVALID_HANDLE, "elapsed of unrecorded events -> INVALID_HANDLE");
    EXPECT(cuEventQuery(a) == CUDA_SUCCESS, "query of unrecorded event -> SUCCESS");
    CHECK(cuEventRecord(a, s));
    spin(spinf, s, 20000);
    CHECK(cuEventRecord(b, s));
    CHECK(cuEventRecord(nt, s));
    EXPECT(cuEventQuery(b) == CUDA_ERROR_NOT_READY, "event NOT_READY before reached");
    EXPECT(cuEventElapsedTime(&ms, a, b) == CUDA_ERROR_NOT_READY, "elapsed NOT_READY before reached");
    CHECK(cuEventSynchronize(b));
    EXPECT(cuEventQuery(b) == CUDA_SUCCESS, "event SUCCESS after synchronize");
    CHECK(cuEventElapsedTime(&ms, a, b));
    EXPECT(ms > 19.9 && ms < 22, "elapsed %.3f ms (expect ~20)", ms);
    EXPECT(cuEventElapsedTime(&ms, a, nt) == CUDA_ERROR_INVALID_HANDLE, "DISABLE_TIMING -> INVALID_HANDLE");

    /* legacy stream: NULL-stream work waits for blocking stream work, not for non-blocking */
    CUstream nb; CHECK(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
    unsigned int fl; CHECK(cuStreamGetFlags(nb, &fl)); EXPECT(fl == CU_STREAM_NON_BLOCKING, "flags %u", fl);
    spin(spinf, s, 30000);
    CHECK(cuEventRecord(a, NULL));
    t0 = now_ms();
    CHECK(cuEventSynchronize(a));
    EXPECT(now_ms() - t0 > 25, "legacy-stream event waited for blocking stream (%.2f ms)", now_ms() - t0);
    spin(spinf, nb, 30000);
    CHECK(cuEventRecord(a, NULL));
    t0 = now_ms();
    CHECK(cuEventSynchronize(a));
    EXPECT(now_ms() - t0 < 5, "legacy-stream event did not wait for non-blocking stream (%.2f ms)", now_ms() - t0);
    CHECK(cuStreamSynchronize(nb));
    /* blocking stream waits for prior legacy work */
    spin(spinf, NULL, 30000);
    CHECK(cuEventRecord(b, s));
    t0 = now_ms();
    CHECK(cuEventSynchronize(b));
    EXPECT(now_ms() - t0 > 25, "blocking stream waited for legacy work (%.2f ms)", now_ms() - t0);

    /* cross-stream wait event */
    spin(spinf, nb, 30000);
    CHECK(cuEventRecord(a, nb));
    CHECK(cuStreamWaitEvent(s, a, 0));
    CHECK(cuEventRecord(b, s));
    t0 = now_ms();
    CHECK(cuEventSynchronize(b));
    EXPECT(now_ms() - t0 > 25, "cuStreamWaitEvent ordered s after nb (%.2f ms)", now_ms() - t0);

    /* host functions and callbacks */
    int calls = 0;
    CHECK(cuLaunchHostFunc(s, host_fn, &calls));
    CHECK(cuStreamAddCallback(s, stream_cb, &calls, 0));
    CHECK(cuStreamSynchronize(s));
    EXPECT(calls == 2 && cb_stream == s && cb_status == CUDA_SUCCESS, "host func + callback ran (%d)", calls);

    /* capture -> instantiate -> launch */
    CUgraph g; CUgraphExec ge; CUstreamCaptureStatus st;
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuStreamIsCapturing(s, &st)); EXPECT(st == CU_STREAM_CAPTURE_STATUS_ACTIVE, "capturing");
    t0 = now_ms();
    for (int i = 0; i < 5; i++) spin(spinf, s, 10000);
    CHECK(cuLaunchHostFunc(s, host_fn, &calls));
    EXPECT(now_ms() - t0 < 5, "captured launches did not run");
    CHECK(cuStreamEndCapture(s, &g));
    size_t n = 0; CHECK(cuGraphGetNodes(g, NULL, &n)); EXPECT(n == 6, "graph has %zu nodes", n);
    CHECK(cuGraphInstantiate(&ge, g, 0));
    t0 = now_ms();
    CHECK(cuGraphLaunch(ge, s));
    CHECK(cuGraphLaunch(ge, s));
    EXPECT(now_ms() - t0 < 5, "graph launch is asynchronous");
    CHECK(cuStreamSynchronize(s));
    EXPECT(now_ms() - t0 > 99 && calls == 4, "graph replayed twice: %.2f ms, host calls %d", now_ms() - t0, calls);
    CHECK(cuGraphExecDestroy(ge));
    CHECK(cuGraphDestroy(g));

    /* synchronous call while capturing */
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(cuStreamSynchronize(s) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "sync while capturing -> CAPTURE_UNSUPPORTED");
    EXPECT(cuStreamEndCapture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "capture invalidated");

    /* destroy with pending work: work still completes */
    CUstream d; CHECK(cuStreamCreate(&d, 0));
    spin(spinf, d, 20000);
    CHECK(cuEventRecord(a, d));
    CHECK(cuStreamDestroy(d));
    EXPECT(cuStreamQuery(d) == CUDA_ERROR_INVALID_HANDLE, "destroyed stream -> INVALID_HANDLE");
    CHECK(cuEventSynchronize(a));
    CHECK(cuCtxSynchronize());
    printf("%s (%d failures)\n", failures ? "FAILED" : "PASSED", failures);
    return failures != 0;
}
