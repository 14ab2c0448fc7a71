"""Driver overhead under a quota through NVIDIA's cuda-bindings (every entry point resolved with
cuGetProcAddress_v2): the primary context, a module (linked with the driver's JIT linker), then 2 MiB
allocations until refused. Prints `key=value` lines that tests/memory_frameworks.rs judges against
simgpu's counters."""

import ctypes
import sys

try:
    from cuda.bindings import driver as cuda  # cuda-bindings >= 12.8
except ImportError:  # older cuda-python layout
    from cuda import cuda

MIB = 1 << 20
PTX = b""".version 7.0
.target sm_80
.address_size 64
.visible .entry touch(.param .u64 p)
{ ret; }
"""


def check(result, what):
    """cuda-bindings returns (CUresult, outputs...): a failed step ends the client."""
    if not isinstance(result, tuple):
        result = (result,)
    err, rest = result[0], result[1:]
    if err != cuda.CUresult.CUDA_SUCCESS:
        print(f"error={what} returned {int(err)} ({err.name})", flush=True)
        sys.exit(1)
    return rest[0] if len(rest) == 1 else rest


def main():
    check(cuda.cuInit(0), "cuInit")
    dev = check(cuda.cuDeviceGet(0), "cuDeviceGet")
    ctx = check(cuda.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    free, total = check(cuda.cuMemGetInfo(), "cuMemGetInfo")
    print(f"context_free={free}\ntotal={total}")
    # The module is linked first, as numba and cuda.core's driver-backed linker load their code:
    # cuLinkCreate, cuLinkAddData, cuLinkComplete, then cuModuleLoadData of the linked image.
    link = check(cuda.cuLinkCreate(0, [], []), "cuLinkCreate")
    check(
        cuda.cuLinkAddData(link, cuda.CUjitInputType.CU_JIT_INPUT_PTX, PTX, len(PTX), b"touch.ptx", 0, None, None),
        "cuLinkAddData",
    )
    image, size = check(cuda.cuLinkComplete(link), "cuLinkComplete")
    module = check(cuda.cuModuleLoadData(ctypes.string_at(int(image), size)), "cuModuleLoadData")
    check(cuda.cuLinkDestroy(link), "cuLinkDestroy")
    # A driver loading lazily (the default since CUDA 12.2) loads the code at the kernel's lookup.
    kernel = check(cuda.cuModuleGetFunction(module, b"touch"), "cuModuleGetFunction")
    free, _ = check(cuda.cuMemGetInfo(), "cuMemGetInfo")
    print(f"module_free={free}")
    # cuda.core's kernel argument handling asks for the parameter layout.
    offset, size = check(cuda.cuFuncGetParamInfo(kernel, 0), "cuFuncGetParamInfo")
    print(f"param0_offset={offset}\nparam0_size={size}")
    filled, held = 0, []
    while True:
        err, ptr = cuda.cuMemAlloc(2 * MIB)
        if err != cuda.CUresult.CUDA_SUCCESS:
            print(f"refused_rc={int(err)}")
            break
        held.append(ptr)
        filled += 2 * MIB
    print(f"fill_bytes={filled}")
    # The pointer's attributes, as cuda.core's buffers ask for them.
    attrs = [
        cuda.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        cuda.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
    ]
    values = check(cuda.cuPointerGetAttributes(len(attrs), attrs, held[0]), "cuPointerGetAttributes")
    print(f"ptr_memory_type={int(values[0])}\nptr_device={int(values[1])}")
    print("done=1", flush=True)


main()
