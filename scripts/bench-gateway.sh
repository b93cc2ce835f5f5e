#!/usr/bin/env bash
# Load test: the paceline gateway against nginx limit_req and HAProxy
# stick-table rate limiting, same policy, same upstream, one core each.
#
#   scripts/bench-gateway.sh            # 10 s per run, 3 rounds
#   DURATION=5s ROUNDS=1 scripts/bench-gateway.sh
#   RUNS="429 0" scripts/bench-gateway.sh   # only the 429 path and +0 ms
#   RUNS=shipped scripts/bench-gateway.sh   # examples/shiplane.toml as shipped
#   RUNS=redis scripts/bench-gateway.sh     # the 429 paths on the memory store and on Redis
#   RUNS=tls scripts/bench-gateway.sh       # the same over TLS, against nginx (same certificate)
#   ANSWER=same RUNS="429 shipped" scripts/bench-gateway.sh   # the peers' 429s as ours
#
# Every round measures every server once, in turn (on the 429, shipped and
# admitted paths paceline first in odd rounds, last in even ones); the summary at the end gives each one's
# median over the rounds (runs on a shared machine move by several percent
# from one to the next, so one run decides nothing), then paceline's
# requests/s over the better peer's, round by round, and their median: a
# ratio of runs minutes apart, so slow drifts of the machine cancel.
# Beside requests/s and latency, each run reports the server's own CPU
# time per request, user and system apart, from its processes' counters
# (/proc/PID/stat of every process listening on its port: nginx's master
# and worker, the gateway's or HAProxy's one process) over the run.
#
# Every server is pinned to core 0 (with the upstream), wrk to core 1.
# Two paths are measured:
#   429 path:      one client over a 10 r/s, burst 20 limit: nearly every
#                  request is rejected (nginx serves its few admitted ones
#                  from a static file; the proxies forward them upstream).
#   admitted path: the same servers with a limit nobody reaches, every
#                  request proxied to the demo API; compared with calling
#                  the demo API directly, with and without a service time.
#   shipped 429:   the gateway with examples/shiplane.toml as shipped (a
#                  Free key: burst and daily policies, five routes,
#                  shedding and escalation on), one Free key sending as
#                  fast as it can; the peers keyed by the same header with
#                  the same 10 r/s, burst 20.
#   redis:         the 429 path and the shipped 429 path of the gateway
#                  alone, once on the memory store and once on a local
#                  redis-server (pinned to the servers' core, started here
#                  on REDIS_PORT): the hot key's 429s are answered from the
#                  store's local cache of denials, so the two should be
#                  within a few percent.
#   tls:           over TLS (one ECDSA P-256 certificate made here with
#                  openssl, served by both), the gateway against nginx
#                  limit_req: the 429 path and the admitted path (+0 ms)
#                  on keep-alive connections, and new connections a
#                  second: the 429 path with `Connection: close`, so every
#                  request is a new TCP connection and a full handshake
#                  (wrk resumes no sessions).
# The proxies tell the upstream who asked, as the gateway always does
# (`X-Forwarded-For`, `X-Forwarded-Proto`): nginx with proxy_set_header,
# HAProxy with `option forwardfor`. The upstream shares the servers' core,
# and two more fields cost it about 2,000 instructions a request, so peers
# that send none are measured doing less; FORWARDED=0 leaves them out (the
# set-up of the results before this was added).
# The peers answer a 429 with their own deny page by default (HAProxy's is
# 212 bytes, nginx's 332); the gateway's carries what the contract asks
# (the problem body naming the policy, RateLimit, RateLimit-Policy,
# Retry-After, Cache-Control: 469 bytes), and on one client core the client
# pays for every byte it parses. ANSWER=same has nginx and HAProxy answer
# with the gateway's fields and body, byte for byte (the RateLimit values
# fixed at what an empty bucket shows), as a user who wanted that contract
# from them would configure it: the same answer from each server.
# The limit is per client IP for all three in the first two (HAProxy's is a
# request rate over the burst window, the closest it has to a token
# bucket); there the gateway's escalation is off, as the peers have none.
# Pinned to one core, the gateway runs a single-threaded runtime.
# Needs: wrk, nginx, haproxy (Debian packages), taskset, a release build.
set -euo pipefail

