/* A stand-in for an interposer that does nothing but call the real cuMemAlloc_v2/cuMemFree_v2, with
 * the real call made from DEPTH nested frames (0: a tail call, no frame of its own). Built four times
 * by scripts/bench/frames; the bench client's alloc/free pair measures what each depth adds, with no
 * accounting at all. Built once more with EXACT: the same frame around a minimal exact accounting.
 * See docs/BENCHMARKS.md, "Frames around the driver call". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

typedef int (*alloc_fn)(unsigned long long *, size_t);
typedef int (*free_fn)(unsigned long long);
static alloc_fn real_alloc;
static free_fn real_free;

__attribute__((constructor)) static void resolve(void) {
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    real_alloc = (alloc_fn)dlsym(driver, "cuMemAlloc_v2");
    real_free = (free_fn)dlsym(driver, "cuMemFree_v2");
}

#define NOINLINE __attribute__((noinline, unused))
/* An empty asm after the call keeps it from being a tail call: the frame stays until the driver returns. */
#define KEEP_FRAME __asm__ volatile("" ::: "memory")

NOINLINE static int alloc1(unsigned long long *p, size_t n) { int r = real_alloc(p, n); KEEP_FRAME; return r; }
NOINLINE static int free1(unsigned long long p) { int r = real_free(p); KEEP_FRAME; return r; }
NOINLINE static int alloc2(unsigned long long *p, size_t n) { int r = alloc1(p, n); KEEP_FRAME; return r; }
NOINLINE static int free2(unsigned long long p) { int r = free1(p); KEEP_FRAME; return r; }

#ifdef EXACT
/* The least an exact quota interposer does around one frame: a per-thread re-entrancy token, a
 * check-and-add on a shared device count against its limit, this process's own count (for a killed
 * process's reclaim), and a record of pointer -> size that any thread's free finds (lock-free open
 * addressing); the reverse on free, once the driver freed. No configuration, no damage checks, no
 * logging, a fixed-size record (the bench keeps one allocation live): a floor for what accounting
 * costs here, not an implementation. The shared counts live in the file named by FRAMES_SHARED. */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
struct shared { _Alignas(64) uint64_t used; _Alignas(64) uint64_t limit; _Alignas(64) uint64_t slot; };
static struct shared *shared;
#define RECORDS 4096
static struct { uint64_t key, bytes; } records[RECORDS];
static __thread int in_hook;

__attribute__((constructor)) static void map_shared(void) {
    int fd = open(getenv("FRAMES_SHARED"), O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, sizeof *shared) != 0) abort();
    shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (shared == MAP_FAILED) abort();
    shared->limit = 1ull << 30;
}
static unsigned home(uint64_t key) { return (unsigned)((key * 0x9E3779B97F4A7C15ull) >> 52) & (RECORDS - 1); }

int cuMemAlloc_v2(unsigned long long *p, size_t n) {
    if (in_hook) return real_alloc(p, n);
    in_hook = 1;
    uint64_t used = __atomic_load_n(&shared->used, __ATOMIC_ACQUIRE);
    do {
        if (used + n > __atomic_load_n(&shared->limit, __ATOMIC_ACQUIRE)) { in_hook = 0; return 2; }
    } while (!__atomic_compare_exchange_n(&shared->used, &used, used + n, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    __atomic_fetch_add(&shared->slot, n, __ATOMIC_ACQ_REL);
    int r = real_alloc(p, n);
    if (r == 0) {
        for (unsigned i = home(*p);; i = (i + 1) & (RECORDS - 1)) {
            uint64_t empty = 0;
            if (__atomic_compare_exchange_n(&records[i].key, &empty, *p, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
                records[i].bytes = n;
                break;
            }
        }
    } else {
        __atomic_fetch_sub(&shared->slot, n, __ATOMIC_ACQ_REL);
        __atomic_fetch_sub(&shared->used, n, __ATOMIC_ACQ_REL);
    }
    in_hook = 0;
    return r;
}
int cuMemFree_v2(unsigned long long p) {
    if (in_hook) return real_free(p);
    in_hook = 1;
    uint64_t n = 0;
    for (unsigned i = home(p); records[i].key != 0; i = (i + 1) & (RECORDS - 1)) {
        uint64_t key = p;
        if (records[i].key == p) {
            n = records[i].bytes;
            if (!__atomic_compare_exchange_n(&records[i].key, &key, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) n = 0;
            break;
        }
    }
    int r = real_free(p);
    if (r == 0 && n != 0) {
        __atomic_fetch_sub(&shared->slot, n, __ATOMIC_ACQ_REL);
        __atomic_fetch_sub(&shared->used, n, __ATOMIC_ACQ_REL);
    }
    in_hook = 0;
    return r;
}
#elif DEPTH == 0
int cuMemAlloc_v2(unsigned long long *p, size_t n) { return real_alloc(p, n); }
int cuMemFree_v2(unsigned long long p) { return real_free(p); }
#elif DEPTH == 1
int cuMemAlloc_v2(unsigned long long *p, size_t n) { int r = real_alloc(p, n); KEEP_FRAME; return r; }
int cuMemFree_v2(unsigned long long p) { int r = real_free(p); KEEP_FRAME; return r; }
#elif DEPTH == 2
int cuMemAlloc_v2(unsigned long long *p, size_t n) { int r = alloc1(p, n); KEEP_FRAME; return r; }
int cuMemFree_v2(unsigned long long p) { int r = free1(p); KEEP_FRAME; return r; }
#else
int cuMemAlloc_v2(unsigned long long *p, size_t n) { int r = alloc2(p, n); KEEP_FRAME; return r; }
int cuMemFree_v2(unsigned long long p) { int r = free2(p); KEEP_FRAME; return r; }
#endif
