# Sourced by the gateway benchmark scripts: what they share.
#
# bench_gateway_config GW_PORT UP_PORT Q W: a gateway on 127.0.0.1:GW_PORT
# in front of 127.0.0.1:UP_PORT, keyed by client IP, one token bucket of
# Q requests per W seconds, no shedding and no escalation (the peers it is
# compared with have neither), written to standard output.
bench_gateway_config() {
  cat <<CONF
key = "ip"
default_plan = "bench"

[gateway]
listen = "127.0.0.1:$1"
upstream = "http://127.0.0.1:$2"
watch = false

[gateway.shedding]
max_in_flight = 0

[plans.bench]
policies = [{ name = "burst", algorithm = "token_bucket", q = $3, w = $4 }]

[escalation]
enabled = false
CONF
}

# shipped_gateway_config GW_PORT UP_PORT: examples/shiplane.toml as shipped,
# only its listen and upstream addresses changed, to standard output.
shipped_gateway_config() {
  sed -e "s|^listen = .*|listen = \"127.0.0.1:$1\"|" \
      -e "s|^upstream = .*|upstream = \"http://127.0.0.1:$2\"|" \
      "$root/examples/shiplane.toml"
}

# haproxy_conf RATE BURST [KEY]: $work/haproxy.cfg, HAProxy on
# 127.0.0.1:$HAP_PORT in front of 127.0.0.1:$UP_PORT, limiting each client
# IP (or KEY, a sample expression) to BURST requests over BURST/RATE
# seconds, HAProxy's closest to a token bucket; it tells the upstream who
# asked unless FORWARDED=0, and answers a 429 with ANS_BODY and the fields
# ANS_POLICY and ANS_LIMIT when ANS_BODY is set (else its own deny page).
haproxy_conf() {
  # over a window of BURST/RATE seconds at most BURST requests
  local window=$(($2 / $1)) type=ip track=src forwarded="" denied=""
  if [ -n "${ANS_BODY:-}" ]; then
    denied=" content-type application/problem+json hdr cache-control no-store hdr ratelimit-policy '$ANS_POLICY' hdr ratelimit '$ANS_LIMIT' hdr retry-after 1 string '$ANS_BODY'"
  fi
  if [ -n "${3:-}" ]; then type="string len 64" track=$3; fi
  if [ "${FORWARDED:-1}" = 1 ]; then
    forwarded=$'  option forwardfor\n  http-request set-header X-Forwarded-Proto http'
  fi
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
  stick-table type $type size 100k expire 60s store http_req_rate(${window}s)
  http-request track-sc0 $track
  http-request deny deny_status 429$denied if { sc_http_req_rate(0) gt $2 }
$forwarded
  default_backend be
backend be
  server up 127.0.0.1:$UP_PORT
EOF
}

# nginx_conf RATE BURST MODE [KEY]: $work/nginx.conf, nginx on
# 127.0.0.1:$NGX_PORT limiting each client IP (or KEY, a variable) to RATE
# r/s with a burst of BURST, serving admitted requests as MODE says
# (static: a file like the demo API's answer; proxy: 127.0.0.1:$UP_PORT,
# telling it who asked unless FORWARDED=0), over TLS with TLS=1; a 429
# answered like haproxy_conf's when ANS_BODY is set.
nginx_conf() {
  mkdir -p "$work/www/v1"
  printf '{"rates":[{"id":"rate_ups_ground","amount":"7.45"}]}' >"$work/www/v1/rates"
  chmod -R a+rX "$work/www"
  local body listen="127.0.0.1:$NGX_PORT" denied=""
  if [ -n "${ANS_BODY:-}" ]; then
    denied="error_page 429 @denied;
    location @denied {
      default_type application/problem+json;
      add_header Cache-Control no-store always;
      add_header RateLimit-Policy '$ANS_POLICY' always;
      add_header RateLimit '$ANS_LIMIT' always;
      add_header Retry-After 1 always;
      return 429 '$ANS_BODY';
    }"
  fi
  if [ -n "${TLS:-}" ]; then
    listen="$listen ssl; ssl_certificate $work/tls.pem; ssl_certificate_key $work/tls.key; ssl_protocols TLSv1.2 TLSv1.3; ssl_session_cache shared:SSL:10m"
  fi
  if [ "$3" = static ]; then
    # not `return`: it would run before limit_req
    body="root $work/www; try_files \$uri =404;"
  else
    body="proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection \"\";"
    if [ "${FORWARDED:-1}" = 1 ]; then
      body="$body proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for; proxy_set_header X-Forwarded-Proto \$scheme;"
    fi
  fi
  cat >"$work/nginx.conf" <<EOF
worker_processes 1;
pid $work/nginx.pid;
error_log $work/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  limit_req_zone ${4:-\$binary_remote_addr} zone=one:10m rate=$1r/s;
  limit_req_status 429;
  upstream up { server 127.0.0.1:$UP_PORT; keepalive 64; }
  server {
    listen $listen;
    $denied
    location / {
      limit_req zone=one burst=$2 nodelay;
      $body
    }
  }
}
EOF
}

# preempted PID...: how often they were taken off their core while
# runnable (their nonvoluntary_ctxt_switches), summed.
preempted() {
  local n=0 p v
  for p in "$@"; do
    v=$(awk '/^nonvoluntary_ctxt_switches/ {print $2}' "/proc/$p/status" 2>/dev/null) || continue
    n=$((n + ${v:-0}))
  done
  echo "$n"
}

# wait_port PORT: until something listens on 127.0.0.1:PORT (up to 10 s;
# under valgrind the gateway takes a while), or exit.
wait_port() {
  for _ in $(seq 1 200); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "nothing listens on port $1" >&2
  exit 1
}

# need CMD PACKAGE: CMD on the PATH, or exit saying how to install it.
need() {
  command -v "$1" >/dev/null 2>&1 || {
    echo "missing $1; install it with: apt-get install -y $2" >&2
    exit 1
  }
}

# bench_setup: a work directory ($work, removed at exit) and the list of
# the servers started ($pids, stopped at exit).
bench_setup() {
  work=$(mktemp -d)
  chmod 755 "$work"
  pids=()
  trap bench_cleanup EXIT
}

bench_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}

# stop_all: every server started so far, stopped and waited for.
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}

# start NAME PORT CMD...: CMD on $SERVER_CPU, its output in $work/NAME.log,
# until something listens on PORT.
start() {
  local name=$1 port=$2
  shift 2
  taskset -c "$SERVER_CPU" "$@" >"$work/$name.log" 2>&1 &
  pids+=($!)
  wait_port "$port"
}

# ms VALUE: wrk's latency (us, ms or s) in milliseconds.
ms() {
  awk -v v="$1" 'BEGIN {
    n = v + 0
    if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n = n; else if (v ~ /s$/) n *= 1000
    printf "%.3f", n
  }'
}