DURATION=${DURATION:-10s}
RUNS=${RUNS:-429 shipped 0 2}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-50}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
UP_PORT=${UP_PORT:-18181}
GW_PORT=${GW_PORT:-18182}
NGX_PORT=${NGX_PORT:-18183}
HAP_PORT=${HAP_PORT:-18184}
REDIS_PORT=${REDIS_PORT:-18185}
PATH_Q=/v1/rates

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/gateway-bench-common.sh
. "$root/scripts/gateway-bench-common.sh"
bin=${PACELINE_BIN:-$root/target/release/paceline}

need wrk wrk
case " $RUNS " in *" tls "*) need nginx nginx; need openssl openssl ;; esac
case " $RUNS " in *" 429 "* | *" shipped "* | *" 0 "* | *" 2 "*)
  need nginx nginx
  need haproxy haproxy ;;
esac
need taskset util-linux
if [ ! -x "$bin" ]; then
  (cd "$root" && cargo build --release -p paceline)
fi

bench_setup
ANS_BODY=""

start_upstream() { # start_upstream DELAY_MS
  start upstream "$UP_PORT" "$bin" demo --upstream-only \
    --listen "127.0.0.1:$UP_PORT" --delay-ms "$1"
}

# --- configurations --------------------------------------------------------

# same_answer PLAN: the gateway's 429 for PLAN ("bench": the 429 path's one
# policy; "free": examples/shiplane.toml's Free plan, its burst policy hit),
# as ANS_POLICY, ANS_LIMIT (the two fields' values) and ANS_BODY; empty
# unless ANSWER=same.
same_answer() {
  ANS_POLICY="" ANS_LIMIT="" ANS_BODY=""
  [ "${ANSWER:-own}" = same ] || return 0
  local seconds=2
  case $1 in
    bench)
      ANS_POLICY='"burst";q=20;w=2'
      ANS_LIMIT='"burst";r=0;t=2' ;;
    free)
      ANS_POLICY='"burst";q=20;w=2, "daily";q=10000;w=86400'
      ANS_LIMIT='"burst";r=0;t=2, "daily";r=9980;t=49523' ;;
  esac
  ANS_BODY='{"type":"https://paceline.invalid/problems/rate_limited","title":"Too many requests","status":429,"detail":"20 of 20 requests used in the last '$seconds' seconds ('$1' plan).","limit":"burst","retry_after_s":1,"violated-policies":["burst"]}'
}

gateway_conf() { # gateway_conf RATE BURST
  # a token bucket of BURST refilled at RATE/s: q = BURST, w = BURST / RATE
  bench_gateway_config "$GW_PORT" "$UP_PORT" "$2" $(($2 / $1)) >"$work/gateway.toml"
}

# --- measuring --------------------------------------------------------------

listeners() { # listeners PORT: the PIDs of every process listening on it
  ss -Htlnp "sport = :$1" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u
}

cpu_ticks() { # cpu_ticks PID...: their user and system clock ticks, summed
  local u=0 s=0 f
  for p in "$@"; do
    # fields after the command's closing parenthesis: utime is the 12th, stime the 13th
    f=$(sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null) || continue
    set -- $f
    u=$((u + ${12})) s=$((s + ${13}))
  done
  echo "$u $s"
}

