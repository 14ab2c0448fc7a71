/* Compute-share client (tests/compute_shares.rs, scripts/bench/compute_launch.sh): an unmodified CUDA
 * program linked with -lcuda, run with libgpuslice.so preloaded. Prints key=value lines.
 *
 * Modes:
 *   spin START_NS MS US [DEPTH]        from CLOCK_REALTIME START_NS, launch `spin` kernels of US as fast
 *                                      as possible for MS ms, keeping DEPTH (default 8) queued
 *   batch START_NS MS US N [event]     as `spin`, but N kernels queued at once, then cuStreamSynchronize
 *                                      (`event`: an event recorded after them, then cuEventSynchronize)
 *                                      (the CPU runs ahead, then blocks: a training loop reading its loss)
 *   graph START_NS MS US N             capture N spin launches into a graph, then cuGraphLaunch it in a
 *                                      loop for MS ms (two graph launches queued)
 *   request START_NS MS PERIOD_MS N US every PERIOD_MS: N kernels of US, then cuStreamSynchronize;
 *                                      prints latency percentiles (us); with
 *                                      COMPUTE_CLIENT_REQUEST_PARTS=1 also each request's parts
 *                                      (part=<first launch us>,<other launches us>,<sync us>,
 *                                      <start, CLOCK_MONOTONIC us>),
 *                                      and with COMPUTE_CLIENT_REQUEST_JITTER_US=J each period
 *                                      lengthened by a pseudo-random 0..J us (a fixed sequence), so
 *                                      that requests do not keep one phase against a neighbour's
 *                                      kernels
 *   hold US                            spin kernels until stdin closes (prints ready=1 pid=...)
 *   bench N REPS                       median ns per cuLaunchKernel (0-us kernels), REPS batches of N
 *   streams START_NS MS US             as `spin`, alternating between two non-blocking streams of one
 *                                      context (their kernels may run concurrently)
 *   capture START_NS MS US             one thread captures graphs (3 spin launches each) in
 *                                      CU_STREAM_CAPTURE_MODE_GLOBAL in a loop while this thread
 *                                      launches spin kernels of US on another stream every US / 2
 *                                      (no synchronisation of its own); prints captures=
 *                                      capture_failures=
 *   capturelate START_NS MS US N       as `spin` for MS ms, then (after 20 ms) N spin launches of US
 *                                      captured on the same stream (cuStreamBeginCapture resolved by
 *                                      cuGetProcAddress, global mode), the graph launched once;
 *                                      prints capture_end= graph_nodes= graph_launch=
 *   ptsz START_NS MS US THREADS        THREADS threads (at most 16), each as `spin` (depth 8) on its
 *                                      own per-thread default stream: even threads through the
 *                                      `_ptsz` entry points with a NULL stream (code compiled with
 *                                      --default-stream per-thread), odd threads through the plain
 *                                      entry points with CU_STREAM_PER_THREAD (prints launches=, the
 *                                      sum, and launches_<thread>=)
 *   multi START_NS MS US NDEV          one thread per device 0..NDEV-1, each as `spin` on its own
 *                                      device's primary context (prints launches_<dev>=...)
 *
 *   teardown START_NS MS US HOW        as `spin` (depth 8), but halfway through tears its context down
 *                                      with kernels queued -- HOW = destroy: a context of its own
 *                                      (cuCtxCreate), cuCtxDestroy; reset: the primary context,
 *                                      cuDevicePrimaryCtxReset -- then sets up a new context and spins
 *                                      on to the end (prints torn_down=1 launches_after=...)
 *   reuse START_NS CYCLES US HOW       CYCLES times: 8 spin kernels of US queued, the context torn down
 *                                      (HOW as teardown), a new one set up, and two events of this
 *                                      program timing one kernel; 16 kernels later the events must
 *                                      still say the same (a driver gives a destroyed context's event
 *                                      handles to the next events created: a library that kept one
 *                                      would move this program's timestamps). Prints cycles= moved=
 *   quit START_NS MS US HOW            as `spin` with DEPTH 8, then leaves with those kernels still
 *                                      queued, no synchronisation: HOW = return (from main) or exit
 *                                      (exit(0) from a second thread while this one launches)
 *   idle START_NS MS                   one kernel (joins the device); at START_NS ten 50 us kernels,
 *                                      then nothing until MS after START_NS (a registered tenant
 *                                      without work)
 *   hostflag US LATER [WARM_MS]        (after WARM_MS, default 0, of spin launches of US, each
 *                                      synchronised) a host function on the stream waits for a flag
 *                                      this thread sets only after LATER more spin launches of US
 *                                      behind it on the same stream (as a kernel spinning on a host
 *                                      flag would); then synchronises. Prints done=1 (never, if a
 *                                      launch hangs)
 *   sidestream START_NS MS LONG_US US  one stream loops LONG_US kernels (two queued), another
 *                                      launches US kernels (DEPTH 4 queued) for MS ms; prints
 *                                      short_launches=
 *   stamp START_NS MS US WHAT LEDGER LOCK LOCK_NS OWNER GRANT EPOCH BEAT SLOTS SLOT_SIZE PID [ATTACK_MS
 *         [TENANT_AT TENANT]]
 *                                      as `spin` (depth 8), while a second thread of this process
 *                                      attacks the device ledger LEDGER (byte offsets of its words
 *                                      given) every 5 ms: WHAT = lock: writes the arbitration lock
 *                                      word naming this process's slot (the slot whose pid word is
 *                                      ours), stamped now, and takes it back within 100 us whenever
 *                                      it is let go of; owner: writes the owner word naming our
 *                                      slot, the grant and heartbeat now, and a new epoch. With
 *                                      ATTACK_MS after the offsets, the attack stops that long
 *                                      after START_NS (the spinning goes on). With TENANT_AT (the
 *                                      offset of a slot's tenant word) and TENANT (our tenant's
 *                                      entry), our slot is the one whose pid and tenant words are
 *                                      ours: in a PID namespace every tenant's process may be pid 1.
 *                                      Prints stamped=
 *   pose START_NS MS US WHAT LEDGER TENANTS ENTRY_SIZE ID_AT NAME_AT SLOTS SLOT_SIZE PID_AT
 *        TENANT_AT OWN VICTIM
 *                                      as `spin` (depth 8), while a second thread of this process
 *                                      writes the device ledger LEDGER (byte offsets of its tables
 *                                      and words given) every 1 ms for the whole run, the entries
 *                                      found by their labels OWN (ours) and VICTIM: WHAT = scramble:
 *                                      garbage over the victim entry's identity words; label: our
 *                                      slot (found once, by our pid and entry) labelled with the
 *                                      victim's entry; copyid: the victim's identity words (read at
 *                                      the first write) into our entry. Prints stamped=
 *
 * COMPUTE_DEVICE=<ordinal> makes every single-device mode use that device (default 0).
 */
