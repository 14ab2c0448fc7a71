#!/usr/bin/env bash
# Lay out simgpu as a real driver installation, so clients find it exactly as they find NVIDIA's:
#   DEST/libcuda.so.1, DEST/libcuda.so           -> PROFILE_DIR/libcuda.so        (crate simgpu-cuda)
#   DEST/libnvidia-ml.so.1, DEST/libnvidia-ml.so -> PROFILE_DIR/libnvidia_ml.so   (crate simgpu-nvml)
#   DEST/../bin/simgpu-stat                      -> PROFILE_DIR/simgpu-stat       (crate simgpu-core)
# Usage: scripts/install-simgpu.sh [PROFILE_DIR (default $TARGET/debug)] [DEST (default $TARGET/simgpu/lib)]
# where TARGET is $CARGO_TARGET_DIR or target/.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
case "$TARGET" in /*) ;; *) TARGET="$ROOT/$TARGET" ;; esac
PROFILE_DIR=$(realpath -m "${1:-$TARGET/debug}")
DEST=$(realpath -m "${2:-$TARGET/simgpu/lib}")
BIN="$(dirname "$DEST")/bin"
missing=0
for f in libcuda.so libnvidia_ml.so simgpu-stat; do
  if [ ! -e "$PROFILE_DIR/$f" ]; then
    echo "install-simgpu: $PROFILE_DIR/$f is missing (build the workspace first)" >&2
    missing=1
  fi
done
[ "$missing" = 0 ] || exit 1
mkdir -p "$DEST" "$BIN"
# Symlinks, not copies: a rebuild is picked up without reinstalling.
ln -sfn "$PROFILE_DIR/libcuda.so" "$DEST/libcuda.so.1"
ln -sfn "$PROFILE_DIR/libcuda.so" "$DEST/libcuda.so"
ln -sfn "$PROFILE_DIR/libnvidia_ml.so" "$DEST/libnvidia-ml.so.1"
ln -sfn "$PROFILE_DIR/libnvidia_ml.so" "$DEST/libnvidia-ml.so"
ln -sfn "$PROFILE_DIR/simgpu-stat" "$BIN/simgpu-stat"
echo "install-simgpu: $DEST (from $PROFILE_DIR)"
