/* Shared by the graph memory clients (graph_memory.c, graph_child.c, graph_pool.c): an unmodified
 * CUDA program linked with -lcuda, working on device 0's primary context with one non-blocking
 * stream, given two sizes in MiB on its command line. */
#ifndef GPUSLICE_TEST_GRAPH_CLIENT_H
#define GPUSLICE_TEST_GRAPH_CLIENT_H
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"

/* The client's stream: non-blocking, on device 0's primary context. */
static CUstream stream;

/* One step whose result is the subject: printed as name=CUresult (0 = success), never fatal. */
static inline CUresult step(const char *name, CUresult r) {
    printf("%s=%d\n", name, (int)r);
    return r;
}

/* Line-buffered output; the two sizes `usage` names (its arguments, in MiB) in bytes, or exit 2;
 * the driver initialised, device 0's primary context made current and `stream` created. Returns
 * device 0. */
static inline CUdevice graph_client_start(int argc, char **argv, const char *usage, size_t *first,
                                          size_t *second) {
    CUdevice dev;
    CUcontext ctx;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 3) {
        fprintf(stderr, "usage: %s\n", usage);
        exit(2);
    }
    *first = strtoull(argv[1], NULL, 10) << 20;
    *second = strtoull(argv[2], NULL, 10) << 20;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    return dev;
}

#endif
