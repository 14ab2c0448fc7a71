#!/usr/bin/env bash
# A Python venv at target/zig-venv with the toolchain of the glibc-versioned build (scripts/build-release):
#   ziglang         zig, whose `zig cc` links against the symbol versions of a chosen glibc (2.28 here)
#                   with no sysroot to install;
#   cargo-zigbuild  drives cargo with `zig cc` as the C compiler and linker of a target such as
#                   x86_64-unknown-linux-gnu.2.28.
# Both come from PyPI, pinned: the same versions give the same artifacts. Idempotent: a stamp file
# naming the requirements makes a second run instant. Prints nothing on success.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
case "$TARGET" in /*) ;; *) TARGET="$ROOT/$TARGET" ;; esac
VENV=${1:-"$TARGET/zig-venv"}
REQS=("ziglang==0.17.1" "cargo-zigbuild==0.24.1")
# shellcheck source=scripts/venv.sh
. "$ROOT/scripts/venv.sh"
stamped_venv "$VENV" bin/cargo-zigbuild "${REQS[@]}"