#include <cuda.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static uint64_t now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static const char module_image[] = "simgpu test module: any bytes";
static CUfunction spin;
static CUstream stream;

static CUdevice device(void) {
    CUdevice dev;
    const char *ordinal = getenv("COMPUTE_DEVICE");
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, ordinal ? atoi(ordinal) : 0));
    return dev;
}

/* The module, the kernel and the stream, in the current context. */
static void load(void) {
    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, module_image));
    CHECK(cuModuleGetFunction(&spin, mod, "spin_kernel"));
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
}

static void setup(void) {
    CUcontext ctx;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, device()));
    CHECK(cuCtxSetCurrent(ctx));
    load();
}

static CUresult launch(uint64_t us) {
    void *params[] = {&us};
    return cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL);
}

static void wait_start(uint64_t start_ns) {
    while (now_ns(CLOCK_REALTIME) < start_ns)
        usleep(200);
}

enum { MAX_RING = 64 };

static uint64_t clock_pair_ns(void);
static int cmp_u64(const void *a, const void *b);

static int mode_spin(uint64_t start_ns, uint64_t ms, uint64_t us, int depth) {
    setup();
    CUevent ring[MAX_RING];
    if (depth < 1 || depth > MAX_RING)
        depth = 8;
    for (int i = 0; i < depth; i++)
        CHECK(cuEventCreate(&ring[i], CU_EVENT_DISABLE_TIMING));
    wait_start(start_ns);
    /* COMPUTE_CLIENT_LAUNCH_CPU=1: the launching thread's CPU time inside each cuLaunchKernel
     * (less what the two clock reads around it cost) is summed: launch_cpu_ns= per launch. */
    int timed = getenv("COMPUTE_CLIENT_LAUNCH_CPU") != NULL;
    /* COMPUTE_CLIENT_PAUSE_US=N: the thread sleeps N us before each launch (outside the timed
     * part): a launch that follows a sleep, with the caches other threads used meanwhile. */
    const char *pause_env = getenv("COMPUTE_CLIENT_PAUSE_US");
    useconds_t pause_us = pause_env ? (useconds_t)atoi(pause_env) : 0;
    uint64_t clock_pair = timed ? clock_pair_ns() : 0, in_launch = 0;
    uint64_t cpu0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    uint64_t t0 = now_ns(CLOCK_REALTIME), end = t0 + ms * 1000000ull;
    long n = 0;
    while (now_ns(CLOCK_REALTIME) < end) {
        if (n >= depth)
            CHECK(cuEventSynchronize(ring[n % depth]));
        if (pause_us)
            usleep(pause_us);
        if (timed) {
            uint64_t a = now_ns(CLOCK_THREAD_CPUTIME_ID);
            CHECK(launch(us));
            in_launch += now_ns(CLOCK_THREAD_CPUTIME_ID) - a;
        } else {
            CHECK(launch(us));
        }
        CHECK(cuEventRecord(ring[n % depth], stream));
        n++;
    }
    uint64_t loop_cpu = now_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0;
    CHECK(cuStreamSynchronize(stream));
    printf("start_ns=%llu\nend_ns=%llu\nlaunches=%ld\n", (unsigned long long)t0,
           (unsigned long long)now_ns(CLOCK_REALTIME), n);
    if (timed && n > 0) {
        /* In the launches, and in the whole loop (its waits for its own kernels included). */
        uint64_t per = in_launch / (uint64_t)n;
        printf("launch_cpu_ns=%llu\nloop_cpu_ns=%llu\nclock_pair_ns=%llu\n",
               (unsigned long long)(per > clock_pair ? per - clock_pair : 0),
               (unsigned long long)(loop_cpu / (uint64_t)n), (unsigned long long)clock_pair);
    }
    return 0;
}

/* What two reads of the thread's CPU clock cost (the median of 21 rounds of 1000 pairs). */
static uint64_t clock_pair_ns(void) {
    uint64_t per[21];
    for (int r = 0; r < 21; r++) {
        uint64_t sum = 0;
        for (int i = 0; i < 1000; i++) {
            uint64_t a = now_ns(CLOCK_THREAD_CPUTIME_ID);
            sum += now_ns(CLOCK_THREAD_CPUTIME_ID) - a;
        }
        per[r] = sum / 1000;
    }
    qsort(per, 21, sizeof *per, cmp_u64);
    return per[10];
}

/* A capture begun late, on a stream with work of ours already measured (a contended device):
 * MS ms as `spin` (depth 8), then a quiet 20 ms, then cuStreamBeginCapture (resolved through
 * cuGetProcAddress, as the CUDA runtime resolves it) in global mode, N spin launches of US into
 * it, cuStreamEndCapture, and the graph launched once. Prints capture_end= graph_nodes=
 * graph_launch= (the begin and end are the trace's markers of the capture). */
