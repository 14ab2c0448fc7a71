#!/usr/bin/env bash
# Driver calls gpuslice adds per contended launch (docs/BENCHMARKS.md, "Host time per contended
# launch"): two tenants spin kernels of US on one simgpu device (shares 50/50, eight in flight,
# simgpu's host call costs), MS ms; simgpu traces every driver call of tenant a (SIMGPU_TRACE).
# Prints its launches and, per launch, the event calls beyond the client's own (one record, one
# synchronize a launch), with what they cost at simgpu's call costs (record 800 ns, query 400 ns).
# Usage: scripts/bench/compute_contended_calls.sh SHIM_LIB [US (5)] [MS (2000)]
# Needs the release build of simgpu in $CARGO_TARGET_DIR/release (default target/).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
SHIM=$(realpath "$1"); US=${2:-5}; MS=${3:-2000}
WORK=$(mktemp -d /tmp/gpuslice-calls-XXXXXX)
STATE=gpuslice-calls-$$
trap 'rm -rf "$WORK"; rm -f /dev/shm/$STATE' EXIT
bash "$ROOT/scripts/install-simgpu.sh" "$TARGET/release" "$WORK/lib" >/dev/null
cc -O2 -I "$ROOT/target/nvidia/include/cu13" "$ROOT/tests/clients/compute_client.c" -o "$WORK/client" \
   -L "$WORK/lib" -lcuda -ldl -lpthread
START=$(( $(date +%s%N) + 500000000 ))
common=(SIMGPU_STATE=$STATE LD_LIBRARY_PATH="$WORK/lib" LD_PRELOAD="$SHIM"
        GPUSLICE_COMPUTE_SHARE=50 GPUSLICE_DEVICE_DIR="$WORK/devices"
        SIMGPU_COST_LAUNCH_NS=2500 SIMGPU_COST_EVENT_RECORD_NS=800 SIMGPU_COST_EVENT_QUERY_NS=400
        SIMGPU_COST_STREAM_QUERY_NS=400 SIMGPU_COST_CONTEXT_NS=100)
env "${common[@]}" SIMGPU_GROUP=b GPUSLICE_LEDGER="$WORK/b.ledger" \
    "$WORK/client" spin "$START" "$MS" "$US" 8 > "$WORK/b.out" &
env "${common[@]}" SIMGPU_GROUP=a GPUSLICE_LEDGER="$WORK/a.ledger" SIMGPU_TRACE="$WORK/trace" \
    "$WORK/client" spin "$START" "$MS" "$US" 8 > "$WORK/a.out"
wait
awk -v us="$US" '{c[$2]++} END {
    l = c["cuLaunchKernel"]; r = c["cuEventRecord"] - l; q = c["cuEventQuery"]; e = c["cuEventElapsedTime"]
    printf "%s us: %d launches; added per launch: cuEventRecord %.3f, cuEventQuery %.3f, cuEventElapsedTime %.3f, all %.3f; at simgpu call costs %.0f ns\n",
        us, l, r / l, q / l, e / l, (r + q + e) / l, (r * 800 + q * 400) / l }' "$WORK/trace"