rows=()
measure() { # measure PATH_NAME SERVER PORT [HEADER]
  local out rps p50 p90 p99 non2xx n secs before after us_user us_sys off0 off1 off
  local header=() pids
  [ -n "${4:-}" ] && header=(-H "$4")
  # the server's own CPU time per request, from its processes' counters
  # (nginx: master and worker; the gateway and HAProxy: one process), and
  # how often a runnable server was taken off its core for something
  # else (another task, a kernel thread): each time, every connection
  # waits, whatever the server's own speed
  mapfile -t pids < <(listeners "$3")
  before=$(cpu_ticks "${pids[@]}")
  off0=$(preempted "${pids[@]}")
  out=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"$DURATION" --latency \
    "${header[@]}" "${SCHEME:-http}://127.0.0.1:$3$PATH_Q")
  after=$(cpu_ticks "${pids[@]}")
  off1=$(preempted "${pids[@]}")
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
  p90=$(awk '$1 == "90%" {print $2}' <<<"$out")
  p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
  secs=$(awk '/requests in/ {sub(/s,?$/, "", $4); print $4}' <<<"$out")
  off=$(awk -v a="$off0" -v b="$off1" -v s="${secs:-1}" 'BEGIN { printf "%.0f", (b - a) / s }')
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  read -r us_user us_sys < <(awk -v b="$before" -v a="$after" -v n="$n" -v hz="$(getconf CLK_TCK)" 'BEGIN {
    split(b, x, " "); split(a, y, " ")
    printf "%.2f %.2f\n", (y[1] - x[1]) * 1e6 / hz / n, (y[2] - x[2]) * 1e6 / hz / n }')
  rows+=("$(printf '%-34s %-16s %12s %10s %10s %10s %12s %8s %8s %7s' "$1" "$2" "$rps" "$p50" "$p90" "$p99" "${non2xx:-0}" "$us_user" "$us_sys" "$off")")
  echo "${rows[-1]}"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$rps" "$(ms "$p50")" "$(ms "$p99")" "$us_user" "$us_sys" "${round:-1}" "$(ms "$p90")" "$off" >>"$work/results.tsv"
}


summary() { # medians per path and server, in the order first measured
  awk -F'\t' '
    { k = $1 SUBSEP $2
      if (!(k in n)) { order[++m] = k }
      n[k]++; rps[k, n[k]] = $3; p50[k, n[k]] = $4; p99[k, n[k]] = $5; usr[k, n[k]] = $6; sys[k, n[k]] = $7
      p90[k, n[k]] = $9; off[k, n[k]] = $10 }
    function med(a, k, c,   i, j, t, v) {
      for (i = 1; i <= c; i++) v[i] = a[k, i] + 0
      for (i = 1; i <= c; i++) for (j = i + 1; j <= c; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
      return (c % 2) ? v[(c + 1) / 2] : (v[c / 2] + v[c / 2 + 1]) / 2
    }
    END {
      printf "%-34s %-16s %12s %10s %10s %10s %8s %8s %7s %7s %14s\n", "path", "server", "req/s", "p50 ms", "p90 ms", "p99 ms", "us usr", "us sys", "off/s", "runs", "vs direct"
      for (i = 1; i <= m; i++) {
        k = order[i]; split(k, kk, SUBSEP)
        r = med(rps, k, n[k])
        if (kk[2] == "upstream direct") direct[kk[1]] = r
        vs = (kk[1] in direct && kk[2] != "upstream direct") ? sprintf("%+.1f%%", (r / direct[kk[1]] - 1) * 100) : ""
        printf "%-34s %-16s %12.0f %10.3f %10.3f %10.3f %8.2f %8.2f %7.0f %7d %14s\n", kk[1], kk[2], r, med(p50, k, n[k]), med(p90, k, n[k]), med(p99, k, n[k]), med(usr, k, n[k]), med(sys, k, n[k]), med(off, k, n[k]), n[k], vs
      }
    }' "$work/results.tsv"
}

ratios() { # per round, paceline's requests/s over the better peer's in that round
  awk -F'\t' '
    $3 + 0 <= 0 { next }
    $2 == "paceline" { ours[$1, $8] = $3 }
    $2 == "nginx limit_req" || $2 == "haproxy" {
      if (!(($1, $8) in best) || $3 + 0 > best[$1, $8]) best[$1, $8] = $3 + 0
    }
    { if (!($1 in seen)) { seen[$1] = 1; order[++m] = $1 } if ($8 + 0 > rounds) rounds = $8 + 0 }
    END {
      for (i = 1; i <= m; i++) {
        p = order[i]; c = 0; line = ""
        for (r = 1; r <= rounds; r++) {
          if (!((p, r) in ours) || !((p, r) in best)) continue
          v[++c] = ours[p, r] / best[p, r]; line = line sprintf(" %.2f", v[c])
        }
        if (c == 0) continue
        for (a = 1; a <= c; a++) for (b = a + 1; b <= c; b++) if (v[b] < v[a]) { t = v[a]; v[a] = v[b]; v[b] = t }
        med = (c % 2) ? v[(c + 1) / 2] : (v[c / 2] + v[c / 2 + 1]) / 2
        printf "%-34s median %.2f   rounds:%s\n", p, med, line
      }
    }' "$work/results.tsv"
}

# servers: the three servers of a comparison, in this round's order
# (paceline first in odd rounds, last in even ones: whatever a run leaves
# behind for the next, such as a warm cache or a busy core, falls on each
# side alike)
servers() {
  if [ $((round % 2)) = 1 ]; then echo paceline nginx haproxy; else echo haproxy nginx paceline; fi
}

# serve_limited SERVER RATE BURST NGINX_MODE: SERVER (paceline, nginx or
# haproxy) limiting each client IP to RATE r/s with a burst of BURST
# (nginx serving admitted requests as NGINX_MODE says: static or proxy);
# sets NAME (the server's name in the results) and PORT
serve_limited() {
  case $1 in
    paceline)
      gateway_conf "$2" "$3"
      start gateway "$GW_PORT" "$bin" gateway --config "$work/gateway.toml"
      NAME=paceline PORT=$GW_PORT ;;
    nginx)
      nginx_conf "$2" "$3" "$4"
      start nginx "$NGX_PORT" nginx -p "$work" -c "$work/nginx.conf" -g 'daemon off;'
      NAME="nginx limit_req" PORT=$NGX_PORT ;;
    haproxy)
      haproxy_conf "$2" "$3"
      start haproxy "$HAP_PORT" haproxy -db -f "$work/haproxy.cfg"
      NAME=haproxy PORT=$HAP_PORT ;;
  esac
}

