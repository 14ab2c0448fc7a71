/* A CUDA program as the Rust `cudarc` crate and numba are: no link-time dependency on the driver,
 * dlopen("libcuda.so.1") and dlsym of every function by its versioned export name (the second
 * column of API_LIST in client.h). Build: cc -I<cuda include> dlopen.c -ldl. Modes: see client.h. */
#include <cuda.h>
#include <dlfcn.h>

#include "client.h"

static void bind_all(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        printf("error=dlopen %s\n", dlerror());
        exit(1);
    }
#define API_DLSYM(f, s)                                  \
    A.p_##f = (__typeof__(A.p_##f))dlsym(h, s);          \
    if (A.p_##f == NULL) {                               \
        printf("error=dlsym %s\n", s);                   \
        exit(1);                                         \
    }
    API_LIST(API_DLSYM)
}
