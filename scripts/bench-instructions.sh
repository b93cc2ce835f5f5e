#!/usr/bin/env bash
# What a request costs each server in its own code, counted rather than
# timed: the gateway, nginx `limit_req` and HAProxy under callgrind, each
# kept busy by `wrk -t1 -c50` on the same paths as bench-gateway.sh, and
# the instructions they ran divided by the requests answered.
#
#   scripts/bench-instructions.sh                  # the 429 path, the shipped 429, admitted
#   PATHS=admitted scripts/bench-instructions.sh
#   SERVERS="paceline nginx" SECONDS_ON=10 scripts/bench-instructions.sh
#
# Requests a second on a 2-core machine swing by 10% and more from one
# run to the next (other tasks, the kernel's own work). An instruction
# count does not: it is the same within about 1% run to run, so it shows
# a change of a few hundred instructions a request that the timed bench
# cannot. (`count-gateway.sh` counts the gateway alone, one request at a
# time; this script counts the peers beside it, each under load, where
# a wake-up serves many connections.) It counts user-space instructions only. The system calls are
# not in it: compare them with `strace -c` (the gateway makes the same
# ones per request as nginx), and the time they take with bench-gateway.sh's
# µs of system time.
#
# Each server runs under valgrind on the server core, nginx as one
# process (`master_process off`), HAProxy with one thread; `wrk` and the
# demo API upstream share the other core. Counting starts after a
# warm-up of WARM seconds, then runs for SECONDS_ON.
# Needs: valgrind, wrk, nginx, haproxy, taskset, a release build.
set -euo pipefail

PATHS=${PATHS:-429 shipped admitted}
SERVERS=${SERVERS:-paceline nginx haproxy}
WARM=${WARM:-2}
SECONDS_ON=${SECONDS_ON:-6}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
UP_PORT=${UP_PORT:-18381}
GW_PORT=${GW_PORT:-18382}
NGX_PORT=${NGX_PORT:-18383}
HAP_PORT=${HAP_PORT:-18384}

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/gateway-bench-common.sh
. "$root/scripts/gateway-bench-common.sh"
bin=${PACELINE_BIN:-$root/target/release/paceline}

need valgrind valgrind
need wrk wrk
need nginx nginx
need haproxy haproxy
need taskset util-linux
if [ ! -x "$bin" ]; then
  (cd "$root" && cargo build --release -p paceline)
fi

bench_setup
ANS_BODY=""
taskset -c "$LOAD_CPU" "$bin" demo --upstream-only --listen "127.0.0.1:$UP_PORT" \
  >"$work/upstream.log" 2>&1 &
up=$!
pids+=("$up")
wait_port "$UP_PORT"

# counted SERVER PORT CMD...: CMD under callgrind on the server core,
# counting only while wrk measures; prints requests and instructions
counted() {
  local name=$1 port=$2 out="$work/callgrind.$1"
  shift 2
  taskset -c "$SERVER_CPU" valgrind --tool=callgrind --instr-atstart=no \
    --callgrind-out-file="$out" "$@" >"$work/$name.log" 2>&1 &
  local vg=$!
  wait_port "$port"
  taskset -c "$LOAD_CPU" wrk -t1 -c50 -d"${WARM}s" "${header[@]}" "http://127.0.0.1:$port/v1/rates" >/dev/null
  callgrind_control -i on "$vg" >/dev/null 2>&1
  local res
  res=$(taskset -c "$LOAD_CPU" wrk -t1 -c50 -d"${SECONDS_ON}s" "${header[@]}" "http://127.0.0.1:$port/v1/rates")
  callgrind_control -i off "$vg" >/dev/null 2>&1
  kill "$vg"
  wait "$vg" 2>/dev/null || true
  local n total
  n=$(awk '/requests in/ {print $1}' <<<"$res")
  # every process valgrind wrote a file for (HAProxy and nginx fork none here)
  total=$(cat "$out"* | awk '/^totals:/ {s += $2} END {print s + 0}')
  echo "$n $total"
}

printf '%-28s %-16s %10s %16s %14s\n' path server requests instructions "per request"
for p in $PATHS; do
  header=()
  case $p in
    429) label="429 path (10 r/s, burst 20)" ;;
    shipped) label="shipped 429 (Free key)"; header=(-H "Authorization: Bearer sk_demo_alice") ;;
    admitted) label="admitted, upstream +0 ms" ;;
    *) echo "unknown path $p (429, shipped, admitted)" >&2; exit 1 ;;
  esac
  for s in $SERVERS; do
    case $s:$p in
      paceline:429) bench_gateway_config "$GW_PORT" "$UP_PORT" 20 2 >"$work/gateway.toml" ;;
      paceline:shipped) shipped_gateway_config "$GW_PORT" "$UP_PORT" >"$work/gateway.toml" ;;
      paceline:admitted) bench_gateway_config "$GW_PORT" "$UP_PORT" 100000000 100 >"$work/gateway.toml" ;;
      nginx:429) nginx_conf 10 20 static ;;
      nginx:shipped) nginx_conf 10 20 static '$http_authorization' ;;
      nginx:admitted) nginx_conf 1000000 100000000 proxy ;;
      haproxy:429) haproxy_conf 10 20 ;;
      haproxy:shipped) haproxy_conf 10 20 'req.hdr(authorization)' ;;
      haproxy:admitted) haproxy_conf 1000000 100000000 ;;
      *) echo "unknown server $s (paceline, nginx, haproxy)" >&2; exit 1 ;;
    esac
    case $s in
      paceline) read -r n total < <(counted paceline "$GW_PORT" "$bin" gateway --config "$work/gateway.toml") ;;
      nginx) read -r n total < <(counted nginx "$NGX_PORT" nginx -p "$work" -c "$work/nginx.conf" -g 'daemon off; master_process off;') ;;
      haproxy) read -r n total < <(counted haproxy "$HAP_PORT" haproxy -db -f "$work/haproxy.cfg") ;;
    esac
    rm -f "$work"/callgrind.*
    printf '%-28s %-16s %10s %16s %14s\n' "$label" "$s" "$n" "$total" "$((total / (n > 0 ? n : 1)))"
  done
done
