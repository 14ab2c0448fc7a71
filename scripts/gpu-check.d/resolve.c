/* How every hooked name resolves, three ways (scripts/gpu-check, probe `resolution`):
 *   linked  the program's own reference (linked against libcuda.so.1 / libnvidia-ml.so.1; weak, so
 *           a name the driver lacks is NULL rather than a load failure)
 *   dlsym   dlsym on a dlopen("libcuda.so.1") / dlopen("libnvidia-ml.so.1") handle
 *   gpa     cuGetProcAddress_v2(base, CUDA version, flags) as the CUDA 12 and 13 runtimes call it
 * One line per lookup: `WAY NAME VERSION FLAGS | RC SYMBOL OWNER` where SYMBOL is the exported symbol
 * the pointer belongs to (dladdr; `null` for NULL) and OWNER `gpuslice` when its object exports
 * gpuslice_dlsym_hook, else `driver` (`-` for NULL). The names come from hooked.h, generated from
 * the tables in src/api when the check is packed. probes.py compares a run under gpuslice with one without. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#define CUDA_NAME(sym, base, version) extern void sym(void) __attribute__((weak));
#define NVML_NAME(sym) extern void sym(void) __attribute__((weak));
#include "hooked.h"
#undef CUDA_NAME
#undef NVML_NAME

static void describe(void *p, char *out, size_t len) {
    Dl_info info;
    if (p == NULL) {
        snprintf(out, len, "null -");
        return;
    }
    if (dladdr(p, &info) == 0 || info.dli_sname == NULL) {
        snprintf(out, len, "unknown -");
        return;
    }
    void *h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    const char *owner = h != NULL && dlsym(h, "gpuslice_dlsym_hook") != NULL ? "gpuslice" : "driver";
    if (info.dli_saddr == p)
        snprintf(out, len, "%s %s", info.dli_sname, owner);
    else
        snprintf(out, len, "%s+%ld %s", info.dli_sname, (long)((char *)p - (char *)info.dli_saddr), owner);
}

static void line(const char *way, const char *name, int version, int flags, int rc, void *p) {
    char d[400];
    describe(p, d, sizeof d);
    printf("%s %s %d %d | %d %s\n", way, name, version, flags, rc, d);
}

int main(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (cuda == NULL) {
        printf("error=dlopen libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(cuda, "cuInit");
    int (*gpa)(const char *, void **, int, unsigned long long, int *) =
        (int (*)(const char *, void **, int, unsigned long long, int *))dlsym(cuda, "cuGetProcAddress_v2");
    int (*get_version)(int *) = (int (*)(int *))dlsym(cuda, "cuDriverGetVersion");
    printf("init=%d\n", init ? init(0) : -1);
    int v = -1;
    printf("version_rc=%d\n", get_version ? get_version(&v) : -1);
    printf("version=%d\n", v);
    static const int versions[] = {12000, 12080, 13000};
    static const int flagsets[] = {0, 2};
#define CUDA_NAME(sym, base, version)                                          \
    line("linked", #sym, 0, 0, 0, (void *)&sym);                               \
    line("dlsym", #sym, 0, 0, 0, dlsym(cuda, #sym));                           \
    for (unsigned i = 0; gpa != NULL && i < 3; i++)                            \
        for (unsigned j = 0; j < 2; j++) {                                     \
            void *p = NULL;                                                    \
            int status = -1;                                                   \
            int rc = gpa(#base, &p, versions[i], flagsets[j], &status);        \
            line("gpa", #base, versions[i], flagsets[j], rc, rc == 0 ? p : NULL); \
        }
#define NVML_NAME(sym)                                                         \
    line("linked", #sym, 0, 0, 0, (void *)&sym);                               \
    line("dlsym", #sym, 0, 0, 0, nvml ? dlsym(nvml, #sym) : NULL);
#include "hooked.h"
    printf("done=1\n");
    return 0;
}