static int mode_capture_late(uint64_t start_ns, uint64_t ms, uint64_t us, int n) {
    CUresult (*begin)(CUstream, CUstreamCaptureMode) = NULL;
    CUdriverProcAddressQueryResult found;
    mode_spin(start_ns, ms, us, 8);
    CHECK(cuGetProcAddress("cuStreamBeginCapture", (void **)&begin, 12000,
                           CU_GET_PROC_ADDRESS_DEFAULT, &found));
    usleep(20000);
    CHECK(begin(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    for (int i = 0; i < n; i++)
        CHECK(launch(us));
    CUgraph g = NULL;
    CUresult e = cuStreamEndCapture(stream, &g);
    size_t nodes = 0;
    CUresult gl = CUDA_ERROR_UNKNOWN;
    if (e == CUDA_SUCCESS && g) {
        CHECK(cuGraphGetNodes(g, NULL, &nodes));
        CUgraphExec x;
        CHECK(cuGraphInstantiate(&x, g, 0));
        gl = cuGraphLaunch(x, stream);
        CHECK(cuStreamSynchronize(stream));
    }
    printf("capture_end=%d\ngraph_nodes=%zu\ngraph_launch=%d\n", (int)e, nodes, (int)gl);
    return 0;
}

static int mode_batch(uint64_t start_ns, uint64_t ms, uint64_t us, int n_batch, int by_event) {
    setup();
    if (n_batch < 1)
        n_batch = 16;
    CUevent done;
    CHECK(cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));
    wait_start(start_ns);
    uint64_t t0 = now_ns(CLOCK_REALTIME), end = t0 + ms * 1000000ull;
    long n = 0;
    while (now_ns(CLOCK_REALTIME) < end) {
        for (int i = 0; i < n_batch; i++, n++)
            CHECK(launch(us));
        if (by_event) {
            CHECK(cuEventRecord(done, stream));
            CHECK(cuEventSynchronize(done));
        } else {
            CHECK(cuStreamSynchronize(stream));
        }
    }
    printf("start_ns=%llu\nend_ns=%llu\nlaunches=%ld\n", (unsigned long long)t0,
           (unsigned long long)now_ns(CLOCK_REALTIME), n);
    return 0;
}

static int mode_streams(uint64_t start_ns, uint64_t ms, uint64_t us) {
    setup();
    CUstream other, s[2];
    CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    s[0] = stream;
    s[1] = other;
    enum { DEPTH = 8 };
    CUevent ring[DEPTH];
    for (int i = 0; i < DEPTH; i++)
        CHECK(cuEventCreate(&ring[i], CU_EVENT_DISABLE_TIMING));
    wait_start(start_ns);
    uint64_t t0 = now_ns(CLOCK_REALTIME), end = t0 + ms * 1000000ull;
    long n = 0;
    while (now_ns(CLOCK_REALTIME) < end) {
        if (n >= DEPTH)
            CHECK(cuEventSynchronize(ring[n % DEPTH]));
        void *params[] = {&us};
        CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s[n % 2], params, NULL));
        CHECK(cuEventRecord(ring[n % DEPTH], s[n % 2]));
        n++;
    }
    CHECK(cuStreamSynchronize(s[0]));
    CHECK(cuStreamSynchronize(s[1]));
    printf("start_ns=%llu\nend_ns=%llu\nlaunches=%ld\n", (unsigned long long)t0,
           (unsigned long long)now_ns(CLOCK_REALTIME), n);
    return 0;
}

/* The per-thread default stream's entry points (cuda.h declares them under these names only when
 * CUDA_API_PER_THREAD_DEFAULT_STREAM renames the plain ones). */
extern __typeof__(cuLaunchKernel) cuLaunchKernel_ptsz;
extern __typeof__(cuEventRecord) cuEventRecord_ptsz;
extern __typeof__(cuStreamSynchronize) cuStreamSynchronize_ptsz;

enum { MAX_PTSZ_THREADS = 16, PTSZ_DEPTH = 8 };

struct ptsz_thread {
    pthread_t id;
    CUcontext ctx;
    uint64_t start_ns, ms, us;
    int via_ptsz;
    long launches;
};

static void *ptsz_loop(void *arg) {
    struct ptsz_thread *t = arg;
    CHECK(cuCtxSetCurrent(t->ctx));
    CUevent ring[PTSZ_DEPTH];
    for (int i = 0; i < PTSZ_DEPTH; i++)
        CHECK(cuEventCreate(&ring[i], CU_EVENT_DISABLE_TIMING));
    wait_start(t->start_ns);
    uint64_t end = now_ns(CLOCK_REALTIME) + t->ms * 1000000ull, us = t->us;
    long n = 0;
    while (now_ns(CLOCK_REALTIME) < end) {
        if (n >= PTSZ_DEPTH)
            CHECK(cuEventSynchronize(ring[n % PTSZ_DEPTH]));
        void *params[] = {&us};
        if (t->via_ptsz) {
            CHECK(cuLaunchKernel_ptsz(spin, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
            CHECK(cuEventRecord_ptsz(ring[n % PTSZ_DEPTH], NULL));
        } else {
            CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, CU_STREAM_PER_THREAD, params, NULL));
            CHECK(cuEventRecord(ring[n % PTSZ_DEPTH], CU_STREAM_PER_THREAD));
        }
        n++;
    }
    if (t->via_ptsz)
        CHECK(cuStreamSynchronize_ptsz(NULL));
    else
        CHECK(cuStreamSynchronize(CU_STREAM_PER_THREAD));
    t->launches = n;
    return NULL;
}

static int mode_ptsz(uint64_t start_ns, uint64_t ms, uint64_t us, int threads) {
    setup();
    if (threads < 1 || threads > MAX_PTSZ_THREADS) {
        fprintf(stderr, "ptsz: THREADS must be 1..%d, not %d\n", MAX_PTSZ_THREADS, threads);
        return 2;
    }
    CUcontext ctx;
    CHECK(cuCtxGetCurrent(&ctx));
    struct ptsz_thread t[MAX_PTSZ_THREADS];
    uint64_t t0 = start_ns > now_ns(CLOCK_REALTIME) ? start_ns : now_ns(CLOCK_REALTIME);
    for (int i = 0; i < threads; i++) {
        t[i] = (struct ptsz_thread){
            .ctx = ctx, .start_ns = start_ns, .ms = ms, .us = us, .via_ptsz = i % 2 == 0};
        if (pthread_create(&t[i].id, NULL, ptsz_loop, &t[i]) != 0) {
            fprintf(stderr, "ptsz: pthread_create failed\n");
            return 1;
        }
    }
    long n = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i].id, NULL);
        n += t[i].launches;
        printf("launches_%d=%ld\n", i, t[i].launches);
    }
    printf("start_ns=%llu\nend_ns=%llu\nlaunches=%ld\n", (unsigned long long)t0,
           (unsigned long long)now_ns(CLOCK_REALTIME), n);
    return 0;
}

