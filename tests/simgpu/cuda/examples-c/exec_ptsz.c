/* simgpu: per-thread default streams (compiled with CUDA_API_PER_THREAD_DEFAULT_STREAM, so every
 * stream call goes to its _ptsz/_ptds export), the launch queue limit, stream attributes.
 * Build: gcc -I target/nvidia/include/cu13 exec_ptsz.c -lcuda -lpthread */
#define CUDA_API_PER_THREAD_DEFAULT_STREAM 1
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
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

static CUcontext ctx;
static CUfunction spinf;
static void spin(CUstream s, unsigned long long us) {
    void *args[] = { &us };
    CHECK(cuLaunchKernel(spinf, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
}

static unsigned long long other_id;
static void *thread_main(void *p) {
    (void)p;
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuStreamGetId(NULL, &other_id));
    return NULL;
}

int main(void) {
    CUdevice dev; CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, "simgpu"));
    CHECK(cuModuleGetFunction(&spinf, mod, "spin"));

    unsigned long long mine, legacy;
    CHECK(cuStreamGetId(NULL, &mine));
    CHECK(cuStreamGetId(CU_STREAM_LEGACY, &legacy));
    pthread_t t; pthread_create(&t, NULL, thread_main, NULL); pthread_join(t, NULL);
    EXPECT(mine != legacy && mine != other_id, "per-thread default streams are distinct (%llu, %llu, legacy %llu)", mine, other_id, legacy);

    /* NULL = this thread's stream: an ordinary blocking stream, it does not wait for another one */
    CUstream s; CHECK(cuStreamCreate(&s, CU_STREAM_DEFAULT));
    CUevent e; CHECK(cuEventCreate(&e, 0));
    spin(s, 30000);
    CHECK(cuEventRecord(e, NULL));
    double t0 = now_ms();
    CHECK(cuEventSynchronize(e));
    EXPECT(now_ms() - t0 < 5, "per-thread stream did not wait for blocking stream s (%.2f ms)", now_ms() - t0);
    CHECK(cuEventRecord(e, CU_STREAM_LEGACY));
    t0 = now_ms();
    CHECK(cuEventSynchronize(e));
    EXPECT(now_ms() - t0 > 20, "CU_STREAM_LEGACY waited for s (%.2f ms)", now_ms() - t0);

    CUcontext c2; CHECK(cuStreamGetCtx(s, &c2)); EXPECT(c2 == ctx, "cuStreamGetCtx");
    int prio, lo, hi; CUstream ps;
    CHECK(cuCtxGetStreamPriorityRange(&lo, &hi));
    CHECK(cuStreamCreateWithPriority(&ps, CU_STREAM_NON_BLOCKING, hi));
    CHECK(cuStreamGetPriority(ps, &prio)); EXPECT(prio == hi, "priority %d (range %d..%d)", prio, lo, hi);

    /* the launch queue holds 1024 kernels: launch 1200 x 100 us, the last ~176 wait for room */
    t0 = now_ms();
    for (int i = 0; i < 1200; i++) spin(ps, 100);
    double launched = now_ms() - t0;
    CHECK(cuStreamSynchronize(ps));
    double total = now_ms() - t0;
    EXPECT(launched > 15 && launched < total - 90, "1200 launches blocked for room: %.1f ms of %.1f ms", launched, total);
    printf("%s (%d failures)\n", failures ? "FAILED" : "PASSED", failures);
    return failures != 0;
}
