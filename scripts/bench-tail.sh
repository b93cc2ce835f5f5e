#!/usr/bin/env bash
# What sets the latency tail: the gateway and HAProxy on the tuned 429
# path (10 r/s, burst 20, one client IP), one core each with `wrk` on the
# other, at several connection counts; then, for each server, what ran on
# the two cores while `wrk` measured.
#
#   scripts/bench-tail.sh                      # CONNS_LIST="10 25 50 100", 2 runs each
#   CONNS_LIST=50 RUNS_EACH=3 scripts/bench-tail.sh
#   SCHED=0 scripts/bench-tail.sh              # without the scheduler trace
#
# Part 1: a fresh server per run, one second of warm-up, then
# `wrk -t1 -c<N> -d$DURATION --latency`: requests a second, p50, p90, p99,
# the largest latency, and how often the server was taken off its core
# while runnable (its `nonvoluntary_ctxt_switches`, per second).
# If the p99 stays near the same value however few connections there
# are, it is not queueing behind other requests.
#
# Part 2 (needs `perf` and the rights to trace the scheduler):
# `perf sched record -a` over 3 s of a 6 s run at 50 connections, then
# per core: the server's and `wrk`'s runs, every other task's time on
# that core and its longest single run, and the longest idle spell of
# the server's core. A request in flight while another task holds either
# core waits for it, whatever the server's speed.
#
# The script itself runs on the load core, so that its own commands do
# not land on the server's. Needs: wrk, haproxy, taskset, a release build.
set -euo pipefail

DURATION=${DURATION:-5s}
CONNS_LIST=${CONNS_LIST:-10 25 50 100}
RUNS_EACH=${RUNS_EACH:-2}
SCHED=${SCHED:-1}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
UP_PORT=${UP_PORT:-18281}
SRV_PORT=${SRV_PORT:-18282}

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/gateway-bench-common.sh
. "$root/scripts/gateway-bench-common.sh"
bin=${PACELINE_BIN:-$root/target/release/paceline}

need wrk wrk
need haproxy haproxy
need taskset util-linux
if [ ! -x "$bin" ]; then
  (cd "$root" && cargo build --release -p paceline)
fi
# this script and what it starts outside the server: on the load core
taskset -pc "$LOAD_CPU" $$ >/dev/null

bench_setup
bench_gateway_config "$SRV_PORT" "$UP_PORT" 20 2 >"$work/gateway.toml"
HAP_PORT=$SRV_PORT haproxy_conf 10 20

serve() { # serve SERVER: the server on the server core; sets SRV_PID
  case $1 in
    paceline) start gateway "$SRV_PORT" "$bin" gateway --config "$work/gateway.toml" ;;
    haproxy) start haproxy "$SRV_PORT" haproxy -db -f "$work/haproxy.cfg" ;;
  esac
  SRV_PID=${pids[-1]}
  taskset -c "$LOAD_CPU" wrk -t1 -c50 -d1s "http://127.0.0.1:$SRV_PORT/v1/rates" >/dev/null
}

start upstream "$UP_PORT" "$bin" demo --upstream-only --listen "127.0.0.1:$UP_PORT"
up=("${pids[@]}")

echo "part 1: the tuned 429 path, a fresh server per run, wrk -t1 -d$DURATION on core $LOAD_CPU"
printf '%-9s %6s %4s %12s %10s %10s %10s %10s %7s\n' server conns run "req/s" p50 p90 p99 max "off/s"
for c in $CONNS_LIST; do
  for s in paceline haproxy; do
    for r in $(seq 1 "$RUNS_EACH"); do
      serve "$s"
      before=$(preempted "$SRV_PID")
      out=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$c" -d"$DURATION" --latency "http://127.0.0.1:$SRV_PORT/v1/rates")
      after=$(preempted "$SRV_PID")
      awk -v s="$s" -v c="$c" -v r="$r" -v off=$((after - before)) '
        /^Requests\/sec/ {rps = $2} $1 == "50%" {p50 = $2} $1 == "90%" {p90 = $2} $1 == "99%" {p99 = $2}
        /^ *Latency/ && !max {max = $4} /requests in/ {secs = $4 + 0}
        END {printf "%-9s %6s %4s %12s %10s %10s %10s %10s %7.0f\n", s, c, r, rps, p50, p90, p99, max, off / (secs ? secs : 1)}' <<<"$out"
      kill "$SRV_PID"; wait "$SRV_PID" 2>/dev/null || true
      pids=("${up[@]}")
    done
  done
done

[ "$SCHED" = 1 ] || exit 0
if ! command -v perf >/dev/null 2>&1; then
  echo "part 2 skipped: no perf (apt-get install -y linux-perf)"
  exit 0
fi
echo
echo "part 2: what ran on each core over 3 s of a 6 s run at 50 connections"
for s in paceline haproxy; do
  serve "$s"
  taskset -c "$LOAD_CPU" wrk -t1 -c50 -d6s --latency "http://127.0.0.1:$SRV_PORT/v1/rates" >"$work/wrk.txt" &
  w=$!
  sleep 1.5
  if ! perf sched record -a -o "$work/sched.data" -- sleep 3 >/dev/null 2>&1; then
    wait "$w"
    echo "part 2 skipped: perf sched record failed (not allowed here?)"
    exit 0
  fi
  wait "$w"
  echo "== $s: $(awk '/^Requests\/sec/ {r = $2} $1 == "99%" {p = $2} /^ *Latency/ && !m {m = $4} END {printf "%s req/s, p99 %s, max %s", r, p, m}' "$work/wrk.txt")"
  # per core, the eight tasks that held it longest: runs, time, longest
  # run (thread ids cut off the names)
  perf sched timehist -i "$work/sched.data" 2>/dev/null | awk -v srv="$SERVER_CPU" '
    NR > 3 && $2 ~ /^\[/ {
      gsub(/[\[\]]/, "", $2); core = $2 + 0
      t = $3; sub(/\[[0-9\/]*\]$/, "", t)
      k = core SUBSEP t; n[k]++; run[k] += $NF; if ($NF > top[k]) top[k] = $NF
    }
    END {
      for (k in n) {
        split(k, kk, SUBSEP)
        printf "  core %s %-24s %6d runs %10.3f ms, longest %7.3f ms\n", kk[1], kk[2], n[k], run[k], top[k]
      }
    }' | sort -k2,2n -k6,6nr | awk '{ shown[$2]++ } shown[$2] <= 8'
  kill "$SRV_PID"; wait "$SRV_PID" 2>/dev/null || true
  pids=("${up[@]}")
done