static int mode_graph(uint64_t start_ns, uint64_t ms, uint64_t us, int nodes) {
    setup();
    CUgraph graph;
    CUgraphExec exec;
    CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    for (int i = 0; i < nodes; i++)
        CHECK(launch(us));
    CHECK(cuStreamEndCapture(stream, &graph));
    CHECK(cuGraphInstantiate(&exec, graph, 0));
    CUevent ring[2];
    for (int i = 0; i < 2; i++)
        CHECK(cuEventCreate(&ring[i], CU_EVENT_DISABLE_TIMING));
    wait_start(start_ns);
    uint64_t t0 = now_ns(CLOCK_REALTIME), end = t0 + ms * 1000000ull;
    long n = 0;
    while (now_ns(CLOCK_REALTIME) < end) {
        if (n >= 2)
            CHECK(cuEventSynchronize(ring[n % 2]));
        CHECK(cuGraphLaunch(exec, stream));
        CHECK(cuEventRecord(ring[n % 2], stream));
        n++;
    }
    CHECK(cuStreamSynchronize(stream));
    printf("start_ns=%llu\nend_ns=%llu\ngraph_launches=%ld\n", (unsigned long long)t0,
           (unsigned long long)now_ns(CLOCK_REALTIME), n);
    return 0;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int mode_request(uint64_t start_ns, uint64_t ms, uint64_t period_ms, int n, uint64_t us) {
    setup();
    /* Warm up (first launch creates the stream's worker, etc.). */
    CHECK(launch(us));
    CHECK(cuStreamSynchronize(stream));
    wait_start(start_ns);
    size_t cap = ms / period_ms + 2, count = 0;
    uint64_t *lat = calloc(cap, sizeof *lat);
    /* The parts of each request: in its first launch (where a launch waits for a grant), in the
     * others, in the synchronisation (its work and whatever runs ahead of it on the device). */
    int parts = getenv("COMPUTE_CLIENT_REQUEST_PARTS") != NULL;
    uint64_t (*part)[4] = calloc(cap, sizeof *part);
    const char *j = getenv("COMPUTE_CLIENT_REQUEST_JITTER_US");
    uint64_t jitter_ns = j ? strtoull(j, NULL, 10) * 1000ull : 0;
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    uint64_t t0 = now_ns(CLOCK_MONOTONIC), end = t0 + ms * 1000000ull, next = t0;
    while (count < cap) {
        uint64_t now = now_ns(CLOCK_MONOTONIC);
        if (now >= end)
            break;
        if (now < next) {
            struct timespec d = {0, (long)(next - now)};
            nanosleep(&d, NULL);
            continue;
        }
        uint64_t a = now_ns(CLOCK_MONOTONIC), first = a;
        for (int i = 0; i < n; i++) {
            CHECK(launch(us));
            if (i == 0)
                first = now_ns(CLOCK_MONOTONIC);
        }
        uint64_t launched = now_ns(CLOCK_MONOTONIC);
        CHECK(cuStreamSynchronize(stream));
        uint64_t done = now_ns(CLOCK_MONOTONIC);
        part[count][0] = first - a;
        part[count][1] = launched - first;
        part[count][2] = done - launched;
        part[count][3] = a;
        lat[count++] = done - a;
        next += period_ms * 1000000ull;
        if (jitter_ns) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            next += (seed >> 33) % jitter_ns;
        }
    }
    if (parts)
        for (size_t i = 0; i < count; i++)
            printf("part=%llu,%llu,%llu,%llu\n", (unsigned long long)part[i][0] / 1000,
                   (unsigned long long)part[i][1] / 1000, (unsigned long long)part[i][2] / 1000,
                   (unsigned long long)part[i][3] / 1000);
    free(part);
    qsort(lat, count, sizeof *lat, cmp_u64);
    printf("requests=%zu\n", count);
    if (count > 0) {
        printf("p50_us=%llu\n", (unsigned long long)lat[count / 2] / 1000);
        printf("p99_us=%llu\n", (unsigned long long)lat[(count * 99) / 100 < count ? (count * 99) / 100 : count - 1] / 1000);
        printf("max_us=%llu\n", (unsigned long long)lat[count - 1] / 1000);
    }
    return 0;
}

static int mode_hold(uint64_t us) {
    setup();
    CHECK(launch(us));
    CHECK(cuStreamSynchronize(stream));
    printf("ready=1\npid=%d\n", (int)getpid());
    fflush(stdout);
    enum { RING = 8 };
    CUevent ring[RING];
    for (int i = 0; i < RING; i++)
        CHECK(cuEventCreate(&ring[i], CU_EVENT_DISABLE_TIMING));
    for (long k = 0;; k++) {
        if (k >= RING)
            CHECK(cuEventSynchronize(ring[k % RING]));
        CHECK(launch(us));
        CHECK(cuEventRecord(ring[k % RING], stream));
        struct pollfd p = {.fd = 0, .events = POLLIN};
        if (poll(&p, 1, 0) > 0) {
            char c;
            if (read(0, &c, 1) <= 0)
                break;
        }
    }
    CHECK(cuStreamSynchronize(stream));
    return 0;
}

static int mode_bench(int n, int reps) {
    setup();
    uint64_t *per = calloc((size_t)reps, sizeof *per);
    for (int r = 0; r < reps; r++) {
        CHECK(cuStreamSynchronize(stream));
        uint64_t a = now_ns(CLOCK_MONOTONIC);
        for (int i = 0; i < n; i++)
            CHECK(launch(0));
        per[r] = (now_ns(CLOCK_MONOTONIC) - a) / (uint64_t)n;
    }
    CHECK(cuStreamSynchronize(stream));
    qsort(per, (size_t)reps, sizeof *per, cmp_u64);
    printf("launch_ns_median=%llu\nlaunch_ns_min=%llu\n", (unsigned long long)per[reps / 2],
           (unsigned long long)per[0]);
    return 0;
}

