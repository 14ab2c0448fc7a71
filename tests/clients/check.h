/* CHECK(call): a driver call that must succeed. On failure the client prints `error=<call> rc=<code>
 * line=<n>` (the key=value form the Rust tests read) and exits 1. Shared by the clients that call the
 * driver directly (linked with -lcuda). */
#ifndef GPUSLICE_TEST_CHECK_H
#define GPUSLICE_TEST_CHECK_H
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                         \
    do {                                                                                    \
        CUresult rc_ = (call);                                                              \
        if (rc_ != CUDA_SUCCESS) {                                                          \
            printf("error=%s rc=%d line=%d\n", #call, (int)rc_, __LINE__);                  \
            fflush(stdout);                                                                 \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

#endif
