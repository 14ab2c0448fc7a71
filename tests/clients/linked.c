/* A CUDA program as nvcc-built applications are: linked with -lcuda, calling the driver directly
 * (the header's macros pick the versioned exports, e.g. cuMemAlloc -> cuMemAlloc_v2).
 * Build: cc -I<cuda include> linked.c -L<driver dir> -lcuda. Modes: see client.h. */
#include <cuda.h>

#include "client.h"

#define API_BIND(f, s) A.p_##f = &f;
static void bind_all(void) { API_LIST(API_BIND) }