struct capture_arg {
    uint64_t end_ns, us;
    long captures, failures;
    CUcontext ctx;
};

static void *capture_thread(void *p) {
    struct capture_arg *a = p;
    CUstream cs;
    CHECK(cuCtxSetCurrent(a->ctx));
    CHECK(cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING));
    while (now_ns(CLOCK_REALTIME) < a->end_ns) {
        CUgraph g = NULL;
        CUresult r = cuStreamBeginCapture(cs, CU_STREAM_CAPTURE_MODE_GLOBAL);
        for (int i = 0; r == CUDA_SUCCESS && i < 3; i++) {
            void *params[] = {&a->us};
            r = cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, cs, params, NULL);
        }
        CUresult e = cuStreamEndCapture(cs, &g);
        if (r != CUDA_SUCCESS || e != CUDA_SUCCESS || g == NULL) {
            a->failures++;
            printf("capture_error=%d end=%d\n", (int)r, (int)e);
        } else {
            a->captures++;
        }
        if (g)
            cuGraphDestroy(g);
    }
    return NULL;
}

static int mode_capture(uint64_t start_ns, uint64_t ms, uint64_t us) {
    setup();
    wait_start(start_ns);
    uint64_t t0 = now_ns(CLOCK_REALTIME);
    struct capture_arg c = {.end_ns = t0 + ms * 1000000ull, .us = us};
    CHECK(cuCtxGetCurrent(&c.ctx));
    pthread_t t;
    pthread_create(&t, NULL, capture_thread, &c);
    /* No synchronisation while the other thread captures in global mode (the program would break
     * its own capture): launches paced by the clock instead. */
    long n = 0;
    while (now_ns(CLOCK_REALTIME) < c.end_ns) {
        CHECK(launch(us));
        usleep((useconds_t)(us / 2));
        n++;
    }
    pthread_join(t, NULL);
    CHECK(cuStreamSynchronize(stream));
    printf("launches=%ld\ncaptures=%ld\ncapture_failures=%ld\n", n, c.captures, c.failures);
    return 0;
}

struct multi_arg {
    int dev;
    uint64_t start_ns, ms, us;
    long launches;
};

static void *multi_thread(void *p) {
    struct multi_arg *a = p;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUstream st;
    CHECK(cuDeviceGet(&dev, a->dev));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, module_image));
    CHECK(cuModuleGetFunction(&fn, mod, "spin_kernel"));
    CHECK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    enum { DEPTH = 8 };
    CUevent ring[DEPTH];
    for (int i = 0; i < DEPTH; i++)
        CHECK(cuEventCreate(&ring[i], CU_EVENT_DISABLE_TIMING));
    wait_start(a->start_ns);
    uint64_t end = now_ns(CLOCK_REALTIME) + a->ms * 1000000ull;
    long n = 0;
    while (now_ns(CLOCK_REALTIME) < end) {
        if (n >= DEPTH)
            CHECK(cuEventSynchronize(ring[n % DEPTH]));
        void *params[] = {&a->us};
        CHECK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, st, params, NULL));
        CHECK(cuEventRecord(ring[n % DEPTH], st));
        n++;
    }
    CHECK(cuStreamSynchronize(st));
    a->launches = n;
    return NULL;
}

static int mode_multi(uint64_t start_ns, uint64_t ms, uint64_t us, int ndev) {
    CHECK(cuInit(0));
    if (ndev < 1 || ndev > 8)
        ndev = 1;
    pthread_t t[8];
    struct multi_arg a[8];
    for (int d = 0; d < ndev; d++) {
        a[d] = (struct multi_arg){.dev = d, .start_ns = start_ns, .ms = ms, .us = us};
        pthread_create(&t[d], NULL, multi_thread, &a[d]);
    }
    for (int d = 0; d < ndev; d++) {
        pthread_join(t[d], NULL);
        printf("launches_%d=%ld\n", d, a[d].launches);
    }
    printf("start_ns=%llu\nend_ns=%llu\n", (unsigned long long)start_ns,
           (unsigned long long)now_ns(CLOCK_REALTIME));
    return 0;
}

/* Spins until `end_ns` keeping DEPTH launches queued (events of the current context); returns the
 * number of launches. Leaves the last DEPTH queued. */
enum { TEAR_DEPTH = 8 };
static long spin_until(uint64_t end_ns, uint64_t us) {
    CUevent ring[TEAR_DEPTH];
    for (int i = 0; i < TEAR_DEPTH; i++)
        CHECK(cuEventCreate(&ring[i], CU_EVENT_DISABLE_TIMING));
    long n = 0;
    while (now_ns(CLOCK_REALTIME) < end_ns) {
        if (n >= TEAR_DEPTH)
            CHECK(cuEventSynchronize(ring[n % TEAR_DEPTH]));
        CHECK(launch(us));
        CHECK(cuEventRecord(ring[n % TEAR_DEPTH], stream));
        n++;
    }
    return n;
}

/* A context to tear down, current, with the module and stream: created (destroy), or the primary one. */
static CUcontext set_up(CUdevice dev, int destroy) {
    CUcontext ctx;
    if (destroy)
        CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    else
        CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    load();
    return ctx;
}

/* The current context torn down (destroyed, or the primary context reset), then a new one set up. */
static void tear_down(CUcontext *ctx, CUdevice dev, int destroy) {
    if (destroy)
        CHECK(cuCtxDestroy(*ctx));
    else
        CHECK(cuDevicePrimaryCtxReset(dev));
    *ctx = set_up(dev, destroy);
}

static int mode_teardown(uint64_t start_ns, uint64_t ms, uint64_t us, const char *how) {
    CUdevice dev = device();
    int destroy = strcmp(how, "destroy") == 0;
    CUcontext ctx = set_up(dev, destroy);
    wait_start(start_ns);
    uint64_t t0 = now_ns(CLOCK_REALTIME), end = t0 + ms * 1000000ull;
    long before = spin_until(t0 + ms * 500000ull, us);
    /* Kernels still queued: the context goes with them. */
    tear_down(&ctx, dev, destroy);
    uint64_t torn = now_ns(CLOCK_REALTIME);
    long after = spin_until(end, us);
    CHECK(cuStreamSynchronize(stream));
    printf("torn_down=1\ntorn_ns=%llu\nlaunches_before=%ld\nlaunches_after=%ld\nend_ns=%llu\n",
           (unsigned long long)torn, before, after, (unsigned long long)now_ns(CLOCK_REALTIME));
    return 0;
}

