/* cuGetProcAddress client: loads the libcuda.so.1 found on LD_LIBRARY_PATH (NVIDIA's real driver,
 * simgpu, or gpuslice's drop-in; maybe with libgpuslice.so preloaded) and answers, for each stdin line
 * `name<TAB>version<TAB>flags`, one line
 *   name version flags | v1 RC SYM | v2 RC STATUS SYM
 * where v1 is cuGetProcAddress (CUDA 11.3 ABI, no status) and v2 is cuGetProcAddress_v2 (CUDA 12).
 * SYM is the exported symbol the returned pointer belongs to (dladdr), `null` for a NULL pointer,
 * `untouched` if the output was not written; STATUS likewise is `untouched` if not written. Symbol
 * names, not addresses, are what the tests compare.
 *
 * Arguments (optional, any order):
 *   owners  after each SYM, OWNER: `gpuslice` when the object holding it exports gpuslice_dlsym_hook,
 *           `driver` otherwise (`-` for no pointer)
 *   init    first print init=RC, version_rc=RC, version=V (cuInit, cuDriverGetVersion); last, done=1 */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char sentinel_target;
#define SENTINEL ((void *)&sentinel_target)

static int owners;

static void describe(void *p, char *out, size_t len) {
    Dl_info info;
    if (p == SENTINEL || p == NULL) {
        snprintf(out, len, "%s%s", p == NULL ? "null" : "untouched", owners ? " -" : "");
        return;
    }
    if (dladdr(p, &info) == 0 || info.dli_sname == NULL) {
        snprintf(out, len, "unknown%s", owners ? " -" : "");
        return;
    }
    const char *owner = "";
    if (owners) {
        void *h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
        owner = h != NULL && dlsym(h, "gpuslice_dlsym_hook") != NULL ? " gpuslice" : " driver";
        if (h != NULL)
            dlclose(h);
    }
    if (info.dli_saddr == p)
        snprintf(out, len, "%s%s", info.dli_sname, owner);
    else
        snprintf(out, len, "%s+%ld%s", info.dli_sname, (long)((char *)p - (char *)info.dli_saddr), owner);
}

int main(int argc, char **argv) {
    int init_lines = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "owners") == 0)
            owners = 1;
        else if (strcmp(argv[i], "init") == 0)
            init_lines = 1;
        else {
            printf("error=unknown argument %s (expected owners, init)\n", argv[i]);
            return 2;
        }
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        printf("error=dlopen %s\n", dlerror());
        return 1;
    }
    PFN_cuGetProcAddress_v11030 v1 = (PFN_cuGetProcAddress_v11030)dlsym(h, "cuGetProcAddress");
    PFN_cuGetProcAddress_v12000 v2 = (PFN_cuGetProcAddress_v12000)dlsym(h, "cuGetProcAddress_v2");
    if (v1 == NULL || v2 == NULL) {
        printf("error=dlsym cuGetProcAddress v1=%p v2=%p\n", (void *)v1, (void *)v2);
        return 1;
    }
    if (init_lines) {
        PFN_cuInit_v2000 init = (PFN_cuInit_v2000)dlsym(h, "cuInit");
        PFN_cuDriverGetVersion_v2020 get_version = (PFN_cuDriverGetVersion_v2020)dlsym(h, "cuDriverGetVersion");
        if (init == NULL || get_version == NULL) {
            printf("error=dlsym cuInit=%p cuDriverGetVersion=%p\n", (void *)init, (void *)get_version);
            return 1;
        }
        printf("init=%d\n", (int)init(0));
        int driver_version = -1;
        int rc = (int)get_version(&driver_version);
        printf("version_rc=%d\nversion=%d\n", rc, driver_version);
    }
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
        int version = atoi(tab1 + 1);
        unsigned long long flags = strtoull(tab2 + 1, NULL, 10);
        char s1[300], s2[300], status_text[32];
        void *p1 = SENTINEL;
        CUresult rc1 = v1(line, &p1, version, flags);
        describe(p1, s1, sizeof s1);
        void *p2 = SENTINEL;
        int status = -12345;
        CUresult rc2 = v2(line, &p2, version, flags, (CUdriverProcAddressQueryResult *)&status);
        describe(p2, s2, sizeof s2);
        if (status == -12345)
            snprintf(status_text, sizeof status_text, "untouched");
        else
            snprintf(status_text, sizeof status_text, "%d", status);
        printf("%s %d %llu | v1 %d %s | v2 %d %s %s\n", line, version, flags, (int)rc1, s1, (int)rc2,
               status_text, s2);
    }
    if (init_lines)
        printf("done=1\n");
    return 0;
}