run_429() {
  local s
  same_answer bench
  for s in $(servers); do
    start_upstream 0
    serve_limited "$s" 10 20 static
    measure "429 path (10 r/s, burst 20)" "$NAME" "$PORT"
    stop_all
  done
  ANS_BODY=""
}

run_shipped() {
  local name="shipped 429 (Free key)" auth="Authorization: Bearer sk_demo_alice" s
  same_answer free
  for s in $(servers); do
    start_upstream 0
    case $s in
      paceline)
        shipped_gateway_config "$GW_PORT" "$UP_PORT" >"$work/gateway.toml"
        start gateway "$GW_PORT" "$bin" gateway --config "$work/gateway.toml"
        measure "$name" paceline "$GW_PORT" "$auth" ;;
      nginx)
        nginx_conf 10 20 static '$http_authorization'
        start nginx "$NGX_PORT" nginx -p "$work" -c "$work/nginx.conf" -g 'daemon off;'
        measure "$name" "nginx limit_req" "$NGX_PORT" "$auth" ;;
      haproxy)
        haproxy_conf 10 20 'req.hdr(authorization)'
        start haproxy "$HAP_PORT" haproxy -db -f "$work/haproxy.cfg"
        measure "$name" "haproxy" "$HAP_PORT" "$auth" ;;
    esac
    stop_all
  done
  ANS_BODY=""
}

to_redis() { # to_redis FILE: the gateway's file, with store = "redis" on REDIS_PORT
  local secret
  secret=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
  printf '%s' "$secret" >"$work/key-hash-secret"
  awk -v port="$REDIS_PORT" -v secret="$work/key-hash-secret" '
    /^store = / { next }
    /^\[gateway\]$/ { print; print "store = \"redis\""; print "key_hash_secret_file = \"" secret "\""; next }
    { print }
    END { print ""; print "[gateway.redis]"; print "url = \"redis://127.0.0.1:" port "\"" }' "$1" >"$1.redis"
  mv "$1.redis" "$1"
}

