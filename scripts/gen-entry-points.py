#!/usr/bin/env python3
"""Regenerate the one table of the CUDA driver and NVML entry points (src/api/*.tsv).

Sources, all NVIDIA's published material fetched by scripts/fetch-nvidia.sh:
  * cudaTypedefs.h (CUDA 12 and 13): every (base name, version introduced, per-thread variant, signature)
    that cuGetProcAddress can hand out;
  * cuda.h (CUDA 12 and 13): the exported name of the newest variant (`#define cuMemAlloc cuMemAlloc_v2`)
    and the declared names;
  * the real driver library (Debian's libcuda1, 535.x): its export list, and -- the oracle -- the exported
    symbol its cuGetProcAddress_v2 returns for each (base, version, flags);
  * nvml.h and the real libnvidia-ml.so.1 for NVML.

The `hook` column is ours: it is kept from the existing table when the table is regenerated.

Usage: scripts/gen-entry-points.py [NVIDIA_DIR]   (default target/nvidia; run fetch-nvidia.sh first)
"""
import ctypes
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NV = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "nvidia")
DRIVER_TSV = os.path.join(ROOT, "src", "api", "driver_entry_points.tsv")
NVML_TSV = os.path.join(ROOT, "src", "api", "nvml_entry_points.tsv")
ERRORS_TSV = os.path.join(ROOT, "src", "api", "errors.tsv")

TYPEDEF_RE = re.compile(
    r"typedef\s+CUresult\s*\(\s*CUDAAPI\s+\*PFN_(\w+?)_v(\d+)(_ptds|_ptsz)?\)\((.*?)\);", re.S
)


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def typedef_rows(path):
    """(base, version, stream) -> C parameter list, from one cudaTypedefs-style header."""
    rows = {}
    for m in TYPEDEF_RE.finditer(read(path)):
        base, ver, stream, sig = m.group(1), int(m.group(2)), (m.group(3) or "")[1:], m.group(4)
        rows[(base, ver, stream)] = " ".join(sig.split())
    return rows


def exports(lib):
    """name -> 'func' | 'data' for every defined dynamic symbol of lib."""
    out = {}
    for line in subprocess.check_output(["nm", "-D", "--defined-only", lib], text=True).splitlines():
        parts = line.split()
        if len(parts) == 3:
            out[parts[2]] = "func" if parts[1] in "Tt" else "data"
    return out


def oracle(lib, names, bases, versions):
    """(base, version, flags) -> exported symbol that the real cuGetProcAddress_v2 resolves, if any."""
    h = ctypes.CDLL(lib)
    by_addr = {}
    for n, kind in names.items():
        if kind == "func":
            by_addr[ctypes.cast(getattr(h, n), ctypes.c_void_p).value] = n
    g2 = h.cuGetProcAddress_v2
    g2.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                   ctypes.POINTER(ctypes.c_int)]
    found = {}
    for b in bases:
        for v in versions:
            for flags in (0, 2):
                p, st = ctypes.c_void_p(), ctypes.c_int(-1)
                if g2(b.encode(), ctypes.byref(p), v, flags, ctypes.byref(st)) == 0 and st.value == 0 and p.value:
                    found[(b, v, flags)] = by_addr.get(p.value)
    return found


def header_names(paths):
    """Declared function names and `#define base name` redirections of cuda.h-style headers."""
    declared, redirect = set(), {}
    for p in paths:
        src = read(p)
        declared |= set(re.findall(r"CUresult\s+CUDAAPI\s+(\w+)\s*\(", src))
        for m in re.finditer(r"^\s*#define\s+(cu\w+)\s+(?:__CUDA_API_PT(?:DS|SZ)\()?(cu\w+)\)?\s*$", src, re.M):
            redirect.setdefault(m.group(1), m.group(2))
    return declared, redirect


def keep_hooks(path):
    hooks = {}
    if os.path.exists(path):
        for line in read(path).splitlines():
            if line and not line.startswith("#"):
                cols = line.split("\t")
                hooks[cols[0]] = cols[-2] if len(cols) >= 2 else "-"
    return hooks


