/* A CUDA program (linked with -lcuda, NVIDIA's cuda.h) for tests/shim_robustness.rs: it is run with
 * libgpuslice.so preloaded and reports what the driver API returned to it as `key=value` lines.
 * Return codes are printed, never hidden: the tests assert on them.
 *
 * Modes (argv[1]):
 *   storm SECONDS THREADS SEED [ASYNC_PERCENT]
 *                                THREADS threads allocate and free random sizes (1-64 MiB, 4 KiB
 *                                multiples; cuMemAlloc_v2/cuMemFree_v2 and, on ASYNC_PERCENT
 *                                (default 25) of them, cuMemAllocAsync/cuMemFreeAsync) for
 *                                SECONDS from a line on stdin (after ready=1); then free
 *                                everything, print counts and freed=1, wait for stdin to close,
 *                                release the context, print done=1
 *   swap SECONDS THREADS SEED    like storm (cuMemAlloc_v2/cuMemFree_v2 only), but the threads share
 *                                one list of live allocations: most frees are of another thread's
 *                                allocation (and the process has a memory pool: one stream-ordered
 *                                allocation before ready=1); then free everything, print counts and
 *                                freed=1, wait for stdin to close, release the context, print done=1
 *   hold MIB                     allocate MIB, print ready=1, wait for stdin to close, exit without
 *                                freeing
 *   retry MIB TIMEOUT_MS         allocate MIB once (first=RC); on a line from stdin, retry every 5 ms
 *                                until it succeeds or TIMEOUT_MS passed (got=, elapsed_ms=, last=)
 *   cmd                          set up (init=, retain= return codes), then one command per stdin
 *                                line: alloc MIB | free | info | fork MIB | exec MIB | forkidle |
 *                                reap | allocasync MIB | freeasync | forkfree | steal PATH | exit
 *                                (allocasync: cuMemAllocAsync on the NULL stream; freeasync frees the
 *                                last one and synchronises; forkfree: a fork child frees the last
 *                                allocation, which the parent keeps; steal: close every descriptor
 *                                but stdio, as a daemonising program does, then open PATH 8 times,
 *                                so the closed numbers are reused)
 *   execchild MIB FD             (started by `cmd`'s exec) allocate MIB, print exec_alloc=, wait for
 *                                FD to reach end of file, exit without freeing
 */
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

static const char *err_name(CUresult rc) {
    const char *name = NULL;
    if (cuGetErrorName(rc, &name) != CUDA_SUCCESS || name == NULL)
        return "?";
    return name;
}

