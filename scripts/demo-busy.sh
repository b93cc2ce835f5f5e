#!/usr/bin/env bash
# `paceline demo --json` five times in a row while a cold release build of
# the workspace runs beside it (in a target directory of its own, removed
# afterwards): one row per run, the cooperative fleet's jobs, 429s and
# finish against the 10.5 s floor, the naive fleet's finish, the SDK's
# pace margin and what it had to cover, and the load average.
#
#   scripts/demo-busy.sh            # RUNS=5 by default
#   RUNS=3 scripts/demo-busy.sh
#   PACE_MARGIN_MS=0 scripts/demo-busy.sh   # the SDK without its pace margin
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-5}
BIN_TARGET=${CARGO_TARGET_DIR:-target}
BUSY_TARGET=$BIN_TARGET/busy-build

cargo build -q -p paceline
BIN=$BIN_TARGET/debug/paceline

rm -rf "$BUSY_TARGET"
CARGO_TARGET_DIR=$BUSY_TARGET cargo build -q --release --workspace >/dev/null 2>&1 &
BUILD=$!
stop_build() {
    kill "$BUILD" 2>/dev/null || true
    wait "$BUILD" 2>/dev/null || true
    rm -rf "$BUSY_TARGET"
}
trap stop_build EXIT
# let the build get going (dependencies compile in parallel first)
sleep 20

printf '%-4s %-6s %-5s %-9s %-7s %-9s %-9s %-12s %-9s %s\n' \
    run jobs 429 finish_s vs_floor naive_s margin_ms headroom_ms drift_ms load
ok=0
for i in $(seq 1 "$RUNS"); do
    out=$("$BIN" demo --json --listen 127.0.0.1:0 --race-listen 127.0.0.1:0 ${PACE_MARGIN_MS:+--pace-margin-ms "$PACE_MARGIN_MS"})
    load=$(cut -d' ' -f1 /proc/loadavg)
    building=$(kill -0 "$BUILD" 2>/dev/null && echo building || echo "build done")
    row=$(printf '%s' "$out" | python3 -c '
import json, sys
v = json.load(sys.stdin)
c, n = v["fleets"]
p = v["pacing"]
fin = c["finished_at_s"] or float("nan")
good = c["jobs_done"] == c["jobs"] and c["rejected_429"] == 0 and abs(fin - v["floor_s"]) <= 0.03 * v["floor_s"]
print("%-6s %-5d %-9.3f %+5.1f%%   %-9.3f %-9.1f %-12.1f %-9.1f %s" % (
    "%d/%d" % (c["jobs_done"], c["jobs"]), c["rejected_429"], fin,
    (fin / v["floor_s"] - 1) * 100, n["finished_at_s"] or float("nan"),
    p["margin_ms"], p["min_headroom_ms"] or float("nan"), p["clock_drift_ms"],
    "ok" if good else "FAIL"))')
    case $row in *ok) ok=$((ok + 1)) ;; esac
    printf '%-4s %s %s (%s)\n' "$i" "$row" "$load" "$building"
done
echo "$ok of $RUNS runs: 50/50 jobs, 0 x 429, within 3% of the floor"
[ "$ok" = "$RUNS" ]
