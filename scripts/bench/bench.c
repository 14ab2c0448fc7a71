/* The benchmark client: an ordinary CUDA program (linked with -lcuda, built against NVIDIA's cuda.h),
 * run by scripts/bench.sh once on the bare driver and once with LD_PRELOAD=libgpuslice.so.
 *
 * Usage: bench MODE N
 *   alloc    N  cuMemAlloc_v2(1 MiB) + cuMemFree_v2 pairs
 *   launch   N  cuLaunchKernel of a non-spin kernel (the stream is held by a host function while the
 *               launches are timed: they only enqueue, and the stream's worker thread never competes
 *               for the CPU; kernels run, untimed, in batches of LAUNCH_BATCH)
 *   getctx   N  cuCtxGetCurrent (never hooked)
 *   getattr  N  cuDeviceGetAttribute (never hooked)
 *   startup  -  cuInit + primary context retain + set current, then exit (timed from outside)
 *   query    -  cuInit + cuDeviceGet + cuDeviceTotalMem, then exit: a program that looks at its
 *               device without a context (device queries, a framework's is-available check)
 *   modules  N  cuModuleLoadData of a small PTX module + cuModuleGetFunction + cuModuleUnload; prints
 *               `ready=1` after the warm-up and waits for a line on stdin before the timed loop, so
 *               that scripts/bench/loads can start two tenants' loops at once
 *
 * Prints `ns_per_op=<float>`: the wall time of the measured loop divided by N, after a warm-up of
 * N/10 iterations (lazy symbol binding, first-use initialisation, page faults are not measured).
 *
 * Each measured loop is its own non-inlined function, bench_loop_<mode>: scripts/bench.sh runs this
 * client under `valgrind --tool=callgrind --toggle-collect=bench_loop_<mode>`, so callgrind counts
 * exactly the instructions executed inside the loop (driver, shim, libc), and divides by N. The warm-up
 * calls the same body through warm_<mode>, which is not collected. */
#include <cuda.h>

#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NOINLINE __attribute__((noinline))

static void die(const char *what, CUresult rc, int line) {
    const char *name = "?";
    cuGetErrorName(rc, &name);
    fprintf(stderr, "bench: %s failed: %d %s (line %d)\n", what, (int)rc, name ? name : "?", line);
    exit(1);
}
#define CHECK(call)                                   \
    do {                                              \
        CUresult rc_ = (call);                        \
        if (rc_ != CUDA_SUCCESS)                      \
            die(#call, rc_, __LINE__);                \
    } while (0)

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static CUdevice dev;
static CUcontext ctx;
static CUstream stream;
static CUfunction noop;
static sem_t gate;

/* The start-up every mode shares (and all the `startup` mode does). */
static void setup(void) {
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
}

/* ---- alloc/free ---- */
#define ALLOC_BYTES ((size_t)1 << 20)
#define ALLOC_BODY(n)                                   \
    for (long i = 0; i < (n); i++) {                    \
        CUdeviceptr p;                                  \
        CHECK(cuMemAlloc(&p, ALLOC_BYTES));             \
        CHECK(cuMemFree(p));                            \
    }
NOINLINE static void warm_alloc(long n) { ALLOC_BODY(n) }
NOINLINE void bench_loop_alloc(long n) { ALLOC_BODY(n) }

/* ---- launch ---- */
/* Launches timed between two host-function gates: the stream's worker waits in `hold` until the
 * batch is queued. A batch stays under simgpu's (and the real driver's) 1024-op queue limit. */
#define LAUNCH_BATCH 500
static void CUDA_CB hold(void *arg) {
    (void)arg;
    while (sem_wait(&gate) != 0) {
    }
}
#define LAUNCH_BODY(n)                                                        \
    for (long i = 0; i < (n); i++) {                                          \
        CHECK(cuLaunchKernel(noop, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL)); \
    }
NOINLINE static void warm_launch(long n) { LAUNCH_BODY(n) }
NOINLINE void bench_loop_launch(long n) { LAUNCH_BODY(n) }

/* Runs `loop` over n launches in batches; returns the nanoseconds spent inside the loop calls. */
static uint64_t launches(void (*loop)(long), long n) {
    uint64_t spent = 0;
    for (long done = 0; done < n;) {
        long batch = n - done < LAUNCH_BATCH ? n - done : LAUNCH_BATCH;
        CHECK(cuLaunchHostFunc(stream, hold, NULL));
        uint64_t t0 = now_ns();
        loop(batch);
        spent += now_ns() - t0;
        sem_post(&gate);
        CHECK(cuStreamSynchronize(stream));
        done += batch;
    }
    return spent;
}

/* ---- calls gpuslice does not hook ---- */
#define GETCTX_BODY(n)                     \
    for (long i = 0; i < (n); i++) {       \
        CUcontext c;                       \
        CHECK(cuCtxGetCurrent(&c));        \
    }
NOINLINE static void warm_getctx(long n) { GETCTX_BODY(n) }
NOINLINE void bench_loop_getctx(long n) { GETCTX_BODY(n) }

#define GETATTR_BODY(n)                                                                \
    for (long i = 0; i < (n); i++) {                                                   \
        int v;                                                                         \
        CHECK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)); \
    }
