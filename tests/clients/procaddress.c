/* cuGetProcAddress oracle client: loads the libcuda.so.1 found on LD_LIBRARY_PATH (NVIDIA's real
 * driver or simgpu) and answers, for each stdin line `name<TAB>version<TAB>flags`, one line
 *   name version flags | v1 RC SYM | v2 RC STATUS SYM
 * where v1 is cuGetProcAddress (CUDA 11.3 ABI, no status) and v2 is cuGetProcAddress_v2 (CUDA 12).
 * SYM is the exported symbol the returned pointer belongs to (dladdr), `null` for a NULL pointer,
 * `untouched` if the output was not written; STATUS likewise is `untouched` if not written.
 * Symbol names, not addresses, are what the Rust test compares between the two drivers. */
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
    if (p == SENTINEL)
        snprintf(out, len, "untouched");
    else if (p == NULL)
        snprintf(out, len, "null");
    else if (dladdr(p, &info) != 0 && info.dli_sname != NULL && info.dli_saddr == p)
        snprintf(out, len, "%s", info.dli_sname);
    else if (dladdr(p, &info) != 0 && info.dli_sname != NULL)
        snprintf(out, len, "%s+%ld", info.dli_sname, (long)((char *)p - (char *)info.dli_saddr));
    else
        snprintf(out, len, "unknown");
}

int main(void) {
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
        cuuint64_t flags = strtoull(tab2 + 1, NULL, 10);
        char s1[256], s2[256], status_text[32];

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

        printf("%s %d %llu | v1 %d %s | v2 %d %s %s\n", line, version, (unsigned long long)flags,
               (int)rc1, s1, (int)rc2, status_text, s2);
    }
    return 0;
}