start_redis() {
  need redis-server redis-server
  mkdir -p "$work/redis"
  start redis "$REDIS_PORT" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 \
    --save '' --appendonly no --dir "$work/redis" --loglevel warning
}

run_redis() {
  for store in memory redis; do
    start_upstream 0
    [ "$store" = redis ] && start_redis
    gateway_conf 10 20
    [ "$store" = redis ] && to_redis "$work/gateway.toml"
    start gateway "$GW_PORT" "$bin" gateway --config "$work/gateway.toml"
    measure "429 path (10 r/s, burst 20)" "paceline $store" "$GW_PORT"
    stop_all
    start_upstream 0
    [ "$store" = redis ] && start_redis
    shipped_gateway_config "$GW_PORT" "$UP_PORT" >"$work/gateway.toml"
    [ "$store" = redis ] && to_redis "$work/gateway.toml"
    start gateway "$GW_PORT" "$bin" gateway --config "$work/gateway.toml"
    measure "shipped 429 (Free key)" "paceline $store" "$GW_PORT" "Authorization: Bearer sk_demo_alice"
    stop_all
  done
}

tls_files() { # one certificate and key for both servers
  [ -f "$work/tls.pem" ] && return 0
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 \
    -keyout "$work/tls.key" -out "$work/tls.pem" 2>/dev/null
  chmod a+r "$work/tls.key" "$work/tls.pem"
}

with_tls() { # with_tls FILE: the gateway's file, listening with TLS
  printf '\n[gateway.tls]\ncert_file = "%s"\nkey_file = "%s"\n' "$work/tls.pem" "$work/tls.key" >>"$1"
}

run_tls() {
  tls_files
  local name
  for what in 429 admitted new; do
    case $what in
      429) name="TLS 429 path (10 r/s, burst 20)" ;;
      admitted) name="TLS admitted, upstream +0 ms" ;;
      new) name="TLS new connections (429 path)" ;;
    esac
    local header=""
    [ "$what" = new ] && header="Connection: close"
    start_upstream 0
    if [ "$what" = admitted ]; then gateway_conf 1000000 100000000; else gateway_conf 10 20; fi
    with_tls "$work/gateway.toml"
    start gateway "$GW_PORT" "$bin" gateway --config "$work/gateway.toml"
    SCHEME=https measure "$name" paceline "$GW_PORT" "$header"
    stop_all
    start_upstream 0
    if [ "$what" = admitted ]; then TLS=1 nginx_conf 1000000 100000000 proxy; else TLS=1 nginx_conf 10 20 static; fi
    start nginx "$NGX_PORT" nginx -p "$work" -c "$work/nginx.conf" -g 'daemon off;'
    SCHEME=https measure "$name" "nginx limit_req" "$NGX_PORT" "$header"
    stop_all
  done
}

run_admitted() { # run_admitted DELAY_MS
  local name="admitted, upstream +$1 ms" s
  start_upstream "$1"
  measure "$name" "upstream direct" "$UP_PORT"
  stop_all
  for s in $(servers); do
    start_upstream "$1"
    serve_limited "$s" 1000000 100000000 proxy
    measure "$name" "$NAME" "$PORT"
    stop_all
  done
}

echo "wrk -t1 -c$CONNS -d$DURATION on core $LOAD_CPU; servers and upstream on core $SERVER_CPU"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-34s %-16s %12s %10s %10s %10s %12s %8s %8s %7s\n' path server "req/s" p50 p90 p99 "non-2xx" "us usr" "us sys" "off/s"
for round in $(seq 1 "$ROUNDS"); do
  for r in $RUNS; do
    case $r in
      429) run_429 ;;
      shipped) run_shipped ;;
      redis) run_redis ;;
      tls) run_tls ;;
      *) run_admitted "$r" ;;
    esac
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "medians over $ROUNDS round(s):"
summary
echo
echo "paceline over the better of the peers measured beside it (nginx, HAProxy), requests/s, round by round:"
ratios
