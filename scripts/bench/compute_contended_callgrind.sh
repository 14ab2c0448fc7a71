#!/usr/bin/env bash
# Instructions per contended launch (docs/BENCHMARKS.md, "Host time per contended launch"): two
# tenants spin kernels of US on one simgpu device (shares 50/50, eight in flight); tenant a runs
# under callgrind, collecting only inside cuLaunchKernel, one file per thread. Prints the
# launching thread's instructions per launch and where they go (callgrind_annotate, inclusive).
# Usage: scripts/bench/compute_contended_callgrind.sh SHIM_LIB [US (5)] [MS (3000)]
# Needs the release build of simgpu in $CARGO_TARGET_DIR/release (default target/).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
SHIM=$(realpath "$1"); US=${2:-5}; MS=${3:-3000}
WORK=$(mktemp -d /tmp/gpuslice-cg-XXXXXX)
trap 'rm -rf "$WORK"; rm -f /dev/shm/gpuslice-cg-$$' EXIT
bash "$ROOT/scripts/install-simgpu.sh" "$TARGET/release" "$WORK/lib" >/dev/null
cc -O2 -I "$ROOT/target/nvidia/include/cu13" "$ROOT/tests/clients/compute_client.c" -o "$WORK/client" \
   -L "$WORK/lib" -lcuda -ldl -lpthread
START=$(( $(date +%s%N) + 2000000000 ))
common=(SIMGPU_STATE=gpuslice-cg-$$ LD_LIBRARY_PATH="$WORK/lib" LD_PRELOAD="$SHIM"
        GPUSLICE_COMPUTE_SHARE=50 GPUSLICE_DEVICE_DIR="$WORK/devices"
        SIMGPU_COST_LAUNCH_NS=${SIMGPU_COST_LAUNCH_NS:-2500} SIMGPU_COST_EVENT_RECORD_NS=${SIMGPU_COST_EVENT_RECORD_NS:-800}
        SIMGPU_COST_EVENT_QUERY_NS=${SIMGPU_COST_EVENT_QUERY_NS:-400} SIMGPU_COST_STREAM_QUERY_NS=${SIMGPU_COST_STREAM_QUERY_NS:-400}
        SIMGPU_COST_CONTEXT_NS=${SIMGPU_COST_CONTEXT_NS:-100})
env "${common[@]}" SIMGPU_GROUP=b GPUSLICE_LEDGER="$WORK/b.ledger" \
    "$WORK/client" spin "$START" $((MS + 4000)) "$US" 8 > "$WORK/b.out" &
env "${common[@]}" SIMGPU_GROUP=a GPUSLICE_LEDGER="$WORK/a.ledger" \
    valgrind -q --tool=callgrind --separate-threads=yes --toggle-collect=cuLaunchKernel \
    --callgrind-out-file="$WORK/cg.out" "$WORK/client" spin "$START" "$MS" "$US" 8 > "$WORK/a.out"
wait
launches=$(tr ' ' '\n' < "$WORK/a.out" | sed -n 's/^launches=//p')
main=$(ls "$WORK"/cg.out-01 2>/dev/null || ls "$WORK"/cg.out* | head -1)
ir=$(sed -n 's/^summary: //p;s/^totals: //p' "$main" | head -1 | awk '{print $1}')
echo "launches=$launches ir_in_launch=$ir ir_per_launch=$(( ir / launches ))"
[ -n "${CG_KEEP:-}" ] && cp "$main" "$CG_KEEP"
echo "--- inclusive"
callgrind_annotate --inclusive=yes --threshold=99 "$main" 2>/dev/null | sed -n '/file:function/,$p' | head -45
echo "--- self"
callgrind_annotate --threshold=99 "$main" 2>/dev/null | sed -n '/file:function/,$p' | head -40
