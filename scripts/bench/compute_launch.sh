#!/usr/bin/env bash
# Launch-hook cost of compute shares: cuLaunchKernel through libgpuslice.so with a share configured and
# one tenant (the fast path) against simgpu without the shim, side by side in one run (alternating
# rounds, median of medians), plus callgrind instructions per launch.
# Usage: scripts/bench/compute_launch.sh [ROUNDS (default 9)]   (builds release into $CARGO_TARGET_DIR)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
case "$CARGO_TARGET_DIR" in /*) ;; *) CARGO_TARGET_DIR="$ROOT/$CARGO_TARGET_DIR" ;; esac
ROUNDS=${1:-9}
cd "$ROOT"
cargo build --release -q -p gpuslice -p simgpu-cuda -p simgpu-nvml -p simgpu-core
REL=$CARGO_TARGET_DIR/release
LIB=$CARGO_TARGET_DIR/bench-compute/lib
bash scripts/install-simgpu.sh "$REL" "$LIB" >/dev/null
BIN=$CARGO_TARGET_DIR/bench-compute/compute_client
cc -O2 -Wall -I target/nvidia/include/cu13 tests/clients/compute_client.c -o "$BIN" -L "$LIB" -lcuda -ldl
TMP=$(mktemp -d); trap 'rm -rf "$TMP"; rm -f /dev/shm/gpuslice-bench-compute-$$' EXIT
run() { # $1 = shim|none, rest = client args
  local what=$1; shift
  local pre=()
  [ "$what" = shim ] && pre=(LD_PRELOAD="$REL/libgpuslice.so" GPUSLICE_COMPUTE_SHARE=50
                            GPUSLICE_TENANT=bench GPUSLICE_LEDGER="$TMP/l" GPUSLICE_DEVICE_DIR="$TMP/dev")
  env -i PATH="$PATH" LD_LIBRARY_PATH="$LIB" SIMGPU_STATE=gpuslice-bench-compute-$$ "${pre[@]}" "$@"
}
declare -a S N
for r in $(seq "$ROUNDS"); do
  N+=("$(run none "$BIN" bench 256 200 | sed -n 's/launch_ns_median=//p')")
  S+=("$(run shim "$BIN" bench 256 200 | sed -n 's/launch_ns_median=//p')")
done
med() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mn=$(med "${N[@]}"); ms=$(med "${S[@]}")
echo "compute_launch: cuLaunchKernel median ns/launch: simgpu alone $mn, with gpuslice (share 50, one tenant) $ms, added $((ms - mn)) ns"
echo "compute_launch: rounds: none=${N[*]} shim=${S[*]}"
if command -v valgrind >/dev/null; then
  ir() { run "$1" valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.$1.$2" "$BIN" bench "$2" 1 >/dev/null 2>&1
         callgrind_annotate "$TMP/cg.$1.$2" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}'; }
  # Instructions per launch: the difference between 2000 and 1000 launches, with and without the shim.
  n1=$(ir none 1000); n2=$(ir none 2000); s1=$(ir shim 1000); s2=$(ir shim 2000)
  echo "compute_launch: callgrind instructions per launch: simgpu alone $(( (n2 - n1) / 1000 )), with gpuslice $(( (s2 - s1) / 1000 )), added $(( (s2 - s1 - n2 + n1) / 1000 ))"
fi