static int mode_reuse(uint64_t start_ns, int cycles, uint64_t us, const char *how) {
    CUdevice dev = device();
    int destroy = strcmp(how, "destroy") == 0;
    CUcontext ctx = set_up(dev, destroy);
    wait_start(start_ns);
    int moved = 0;
    for (int c = 0; c < cycles; c++) {
        for (int i = 0; i < 8; i++)
            CHECK(launch(us));
        tear_down(&ctx, dev, destroy);
        CUevent a, b;
        CHECK(cuEventCreate(&a, 0));
        CHECK(cuEventCreate(&b, 0));
        CHECK(cuEventRecord(a, stream));
        CHECK(launch(us));
        CHECK(cuEventRecord(b, stream));
        CHECK(cuEventSynchronize(b));
        float before, after = -1;
        CHECK(cuEventElapsedTime(&before, a, b));
        for (int i = 0; i < 16; i++)
            CHECK(launch(us));
        CHECK(cuStreamSynchronize(stream));
        /* Recorded again by someone else, the events may not even be complete or in order. */
        if (cuEventElapsedTime(&after, a, b) != CUDA_SUCCESS || after != before)
            moved++;
        CHECK(cuEventDestroy(a));
        CHECK(cuEventDestroy(b));
    }
    printf("cycles=%d\nmoved=%d\n", cycles, moved);
    return 0;
}

static void *exit_thread(void *p) {
    uint64_t end_ns = *(uint64_t *)p;
    wait_start(end_ns);
    printf("leaving_ns=%llu\n", (unsigned long long)now_ns(CLOCK_REALTIME));
    exit(0);
}

static int mode_quit(uint64_t start_ns, uint64_t ms, uint64_t us, const char *how) {
    setup();
    wait_start(start_ns);
    uint64_t end = now_ns(CLOCK_REALTIME) + ms * 1000000ull;
    if (strcmp(how, "exit") == 0) {
        /* exit() from another thread while this one keeps launching. */
        pthread_t t;
        pthread_create(&t, NULL, exit_thread, &end);
        for (;;)
            spin_until(UINT64_MAX, us);
    }
    spin_until(end, us);
    printf("leaving_ns=%llu\n", (unsigned long long)now_ns(CLOCK_REALTIME));
    return 0; /* with TEAR_DEPTH kernels queued */
}

static int mode_idle(uint64_t start_ns, uint64_t ms) {
    setup();
    CHECK(launch(0));
    CHECK(cuStreamSynchronize(stream));
    /* A little work beside the others at the start, then none. */
    wait_start(start_ns);
    for (int i = 0; i < 10; i++)
        CHECK(launch(50));
    CHECK(cuStreamSynchronize(stream));
    printf("idle_from_ns=%llu\n", (unsigned long long)now_ns(CLOCK_REALTIME));
    wait_start(start_ns + ms * 1000000ull);
    return 0;
}

static volatile int host_flag;

static void CUDA_CB wait_flag(void *arg) {
    (void)arg;
    while (!host_flag)
        usleep(100);
}

static int mode_hostflag(uint64_t us, int later, uint64_t warm_ms) {
    setup();
    uint64_t warm_end = now_ns(CLOCK_MONOTONIC) + warm_ms * 1000000ull;
    while (now_ns(CLOCK_MONOTONIC) < warm_end) {
        CHECK(launch(us));
        CHECK(cuStreamSynchronize(stream));
    }
    CHECK(cuLaunchHostFunc(stream, wait_flag, NULL));
    for (int i = 0; i < later; i++)
        CHECK(launch(us));
    host_flag = 1;
    CHECK(cuStreamSynchronize(stream));
    printf("done=1\n");
    return 0;
}

static int mode_sidestream(uint64_t start_ns, uint64_t ms, uint64_t long_us, uint64_t us) {
    setup();
    CUstream side;
    CHECK(cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
    enum { DEPTH = 4 };
    CUevent ring[DEPTH], longs[2];
    for (int i = 0; i < DEPTH; i++)
        CHECK(cuEventCreate(&ring[i], CU_EVENT_DISABLE_TIMING));
    for (int i = 0; i < 2; i++)
        CHECK(cuEventCreate(&longs[i], CU_EVENT_DISABLE_TIMING));
    wait_start(start_ns);
    uint64_t t0 = now_ns(CLOCK_REALTIME), end = t0 + ms * 1000000ull;
    long n = 0, nl = 0;
    while (now_ns(CLOCK_REALTIME) < end) {
        /* Keep two long kernels queued on the side stream. */
        if (nl < 2 || cuEventQuery(longs[nl % 2]) == CUDA_SUCCESS) {
            void *params[] = {&long_us};
            CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, side, params, NULL));
            CHECK(cuEventRecord(longs[nl % 2], side));
            nl++;
        }
        if (n >= DEPTH)
            CHECK(cuEventSynchronize(ring[n % DEPTH]));
        CHECK(launch(us));
        CHECK(cuEventRecord(ring[n % DEPTH], stream));
        n++;
    }
    CHECK(cuCtxSynchronize());
    printf("short_launches=%ld\nlong_launches=%ld\n", n, nl);
    return 0;
}

struct stamper {
    int owner_mode;
    const char *path;
    size_t at[10]; /* lock, lock_ns, owner, grant, epoch, beat, slots, slot size, pid, tenant */
    long tenant;   /* our tenant's entry, or -1: any */
    uint64_t end_ns;
    uint64_t attack_end_ns;
    long stamped;
};

