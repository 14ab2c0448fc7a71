"""Occupancy through NVIDIA's cuda-bindings, as cuda.core's `Kernel.occupancy` asks for it: the
committed sm_80 cubin's `saxpy`, blocks per multiprocessor for several block sizes and dynamic
shared memory, the block size that fills a multiprocessor, and the dynamic shared memory left per
block. Prints `key=value` lines (tests/simgpu_clients.rs). Usage: CUBIN"""

import sys

from cuda.bindings import driver as cuda


def check(result):
    err, *rest = result
    if err != cuda.CUresult.CUDA_SUCCESS:
        print(f"error={int(err)}", flush=True)
        sys.exit(1)
    return rest[0] if len(rest) == 1 else rest


check(cuda.cuInit(0))
ctx = check(cuda.cuDevicePrimaryCtxRetain(check(cuda.cuDeviceGet(0))))
check(cuda.cuCtxSetCurrent(ctx))
with open(sys.argv[1], "rb") as f:
    module = check(cuda.cuModuleLoadData(f.read()))
kernel = check(cuda.cuModuleGetFunction(module, b"saxpy"))
for block, shared in [(32, 0), (256, 0), (1024, 0), (256, 48 << 10), (2048, 0)]:
    blocks = check(cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(kernel, block, shared))
    print(f"active_{block}_{shared}={blocks}")
grid, block = check(cuda.cuOccupancyMaxPotentialBlockSize(kernel, None, 0, 0))
print(f"potential_grid={grid}\npotential_block={block}")
grid, block = check(cuda.cuOccupancyMaxPotentialBlockSize(kernel, None, 0, 200))
print(f"limited_grid={grid}\nlimited_block={block}")
print(f"available_4x256={check(cuda.cuOccupancyAvailableDynamicSMemPerBlock(kernel, 4, 256))}")
print(f"multiprocessors={check(cuda.cuDeviceGetAttribute(cuda.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0))}")
