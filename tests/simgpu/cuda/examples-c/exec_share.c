/* simgpu: the device runs one kernel at a time. `exec_share streams`: two streams of one process
 * never overlap. `exec_share spin SECONDS US`: launch US-microsecond spin kernels back to back
 * for SECONDS, exit status 0 if the process got 35..65% of the time (run two at once: each gets about
 * half the device; compare busy_ns in simgpu-stat). No arguments: both checks, the second with two
 * child processes. Build: gcc -I target/nvidia/include/cu13 exec_share.c -lcuda */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { \
    fprintf(stderr, "FAIL %s:%d %s -> %d\n", __FILE__, __LINE__, #call, r_); exit(1); } } while (0)

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static CUfunction spinf;
static void spin(CUstream s, unsigned long long us) {
    void *args[] = { &us };
    CHECK(cuLaunchKernel(spinf, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
}

/* Two children spinning at once (each its own process, CUDA initialised after the fork). */
static int two_processes(void) {
    pid_t kids[2];
    for (int i = 0; i < 2; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            execl("/proc/self/exe", "exec_share", "spin", "1.5", "2000", (char *)NULL);
            _exit(127);
        }
    }
    int bad = 0;
    for (int i = 0; i < 2; i++) {
        int st = 0;
        waitpid(kids[i], &st, 0);
        bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    printf("%s two processes each got about half the device\n", bad ? "FAIL" : "ok  ");
    return bad;
}

int main(int argc, char **argv) {
    CUdevice dev; CUcontext ctx; CUmodule mod;
    if (argc == 1 && two_processes() != 0) return 1;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, "simgpu"));
    CHECK(cuModuleGetFunction(&spinf, mod, "spin_kernel"));
    if (argc == 1 || strcmp(argv[1], "streams") == 0) {
        CUstream a, b;
        CHECK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
        CHECK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
        double t0 = now_ms();
        for (int i = 0; i < 20; i++) { spin(a, 5000); spin(b, 5000); }
        CHECK(cuCtxSynchronize());
        double t = now_ms() - t0;
        int ok = t > 199 && t < 230;
        printf("%s 40 x 5 ms kernels on two streams took %.2f ms (serialized: ~200)\n", ok ? "ok  " : "FAIL", t);
        return !ok;
    }
    if (argc > 3 && strcmp(argv[1], "spin") == 0) {
        double secs = atof(argv[2]);
        unsigned long long us = strtoull(argv[3], NULL, 10);
        CUstream s; CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CUevent e[4];
        for (int i = 0; i < 4; i++) CHECK(cuEventCreate(&e[i], CU_EVENT_DISABLE_TIMING));
        double t0 = now_ms();
        long n = 0;
        /* Keep a few kernels queued (like a real training loop): wait for the one 4 launches ago. */
        while (now_ms() - t0 < secs * 1e3) {
            CHECK(cuEventSynchronize(e[n % 4]));
            spin(s, us);
            CHECK(cuEventRecord(e[n % 4], s));
            n++;
        }
        CHECK(cuStreamSynchronize(s));
        double t = now_ms() - t0;
        double share = 100.0 * n * us / 1e3 / t;
        printf("pid %d: %ld kernels x %llu us = %.0f ms busy in %.0f ms (%.0f%%)\n", getpid(), n, us,
               n * us / 1e3, t, share);
        return !(share > 35 && share < 65);
    }
    fprintf(stderr, "usage: %s streams | spin SECONDS US\n", argv[0]);
    return 2;
}