static void *stamp_thread(void *arg) {
    struct stamper *st = arg;
    int fd = open(st->path, O_RDWR);
    if (fd < 0) {
        perror(st->path);
        exit(3);
    }
    size_t size = st->at[6] + 256 * st->at[7];
    unsigned char *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        perror("mmap");
        exit(3);
    }
    uint32_t self = (uint32_t)getpid();
    while (now_ns(CLOCK_REALTIME) < st->end_ns) {
        if (now_ns(CLOCK_REALTIME) >= st->attack_end_ns) {
            usleep(5000);
            continue;
        }
        uint32_t mine = 0;
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t pid = __atomic_load_n((uint32_t *)(m + st->at[6] + i * st->at[7] + st->at[8]),
                                           __ATOMIC_ACQUIRE);
            uint32_t tenant = st->tenant < 0 ? 0
                                              : __atomic_load_n((uint32_t *)(m + st->at[6] +
                                                                             i * st->at[7] + st->at[9]),
                                                                __ATOMIC_ACQUIRE);
            if (pid == self && (st->tenant < 0 || tenant == (uint32_t)st->tenant)) {
                mine = i + 1;
                break;
            }
        }
        uint64_t t = now_ns(CLOCK_MONOTONIC);
        if (mine && st->owner_mode) {
            uint32_t *epoch = (uint32_t *)(m + st->at[4]);
            __atomic_store_n((uint64_t *)(m + st->at[3]), t, __ATOMIC_RELEASE);
            __atomic_store_n((uint64_t *)(m + st->at[5]), t, __ATOMIC_RELEASE);
            __atomic_store_n((uint32_t *)(m + st->at[2]), mine, __ATOMIC_RELEASE);
            __atomic_store_n(epoch, __atomic_load_n(epoch, __ATOMIC_ACQUIRE) + 1, __ATOMIC_RELEASE);
            st->stamped++;
            usleep(5000);
        } else if (mine) {
            /* Re-stamped every 5 ms, and taken back within 100 us whenever our own scheduler
             * thread (which may take a word naming its slot) lets go of it. */
            uint32_t *lock = (uint32_t *)(m + st->at[0]);
            __atomic_store_n(lock, mine, __ATOMIC_RELEASE);
            __atomic_store_n((uint64_t *)(m + st->at[1]), t, __ATOMIC_RELEASE);
            st->stamped++;
            for (int i = 0; i < 50; i++) {
                usleep(100);
                if (__atomic_load_n(lock, __ATOMIC_ACQUIRE) != mine) {
                    __atomic_store_n(lock, mine, __ATOMIC_RELEASE);
                    __atomic_store_n((uint64_t *)(m + st->at[1]), now_ns(CLOCK_MONOTONIC),
                                     __ATOMIC_RELEASE);
                }
            }
        } else {
            usleep(5000);
        }
    }
    return NULL;
}

static int mode_stamp(int argc, char **argv) {
    struct stamper st = {0};
    uint64_t start = strtoull(argv[2], NULL, 10), ms = strtoull(argv[3], NULL, 10);
    st.owner_mode = strcmp(argv[5], "owner") == 0;
    st.path = argv[6];
    for (int i = 0; i < 9; i++)
        st.at[i] = strtoull(argv[7 + i], NULL, 10);
    st.end_ns = start + ms * 1000000ull;
    st.attack_end_ns = argc > 16 ? start + strtoull(argv[16], NULL, 10) * 1000000ull : st.end_ns;
    st.tenant = -1;
    if (argc > 18) {
        st.at[9] = strtoull(argv[17], NULL, 10);
        st.tenant = strtol(argv[18], NULL, 10);
    }
    pthread_t t;
    pthread_create(&t, NULL, stamp_thread, &st);
    int r = mode_spin(start, ms, strtoull(argv[4], NULL, 10), 8);
    pthread_join(t, NULL);
    printf("stamped=%ld\n", st.stamped);
    return r;
}

struct poser {
    int what; /* 0 scramble, 1 label, 2 copyid */
    const char *path;
    size_t tenants, entry_size, id_at, name_at, slots, slot_size, pid_at, tenant_at;
    const char *own, *victim;
    uint64_t end_ns;
    long stamped;
};

/* The entry labelled `name` (its NUL-padded name words) of the ledger's 32, or -1. */
static long entry_named(const struct poser *p, const unsigned char *m, const char *name) {
    for (long i = 0; i < 32; i++) {
        const char *n = (const char *)(m + p->tenants + i * p->entry_size + p->name_at);
        if (strncmp(n, name, 64) == 0)
            return i;
    }
    return -1;
}

static void *pose_thread(void *arg) {
    struct poser *p = arg;
    int fd = open(p->path, O_RDWR);
    if (fd < 0) {
        perror(p->path);
        exit(3);
    }
    size_t size = p->slots + 256 * p->slot_size;
    unsigned char *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        perror("mmap");
        exit(3);
    }
    uint32_t self = (uint32_t)getpid();
    long slot = -1;
    uint64_t victim_id[2] = {0, 0};
    int have_id = 0;
    while (now_ns(CLOCK_REALTIME) < p->end_ns) {
        long own = entry_named(p, m, p->own), victim = entry_named(p, m, p->victim);
        /* The victim's entry its process uses: the one a live slot (not ours) is labelled with. */
        for (long i = 0; i < 256; i++) {
            unsigned char *s = m + p->slots + i * p->slot_size;
            uint32_t t = __atomic_load_n((uint32_t *)(s + p->tenant_at), __ATOMIC_ACQUIRE);
            if (i == slot || __atomic_load_n((uint32_t *)s, __ATOMIC_ACQUIRE) == 0 || t >= 32)
                continue;
            const char *n = (const char *)(m + p->tenants + t * p->entry_size + p->name_at);
            if (strncmp(n, p->victim, 64) == 0) {
                victim = t;
                break;
            }
        }
        if (own < 0 || victim < 0) {
            usleep(1000);
            continue;
        }
        uint64_t *vid = (uint64_t *)(m + p->tenants + victim * p->entry_size + p->id_at);
        uint64_t *oid = (uint64_t *)(m + p->tenants + own * p->entry_size + p->id_at);
        if (p->what == 0) {
            /* Every entry carrying the victim's label (the node's and its processes' alike). */
            for (long i = 0; i < 32; i++) {
                unsigned char *e = m + p->tenants + i * p->entry_size;
                if (strncmp((const char *)(e + p->name_at), p->victim, 64) != 0)
                    continue;
                uint64_t *id = (uint64_t *)(e + p->id_at);
                __atomic_store_n(&id[0], 0x5a5a5a5a5a5a5a5aull, __ATOMIC_RELEASE);
                __atomic_store_n(&id[1], 0xa5a5a5a5a5a5a5a5ull, __ATOMIC_RELEASE);
            }
            p->stamped++;
        } else if (p->what == 1) {
            for (long i = 0; slot < 0 && i < 256; i++) {
                unsigned char *s = m + p->slots + i * p->slot_size;
                if (__atomic_load_n((uint32_t *)(s + p->pid_at), __ATOMIC_ACQUIRE) == self &&
                    __atomic_load_n((uint32_t *)(s + p->tenant_at), __ATOMIC_ACQUIRE) ==
                        (uint32_t)own)
                    slot = i;
            }
            if (slot >= 0) {
                uint32_t *t = (uint32_t *)(m + p->slots + slot * p->slot_size + p->tenant_at);
                __atomic_store_n(t, (uint32_t)victim, __ATOMIC_RELEASE);
                p->stamped++;
            }
        } else {
            if (!have_id) {
                victim_id[0] = __atomic_load_n(&vid[0], __ATOMIC_ACQUIRE);
                victim_id[1] = __atomic_load_n(&vid[1], __ATOMIC_ACQUIRE);
                have_id = 1;
            }
            __atomic_store_n(&oid[0], victim_id[0], __ATOMIC_RELEASE);
            __atomic_store_n(&oid[1], victim_id[1], __ATOMIC_RELEASE);
            p->stamped++;
        }
        usleep(1000);
    }
    return NULL;
}