def main():
    drv = os.path.join(NV, "driver", "libcuda.so.1")
    nvml_lib = os.path.join(NV, "driver", "libnvidia-ml.so.1")
    inc12, inc13 = os.path.join(NV, "include", "cu12"), os.path.join(NV, "include", "cu13")
    typedefs = typedef_rows(os.path.join(inc12, "cudaTypedefs.h"))
    for extra in ("cudaGLTypedefs.h", "cudaEGLTypedefs.h", "cudaVDPAUTypedefs.h", "cudaProfilerTypedefs.h"):
        if os.path.exists(os.path.join(inc12, extra)):
            typedefs.update(typedef_rows(os.path.join(inc12, extra)))
    typedefs.update(typedef_rows(os.path.join(inc13, "cudaTypedefs.h")))
    # Newest header first: its `#define base name` names the newest variant.
    declared, redirect = header_names([os.path.join(d, h) for d in (inc13, inc12)
                                       for h in ("cuda.h", "cudaGL.h", "cudaEGL.h", "cudaVDPAU.h", "cudaProfiler.h")
                                       if os.path.exists(os.path.join(d, h))])
    real = exports(drv)
    versions = sorted({v for _, v, _ in typedefs})
    probe_versions = sorted(set(versions) | {12020})
    bases = sorted({b for b, _, _ in typedefs} | {n for n, k in real.items() if k == "func"})
    found = oracle(drv, real, bases, probe_versions)

    rows = {}  # symbol -> [base, version, stream, kind, signature]
    for (base, ver, stream), sig in sorted(typedefs.items()):
        sym = found.get((base, ver, 2 if stream else 0))
        # The oracle answers with the newest variant it knows at or below `ver`; a symbol already given
        # to an older version means the real 535 driver predates this variant.
        if sym is not None and (not stream or sym.endswith("_" + stream)) and sym not in rows:
            pass
        else:
            plain_versions = sorted(v for b, v, s in typedefs if b == base and not s)
            newest = plain_versions[-1] if plain_versions else ver
            candidates = []
            if ver == newest and redirect.get(base, base) != base:
                candidates.append(redirect[base])
            if plain_versions and ver == plain_versions[0]:
                candidates.append(base)
            if ver in plain_versions:
                candidates.append("%s_v%d" % (base, plain_versions.index(ver) + 1))
            candidates.append(base)
            taken = {r for r, v in rows.items() if v[0] == base}
            sym = next((c for c in candidates if c not in taken and (c in declared or c in real)), candidates[0])
            if stream:
                sym = sym + "_" + stream
            plain = sym[: -len(stream) - 1] if stream else sym
            if plain not in declared and sym not in real:
                # e.g. cuWGLGetDevice: a typedef for another platform's entry point.
                print("skipped: %s (v%d %s) is neither declared nor exported" % (sym, ver, stream or "plain"),
                      file=sys.stderr)
                continue
        rows[sym] = [base, ver, stream or "-", "func", sig]
    # Entry points the real cuGetProcAddress hands out without a public typedef (interop, profiler):
    # take the version at which the oracle starts resolving them.
    for (base, ver, flags), sym in sorted(found.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        if sym and sym not in rows:
            rows[sym] = [base, ver, "-" if flags == 0 else sym.rsplit("_", 1)[1], "func", "?"]
    # Everything else the real driver exports (debugger hooks and data): exported, never resolvable.
    for name, kind in real.items():
        if name not in rows:
            rows[name] = [name, 0, "-", kind, "?"]

    hooks = keep_hooks(DRIVER_TSV)
    with open(DRIVER_TSV, "w") as f:
        f.write("# Generated by scripts/gen-entry-points.py from NVIDIA's headers and the real driver: do not edit\n")
        f.write("# by hand except the `hook` column. version = CUDA version (1000*major+10*minor) at which\n")
        f.write("# cuGetProcAddress starts returning this symbol for `base` (0: exported, never resolved);\n")
        f.write("# stream = per-thread default stream variant; in_535 = exported by the real 535 driver.\n")
        f.write("# hook: `-` pass-through; `call` gpuslice calls the real one but does not hook it; otherwise the hook group.\n")
        f.write("# symbol\tbase\tversion\tstream\tkind\tin_535\thook\tsignature\n")
        for sym, (base, ver, stream, kind, sig) in sorted(rows.items(), key=lambda kv: (kv[1][0], kv[1][1], kv[1][2], kv[0])):
            f.write("\t".join([sym, base, str(ver), stream, kind, "1" if sym in real else "0",
                               hooks.get(sym, "-"), sig]) + "\n")

    nvml_real = exports(nvml_lib)
    nvml_src = read(os.path.join(NV, "include", "nvml", "nvml.h"))
    nvml_decl = {}
    for m in re.finditer(r"nvmlReturn_t\s+DECLDIR\s+(nvml\w+)\s*\((.*?)\);", nvml_src, re.S):
        nvml_decl[m.group(1)] = " ".join(m.group(2).split())
    nvml_decl.update({m.group(1): "?" for m in re.finditer(r"\bconst\s+DECLDIR\s+char\s*\*\s*(nvml\w+)", nvml_src)
                      if m.group(1) not in nvml_decl})
    names = sorted(set(nvml_real) | set(nvml_decl))
    hooks = keep_hooks(NVML_TSV)
    with open(NVML_TSV, "w") as f:
        f.write("# Generated by scripts/gen-entry-points.py from nvml.h and the real libnvidia-ml: do not edit\n")
        f.write("# by hand except the `hook` column. in_535 = exported by the real 535 library.\n")
        f.write("# hook: `-` pass-through; `call` gpuslice calls the real one but does not hook it; otherwise the hook group.\n")
        f.write("# symbol\tkind\tin_535\thook\tsignature\n")
        for n in names:
            f.write("\t".join([n, nvml_real.get(n, "func"), "1" if n in nvml_real else "0", hooks.get(n, "-"),
                               nvml_decl.get(n, "?")]) + "\n")
    write_errors(drv, nvml_lib, os.path.join(inc13, "cuda.h"), os.path.join(NV, "include", "nvml", "nvml.h"))
    print("driver: %d symbols, nvml: %d symbols" % (len(rows), len(names)))


def write_errors(drv, nvml_lib, cuda_h, nvml_h):
    """CUresult and nvmlReturn_t codes with the real libraries' own names and strings."""
    cu = ctypes.CDLL(drv)
    nv = ctypes.CDLL(nvml_lib)
    nv.nvmlErrorString.restype = ctypes.c_char_p
    out = []
    src = read(cuda_h)
    body = re.search(r"typedef enum cudaError_enum \{(.*?)\} CUresult;", src, re.S).group(1)
    for m in re.finditer(r"/\*\*(.*?)\*/\s*(CUDA_\w+)\s*=\s*(\d+)", body, re.S):
        doc, name, code = m.group(1), m.group(2), int(m.group(3))
        p = ctypes.c_char_p()
        if cu.cuGetErrorString(code, ctypes.byref(p)) == 0 and p.value:
            text = p.value.decode()
        else:  # newer than the 535 driver: the header's first sentence
            text = " ".join(doc.replace("*", " ").split()).split(". ")[0].rstrip(".")
        out.append(("cuda", code, name, text))
    body = re.search(r"typedef enum nvmlReturn_enum\s*\{(.*?)\}\s*nvmlReturn_t;", read(nvml_h), re.S).group(1)
    for m in re.finditer(r"(NVML_\w+)\s*=\s*(\d+)", body):
        out.append(("nvml", int(m.group(2)), m.group(1), nv.nvmlErrorString(int(m.group(2))).decode()))
    with open(ERRORS_TSV, "w") as f:
        f.write("# Generated by scripts/gen-entry-points.py: CUresult / nvmlReturn_t codes, names and the strings\n")
        f.write("# the real 535 libraries return (header text for codes newer than 535).\n")
        f.write("# api\tcode\tname\tstring\n")
        for api, code, name, text in out:
            f.write("%s\t%d\t%s\t%s\n" % (api, code, name, text))


if __name__ == "__main__":
    main()
