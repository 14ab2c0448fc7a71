/* Green contexts (CUDA 12.4+) under a quota: the device's SM resource, a descriptor of it, green
 * contexts made from it (each retains the device's primary context), their converted contexts
 * made current, a stream of one; the primary context also retained by the program. Prints
 * `key=value` lines for tests/memory_green.rs.
 *
 *   green N   N green contexts (the primary retained once more by the program), the first one's
 *             converted context current; free0= (cuMemGetInfo), ready=1, wait for a line; fill in
 *             2 MiB chunks (fill_bytes=); the allocations freed, every green context destroyed and
 *             the primary released (primary_active=); ready2=1, wait for EOF
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

#define MIB (1024ull * 1024ull)

int main(int argc, char **argv) {
    int n = argc > 2 ? atoi(argv[2]) : 1;
    if (argc < 2 || strcmp(argv[1], "green") != 0 || n < 1 || n > 8) {
        fprintf(stderr, "usage: %s green N\n", argv[0]);
        return 2;
    }
    CUdevice dev;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    printf("pid=%d\n", (int)getpid());

    CUdevResource sms;
    memset(&sms, 0, sizeof sms);
    CHECK(cuDeviceGetDevResource(dev, &sms, CU_DEV_RESOURCE_TYPE_SM));
    printf("sm_count=%u\n", sms.sm.smCount);
    CUdevResourceDesc desc;
    CHECK(cuDevResourceGenerateDesc(&desc, &sms, 1));

    CUgreenCtx green[8];
    for (int i = 0; i < n; i++) CHECK(cuGreenCtxCreate(&green[i], desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
    CUcontext primary, converted;
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
    CHECK(cuCtxFromGreenCtx(&converted, green[0]));
    printf("converted_is_primary=%d\n", converted == primary);
    CHECK(cuCtxSetCurrent(converted));
    CUstream s;
    CHECK(cuGreenCtxStreamCreate(&s, green[0], CU_STREAM_NON_BLOCKING, 0));
    CUgreenCtx of_stream = NULL;
    CHECK(cuStreamGetGreenCtx(s, &of_stream));
    printf("stream_green_ok=%d\n", of_stream == green[0]);
    CUcontext stream_ctx = NULL;
    CHECK(cuStreamGetCtx(s, &stream_ctx));
    printf("stream_ctx_ok=%d\n", stream_ctx == converted);

    size_t free0, total0;
    CHECK(cuMemGetInfo(&free0, &total0));
    printf("free0=%zu\ntotal0=%zu\nready=1\n", free0, total0);
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 0;

    static CUdeviceptr chunks[1 << 14];
    int k = 0;
    while (k < (int)(sizeof chunks / sizeof *chunks) && cuMemAlloc(&chunks[k], 2 * MIB) == CUDA_SUCCESS) k++;
    printf("fill_bytes=%llu\n", (unsigned long long)k * 2 * MIB);
    while (k > 0) CHECK(cuMemFree(chunks[--k]));
    CHECK(cuStreamDestroy(s));
    CHECK(cuCtxSetCurrent(NULL));
    for (int i = 0; i < n; i++) CHECK(cuGreenCtxDestroy(green[i]));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    unsigned int flags;
    int active = -1;
    CHECK(cuDevicePrimaryCtxGetState(dev, &flags, &active));
    printf("primary_active=%d\nready2=1\n", active);
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {}
    return 0;
}
