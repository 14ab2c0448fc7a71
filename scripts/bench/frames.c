/* A stand-in for an interposer that does nothing but call the real cuMemAlloc_v2/cuMemFree_v2, with
 * the real call made from DEPTH nested frames (0: a tail call, no frame of its own). Built four times
 * by scripts/bench/frames; the bench client's alloc/free pair measures what each depth adds, with no
 * accounting at all. See docs/BENCHMARKS.md, "Frames around the driver call". */
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

#if DEPTH == 0
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
