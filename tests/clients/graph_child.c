/* Graph memory nodes in child graphs (tests/graph_memory_quota.rs): an unmodified CUDA program
 * linked with -lcuda. Since CUDA 12.9 a graph with memory allocation or free nodes may be embedded in
 * another graph if it is moved there (cuGraphAddNode, CU_GRAPH_NODE_TYPE_GRAPH,
 * CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE): its allocations get their memory when the parent is launched.
 * Prints one key=value line per step (the CUresult of the step, 0 = success); a step that is not the
 * subject of the test stops the program (CHECK).
 *
 * Usage: graph_child BIG_MIB GRAPH_MIB
 *   moved:  a child graph with one GRAPH_MIB allocation node (not freed in it), moved into a parent
 *           that also holds a cloned child graph (cuGraphAddChildGraphNode, an empty node); the
 *           parent launched beside a BIG_MIB cuMemAlloc, then alone; BIG_MIB while its allocation
 *           is held; cuMemFreeAsync of the allocation; cuDeviceGraphMemTrim (freed graph memory
 *           stays cached in the device's graph memory pool until then); BIG_MIB again.
 *   nested: a grandchild graph allocating GRAPH_MIB, moved into a child graph that frees it, moved
 *           into a parent: launched beside BIG_MIB, then alone; trimmed; BIG_MIB after it.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_client.h"

/* A graph with one allocation node of `bytes` on device 0; its address in *dptr. */
static CUgraph allocating(size_t bytes, CUdeviceptr *dptr) {
    CUgraph g;
    CUgraphNode n;
    CUDA_MEM_ALLOC_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.poolProps.location.id = 0;
    p.bytesize = bytes;
    CHECK(cuGraphCreate(&g, 0));
    CHECK(cuGraphAddMemAllocNode(&n, g, NULL, 0, &p));
    *dptr = p.dptr;
    return g;
}

/* Moves `child` into `parent` as a child graph node (CUDA 12.9's ownership transfer). */
static CUresult move_into(CUgraph parent, CUgraph child) {
    CUgraphNode n;
    CUgraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = CU_GRAPH_NODE_TYPE_GRAPH;
    p.graph.graph = child;
    p.graph.ownership = CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE;
    return cuGraphAddNode(&n, parent, NULL, NULL, 0, &p);
}

int main(int argc, char **argv) {
    size_t big, graph;
    CUdevice dev = graph_client_start(argc, argv, "graph_child BIG_MIB GRAPH_MIB", &big, &graph);
    CUdeviceptr a, b;

    /* Moved: the child's allocation outlives the parent's launch. */
    CUdeviceptr g;
    CUgraph child = allocating(graph, &g);
    CUgraph parent, plain;
    CUgraphNode empty, cloned;
    CHECK(cuGraphCreate(&parent, 0));
    CHECK(cuGraphCreate(&plain, 0));
    CHECK(cuGraphAddEmptyNode(&empty, plain, NULL, 0));
    step("clone", cuGraphAddChildGraphNode(&cloned, parent, NULL, 0, plain));
    if (step("move", move_into(parent, child)) != CUDA_SUCCESS)
        return 1;
    CUgraphExec moved;
    CHECK(cuGraphInstantiate(&moved, parent, 0));
    CHECK(cuMemAlloc(&a, big));
    if (step("moved_launch_beside_big", cuGraphLaunch(moved, stream)) == CUDA_SUCCESS) {
        CHECK(cuMemFreeAsync(g, stream));
        CHECK(cuStreamSynchronize(stream));
    }
    CHECK(cuMemFree(a));
    if (step("moved_launch_alone", cuGraphLaunch(moved, stream)) == CUDA_SUCCESS)
        CHECK(cuStreamSynchronize(stream));
    if (step("big_while_held", cuMemAlloc(&b, big)) == CUDA_SUCCESS)
        CHECK(cuMemFree(b));
    step("held_free", cuMemFreeAsync(g, stream));
    CHECK(cuStreamSynchronize(stream));
    /* Freed graph memory stays cached in the device's graph memory pool until trimmed. */
    CHECK(cuDeviceGraphMemTrim(dev));
    if (step("big_after_held_free", cuMemAlloc(&b, big)) == CUDA_SUCCESS)
        CHECK(cuMemFree(b));

    /* Nested: allocated two levels down, freed one level down. */
    CUdeviceptr t;
    CUgraph grandchild = allocating(graph, &t);
    CUgraph middle, top;
    CUgraphNode freed;
    CHECK(cuGraphCreate(&middle, 0));
    CHECK(cuGraphCreate(&top, 0));
    step("nested_move_inner", move_into(middle, grandchild));
    CHECK(cuGraphAddMemFreeNode(&freed, middle, NULL, 0, t));
    step("nested_move_outer", move_into(top, middle));
    CUgraphExec nested;
    CHECK(cuGraphInstantiate(&nested, top, 0));
    CHECK(cuMemAlloc(&a, big));
    if (step("nested_launch_beside_big", cuGraphLaunch(nested, stream)) == CUDA_SUCCESS)
        CHECK(cuStreamSynchronize(stream));
    CHECK(cuMemFree(a));
    if (step("nested_launch_alone", cuGraphLaunch(nested, stream)) == CUDA_SUCCESS)
        CHECK(cuStreamSynchronize(stream));
    CHECK(cuDeviceGraphMemTrim(dev));
    if (step("big_after_nested", cuMemAlloc(&b, big)) == CUDA_SUCCESS)
        CHECK(cuMemFree(b));

    CHECK(cuGraphExecDestroy(moved));
    CHECK(cuGraphExecDestroy(nested));
    CHECK(cuGraphDestroy(parent));
    CHECK(cuGraphDestroy(top));
    CHECK(cuGraphDestroy(plain));
    printf("done=1\n");
    return 0;
}
