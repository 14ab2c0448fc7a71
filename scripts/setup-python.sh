#!/usr/bin/env bash
# A Python venv at target/venv with NVIDIA's own Python clients of the driver, used by the integration
# tests as real-world judges of simgpu:
#   cuda-bindings 12.9.x: resolves every driver entry point through cuGetProcAddress. The 12.9 line is
#     the newest built for CUDA 12 drivers (13.x requires a CUDA 13 driver); simgpu reports 12080 (12.8),
#     and 12.9 bindings run on any 12.x driver (entry points newer than the driver are simply absent).
#   nvidia-ml-py: pynvml, NVIDIA's NVML bindings (ctypes over libnvidia-ml.so.1).
#   cuda-core 1.2.x: NVIDIA's Pythonic layer over cuda-bindings (devices, memory resources on the
#     device's pool, object code, launches), with numpy for kernel arguments. Run without NVRTC:
#     the tests load prebuilt cubins.
#   jsonschema: validates the CDI specs gpuslice writes against the CDI project's schema (node/tests).
# Idempotent: a stamp file naming the requirements makes a second run instant.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV=${1:-"$ROOT/target/venv"}
REQS=("cuda-bindings==12.9.*" "nvidia-ml-py" "jsonschema" "cuda-core==1.2.*" "numpy")
# shellcheck source=scripts/venv.sh
. "$ROOT/scripts/venv.sh"
stamped_venv "$VENV" bin/python "${REQS[@]}"
