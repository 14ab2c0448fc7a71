/* Shared by the clients that load modules (memory_lazy.c, pod_memory.c, quota_overhead.c): a PTX
 * image of a chosen size, whose kernel `touch` has a chosen local frame. */
#ifndef GPUSLICE_TEST_PTX_H
#define GPUSLICE_TEST_PTX_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A PTX image of `bytes` (at least its text; padded with a comment) whose kernel `touch` has a
 * local frame of `local` bytes per thread (none: 0). NUL-terminated, as the driver API requires. */
static inline char *ptx_image(size_t bytes, unsigned long long local) {
    char head[512];
    if (local)
        snprintf(head, sizeof head,
                 ".version 7.0\n.target sm_80\n.address_size 64\n"
                 ".visible .entry touch(.param .u64 p)\n{\n.local .align 8 .b8 __local_depot0[%llu];\nret;\n}\n//",
                 local);
    else
        snprintf(head, sizeof head, ".version 7.0\n.target sm_80\n.address_size 64\n"
                                    ".visible .entry touch(.param .u64 p)\n{ ret; }\n//");
    size_t n = bytes < strlen(head) + 2 ? strlen(head) + 2 : bytes;
    char *s = malloc(n + 1);
    if (!s) exit(1);
    memset(s, 'x', n);
    memcpy(s, head, strlen(head));
    s[n - 1] = '\n';
    s[n] = 0;
    return s;
}
#endif
