#!/usr/bin/env bash
# Load test: `paceline check` behind nginx (the auth_request recipe of
# examples/nginx-check.conf) against nginx limit_req alone, on the same
# 429 path: one Free key (examples/shiplane.toml as shipped: a burst of 20
# refilled at 10 r/s, and a daily quota) sending as fast as it can, so
# nearly every request is refused. `paceline gateway` with the same file
# is measured beside them for reference.
#
#   scripts/bench-check.sh                    # 10 s per run, 3 rounds
#   DURATION=2s ROUNDS=1 scripts/bench-check.sh   # a smoke run
#   CHECK_HTTP1=hyper scripts/bench-check.sh  # the check's connections all hyper's
#
# Every round measures every server once, in turn; the summary gives each
# one's median over the rounds. The servers (nginx, paceline, the
# upstream) are pinned to core 0, wrk to core 1.
#
#   nginx + paceline check: nginx asks the check (auth_request); a refusal
#       is a second call to the check, which answers it from its sealed
#       copy, so each 429 costs nginx two subrequests and the check two
#       answers (one decision). The example file as it is, its addresses
#       replaced and its access log off (as nginx's below).
#   nginx limit_req: limit_req keyed by the Authorization field, 10 r/s
#       with a burst of 20, its admitted requests served from a static
#       file; its 429 has no body, no Retry-After and no fields.
#   paceline gateway: the same file, in the path of the traffic.
# Needs: wrk, nginx (Debian packages), taskset, a release build.
set -euo pipefail

DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-50}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
UP_PORT=${UP_PORT:-18191}
CHECK_PORT=${CHECK_PORT:-18192}
NGX_PORT=${NGX_PORT:-18193}
GW_PORT=${GW_PORT:-18194}
PATH_Q=/v1/rates
AUTH="Authorization: Bearer sk_demo_alice"

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/gateway-bench-common.sh
. "$root/scripts/gateway-bench-common.sh"
bin=${PACELINE_BIN:-$root/target/release/paceline}

need wrk wrk
need nginx nginx
need taskset util-linux
if [ ! -x "$bin" ]; then
  (cd "$root" && cargo build --release -p paceline)
fi

bench_setup

start_upstream() {
  start upstream "$UP_PORT" "$bin" demo --upstream-only \
    --listen "127.0.0.1:$UP_PORT" --delay-ms 0
}

# --- configurations --------------------------------------------------------

check_nginx_conf() { # examples/nginx-check.conf on this run's ports
  mkdir -p "$work/check-nginx/logs" "$work/check-nginx/temp"
  sed -e "s|127\.0\.0\.1:8080|127.0.0.1:$NGX_PORT|" \
      -e "s|127\.0\.0\.1:8081|127.0.0.1:$CHECK_PORT|" \
      -e "s|127\.0\.0\.1:9000|127.0.0.1:$UP_PORT|" \
      -e "s|access_log logs/access.log;|access_log off;|" \
      "$root/examples/nginx-check.conf" >"$work/check-nginx/nginx.conf"
}

limit_req_conf() { # nginx limit_req alone, keyed by Authorization
  mkdir -p "$work/limit-nginx/www/v1"
  printf '{"rates":[{"id":"rate_ups_ground","amount":"7.45"}]}' >"$work/limit-nginx/www/v1/rates"
  chmod -R a+rX "$work/limit-nginx"
  cat >"$work/limit-nginx/nginx.conf" <<CONF
worker_processes 1;
pid $work/limit-nginx/nginx.pid;
error_log $work/limit-nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  limit_req_zone \$http_authorization zone=one:10m rate=10r/s;
  limit_req_status 429;
  server {
    listen 127.0.0.1:$NGX_PORT;
    location / {
      limit_req zone=one burst=20 nodelay;
      root $work/limit-nginx/www;
      try_files \$uri =404;
    }
  }
}
CONF
}

# --- measuring --------------------------------------------------------------

