#!/usr/bin/env bash
# Lay out gpuslice's drop-in libraries as a driver installation, to put first on the library path (or in
# place of the driver's own files, e.g. bind-mounted into a container):
#   DEST/libcuda.so.1, DEST/libcuda.so               <- PROFILE_DIR/libgpuslice_cuda.so  (shim-c/dropin-cuda)
#   DEST/libnvidia-ml.so.1, DEST/libnvidia-ml.so     <- PROFILE_DIR/libgpuslice_nvml.so  (shim-c/dropin-nvml)
# The real driver is then found by GPUSLICE_REAL_LIBCUDA / GPUSLICE_REAL_NVML or in the standard driver
# locations (docs/DEPLOYMENT.md).
# Usage: scripts/install-dropin.sh [--copy] [PROFILE_DIR (default $TARGET/debug)] [DEST (default $TARGET/dropin-lib)]
# where TARGET is $CARGO_TARGET_DIR or target/. Symlinks by default (a rebuild is picked up); --copy for
# an image or a bind mount.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
case "$TARGET" in /*) ;; *) TARGET="$ROOT/$TARGET" ;; esac
mode=link
if [ "${1:-}" = "--copy" ]; then mode=copy; shift; fi
PROFILE_DIR=$(realpath -m "${1:-$TARGET/debug}")
DEST=$(realpath -m "${2:-$TARGET/dropin-lib}")
missing=0
for f in libgpuslice_cuda.so libgpuslice_nvml.so; do
  if [ ! -e "$PROFILE_DIR/$f" ]; then
    echo "install-dropin: $PROFILE_DIR/$f is missing (cargo build -p gpuslice-dropin-cuda -p gpuslice-dropin-nvml)" >&2
    missing=1
  fi
done
[ "$missing" = 0 ] || exit 1
mkdir -p "$DEST"
put() { # SOURCE NAME...
  local src=$1; shift
  for name in "$@"; do
    if [ "$mode" = copy ]; then
      cp -f "$src" "$DEST/.$name.tmp" && mv -f "$DEST/.$name.tmp" "$DEST/$name"
    else
      ln -sfn "$src" "$DEST/$name"
    fi
  done
}
put "$PROFILE_DIR/libgpuslice_cuda.so" libcuda.so.1 libcuda.so
put "$PROFILE_DIR/libgpuslice_nvml.so" libnvidia-ml.so.1 libnvidia-ml.so
echo "install-dropin: $DEST (from $PROFILE_DIR, $mode)"
