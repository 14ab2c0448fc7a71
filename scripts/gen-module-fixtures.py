#!/usr/bin/env python3
"""Rebuilds tests/fixtures/modules from kernel.cu with NVIDIA's own tools, so the image parser
(src/api/image.rs) is tested on what NVIDIA's compiler and fatbinary writer produce.

Needs NVRTC and nvFatbin (no GPU): pip install nvidia-cuda-nvrtc-cu12 nvidia-nvfatbin-cu12.
The tests read the committed images; nothing runs this in CI.
"""
import ctypes
import pathlib
import sys

import nvidia.cuda_nvrtc
import nvidia.nvfatbin

HERE = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "modules"


def lib(package, name):
    return ctypes.CDLL(str(pathlib.Path(list(package.__path__)[0]) / "lib" / name))


nvrtc = lib(nvidia.cuda_nvrtc, "libnvrtc.so.12")
nvfatbin = lib(nvidia.nvfatbin, "libnvfatbin.so.12")


def compile_for(arch):
    """A cubin for sm_XY, PTX for compute_XY."""
    prog = ctypes.c_void_p()
    source = (HERE / "kernel.cu").read_bytes()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source, b"kernel.cu", 0, None, None) == 0
    opts = (ctypes.c_char_p * 1)(b"-arch=" + arch.encode())
    if nvrtc.nvrtcCompileProgram(prog, 1, opts) != 0:
        sys.exit(f"NVRTC could not compile kernel.cu for {arch}")
    size = ctypes.c_size_t()
    get_size, get = (
        (nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN)
        if arch.startswith("sm_")
        else (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)
    )
    assert get_size(prog, ctypes.byref(size)) == 0
    buf = ctypes.create_string_buffer(size.value)
    assert get(prog, buf) == 0
    return buf.raw


def fatbin(pieces, *options):
    handle = ctypes.c_void_p()
    opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    assert nvfatbin.nvFatbinCreate(ctypes.byref(handle), opts, len(options)) == 0
    for kind, arch, image in pieces:
        if kind == "cubin":
            r = nvfatbin.nvFatbinAddCubin(handle, image, len(image), arch.encode(), b"kernel")
        else:
            r = nvfatbin.nvFatbinAddPTX(handle, image, len(image), arch.encode(), b"kernel", b"")
        assert r == 0, f"nvFatbinAdd {kind} {arch}: {r}"
    size = ctypes.c_size_t()
    assert nvfatbin.nvFatbinSize(handle, ctypes.byref(size)) == 0
    buf = ctypes.create_string_buffer(size.value)
    assert nvfatbin.nvFatbinGet(handle, buf) == 0
    return buf.raw


def main():
    sm80, sm90, ptx90 = compile_for("sm_80"), compile_for("sm_90"), compile_for("compute_90")
    (HERE / "kernel.sm_80.cubin").write_bytes(sm80)
    (HERE / "kernel.compute_90.ptx").write_bytes(ptx90)
    pieces = [("cubin", "80", sm80), ("cubin", "90", sm90), ("ptx", "90", ptx90)]
    (HERE / "kernel.fatbin").write_bytes(fatbin(pieces))
    (HERE / "kernel.compressed.fatbin").write_bytes(fatbin(pieces, "-compress-all"))


if __name__ == "__main__":
    main()
