#!/usr/bin/env bash
# `make demo`: a local controller and worker (rc up) on two generic devices, a few jobs
# contending for them so the queue is visible, the fleet views, then a clean stop.
set -euo pipefail
cd "$(dirname "$0")/.."
RC="$PWD/.venv/bin/rc"
DEMO="$PWD/.demo"
rm -rf "$DEMO"
mkdir -p "$DEMO/home"
# Everything lives under .demo: its own data directory and user config file.
export HOME="$DEMO/home" XDG_DATA_HOME="$DEMO/data" XDG_CONFIG_HOME="$DEMO/config"
unset RC_CONTROLLER RC_TOKEN RC_CONFIG RC_SUBMITTER
PORT="${RC_DEMO_PORT:-18080}"

"$RC" up --addr "127.0.0.1:$PORT" --devices 2 2> "$DEMO/up.log" &
UP=$!
trap 'kill -INT $UP 2>/dev/null; wait $UP 2>/dev/null || true' EXIT
for _ in $(seq 100); do "$RC" devices >/dev/null 2>&1 && break; sleep 0.1; done
cat "$DEMO/up.log"

echo; echo "== four jobs contend for two devices"
# rc up names its client token after $USER, so each --as stays under that name (EXT-WHO-4).
for i in 1 2 3 4; do
  "$RC" run --as "${USER:-demo}/demo-$i" -- sh -c "echo job $i on \$RC_DEVICE; sleep 2; echo job $i done" &
done
sleep 1
echo; echo "== rc devices"; "$RC" devices
echo; echo "== rc ps (two running, two queued)"; "$RC" ps
wait $(jobs -p | grep -v "^$UP\$") 2>/dev/null || true
echo; echo "== rc jobs"; "$RC" jobs -n 4
echo; echo "== stopping"
kill -INT $UP; wait $UP; trap - EXIT
echo "demo finished cleanly"
