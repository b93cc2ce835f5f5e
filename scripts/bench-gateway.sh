#!/usr/bin/env bash
# Load test: the paceline gateway against nginx limit_req and HAProxy
# stick-table rate limiting, same policy, same upstream, one core each.
#
#   scripts/bench-gateway.sh            # 10 s per run
#   DURATION=5s scripts/bench-gateway.sh
#   RUNS="429 0" scripts/bench-gateway.sh   # only the 429 path and +0 ms
#
# Every server is pinned to core 0 (with the upstream), wrk to core 1.
# Two paths are measured:
#   429 path:      one client over a 10 r/s, burst 20 limit: nearly every
#                  request is rejected (nginx serves its few admitted ones
#                  from a static file; the proxies forward them upstream).
#   admitted path: the same servers with a limit nobody reaches, every
#                  request proxied to the demo API; compared with calling
#                  the demo API directly, with and without a service time.
# The limit is per client IP for all three (HAProxy's is a request rate
# over the burst window, the closest it has to a token bucket); the
# gateway's escalation is off, as the peers have none. Pinned to one core,
# the gateway runs a single-threaded runtime.
# Needs: wrk, nginx, haproxy (Debian packages), taskset, a release build.
set -euo pipefail

DURATION=${DURATION:-10s}
RUNS=${RUNS:-429 0 2}
CONNS=${CONNS:-50}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
UP_PORT=${UP_PORT:-18181}
GW_PORT=${GW_PORT:-18182}
NGX_PORT=${NGX_PORT:-18183}
HAP_PORT=${HAP_PORT:-18184}
PATH_Q=/v1/rates

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${PACELINE_BIN:-$root/target/release/paceline}

need() {
  command -v "$1" >/dev/null 2>&1 || {
    echo "missing $1; install it with: apt-get install -y $2" >&2
    exit 1
  }
}
need wrk wrk
need nginx nginx
need haproxy haproxy
need taskset util-linux
if [ ! -x "$bin" ]; then
  (cd "$root" && cargo build --release -p paceline)
fi

work=$(mktemp -d)
chmod 755 "$work"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

wait_port() {
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "nothing listens on port $1" >&2
  exit 1
}

stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}

start() { # start NAME PORT CMD...
  local name=$1 port=$2
  shift 2
  taskset -c "$SERVER_CPU" "$@" >"$work/$name.log" 2>&1 &
  pids+=($!)
  wait_port "$port"
}

start_upstream() { # start_upstream DELAY_MS
  start upstream "$UP_PORT" "$bin" demo --upstream-only \
    --listen "127.0.0.1:$UP_PORT" --delay-ms "$1"
}

# --- configurations --------------------------------------------------------

gateway_conf() { # gateway_conf RATE BURST
  # a token bucket of BURST refilled at RATE/s: q = BURST, w = BURST / RATE
  cat >"$work/gateway.toml" <<EOF
key = "ip"
default_plan = "bench"

[gateway]
listen = "127.0.0.1:$GW_PORT"
upstream = "http://127.0.0.1:$UP_PORT"
watch = false

[gateway.shedding]
max_in_flight = 0

[plans.bench]
policies = [{ name = "burst", algorithm = "token_bucket", q = $2, w = $(($2 / $1)) }]

[escalation]
enabled = false
EOF
}

nginx_conf() { # nginx_conf RATE BURST MODE(static|proxy)
  mkdir -p "$work/www/v1"
  printf '{"rates":[{"id":"rate_ups_ground","amount":"7.45"}]}' >"$work/www/v1/rates"
  chmod -R a+rX "$work/www"
  local body
  if [ "$3" = static ]; then
    # not `return`: it would run before limit_req
    body="root $work/www; try_files \$uri =404;"
  else
    body="proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection \"\";"
  fi
  cat >"$work/nginx.conf" <<EOF
worker_processes 1;
pid $work/nginx.pid;
error_log $work/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  limit_req_zone \$binary_remote_addr zone=one:10m rate=$1r/s;
  limit_req_status 429;
  upstream up { server 127.0.0.1:$UP_PORT; keepalive 64; }
  server {
    listen 127.0.0.1:$NGX_PORT;
    location / {
      limit_req zone=one burst=$2 nodelay;
      $body
    }
  }
}
EOF
}

haproxy_conf() { # haproxy_conf RATE BURST
  # over a window of BURST/RATE seconds at most BURST requests
  local window=$(($2 / $1))
  cat >"$work/haproxy.cfg" <<EOF
global
  nbthread 1
  maxconn 4096
defaults
  mode http
  timeout connect 2s
  timeout client 30s
  timeout server 30s
  http-reuse always
frontend fe
  bind 127.0.0.1:$HAP_PORT
  stick-table type ip size 100k expire 60s store http_req_rate(${window}s)
  http-request track-sc0 src
  http-request deny deny_status 429 if { sc_http_req_rate(0) gt $2 }
  default_backend be
backend be
  server up 127.0.0.1:$UP_PORT
EOF
}

# --- measuring --------------------------------------------------------------

rows=()
measure() { # measure PATH_NAME SERVER PORT
  local out rps p50 p99 non2xx
  out=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"$DURATION" --latency \
    "http://127.0.0.1:$3$PATH_Q")
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
  p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")
  rows+=("$(printf '%-34s %-16s %12s %10s %10s %12s' "$1" "$2" "$rps" "$p50" "$p99" "${non2xx:-0}")")
  echo "${rows[-1]}"
}

run_429() {
  start_upstream 0
  gateway_conf 10 20
  start gateway "$GW_PORT" "$bin" gateway --config "$work/gateway.toml"
  measure "429 path (10 r/s, burst 20)" paceline "$GW_PORT"
  stop_all
  start_upstream 0
  nginx_conf 10 20 static
  start nginx "$NGX_PORT" nginx -p "$work" -c "$work/nginx.conf" -g 'daemon off;'
  measure "429 path (10 r/s, burst 20)" "nginx limit_req" "$NGX_PORT"
  stop_all
  start_upstream 0
  haproxy_conf 10 20
  start haproxy "$HAP_PORT" haproxy -db -f "$work/haproxy.cfg"
  measure "429 path (10 r/s, burst 20)" "haproxy" "$HAP_PORT"
  stop_all
}

run_admitted() { # run_admitted DELAY_MS
  local name="admitted, upstream +$1 ms"
  start_upstream "$1"
  measure "$name" "upstream direct" "$UP_PORT"
  gateway_conf 1000000 100000000
  start gateway "$GW_PORT" "$bin" gateway --config "$work/gateway.toml"
  measure "$name" paceline "$GW_PORT"
  stop_all
  start_upstream "$1"
  nginx_conf 1000000 100000000 proxy
  start nginx "$NGX_PORT" nginx -p "$work" -c "$work/nginx.conf" -g 'daemon off;'
  measure "$name" "nginx limit_req" "$NGX_PORT"
  stop_all
  start_upstream "$1"
  haproxy_conf 1000000 100000000
  start haproxy "$HAP_PORT" haproxy -db -f "$work/haproxy.cfg"
  measure "$name" "haproxy" "$HAP_PORT"
  stop_all
}

echo "wrk -t1 -c$CONNS -d$DURATION on core $LOAD_CPU; servers and upstream on core $SERVER_CPU"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-34s %-16s %12s %10s %10s %12s\n' path server "req/s" p50 p99 "non-2xx"
for r in $RUNS; do
  case $r in
    429) run_429 ;;
    *) run_admitted "$r" ;;
  esac
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
