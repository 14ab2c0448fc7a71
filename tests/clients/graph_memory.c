/* Graph memory near the quota (tests/graph_memory_quota.rs): an unmodified CUDA program linked with
 * -lcuda. Allocations captured from cuMemAllocAsync into graphs (CU_STREAM_CAPTURE_MODE_GLOBAL) get
 * their memory when the graph is launched (CUDA Programming Guide, "Graph Memory Nodes"). Prints one
 * key=value line per step (the CUresult of the step, 0 = success); a step that is not the subject of
 * the test stops the program (CHECK).
 *
 * Usage: graph_memory BIG_MIB GRAPH_MIB
 *   held graph:      capture cuMemAllocAsync(GRAPH_MIB) (not freed in the graph); launch it beside a
 *                    BIG_MIB cuMemAlloc, then alone; a BIG_MIB allocation while the graph's memory is
 *                    held; cuMemFreeAsync of the graph's allocation; BIG_MIB while the device's
 *                    graph memory pool caches it; cuDeviceGraphMemTrim; BIG_MIB again (a trim
 *                    also comes before each later "after" step).
 *   transient graph: capture cuMemAllocAsync(GRAPH_MIB) + cuMemFreeAsync of it (freed in the graph);
 *                    launch it beside BIG_MIB, then alone; BIG_MIB after it.
 *   freed in a capture: a graph holding its GRAPH_MIB allocation, launched; a graph freeing it,
 *                    launched into a stream being captured (recorded, not run); BIG_MIB then; the
 *                    freeing graph launched for real; BIG_MIB again.
 *   two at once:     two such graphs with a 3 s kernel (simgpu's `spin`) between the allocation and
 *                    its free, launched on two streams; then the second alone once both ran.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

#include "graph_client.h"

static CUfunction spin;
static unsigned long long spin_us = 3000000;

static CUgraphExec capture(size_t bytes, int free_in_graph, const char *name, CUdeviceptr *out) {
    CUdeviceptr p = 0;
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    CUresult r = cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
    if (r == CUDA_SUCCESS)
        r = cuMemAllocAsync(&p, bytes, stream);
    if (r == CUDA_SUCCESS && free_in_graph == 2) {
        void *params[] = {&spin_us};
        r = cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL);
    }
    if (r == CUDA_SUCCESS && free_in_graph)
        r = cuMemFreeAsync(p, stream);
    CUresult e = cuStreamEndCapture(stream, &graph);
    printf("%s_capture=%d\n%s_end=%d\n", name, (int)r, name, (int)e);
    CHECK(r);
    CHECK(e);
    CHECK(cuGraphInstantiate(&exec, graph, 0));
    *out = p;
    return exec;
}

int main(int argc, char **argv) {
    size_t big, graph;
    CUdevice dev = graph_client_start(argc, argv, "graph_memory BIG_MIB GRAPH_MIB", &big, &graph);
    CUdeviceptr a, b;

    /* Held: the graph's allocation outlives its launch. */
    CUdeviceptr g;
    CUgraphExec held = capture(graph, 0, "held", &g);
    CHECK(cuMemAlloc(&a, big));
    if (step("held_launch_beside_big", cuGraphLaunch(held, stream)) == CUDA_SUCCESS) {
        /* (Where it fits.) Freed before the graph is launched again, as the driver requires. */
        CHECK(cuMemFreeAsync(g, stream));
        CHECK(cuStreamSynchronize(stream));
    }
    CHECK(cuMemFree(a));
    if (step("held_launch_alone", cuGraphLaunch(held, stream)) == CUDA_SUCCESS)
        CHECK(cuStreamSynchronize(stream));
    if (step("big_while_held", cuMemAlloc(&b, big)) == CUDA_SUCCESS)
        CHECK(cuMemFree(b));
    /* Its address is the one the capture returned; freeing it returns the memory. */
    step("held_free", cuMemFreeAsync(g, stream));
    CHECK(cuStreamSynchronize(stream));
    /* Freed graph memory stays cached in the device's graph memory pool until trimmed. */
    if (step("big_before_trim", cuMemAlloc(&b, big)) == CUDA_SUCCESS)
        CHECK(cuMemFree(b));
    step("trim", cuDeviceGraphMemTrim(dev));
    if (step("big_after_held_free", cuMemAlloc(&b, big)) == CUDA_SUCCESS)
        CHECK(cuMemFree(b));

    /* Transient: the graph frees its allocation itself. */
    CUdeviceptr t;
    CUgraphExec transient = capture(graph, 1, "transient", &t);
    CHECK(cuMemAlloc(&a, big));
    if (step("transient_launch_beside_big", cuGraphLaunch(transient, stream)) == CUDA_SUCCESS)
        CHECK(cuStreamSynchronize(stream));
    CHECK(cuMemFree(a));
    if (step("transient_launch_alone", cuGraphLaunch(transient, stream)) == CUDA_SUCCESS)
        CHECK(cuStreamSynchronize(stream));
    CHECK(cuDeviceGraphMemTrim(dev));
    if (step("big_after_transient", cuMemAlloc(&b, big)) == CUDA_SUCCESS)
        CHECK(cuMemFree(b));

    /* Freed in a capture: recorded into the captured graph, the free does not run now. */
    CUdeviceptr k;
    CUgraphExec keeper = capture(graph, 0, "keeper", &k);
    step("keeper_launch", cuGraphLaunch(keeper, stream));
    CHECK(cuStreamSynchronize(stream));
    CUgraph fg, cg;
    CUgraphExec freer;
    CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuMemFreeAsync(k, stream));
    CHECK(cuStreamEndCapture(stream, &fg));
    CHECK(cuGraphInstantiate(&freer, fg, 0));
    CUstream capturing;
    CHECK(cuStreamCreate(&capturing, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamBeginCapture(capturing, CU_STREAM_CAPTURE_MODE_GLOBAL));
    step("freer_launch_captured", cuGraphLaunch(freer, capturing));
    step("freer_capture_end", cuStreamEndCapture(capturing, &cg));
    if (step("big_after_captured_free", cuMemAlloc(&b, big)) == CUDA_SUCCESS)
        CHECK(cuMemFree(b));
    step("freer_launch", cuGraphLaunch(freer, stream));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuDeviceGraphMemTrim(dev));
    if (step("big_after_free", cuMemAlloc(&b, big)) == CUDA_SUCCESS)
        CHECK(cuMemFree(b));

    /* Two at once: each holds its allocation until its free node runs, 3 s after its launch. */
    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, ".version 7.0\n.target sm_80\n.address_size 64\n"
                                 ".visible .entry spin(.param .u64 us)\n{ ret; }\n"));
    CHECK(cuModuleGetFunction(&spin, mod, "spin"));
    CUstream other;
    CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    CUdeviceptr t1, t2;
    CUgraphExec first = capture(graph, 2, "first", &t1);
    CUgraphExec second = capture(graph, 2, "second", &t2);
    step("first_launch", cuGraphLaunch(first, stream));
    step("second_launch_beside_first", cuGraphLaunch(second, other));
    CHECK(cuCtxSynchronize());
    step("second_launch_after_first", cuGraphLaunch(second, other));
    CHECK(cuCtxSynchronize());
    printf("done=1\n");
    return 0;
}