static int mode_pose(char **argv) {
    struct poser p = {0};
    uint64_t start = strtoull(argv[2], NULL, 10), ms = strtoull(argv[3], NULL, 10);
    p.what = strcmp(argv[5], "scramble") == 0 ? 0 : strcmp(argv[5], "label") == 0 ? 1 : 2;
    p.path = argv[6];
    size_t *at[] = {&p.tenants, &p.entry_size, &p.id_at,     &p.name_at,
                    &p.slots,   &p.slot_size,  &p.pid_at,    &p.tenant_at};
    for (int i = 0; i < 8; i++)
        *at[i] = strtoull(argv[7 + i], NULL, 10);
    p.own = argv[15];
    p.victim = argv[16];
    p.end_ns = start + ms * 1000000ull;
    pthread_t t;
    pthread_create(&t, NULL, pose_thread, &p);
    int r = mode_spin(start, ms, strtoull(argv[4], NULL, 10), 8);
    pthread_join(t, NULL);
    printf("stamped=%ld\n", p.stamped);
    return r;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *m = argc > 1 ? argv[1] : "";
    if (strcmp(m, "spin") == 0 && argc >= 5)
        return mode_spin(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10),
                         strtoull(argv[4], NULL, 10), argc > 5 ? atoi(argv[5]) : 8);
    if (strcmp(m, "batch") == 0 && (argc == 6 || (argc == 7 && strcmp(argv[6], "event") == 0)))
        return mode_batch(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10),
                          strtoull(argv[4], NULL, 10), atoi(argv[5]), argc == 7);
    if (strcmp(m, "graph") == 0 && argc == 6)
        return mode_graph(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10),
                          strtoull(argv[4], NULL, 10), atoi(argv[5]));
    if (strcmp(m, "request") == 0 && argc == 7)
        return mode_request(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10),
                            strtoull(argv[4], NULL, 10), atoi(argv[5]), strtoull(argv[6], NULL, 10));
    if (strcmp(m, "hold") == 0 && argc == 3)
        return mode_hold(strtoull(argv[2], NULL, 10));
    if (strcmp(m, "streams") == 0 && argc == 5)
        return mode_streams(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10),
                            strtoull(argv[4], NULL, 10));
    if (strcmp(m, "capture") == 0 && argc == 5)
        return mode_capture(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10),
                            strtoull(argv[4], NULL, 10));
    if (strcmp(m, "capturelate") == 0 && argc == 6)
        return mode_capture_late(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10),
                                 strtoull(argv[4], NULL, 10), atoi(argv[5]));
    if (strcmp(m, "ptsz") == 0 && argc == 6)
        return mode_ptsz(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10),
                         strtoull(argv[4], NULL, 10), atoi(argv[5]));
    if (strcmp(m, "multi") == 0 && argc == 6)
        return mode_multi(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10),
                          strtoull(argv[4], NULL, 10), atoi(argv[5]));
    if (strcmp(m, "teardown") == 0 && argc == 6)
        return mode_teardown(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10),
                             strtoull(argv[4], NULL, 10), argv[5]);
    if (strcmp(m, "reuse") == 0 && argc == 6)
        return mode_reuse(strtoull(argv[2], NULL, 10), atoi(argv[3]), strtoull(argv[4], NULL, 10),
                          argv[5]);
    if (strcmp(m, "quit") == 0 && argc == 6)
        return mode_quit(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10),
                         strtoull(argv[4], NULL, 10), argv[5]);
    if (strcmp(m, "idle") == 0 && argc == 4)
        return mode_idle(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10));
    if (strcmp(m, "hostflag") == 0 && (argc == 4 || argc == 5))
        return mode_hostflag(strtoull(argv[2], NULL, 10), atoi(argv[3]),
                             argc == 5 ? strtoull(argv[4], NULL, 10) : 0);
    if (strcmp(m, "sidestream") == 0 && argc == 6)
        return mode_sidestream(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10),
                               strtoull(argv[4], NULL, 10), strtoull(argv[5], NULL, 10));
    if (strcmp(m, "stamp") == 0 && (argc == 16 || argc == 17 || argc == 19))
        return mode_stamp(argc, argv);
    if (strcmp(m, "pose") == 0 && argc == 17)
        return mode_pose(argv);
    if (strcmp(m, "bench") == 0 && argc == 4)
        return mode_bench(atoi(argv[2]), atoi(argv[3]));
    fprintf(stderr, "usage: see the comment at the top of compute_client.c\n");
    return 2;
}
