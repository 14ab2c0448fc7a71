/* Which library answers: loads the libcuda.so.1 found on LD_LIBRARY_PATH (NVIDIA's real driver,
 * simgpu, or gpuslice's drop-in; maybe with libgpuslice.so preloaded), prints
 *   init=RC  version_rc=RC  version=V
 * then, for each stdin line `name<TAB>version<TAB>flags`, one line
 *   name version flags | v1 RC SYM OWNER | v2 RC STATUS SYM OWNER
 * where SYM is the exported symbol the returned pointer belongs to (dladdr) and OWNER is `gpuslice`
 * when that object exports gpuslice_dlsym_hook, `driver` otherwise (`-` for no pointer). */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char sentinel_target;
#define SENTINEL ((void *)&sentinel_target)

static void describe(void *p, char *out, size_t len) {
    Dl_info info;
    if (p == SENTINEL) {
        snprintf(out, len, "untouched -");
    } else if (p == NULL) {
        snprintf(out, len, "null -");
    } else if (dladdr(p, &info) != 0 && info.dli_sname != NULL) {
        void *h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
        int ours = h != NULL && dlsym(h, "gpuslice_dlsym_hook") != NULL;
        if (h != NULL) dlclose(h);
        if (info.dli_saddr == p)
            snprintf(out, len, "%s %s", info.dli_sname, ours ? "gpuslice" : "driver");
        else
            snprintf(out, len, "%s+%ld %s", info.dli_sname, (long)((char *)p - (char *)info.dli_saddr),
                     ours ? "gpuslice" : "driver");
    } else {
        snprintf(out, len, "unknown -");
    }
}

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        printf("error=dlopen %s\n", dlerror());
        return 1;
    }
    PFN_cuInit_v2000 init = (PFN_cuInit_v2000)dlsym(h, "cuInit");
    PFN_cuDriverGetVersion_v2020 get_version = (PFN_cuDriverGetVersion_v2020)dlsym(h, "cuDriverGetVersion");
    PFN_cuGetProcAddress_v11030 v1 = (PFN_cuGetProcAddress_v11030)dlsym(h, "cuGetProcAddress");
    PFN_cuGetProcAddress_v12000 v2 = (PFN_cuGetProcAddress_v12000)dlsym(h, "cuGetProcAddress_v2");
    if (init == NULL || get_version == NULL || v1 == NULL || v2 == NULL) {
        printf("error=dlsym\n");
        return 1;
    }
    printf("init=%d\n", (int)init(0));
    int version = -1;
    int rc = (int)get_version(&version);
    printf("version_rc=%d\nversion=%d\n", rc, version);
    char line[1024];
    while (fgets(line, sizeof line, stdin) != NULL) {
        line[strcspn(line, "\n")] = 0;
        char *tab1 = strchr(line, '\t');
        char *tab2 = tab1 ? strchr(tab1 + 1, '\t') : NULL;
        if (tab2 == NULL) {
            printf("error=bad input line %s\n", line);
            return 1;
        }
        *tab1 = 0;
        int cuda_version = atoi(tab1 + 1);
        cuuint64_t flags = strtoull(tab2 + 1, NULL, 10);
        char s1[300], s2[300], status_text[32];
        void *p1 = SENTINEL;
        CUresult rc1 = v1(line, &p1, cuda_version, flags);
        describe(p1, s1, sizeof s1);
        void *p2 = SENTINEL;
        int status = -12345;
        CUresult rc2 = v2(line, &p2, cuda_version, flags, (CUdriverProcAddressQueryResult *)&status);
        describe(p2, s2, sizeof s2);
        if (status == -12345)
            snprintf(status_text, sizeof status_text, "untouched");
        else
            snprintf(status_text, sizeof status_text, "%d", status);
        printf("%s %d %llu | v1 %d %s | v2 %d %s %s\n", line, cuda_version, (unsigned long long)flags,
               (int)rc1, s1, (int)rc2, status_text, s2);
    }
    printf("done=1\n");
    return 0;
}
