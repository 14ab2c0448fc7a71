#!/bin/sh
# Builds simgpu's libcuda and runs the C smoke tests in this directory against it, compiled with
# NVIDIA's real cu13 header (scripts/fetch-nvidia.sh). Usage: tests/simgpu/cuda/examples-c/run.sh
set -eu
root=$(cd "$(dirname "$0")/../../../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
cargo build -q -p simgpu-cuda --manifest-path "$root/Cargo.toml"
out=$target/simgpu-c
mkdir -p "$out/lib"
ln -sf "$target/debug/libcuda.so" "$out/lib/libcuda.so.1"
ln -sf "$target/debug/libcuda.so" "$out/lib/libcuda.so"
status=0
for src in "$root"/tests/simgpu/cuda/examples-c/*.c; do
    name=$(basename "$src" .c)
    gcc -Wall -Werror -I "$root/target/nvidia/include/cu13" "$src" -L "$out/lib" -lcuda -ldl -o "$out/$name"
    echo "== $name"
    LD_LIBRARY_PATH=$out/lib SIMGPU_STATE=simgpu-c-$name-$$ SIMGPU_MEMORY=1GiB timeout 120 "$out/$name" || status=1
done
exit $status