measure() { # measure SERVER PORT
  local out rps p50 p99 non2xx
  out=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"$DURATION" --latency \
    -H "$AUTH" "http://127.0.0.1:$2$PATH_Q")
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
  p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")
  printf '%-26s %12s %10s %10s %12s\n' "$1" "$rps" "$p50" "$p99" "${non2xx:-0}"
  printf '%s\t%s\t%s\t%s\n' "$1" "$rps" "$(ms "$p50")" "$(ms "$p99")" >>"$work/results.tsv"
}


summary() { # medians per server, in the order first measured
  awk -F'\t' '
    { k = $1
      if (!(k in n)) { order[++m] = k }
      n[k]++; rps[k, n[k]] = $2; p50[k, n[k]] = $3; p99[k, n[k]] = $4 }
    function med(a, k, c,   i, j, t, v) {
      for (i = 1; i <= c; i++) v[i] = a[k, i] + 0
      for (i = 1; i <= c; i++) for (j = i + 1; j <= c; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
      return (c % 2) ? v[(c + 1) / 2] : (v[c / 2] + v[c / 2 + 1]) / 2
    }
    END {
      printf "%-26s %12s %10s %10s %7s %16s\n", "server", "req/s", "p50 ms", "p99 ms", "runs", "vs limit_req"
      for (i = 1; i <= m; i++) if (order[i] == "nginx limit_req") base = med(rps, order[i], n[order[i]])
      for (i = 1; i <= m; i++) {
        k = order[i]; r = med(rps, k, n[k])
        vs = (base > 0 && k != "nginx limit_req") ? sprintf("%+.1f%%", (r / base - 1) * 100) : ""
        printf "%-26s %12.0f %10.3f %10.3f %7d %16s\n", k, r, med(p50, k, n[k]), med(p99, k, n[k]), n[k], vs
      }
    }' "$work/results.tsv"
}

run_round() {
  # nginx + paceline check: refusals answered by the check, twice asked
  start_upstream
  local file="$root/examples/shiplane.toml"
  if [ -n "${CHECK_HTTP1:-}" ]; then
    # the check's connections served by CHECK_HTTP1 (paceline or hyper)
    case $CHECK_HTTP1 in
      paceline | hyper) ;;
      *) echo "CHECK_HTTP1 is paceline or hyper, not $CHECK_HTTP1" >&2; exit 1 ;;
    esac
    file="$work/check.toml"
    sed "s/^\[gateway\]$/[gateway]\nhttp1_server = \"$CHECK_HTTP1\"/" \
      "$root/examples/shiplane.toml" >"$file"
    grep -q "^http1_server = \"$CHECK_HTTP1\"$" "$file" || {
      echo "examples/shiplane.toml has no [gateway] line to add http1_server under" >&2
      exit 1
    }
  fi
  start check "$CHECK_PORT" "$bin" check --config "$file" \
    --listen "127.0.0.1:$CHECK_PORT"
  check_nginx_conf
  start nginx "$NGX_PORT" nginx -p "$work/check-nginx" -c "$work/check-nginx/nginx.conf" -g 'daemon off;'
  measure "nginx + paceline check" "$NGX_PORT"
  stop_all
  # nginx limit_req alone
  start_upstream
  limit_req_conf
  start nginx "$NGX_PORT" nginx -p "$work/limit-nginx" -c "$work/limit-nginx/nginx.conf" -g 'daemon off;'
  measure "nginx limit_req" "$NGX_PORT"
  stop_all
  # the gateway, for reference
  start_upstream
  shipped_gateway_config "$GW_PORT" "$UP_PORT" >"$work/gateway.toml"
  start gateway "$GW_PORT" "$bin" gateway --config "$work/gateway.toml" --threads 1
  measure "paceline gateway" "$GW_PORT"
  stop_all
}

echo "wrk -t1 -c$CONNS -d$DURATION on core $LOAD_CPU; servers and upstream on core $SERVER_CPU"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-26s %12s %10s %10s %12s\n' server "req/s" p50 p99 "non-2xx"
for _ in $(seq 1 "$ROUNDS"); do
  run_round
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "medians over $ROUNDS round(s):"
summary
