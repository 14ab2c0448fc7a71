/* dlsym/dlvsym lookups that gpuslice's interposer must leave exactly as glibc answers them. Prints each
 * answer as OBJECT!SYMBOL+OFFSET (dladdr; `null` for NULL), comparable between processes whatever the
 * address layout. Built with -rdynamic by tests/shim_paths.rs (its own symbols are then in the dynamic
 * symbol table). Modes:
 *   lookups   non-driver names through RTLD_DEFAULT, RTLD_NEXT and a handle, the malloc wrapper
 *             (quota_mallocwrap.c, preloaded), dlvsym of driver and libc names
 *   nolib     dlopen("libcuda.so.1") where there is none: report and exit 0 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void describe(const char *key, void *p) {
    Dl_info info;
    if (p == NULL) {
        printf("%s=null\n", key);
        return;
    }
    if (dladdr(p, &info) == 0 || info.dli_fname == NULL) {
        printf("%s=unknown\n", key);
        return;
    }
    const char *slash = strrchr(info.dli_fname, '/');
    const char *obj = slash ? slash + 1 : info.dli_fname;
    if (*obj == 0)
        obj = "main-program";
    if (info.dli_sname != NULL)
        printf("%s=%s!%s+%ld\n", key, obj, info.dli_sname, (long)((char *)p - (char *)info.dli_saddr));
    else
        printf("%s=%s!?+%ld\n", key, obj, (long)((char *)p - (char *)info.dli_fbase));
}

/* Looked up by name through RTLD_DEFAULT: must be found here. */
__attribute__((noinline, used)) int quota_hygiene_own_symbol(int x) {
    return x + 1;
}
/* A name the interposer's "cu" prefix test sees, but no library defines. */
__attribute__((noinline, used)) int cuquota_hygiene_own(int x) {
    return x + 2;
}

static void lookup_error(const char *key, void *handle, const char *name) {
    dlerror();
    void *p = dlsym(handle, name);
    const char *e = dlerror();
    describe(key, p);
    printf("%s.dlerror=%s\n", key, e != NULL ? "set" : "clear");
}

static int mode_lookups(void) {
    describe("puts.default", dlsym(RTLD_DEFAULT, "puts"));
    describe("puts.next", dlsym(RTLD_NEXT, "puts"));
    describe("malloc.default", dlsym(RTLD_DEFAULT, "malloc"));
    describe("malloc.next", dlsym(RTLD_NEXT, "malloc"));
    describe("own.default", dlsym(RTLD_DEFAULT, "quota_hygiene_own_symbol"));
    describe("own_cu.default", dlsym(RTLD_DEFAULT, "cuquota_hygiene_own"));
    lookup_error("missing.default", RTLD_DEFAULT, "quota_hygiene_no_such_symbol");
    lookup_error("missing_cu.default", RTLD_DEFAULT, "cuNoSuchFunction");
    lookup_error("missing_nvml.default", RTLD_DEFAULT, "nvmlNoSuchFunction");
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    describe("puts.libc_handle", libc ? dlsym(libc, "puts") : NULL);
    describe("dlvsym.puts", dlvsym(RTLD_DEFAULT, "puts", "GLIBC_2.2.5"));
    describe("dlvsym.puts_bad_version", dlvsym(RTLD_DEFAULT, "puts", "GLIBC_999"));

    void *(*next_malloc)(void) = (void *(*)(void))dlsym(RTLD_DEFAULT, "mallocwrap_next_malloc");
    unsigned long (*calls)(void) = (unsigned long (*)(void))dlsym(RTLD_DEFAULT, "mallocwrap_calls");
    describe("mallocwrap.next_malloc", next_malloc ? next_malloc() : NULL);
    void *volatile keep = malloc(100); /* volatile: the call must happen */
    printf("mallocwrap.used=%d\n", calls != NULL && calls() > 0);
    free(keep);

    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    printf("libcuda.loaded=%d\n", cuda != NULL);
    if (cuda != NULL) {
        describe("cuda.dlsym.cuMemAlloc_v2", dlsym(cuda, "cuMemAlloc_v2"));
        describe("cuda.dlsym.cuInit", dlsym(cuda, "cuInit"));
        describe("cuda.dlvsym.cuMemAlloc_v2", dlvsym(cuda, "cuMemAlloc_v2", "libcuda.so.1"));
        describe("cuda.dlvsym.cuInit", dlvsym(cuda, "cuInit", "libcuda.so.1"));
        describe("cuda.dlsym.puts", dlsym(cuda, "puts"));
        lookup_error("cuda.dlsym.missing", cuda, "cuNoSuchFunction");
    }
    printf("done=1\n");
    return 0;
}

static int mode_nolib(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    printf("libcuda.loaded=%d\n", cuda != NULL);
    printf("done=1\n");
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argc > 1 ? argv[1] : "lookups";
    if (strcmp(mode, "lookups") == 0)
        return mode_lookups();
    if (strcmp(mode, "nolib") == 0)
        return mode_nolib();
    fprintf(stderr, "usage: %s lookups|nolib\n", argv[0]);
    return 2;
}
