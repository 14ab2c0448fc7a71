/* Driver memory a pod's process spends without an allocation call, step by step
 * (tests/node_reconcile.rs): code a lazily loaded library's kernel loads at its first launch, the
 * local memory a kernel with a large frame grows, the graph memory pool's cache, and its trim. An
 * unmodified CUDA program linked with -lcuda on device 0's primary context that never asks
 * cuMemGetInfo. Prints key=value lines (each step's CUresult, 0 = success) and waits for a line of
 * stdin after each step, where the test compares the counters.
 *
 * Usage: pod_memory LIB_MIB LOCAL_BYTES GRAPH_MIB
 *   the primary context made current: ready=1, wait; a library (cuLibraryLoadData, loaded lazily)
 *   of a LIB_MIB MiB PTX kernel got and launched (lazy_rc): lazy=1, wait; a module whose kernel has
 *   a local frame of LOCAL_BYTES per thread, its function launched twice (local_rc, local2_rc):
 *   local=1, wait; a graph allocating GRAPH_MIB and freeing it itself, launched twice (graph_rc,
 *   graph2_rc): graph=1, wait; the quota filled with 2 MiB allocations until one is refused
 *   (fill_mib=): filled=1, wait; those freed and cuDeviceGraphMemTrim (trim_rc): trimmed=1, wait.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ptx.h"

#define MIB (1024ull * 1024ull)

static void wait_line(void) {
    char line[64];
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) exit(0);
}

static CUresult launch(CUfunction f, CUstream s) {
    unsigned long long p = 0;
    void *params[] = {&p};
    return cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, 0);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 4) {
        fprintf(stderr, "usage: pod_memory LIB_MIB LOCAL_BYTES GRAPH_MIB\n");
        return 2;
    }
    size_t lib_bytes = strtoull(argv[1], 0, 10) * MIB;
    unsigned long long local = strtoull(argv[2], 0, 10);
    size_t graph_bytes = strtoull(argv[3], 0, 10) * MIB;
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    printf("ready=1\n");
    wait_line();

    char *ptx = ptx_image(lib_bytes, 0);
    CUlibrary lib;
    CUkernel k;
    CHECK(cuLibraryLoadData(&lib, ptx, 0, 0, 0, 0, 0, 0));
    free(ptx);
    CHECK(cuLibraryGetKernel(&k, lib, "touch"));
    printf("lazy_rc=%d\n", (int)launch((CUfunction)k, stream));
    CHECK(cuStreamSynchronize(stream));
    printf("lazy=1\n");
    wait_line();

    ptx = ptx_image(0, local);
    CUmodule mod;
    CUfunction f;
    CHECK(cuModuleLoadData(&mod, ptx));
    free(ptx);
    CHECK(cuModuleGetFunction(&f, mod, "touch"));
    printf("local_rc=%d\n", (int)launch(f, stream));
    printf("local2_rc=%d\n", (int)launch(f, stream));
    CHECK(cuStreamSynchronize(stream));
    printf("local=1\n");
    wait_line();

    CUdeviceptr p;
    CUgraph graph;
    CUgraphExec exec;
    CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuMemAllocAsync(&p, graph_bytes, stream));
    CHECK(cuMemFreeAsync(p, stream));
    CHECK(cuStreamEndCapture(stream, &graph));
    CHECK(cuGraphInstantiate(&exec, graph, 0));
    printf("graph_rc=%d\n", (int)cuGraphLaunch(exec, stream));
    CHECK(cuStreamSynchronize(stream));
    printf("graph2_rc=%d\n", (int)cuGraphLaunch(exec, stream));
    CHECK(cuStreamSynchronize(stream));
    printf("graph=1\n");
    wait_line();

    static CUdeviceptr chunks[1 << 14];
    int n = 0;
    while (n < (int)(sizeof chunks / sizeof *chunks) && cuMemAlloc(&chunks[n], 2 * MIB) == CUDA_SUCCESS) n++;
    printf("fill_mib=%d\nfilled=1\n", 2 * n);
    wait_line();

    while (n > 0) CHECK(cuMemFree(chunks[--n]));
    printf("trim_rc=%d\n", (int)cuDeviceGraphMemTrim(dev));
    printf("trimmed=1\n");
    wait_line();
    return 0;
}
