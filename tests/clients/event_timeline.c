/* Events measure the device timeline. The stream is held at a host function until every op is
 * queued; then two spin kernels of KERNEL_US run back to back between three events. On a GPU the
 * events are stamped by the device as it reaches them, so each interval is exactly one kernel's
 * duration, however late the host's threads are. Prints `first_ns=` and `second_ns=` (the
 * intervals) and `kernel_ns=`; `same_ns=`, an event's interval to itself; then whether a destroyed
 * event's and a destroyed context's handles went to the next ones created (`event_reused=`,
 * `context_reused=`, 1 or 0). Build: cc -I<cuda include> event_timeline.c -lcuda. Usage: KERNEL_US */
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "check.h"

static atomic_int released;

/* Runs on the stream: keeps it from reaching the events until everything is queued. */
static void CUDA_CB hold_stream(void *unused) {
    (void)unused;
    while (!atomic_load(&released)) {
        struct timespec t = {0, 100000};
        nanosleep(&t, NULL);
    }
}

static void launch_spin(CUfunction spin, CUstream s, unsigned long long us) {
    void *args[] = {&us};
    CHECK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
}

int main(int argc, char **argv) {
    unsigned long long us = argc > 1 ? strtoull(argv[1], NULL, 10) : 20000;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction spin;
    CUstream s;
    CUevent e[3];
    static const char image[] = "simgpu test module: any bytes";
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    CHECK(cuModuleLoadData(&mod, image));
    CHECK(cuModuleGetFunction(&spin, mod, "spin"));
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    for (int i = 0; i < 3; i++)
        CHECK(cuEventCreate(&e[i], CU_EVENT_DEFAULT));
    CHECK(cuLaunchHostFunc(s, hold_stream, NULL));
    CHECK(cuEventRecord(e[0], s));
    launch_spin(spin, s, us);
    CHECK(cuEventRecord(e[1], s));
    launch_spin(spin, s, us);
    CHECK(cuEventRecord(e[2], s));
    atomic_store(&released, 1);
    CHECK(cuStreamSynchronize(s));
    float first, second;
    CHECK(cuEventElapsedTime(&first, e[0], e[1]));
    CHECK(cuEventElapsedTime(&second, e[1], e[2]));
    printf("first_ns=%lld\nsecond_ns=%lld\nkernel_ns=%llu\n", (long long)(first * 1e6 + 0.5),
           (long long)(second * 1e6 + 0.5), us * 1000ULL);
    float same = -1;
    CHECK(cuEventElapsedTime(&same, e[1], e[1]));
    printf("same_ns=%lld\n", (long long)(same * 1e6));
    CUevent old = e[2];
    CHECK(cuEventDestroy(e[2]));
    CHECK(cuEventCreate(&e[2], CU_EVENT_DEFAULT));
    printf("event_reused=%d\n", e[2] == old);
    CUcontext old_ctx = ctx;
    CHECK(cuCtxDestroy(ctx));
    CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    printf("context_reused=%d\n", ctx == old_ctx);
    return 0;
}