NOINLINE static void warm_getattr(long n) { GETATTR_BODY(n) }
NOINLINE void bench_loop_getattr(long n) { GETATTR_BODY(n) }

/* ---- module loads ---- */
/* A PTX module of about 16 KiB (Triton and torch.compile load thousands of such): lazy loading
 * spends nothing at cuModuleLoadData, the kernel's code at cuModuleGetFunction (measured by gpuslice).
 */
static char module_ptx[16 * 1024];
static void make_module(void) {
    const char *head = ".version 7.0\n.target sm_80\n.address_size 64\n"
                       ".visible .entry k(.param .u64 p)\n{ ret; }\n//";
    size_t n = sizeof module_ptx - 1;
    memset(module_ptx, 'x', n);
    memcpy(module_ptx, head, strlen(head));
    module_ptx[n - 1] = '\n';
    module_ptx[n] = 0;
}
#define MODULES_BODY(n)                                  \
    for (long i = 0; i < (n); i++) {                     \
        CUmodule m;                                      \
        CUfunction f;                                    \
        CHECK(cuModuleLoadData(&m, module_ptx));         \
        CHECK(cuModuleGetFunction(&f, m, "k"));          \
        CHECK(cuModuleUnload(m));                        \
    }
NOINLINE static void warm_modules(long n) { MODULES_BODY(n) }
NOINLINE void bench_loop_modules(long n) { MODULES_BODY(n) }

static void report(const char *mode, long n, uint64_t ns) {
    printf("mode=%s\nn=%ld\nns_per_op=%.2f\n", mode, n, (double)ns / (double)n);
}

/* Times `loop` after warming up with `warm`. */
static void timed(const char *mode, void (*warm)(long), void (*loop)(long), long n) {
    warm(n / 10 + 1);
    uint64_t t0 = now_ns();
    loop(n);
    report(mode, n, now_ns() - t0);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    long n = argc > 2 ? atol(argv[2]) : 0;
    if (strcmp(mode, "startup") == 0) {
        setup();
        return 0;
    }
    if (strcmp(mode, "query") == 0) {
        size_t total = 0;
        CHECK(cuInit(0));
        CHECK(cuDeviceGet(&dev, 0));
        CHECK(cuDeviceTotalMem(&total, dev));
        return total == 0;
    }
    if (n <= 0) {
        fprintf(stderr, "usage: %s alloc|launch|getctx|getattr|modules N | startup | query\n", argv[0]);
        return 2;
    }
    setup();
    if (strcmp(mode, "alloc") == 0) {
        timed(mode, warm_alloc, bench_loop_alloc, n);
    } else if (strcmp(mode, "launch") == 0) {
        /* Any bytes are a module image for simgpu; a kernel not named spin* costs SIMGPU_KERNEL_NS. */
        static const char image[] = "gpuslice bench module";
        CUmodule mod;
        CHECK(cuModuleLoadData(&mod, image));
        CHECK(cuModuleGetFunction(&noop, mod, "noop_kernel"));
        CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
        sem_init(&gate, 0, 0);
        launches(warm_launch, n / 10 + 1);
        report(mode, n, launches(bench_loop_launch, n));
    } else if (strcmp(mode, "modules") == 0) {
        make_module();
        warm_modules(n / 10 + 1);
        printf("ready=1\n");
        fflush(stdout);
        char line[16];
        if (!fgets(line, sizeof line, stdin)) return 1;
        uint64_t t0 = now_ns();
        bench_loop_modules(n);
        report(mode, n, now_ns() - t0);
    } else if (strcmp(mode, "getctx") == 0) {
        timed(mode, warm_getctx, bench_loop_getctx, n);
    } else if (strcmp(mode, "getattr") == 0) {
        timed(mode, warm_getattr, bench_loop_getattr, n);
    } else {
        fprintf(stderr, "bench: unknown mode %s\n", mode);
        return 2;
    }
    CHECK(cuDevicePrimaryCtxRelease(dev));
    return 0;
}
