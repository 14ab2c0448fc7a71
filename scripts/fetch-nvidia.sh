#!/usr/bin/env bash
# Fetch NVIDIA's published material into a project-owned directory (never the system, never committed):
#   DEST/driver/   libcuda.so.1, libnvidia-ml.so.1 from Debian non-free libcuda1/libnvidia-ml1 (535.x)
#   DEST/include/cu12/, DEST/include/cu13/, DEST/include/nvml/   headers from NVIDIA's pip wheels
# Used by scripts/gen-entry-points.py (the API table) and by the tests that use the real driver as oracle.
# Idempotent: a complete DEST is left alone.
set -euo pipefail
DEST=${1:-"$(cd "$(dirname "$0")/.." && pwd)/target/nvidia"}
CU12_VERSION=12.9.79
CU13_VERSION=13.5.37
NVML_VERSION=12.9.79
mkdir -p "$DEST"
cd "$DEST"
if [ -f .complete ]; then exit 0; fi

# 1. The real driver libraries, from Debian's non-free component (download and unpack only).
if [ ! -e driver/libcuda.so.1 ]; then
  src=/etc/apt/sources.list.d/gpuslice-nonfree.sources
  if ! apt-cache policy libcuda1 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    if [ ! -f "$src" ]; then
      codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
      printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$codename" > "$src"
    fi
    apt-get update -qq >/dev/null
  fi
  rm -rf debs unpacked && mkdir -p debs unpacked driver
  (cd debs && chmod 777 . && apt-get download -qq libcuda1 libnvidia-ml1 >/dev/null 2>&1) || (cd debs && apt-get download libcuda1 libnvidia-ml1)
  for d in debs/*.deb; do dpkg -x "$d" unpacked; done
  libdir=$(dirname "$(find unpacked -name 'libcuda.so.1' | head -n1)")
  cp -a "$libdir"/libcuda.so* "$libdir"/libnvidia-ml.so* driver/
  rm -rf debs unpacked
fi

# 2. Headers from NVIDIA's pip wheels (cuda.h, cudaTypedefs.h for CUDA 12 and 13; nvml.h).
if [ ! -e include/cu13/cudaTypedefs.h ] || [ ! -e include/cu12/cudaTypedefs.h ] || [ ! -e include/nvml/nvml.h ]; then
  rm -rf wheels && mkdir -p wheels include/cu12 include/cu13 include/nvml
  python3 -m pip download -q --no-deps -d wheels \
    "nvidia-cuda-runtime-cu12==$CU12_VERSION" "nvidia-cuda-runtime==$CU13_VERSION" "nvidia-nvml-dev-cu12==$NVML_VERSION"
  for w in wheels/*.whl; do python3 -m zipfile -e "$w" "wheels/x-$(basename "$w" .whl)"; done
  cp wheels/x-nvidia_cuda_runtime_cu12-*/nvidia/cuda_runtime/include/*.h include/cu12/
  cp wheels/x-nvidia_cuda_runtime-*/nvidia/cu13/include/*.h include/cu13/
  cp wheels/x-nvidia_nvml_dev_cu12-*/nvidia/nvml_dev/include/nvml.h include/nvml/
  rm -rf wheels
fi
touch .complete
