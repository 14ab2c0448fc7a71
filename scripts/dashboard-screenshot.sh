#!/usr/bin/env bash
# Makes the dashboard picture of docs/OBSERVABILITY.md from a real run:
#   1. `scripts/demo --seconds N` (two tenants on simgpu: memory at the quota, then compute shares 30/70);
#   2. `gpuslice exporter` on the demo's ledger directory, scraped every second by Debian's Prometheus
#      (private config and data directory, loopback ports);
#   3. scripts/render-dashboard.py draws every panel of deploy/grafana/gpuslice.json from that
#      Prometheus's answers to the panels' own queries; headless Chromium (Debian's `chromium`)
#      takes the screenshot.
# usage: scripts/dashboard-screenshot.sh [SECONDS (default 30)] [OUT.png (default docs/img/dashboard.png)]
# Needs: prometheus, chromium: Debian's packages, installed here with apt-get when missing (as root;
# otherwise the script says what to install).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_SECONDS=${1:-30}
OUT=${2:-docs/img/dashboard.png}
TARGET=${CARGO_TARGET_DIR:-target}
missing=()
for tool in prometheus chromium; do
  command -v $tool >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing ${missing[*]} (Debian packages)" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "${missing[*]} missing: apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Build first, so that the demo starts its tenants at once when it is started below.
cargo build --quiet -p gpuslice -p gpuslice-cli -p simgpu-cuda -p simgpu-nvml -p simgpu-core
scripts/install-simgpu.sh "$TARGET/debug" "$TARGET/simgpu/lib" >/dev/null
# The demo keeps everything in /dev/shm/gpuslice-demo-<its pid>; the subshell's pid becomes the
# demo's (exec), so the exporter and Prometheus are watching before the demo's first tenant starts.
( until [ -e "$work/go" ]; do sleep 0.1; done; exec scripts/demo --seconds "$RUN_SECONDS" >"$work/demo.out" 2>&1 ) &
demo=$!
pids+=($demo)
dir=/dev/shm/gpuslice-demo-$demo
# The demo's simulated GPU, so that the exporter asks simgpu's NVML for the GPU's index.
LD_LIBRARY_PATH="$TARGET/simgpu/lib" SIMGPU_STATE="$dir/simgpu-state" \
  "$TARGET/debug/gpuslice" exporter --listen 127.0.0.1:0 --ledger-dir "$dir" --state-dir "$work/no-node" >"$work/exporter.out" &
pids+=($!)
until grep -q listening "$work/exporter.out"; do sleep 0.1; done
exporter=$(grep -o '127.0.0.1:[0-9]*' "$work/exporter.out")
prom="127.0.0.1:$(free_port)"
cat >"$work/prometheus.yml" <<YML
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: gpuslice
    static_configs: [{targets: ['$exporter']}]
YML
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
  --web.listen-address="$prom" >"$work/prometheus.log" 2>&1 &
pids+=($!)
until curl -sf "http://$prom/-/ready" >/dev/null; do sleep 0.2; done
sleep 2 # an empty scrape or two first
start=$(date +%s.%N)
touch "$work/go"
wait $demo || { cat "$work/demo.out"; echo "the demo failed" >&2; exit 1; }
end=$(date +%s.%N)
cat "$work/demo.out"
sleep 2 # the last scrape is in
python3 scripts/render-dashboard.py --prometheus "http://$prom" --start "$start" --end "$end" >"$work/dashboard.html"
height=$(grep -o 'height:[0-9]*px; position:relative' "$work/dashboard.html" | grep -o '[0-9]*' | head -1)
mkdir -p "$(dirname "$OUT")"
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1600,"$height" \
  --screenshot="$PWD/$OUT" "file://$work/dashboard.html" 2>"$work/chromium.log" >/dev/null \
  || { cat "$work/chromium.log"; exit 1; }
echo "wrote $OUT ($(date -u +%FT%TZ); exporter $exporter, prometheus $prom, ${RUN_SECONDS} s demo)"
