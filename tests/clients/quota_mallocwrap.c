/* A malloc interposer, preloaded AFTER libgpuslice.so (which exports dlsym): it finds glibc's malloc
 * and free with dlsym(RTLD_NEXT, ...), which only works if gpuslice forwards the lookup so that glibc
 * still sees this library as the caller. Built as a shared library by tests/shim_paths.rs. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>

static void *(*next_malloc)(size_t);
static void (*next_free)(void *);
static unsigned long calls;

/* Allocations made while dlsym itself runs (glibc may allocate there) come from here. */
static _Alignas(16) unsigned char early[8192];
static size_t early_used;
static int resolving;

static int is_early(const void *p) {
    return (const unsigned char *)p >= early && (const unsigned char *)p < early + sizeof early;
}

static void resolve(void) {
    if (next_malloc != NULL || resolving)
        return;
    resolving = 1;
    next_free = (void (*)(void *))dlsym(RTLD_NEXT, "free");
    next_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
    resolving = 0;
}

void *malloc(size_t n) {
    resolve();
    if (next_malloc == NULL) {
        size_t at = (early_used + 15) & ~(size_t)15;
        if (at + n > sizeof early)
            return NULL;
        early_used = at + n;
        return early + at;
    }
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    return next_malloc(n);
}

void free(void *p) {
    if (p == NULL || is_early(p))
        return;
    resolve();
    if (next_free != NULL)
        next_free(p);
}

/* For the client: what RTLD_NEXT gave, and whether this malloc is the one in use. */
void *mallocwrap_next_malloc(void) {
    resolve();
    return (void *)next_malloc;
}

unsigned long mallocwrap_calls(void) {
    return calls;
}
