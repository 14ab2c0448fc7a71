/* The graph memory pool's cache (tests/graph_pool_cache.rs): an unmodified CUDA program linked with
 * -lcuda that never asks cuMemGetInfo (what is judged is what graph launches and trims were charged,
 * not what reconciliation found later). Freed graph memory stays cached in the device's graph memory
 * pool until cuDeviceGraphMemTrim ("Free unused memory that was cached on the specified device for
 * use with graphs back to the OS"). Prints key=value lines and waits for a line of stdin at each
 * point the test looks at the counters.
 *
 * Usage: graph_pool GRAPH_MIB BIG_MIB
 *   a graph allocating GRAPH_MIB and freeing it itself, launched and synchronised: pid=, launched=1,
 *   wait; cuMemAlloc(BIG_MIB) (big_cached=rc): wait; cuDeviceGraphMemTrim (trim=rc): trimmed=1, wait;
 *   cuMemAlloc(BIG_MIB) again (big_trimmed=rc), freed; the graph launched and synchronised twice
 *   (relaunch=rc): relaunched=1, wait; trimmed again (trim2=rc): done=1, wait; a second graph
 *   allocating GRAPH_MIB/2 without freeing it, launched and synchronised, its allocation then freed
 *   with cuMemFree (free_outside=rc): freed_outside=1, wait; trimmed (trim3=rc): trimmed3=1, wait.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "graph_client.h"

static void wait_line(void) {
    char line[64];
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) exit(0);
}

int main(int argc, char **argv) {
    size_t bytes, big;
    CUdevice dev = graph_client_start(argc, argv, "graph_pool GRAPH_MIB BIG_MIB", &bytes, &big);
    CUdeviceptr p, b;
    CUgraph graph;
    CUgraphExec exec;
    CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuMemAllocAsync(&p, bytes, stream));
    CHECK(cuMemFreeAsync(p, stream));
    CHECK(cuStreamEndCapture(stream, &graph));
    CHECK(cuGraphInstantiate(&exec, graph, 0));

    CHECK(cuGraphLaunch(exec, stream));
    CHECK(cuStreamSynchronize(stream));
    printf("pid=%d\nlaunched=1\n", (int)getpid());
    wait_line();
    CUresult r = cuMemAlloc(&b, big);
    printf("big_cached=%d\n", (int)r);
    if (r == CUDA_SUCCESS)
        CHECK(cuMemFree(b));
    wait_line();
    printf("trim=%d\n", (int)cuDeviceGraphMemTrim(dev));
    printf("trimmed=1\n");
    wait_line();
    r = cuMemAlloc(&b, big);
    printf("big_trimmed=%d\n", (int)r);
    if (r == CUDA_SUCCESS)
        CHECK(cuMemFree(b));
    r = cuGraphLaunch(exec, stream);
    CHECK(cuStreamSynchronize(stream));
    if (r == CUDA_SUCCESS)
        r = cuGraphLaunch(exec, stream);
    CHECK(cuStreamSynchronize(stream));
    printf("relaunch=%d\nrelaunched=1\n", (int)r);
    wait_line();
    printf("trim2=%d\ndone=1\n", (int)cuDeviceGraphMemTrim(dev));
    wait_line();
    CUdeviceptr q;
    CUgraph kept;
    CUgraphExec kept_exec;
    CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuMemAllocAsync(&q, bytes / 2, stream));
    CHECK(cuStreamEndCapture(stream, &kept));
    CHECK(cuGraphInstantiate(&kept_exec, kept, 0));
    CHECK(cuGraphLaunch(kept_exec, stream));
    CHECK(cuStreamSynchronize(stream));
    /* Freed outside any graph: into the pool's cache, with no synchronisation, launch or trim after. */
    printf("free_outside=%d\nfreed_outside=1\n", (int)cuMemFree(q));
    wait_line();
    printf("trim3=%d\ntrimmed3=1\n", (int)cuDeviceGraphMemTrim(dev));
    wait_line();
    return 0;
}
