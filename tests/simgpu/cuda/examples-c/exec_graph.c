/* simgpu: modules/libraries/functions, cuLaunchKernelEx and `extra` parameters, graphs built by hand
 * and captured across forked streams. Build: gcc -I target/nvidia/include/cu13 exec_graph.c -lcuda */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int failures;
#define CHECK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { \
    fprintf(stderr, "FAIL %s:%d %s -> %d\n", __FILE__, __LINE__, #call, r_); exit(1); } } while (0)
#define EXPECT(cond, ...) do { if (!(cond)) { fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); failures++; } else { printf("ok   "); printf(__VA_ARGS__); printf("\n"); } } while (0)

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(void) {
    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction spinf;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));

    /* modules, libraries */
    EXPECT(cuModuleLoad(&mod, "/nonexistent/kernels.cubin") == CUDA_ERROR_FILE_NOT_FOUND, "cuModuleLoad missing file -> FILE_NOT_FOUND");
    CHECK(cuModuleLoad(&mod, "/etc/hostname"));
    CHECK(cuModuleUnload(mod));
    EXPECT(cuModuleGetFunction(&spinf, mod, "spin") == CUDA_ERROR_INVALID_HANDLE, "unloaded module -> INVALID_HANDLE");
    CUlibrary lib; CUkernel k; CUfunction kf; const char *kname;
    CHECK(cuLibraryLoadData(&lib, "simgpu", NULL, NULL, 0, NULL, NULL, 0));
    CHECK(cuLibraryGetKernel(&k, lib, "spin_lib"));
    CHECK(cuKernelGetFunction(&kf, k));
    CHECK(cuKernelGetName(&kname, k));
    EXPECT(strcmp(kname, "spin_lib") == 0, "cuKernelGetName -> %s", kname);
    CHECK(cuLibraryGetModule(&mod, lib));
    CHECK(cuModuleGetFunction(&spinf, mod, "spin"));
    int v;
    CHECK(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, spinf));
    EXPECT(v == 1024, "max threads per block %d", v);
    EXPECT(cuLaunchKernel(spinf, 1, 1, 1, 1, 1, 1, 64 * 1024, NULL, NULL, NULL) == CUDA_ERROR_INVALID_VALUE, "64 KiB dynamic shared -> INVALID_VALUE");
    CHECK(cuFuncSetAttribute(spinf, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 64 * 1024));
    CHECK(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, spinf));
    EXPECT(v == 64 * 1024, "after cuFuncSetAttribute: %d", v);
    CHECK(cuFuncSetCacheConfig(spinf, CU_FUNC_CACHE_PREFER_SHARED));

    CUstream s, s2; CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)); CHECK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    /* cuLaunchKernelEx with a CUkernel handle and a packed `extra` buffer */
    unsigned long long us = 20000;
    size_t size = sizeof us;
    void *extra[] = { CU_LAUNCH_PARAM_BUFFER_POINTER, &us, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END };
    CUlaunchAttribute attr; memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_PRIORITY; attr.value.priority = 0;
    CUlaunchConfig cfg = { 1, 1, 1, 64, 1, 1, 0, s, &attr, 1 };
    double t0 = now_ms();
    CHECK(cuLaunchKernelEx(&cfg, (CUfunction)k, NULL, extra));
    us = 1; /* the client may reuse its memory at once */
    CHECK(cuStreamSynchronize(s));
    EXPECT(now_ms() - t0 > 19.5 && now_ms() - t0 < 25, "cuLaunchKernelEx + extra: %.2f ms (expect 20)", now_ms() - t0);

    /* a graph built by hand */
    CUgraph g; CUgraphNode n1, n2, e; CUgraphExec ge;
    CHECK(cuGraphCreate(&g, 0));
    unsigned long long a = 10000, b = 5000;
    void *pa[] = { &a }, *pb[] = { &b };
    CUDA_KERNEL_NODE_PARAMS kp; memset(&kp, 0, sizeof kp);
    kp.func = spinf; kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1; kp.blockDimX = 32; kp.blockDimY = kp.blockDimZ = 1;
    kp.kernelParams = pa;
    CHECK(cuGraphAddKernelNode(&n1, g, NULL, 0, &kp));
    kp.kernelParams = pb;
    CHECK(cuGraphAddKernelNode(&n2, g, &n1, 1, &kp));
    CHECK(cuGraphAddEmptyNode(&e, g, &n2, 1));
    CUDA_GRAPH_INSTANTIATE_PARAMS ip; memset(&ip, 0, sizeof ip);
    ip.flags = CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD; ip.hUploadStream = s; ip.result_out = 99;
    CHECK(cuGraphInstantiateWithParams(&ge, g, &ip));
    EXPECT(ip.result_out == CUDA_GRAPH_INSTANTIATE_SUCCESS, "instantiate with params");
    CHECK(cuGraphUpload(ge, s));
    t0 = now_ms();
    for (int i = 0; i < 4; i++) CHECK(cuGraphLaunch(ge, s));
    CHECK(cuStreamSynchronize(s));
    EXPECT(now_ms() - t0 > 59.5 && now_ms() - t0 < 70, "4 launches of a 15 ms graph: %.2f ms", now_ms() - t0);
    CHECK(cuGraphExecDestroy(ge)); CHECK(cuGraphDestroy(g));

    /* capture forked into a second stream through events, joined back */
    CUevent fork, join; CHECK(cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING)); CHECK(cuEventCreate(&join, CU_EVENT_DISABLE_TIMING));
    void *p1[] = { &a };
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CHECK(cuLaunchKernel(spinf, 1, 1, 1, 1, 1, 1, 0, s, p1, NULL));
    CHECK(cuEventRecord(fork, s));
    CHECK(cuStreamWaitEvent(s2, fork, 0));
    CUstreamCaptureStatus st; cuuint64_t id; CUgraph cg;
    CHECK(cuStreamGetCaptureInfo(s2, &st, &id, &cg, NULL, NULL, NULL));
    EXPECT(st == CU_STREAM_CAPTURE_STATUS_ACTIVE && cg != NULL, "forked stream joined the capture (id %llu)", (unsigned long long)id);
    CHECK(cuLaunchKernel(spinf, 1, 1, 1, 1, 1, 1, 0, s2, p1, NULL));
    CHECK(cuEventRecord(join, s2));
    CHECK(cuStreamWaitEvent(s, join, 0));
    EXPECT(cuStreamEndCapture(s2, &g) == CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "ending on the forked stream -> UNMATCHED");
    EXPECT(cuStreamEndCapture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "... which invalidated the capture");
    CHECK(cuStreamIsCapturing(s2, &st)); EXPECT(st == CU_STREAM_CAPTURE_STATUS_NONE, "capture over for the forked stream too");

    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuLaunchKernel(spinf, 1, 1, 1, 1, 1, 1, 0, s, p1, NULL));
    CHECK(cuEventRecord(fork, s));
    CHECK(cuStreamWaitEvent(s2, fork, 0));
    CHECK(cuLaunchKernel(spinf, 1, 1, 1, 1, 1, 1, 0, s2, p1, NULL));
    CHECK(cuEventRecord(join, s2));
    CHECK(cuStreamWaitEvent(s, join, 0));
    CHECK(cuStreamEndCapture(s, &g));
    CHECK(cuGraphInstantiateWithFlags(&ge, g, 0));
    size_t n = 0; CHECK(cuGraphGetNodes(g, NULL, &n)); EXPECT(n == 2, "captured graph has %zu kernel nodes", n);
    t0 = now_ms();
    CHECK(cuGraphLaunch(ge, s2));
    CHECK(cuStreamSynchronize(s2));
    EXPECT(now_ms() - t0 > 19.5 && now_ms() - t0 < 25, "captured graph ran: %.2f ms", now_ms() - t0);

    /* legacy-stream work while a blocking stream captures would depend on it: refused */
    CUstream blocking; CHECK(cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
    CHECK(cuStreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_RELAXED));
    EXPECT(cuLaunchKernel(spinf, 1, 1, 1, 1, 1, 1, 0, NULL, p1, NULL) == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "legacy launch during capture -> CAPTURE_IMPLICIT");
    EXPECT(cuStreamEndCapture(blocking, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "... and the capture is invalidated");
    EXPECT(cuStreamBeginCapture(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "capturing the legacy stream -> UNSUPPORTED");

    CHECK(cuLibraryUnload(lib));
    EXPECT(cuLaunchKernel(spinf, 1, 1, 1, 1, 1, 1, 0, s, p1, NULL) == CUDA_ERROR_INVALID_HANDLE, "function of unloaded library -> INVALID_HANDLE");
    printf("%s (%d failures)\n", failures ? "FAILED" : "PASSED", failures);
    return failures != 0;
}