/* A failed step that the test does not expect to fail ends the client, naming the call. */
#define CHECK(call)                                                                                \
    do {                                                                                           \
        CUresult rc_ = (call);                                                                     \
        if (rc_ != CUDA_SUCCESS) {                                                                 \
            printf("error=%s rc=%d name=%s line=%d\n", #call, (int)rc_, err_name(rc_), __LINE__); \
            fflush(stdout);                                                                        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static CUdevice dev;
static CUcontext ctx;

static void setup(void) {
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
}

/* Blocks until stdin reaches end of file (the test's signal to finish). */
static void wait_stdin_eof(void) {
    char buf[256];
    while (read(0, buf, sizeof buf) > 0)
        ;
}

/* ---- storm ---- */

struct storm_stats {
    long allocs, refused, async_allocs, frees;
    int bad_rc;
    char bad_call[64];
};

static int storm_seconds;
static unsigned storm_seed;
static int storm_async_pct = 25;

static void *storm_thread(void *arg) {
    struct storm_stats *st = arg;
    enum { LIVE = 8 };
    CUdeviceptr live[LIVE];
    int is_async[LIVE];
    int n = 0;
    unsigned seed = storm_seed ^ (unsigned)(uintptr_t)arg ^ (unsigned)getpid() * 2654435761u;
    CUstream stream;
    CUresult rc;
#define STORM_CHECK(call, name)                                                                    \
    do {                                                                                           \
        rc = (call);                                                                               \
        if (rc != CUDA_SUCCESS) {                                                                  \
            st->bad_rc = (int)rc;                                                                  \
            snprintf(st->bad_call, sizeof st->bad_call, "%s", name);                               \
            return NULL;                                                                           \
        }                                                                                          \
    } while (0)
    STORM_CHECK(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    STORM_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    uint64_t end = now_ms() + (uint64_t)storm_seconds * 1000u;
    while (now_ms() < end) {
        int r = rand_r(&seed) % 100;
        if (n < LIVE && (n == 0 || r < 55)) {
            size_t size = MIB + (size_t)(rand_r(&seed) % (63 * 256 + 1)) * 4096;
            int a = rand_r(&seed) % 100 < storm_async_pct;
            CUdeviceptr p = 0;
            rc = a ? cuMemAllocAsync(&p, size, stream) : cuMemAlloc(&p, size);
            if (rc == CUDA_SUCCESS) {
                live[n] = p;
                is_async[n] = a;
                n++;
                st->allocs++;
                st->async_allocs += a;
            } else if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
                st->refused++;
                /* Give the others a chance to free: a refused program usually backs off. */
                if (n > 0) {
                    n--;
                    STORM_CHECK(is_async[n] ? cuMemFreeAsync(live[n], stream) : cuMemFree(live[n]),
                                "free after refusal");
                    st->frees++;
                }
            } else {
                STORM_CHECK(rc, a ? "cuMemAllocAsync" : "cuMemAlloc_v2");
            }
        } else if (n > 0) {
            int i = rand_r(&seed) % n;
            STORM_CHECK(is_async[i] ? cuMemFreeAsync(live[i], stream) : cuMemFree(live[i]), "free");
            live[i] = live[n - 1];
            is_async[i] = is_async[n - 1];
            n--;
            st->frees++;
        }
        if (rand_r(&seed) % 16 == 0)
            STORM_CHECK(cuStreamSynchronize(stream), "cuStreamSynchronize");
    }
    while (n > 0) {
        n--;
        STORM_CHECK(is_async[n] ? cuMemFreeAsync(live[n], stream) : cuMemFree(live[n]), "final free");
        st->frees++;
    }
    STORM_CHECK(cuStreamSynchronize(stream), "final cuStreamSynchronize");
    STORM_CHECK(cuStreamDestroy(stream), "cuStreamDestroy");
    return NULL;
#undef STORM_CHECK
}

enum { STORM_MAX_THREADS = 64 };

struct storm_totals {
    long allocs, refused, async_allocs, frees;
    int bad;
};

/* Prints ready=1 (every process holds its context before any of them starts: the test's start
 * line), waits for a line on stdin, runs `threads` threads of `body` and sums what they counted.
 * Returns 0, or the mode's exit code. */
static int run_storm_threads(int threads, void *(*body)(void *), struct storm_totals *t) {
    printf("ready=1\n");
    fflush(stdout);
    char line[64];
    if (fgets(line, sizeof line, stdin) == NULL)
        return 4;
    pthread_t tid[STORM_MAX_THREADS];
    static struct storm_stats st[STORM_MAX_THREADS];
    for (int i = 0; i < threads; i++)
        if (pthread_create(&tid[i], NULL, body, &st[i]) != 0)
            return 3;
    for (int i = 0; i < threads; i++) {
        pthread_join(tid[i], NULL);
        t->allocs += st[i].allocs;
        t->refused += st[i].refused;
        t->async_allocs += st[i].async_allocs;
        t->frees += st[i].frees;
        if (st[i].bad_rc != 0) {
            t->bad++;
            printf("bad_call=%s bad_rc=%d (%s)\n", st[i].bad_call, st[i].bad_rc,
                   err_name((CUresult)st[i].bad_rc));
        }
    }
    return 0;
}

static int mode_storm(int seconds, int threads, unsigned seed) {
    if (threads < 1 || threads > STORM_MAX_THREADS)
        return 2;
    storm_seconds = seconds;
    storm_seed = seed;
    setup();
    struct storm_totals t = {0};
    int rc = run_storm_threads(threads, storm_thread, &t);
    if (rc != 0)
        return rc;
    printf("allocs=%ld\nrefused=%ld\nasync_allocs=%ld\nfrees=%ld\nbad=%d\npid=%d\nfreed=1\n", t.allocs,
           t.refused, t.async_allocs, t.frees, t.bad, (int)getpid());
    fflush(stdout);
    wait_stdin_eof();
    CHECK(cuDevicePrimaryCtxRelease(dev));
    printf("done=1\n");
    return 0;
}

/* ---- swap ---- */

static pthread_mutex_t swap_lock = PTHREAD_MUTEX_INITIALIZER;
enum { SWAP_LIVE = 256 };
static CUdeviceptr swap_live[SWAP_LIVE];
static int swap_n;

/* Takes a random live allocation out of the shared list (0: none). */
static CUdeviceptr swap_take(unsigned *seed) {
    CUdeviceptr p = 0;
    pthread_mutex_lock(&swap_lock);
    if (swap_n > 0) {
        int i = rand_r(seed) % swap_n;
        p = swap_live[i];
        swap_live[i] = swap_live[--swap_n];
    }
    pthread_mutex_unlock(&swap_lock);
    return p;
}

static void *swap_thread(void *arg) {
    struct storm_stats *st = arg;
    unsigned seed = storm_seed ^ (unsigned)(uintptr_t)arg ^ (unsigned)getpid() * 2654435761u;
    CUresult rc = cuCtxSetCurrent(ctx);
    if (rc != CUDA_SUCCESS) {
        st->bad_rc = (int)rc;
        snprintf(st->bad_call, sizeof st->bad_call, "cuCtxSetCurrent");
        return NULL;
    }
    uint64_t end = now_ms() + (uint64_t)storm_seconds * 1000u;
    while (now_ms() < end) {
        CUdeviceptr p = 0;
        if (rand_r(&seed) % 100 < 55) {
            size_t size = MIB + (size_t)(rand_r(&seed) % (63 * 256 + 1)) * 4096;
            rc = cuMemAlloc(&p, size);
            if (rc == CUDA_SUCCESS) {
                st->allocs++;
                pthread_mutex_lock(&swap_lock);
                int kept = swap_n < SWAP_LIVE;
                if (kept)
                    swap_live[swap_n++] = p;
                pthread_mutex_unlock(&swap_lock);
                if (kept)
                    continue;
            } else if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
                st->refused++;
                p = swap_take(&seed);
                if (p == 0)
                    continue;
            } else {
                st->bad_rc = (int)rc;
                snprintf(st->bad_call, sizeof st->bad_call, "cuMemAlloc_v2");
                return NULL;
            }
        } else if ((p = swap_take(&seed)) == 0) {
            continue;
        }
        rc = cuMemFree(p);
        if (rc != CUDA_SUCCESS) {
            st->bad_rc = (int)rc;
            snprintf(st->bad_call, sizeof st->bad_call, "cuMemFree_v2");
            return NULL;
        }
        st->frees++;
    }
    return NULL;
}

static int mode_swap(int seconds, int threads, unsigned seed) {
    if (threads < 1 || threads > STORM_MAX_THREADS)
        return 2;
    storm_seconds = seconds;
    storm_seed = seed;
    setup();
    /* One stream-ordered allocation first: the process has a memory pool, as a framework using
     * stream-ordered allocation does, so a refusal also settles pools before it is final. */
    CUdeviceptr first = 0;
    CHECK(cuMemAllocAsync(&first, MIB, NULL));
    CHECK(cuMemFreeAsync(first, NULL));
    CHECK(cuStreamSynchronize(NULL));
    struct storm_totals t = {0};
    int rc = run_storm_threads(threads, swap_thread, &t);
    if (rc != 0)
        return rc;
    unsigned s = seed;
    CUdeviceptr p;
    while ((p = swap_take(&s)) != 0) {
        CUresult free_rc = cuMemFree(p);
        if (free_rc != CUDA_SUCCESS) {
            t.bad++;
            printf("bad_call=final cuMemFree_v2 bad_rc=%d (%s)\n", (int)free_rc, err_name(free_rc));
        }
        t.frees++;
    }
    printf("allocs=%ld\nrefused=%ld\nasync_allocs=0\nfrees=%ld\nbad=%d\npid=%d\nfreed=1\n", t.allocs,
           t.refused, t.frees, t.bad, (int)getpid());
    fflush(stdout);
    wait_stdin_eof();
    CHECK(cuDevicePrimaryCtxRelease(dev));
    printf("done=1\n");
    return 0;
}

/* ---- hold / retry ---- */

static int mode_hold(size_t mib) {
    setup();
    CUdeviceptr p;
    CHECK(cuMemAlloc(&p, mib * MIB));
    printf("ready=1\npid=%d\n", (int)getpid());
    fflush(stdout);
    wait_stdin_eof();
    _exit(0);
}

static int mode_retry(size_t mib, uint64_t timeout_ms) {
    setup();
    CUdeviceptr p;
    CUresult rc = cuMemAlloc(&p, mib * MIB);
    printf("first=%d\n", (int)rc);
    fflush(stdout);
    if (rc == CUDA_SUCCESS)
        return 0;
    char line[64];
    if (fgets(line, sizeof line, stdin) == NULL)
        return 0;
    uint64_t t0 = now_ms(), elapsed = 0;
    long tries = 0;
    for (;;) {
        rc = cuMemAlloc(&p, mib * MIB);
        tries++;
        elapsed = now_ms() - t0;
        if (rc != CUDA_ERROR_OUT_OF_MEMORY || elapsed >= timeout_ms)
            break;
        usleep(5000);
    }
    printf("got=%d\nlast=%d\nelapsed_ms=%llu\ntries=%ld\n", rc == CUDA_SUCCESS, (int)rc,
           (unsigned long long)elapsed, tries);
    return 0;
}

/* ---- cmd ---- */

struct child {
    pid_t pid;
    int release_fd; /* closing it tells the child to exit */
    int idle;       /* a forkidle child: ended by SIGTERM */
};

static int mode_cmd(const char *self) {
    CUresult rc = cuInit(0);
    printf("init=%d\n", (int)rc);
    if (rc == CUDA_SUCCESS)
        rc = cuDeviceGet(&dev, 0);
    if (rc == CUDA_SUCCESS)
        rc = cuDevicePrimaryCtxRetain(&ctx, dev);
    printf("retain=%d\n", (int)rc);
    if (rc == CUDA_SUCCESS)
        CHECK(cuCtxSetCurrent(ctx));
    printf("pid=%d\nready=1\n", (int)getpid());
    fflush(stdout);

    enum { MAX = 256, MAX_CHILDREN = 16 };
    CUdeviceptr ptrs[MAX], async_ptrs[MAX];
    int n = 0, n_async = 0;
    struct child children[MAX_CHILDREN];
    int nchildren = 0;
    char line[256];
    while (fgets(line, sizeof line, stdin) != NULL) {
        char word[32] = "";
        unsigned long arg = 0;
        if (sscanf(line, "%31s %lu", word, &arg) < 1)
            continue;
        if (strcmp(word, "alloc") == 0) {
            CUdeviceptr p = 0;
            rc = cuMemAlloc(&p, arg * MIB);
            if (rc == CUDA_SUCCESS && n < MAX)
                ptrs[n++] = p;
            printf("alloc=%d\n", (int)rc);
        } else if (strcmp(word, "free") == 0) {
            rc = n > 0 ? cuMemFree(ptrs[--n]) : CUDA_ERROR_INVALID_VALUE;
            printf("free=%d\n", (int)rc);
        } else if (strcmp(word, "allocasync") == 0) {
            CUdeviceptr p = 0;
            rc = cuMemAllocAsync(&p, arg * MIB, NULL);
            if (rc == CUDA_SUCCESS && n_async < MAX)
                async_ptrs[n_async++] = p;
            printf("allocasync=%d\n", (int)rc);
        } else if (strcmp(word, "freeasync") == 0) {
            rc = n_async > 0 ? cuMemFreeAsync(async_ptrs[--n_async], NULL) : CUDA_ERROR_INVALID_VALUE;
            if (rc == CUDA_SUCCESS)
                rc = cuStreamSynchronize(NULL);
            printf("freeasync=%d\n", (int)rc);
        } else if (strcmp(word, "info") == 0) {
            size_t f = 0, t = 0;
            rc = cuMemGetInfo(&f, &t);
            printf("info_free=%zu\ninfo_total=%zu\ninfo=%d\n", f, t, (int)rc);
        } else if (strcmp(word, "fork") == 0 || strcmp(word, "exec") == 0) {
            int release[2], ready[2];
            if (nchildren == MAX_CHILDREN || pipe(release) != 0 || pipe(ready) != 0) {
                printf("forked=-1\n");
                fflush(stdout);
                continue;
            }
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                close(release[1]);
                close(ready[0]);
                if (word[0] == 'e') {
                    /* The exec'd program finds the ledger only through the environment. */
                    char mib[32], fd[32];
                    snprintf(mib, sizeof mib, "%lu", arg);
                    snprintf(fd, sizeof fd, "%d", release[0]);
                    dup2(ready[1], 3 + 100);
                    close(ready[1]);
                    execl(self, self, "execchild", mib, fd, "103", (char *)NULL);
                    printf("exec_error=%d\n", errno);
                    fflush(stdout);
                    _exit(127);
                }
                /* The forked child allocates on the context it inherited. */
                CUdeviceptr p = 0;
                rc = cuMemAlloc(&p, arg * MIB);
                printf("child_alloc=%d\nchild_pid=%d\n", (int)rc, (int)getpid());
                fflush(stdout);
                if (write(ready[1], "r", 1) != 1)
                    _exit(3);
                char c;
                while (read(release[0], &c, 1) > 0)
                    ;
                _exit(0);
            }
            close(release[0]);
            close(ready[1]);
            char c;
            ssize_t got = read(ready[0], &c, 1);
            close(ready[0]);
            children[nchildren].pid = pid;
            children[nchildren].release_fd = release[1];
            children[nchildren].idle = 0;
            nchildren++;
            printf("forked=%d\nchild_ready=%d\n", (int)pid, got == 1);
        } else if (strcmp(word, "forkfree") == 0) {
            /* A fork child frees the parent's last allocation (undefined for CUDA: the parent
             * still holds it), then exits. */
            if (n == 0) {
                printf("forkfree=-1\n");
                fflush(stdout);
                continue;
            }
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                printf("child_free=%d\n", (int)cuMemFree(ptrs[n - 1]));
                fflush(stdout);
                _exit(0);
            }
            int status = 0;
            waitpid(pid, &status, 0);
            printf("forkfree=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
        } else if (strcmp(word, "steal") == 0) {
            char path[200] = "";
            if (sscanf(line, "%*s %199s", path) != 1) {
                printf("steal=-1\n");
                fflush(stdout);
                continue;
            }
            for (int fd = 3; fd < 1024; fd++)
                close(fd);
            int opened = 0;
            for (int i = 0; i < 8; i++)
                if (open(path, O_RDWR | O_CREAT, 0600) >= 0)
                    opened++;
            printf("steal=%d\n", opened);
        } else if (strcmp(word, "forkidle") == 0) {
            /* A child that never touches CUDA (a data-loader worker, a shell-out helper). */
            int release[2];
            if (nchildren == MAX_CHILDREN || pipe(release) != 0) {
                printf("idle_pid=-1\n");
                fflush(stdout);
                continue;
            }
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                /* It outlives its parent, as such helpers do: only a signal ends it. */
                close(release[0]);
                close(release[1]);
                for (;;)
                    pause();
            }
            close(release[0]);
            children[nchildren].pid = pid;
            children[nchildren].release_fd = release[1];
            children[nchildren].idle = 1;
            nchildren++;
            printf("idle_pid=%d\n", (int)pid);
        } else if (strcmp(word, "reap") == 0) {
            if (nchildren == 0) {
                printf("reaped=-1\n");
            } else {
                nchildren--;
                close(children[nchildren].release_fd);
                if (children[nchildren].idle)
                    kill(children[nchildren].pid, SIGTERM);
                int status = 0;
                waitpid(children[nchildren].pid, &status, 0);
                printf("reaped=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
            }
        } else if (strcmp(word, "exit") == 0) {
            printf("bye=1\n");
            fflush(stdout);
            return 0;
        } else {
            printf("unknown=%s\n", word);
        }
        fflush(stdout);
    }
    return 0;
}

static int mode_execchild(size_t mib, int release_fd, int ready_fd) {
    setup();
    CUdeviceptr p = 0;
    CUresult rc = cuMemAlloc(&p, mib * MIB);
    printf("exec_alloc=%d\nexec_pid=%d\n", (int)rc, (int)getpid());
    fflush(stdout);
    if (write(ready_fd, "r", 1) != 1)
        return 3;
    close(ready_fd);
    char c;
    while (read(release_fd, &c, 1) > 0)
        ;
    _exit(0);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "storm") == 0 && (argc == 5 || argc == 6)) {
        if (argc == 6)
            storm_async_pct = atoi(argv[5]);
        return mode_storm(atoi(argv[2]), atoi(argv[3]), (unsigned)strtoul(argv[4], NULL, 10));
    }
    if (strcmp(mode, "swap") == 0 && argc == 5)
        return mode_swap(atoi(argv[2]), atoi(argv[3]), (unsigned)strtoul(argv[4], NULL, 10));
    if (strcmp(mode, "hold") == 0 && argc == 3)
        return mode_hold(strtoull(argv[2], NULL, 10));
    if (strcmp(mode, "retry") == 0 && argc == 4)
        return mode_retry(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10));
    if (strcmp(mode, "cmd") == 0)
        return mode_cmd(argv[0]);
    if (strcmp(mode, "execchild") == 0 && argc == 5)
        return mode_execchild(strtoull(argv[2], NULL, 10), atoi(argv[3]), atoi(argv[4]));
    fprintf(stderr, "usage: %s storm S T SEED | hold MIB | retry MIB MS | cmd\n", argv[0]);
    return 2;
}
