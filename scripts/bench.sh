#!/usr/bin/env bash
# THE benchmark command: what the memory-quota shim adds to a CUDA program's calls, measured side by
# side in one run -- the same client (scripts/bench/bench.c, built against NVIDIA's cuda.h, linked
# with -lcuda) on simgpu, without and with LD_PRELOAD=libgpuslice.so (a quota configured) -- as wall
# time (paired, interleaved runs pinned to one CPU, medians) and as instructions (callgrind,
# deterministic). Prints a table; method and results: docs/BENCHMARKS.md.
#
# Usage: scripts/bench.sh [--reps N] [--startup-runs N] [--cpu C] [--old-shim PATH]   (defaults 9, 400, 1)
# --old-shim: another build of libgpuslice.so (e.g. the last release) measured as a third side.
# Builds the release profile in $CARGO_TARGET_DIR (default target/) and installs simgpu into a private
# directory, $TARGET/bench/simgpu/lib. Outputs (callgrind files, results.json) go to $TARGET/bench/out.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
case "$TARGET" in /*) ;; *) TARGET="$ROOT/$TARGET" ;; esac
export CARGO_TARGET_DIR=$TARGET
BENCH="$TARGET/bench"
OUT="$BENCH/out"
step() { echo "==> $*" >&2; }

# Tools: a C compiler, valgrind (instruction counts), strace (syscall counts), hyperfine (cross-check).
need=()
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v valgrind >/dev/null 2>&1 || need+=(valgrind)
command -v strace >/dev/null 2>&1 || need+=(strace)
command -v hyperfine >/dev/null 2>&1 || need+=(hyperfine)
if [ ${#need[@]} -gt 0 ]; then
  step "apt-get install ${need[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
for t in cc valgrind python3; do
  command -v "$t" >/dev/null 2>&1 || { echo "bench: $t is required" >&2; exit 1; }
done

step "fetch NVIDIA headers"
mkdir -p "$OUT"
scripts/fetch-nvidia.sh >"$OUT/fetch-nvidia.log" 2>&1 || { cat "$OUT/fetch-nvidia.log" >&2; exit 1; }

step "cargo build --release (gpuslice, simgpu)"
cargo build --release --quiet -p gpuslice -p simgpu-cuda -p simgpu-nvml -p simgpu-core
scripts/install-simgpu.sh "$TARGET/release" "$BENCH/simgpu/lib" >&2

step "build the bench client and the idle neighbour (tests/clients/compute_client.c)"
cc -O2 -g -Wall -Wextra -Werror -I "$ROOT/target/nvidia/include/cu12" scripts/bench/bench.c \
  -L "$BENCH/simgpu/lib" -lcuda -lpthread -o "$BENCH/bench-client"
cc -O2 -g -I "$ROOT/target/nvidia/include/cu13" -I tests/clients tests/clients/compute_client.c \
  -L "$BENCH/simgpu/lib" -lcuda -lpthread -lm -o "$BENCH/neighbour-client"

# simgpu's state file and the ledger live in shared memory, as they do in production.
SHM=$(mktemp -d /dev/shm/gpuslice-bench.XXXXXX)
trap 'rm -rf "$SHM"' EXIT

step "measure (about 2 minutes)"
python3 -B scripts/bench/run.py \
  --bench "$BENCH/bench-client" \
  --shim "$TARGET/release/libgpuslice.so" \
  --simgpu-lib "$BENCH/simgpu/lib" \
  --simgpu-stat "$BENCH/simgpu/bin/simgpu-stat" --neighbour "$BENCH/neighbour-client" \
  --work "$OUT" --shm "$SHM" --json "$OUT/results.json" "$@"
