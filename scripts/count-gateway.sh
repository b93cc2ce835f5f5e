#!/usr/bin/env bash
# Instructions the gateway spends per request, counted by callgrind: a
# figure that does not move with the machine's load, for comparing two
# builds of the gateway where wrk's rates are too noisy to tell them apart.
#
#   scripts/count-gateway.sh              # admitted (proxied) and 429 paths
#   PATHS="shipped" scripts/count-gateway.sh   # examples/shiplane.toml as shipped
#   PACELINE_BIN=/path/to/paceline scripts/count-gateway.sh
#
# Paths: `admitted` and `429` use the tuned configuration of
# gateway-bench-common.sh (per-IP key, one token bucket, no shedding, no
# escalation); `shipped` is examples/shiplane.toml unchanged but for its
# addresses (a Free key, two policies, shedding and escalation on), with
# one key past its burst: the 429s a client that ignores Retry-After gets.
#
# One client sends requests one after another on one keep-alive
# connection. The gateway runs under callgrind twice, for N and 2N
# requests; its counters are zeroed after start-up and a few warm-up
# requests (clock calibration and first-use set-up vary from run to run),
# and the difference divided by N is the cost of one request. It counts
# the gateway's own user-space instructions only: system calls are not in
# it.
# Needs: valgrind, python3, taskset (Debian packages), a release build.
set -euo pipefail

N=${N:-3000}
UP_PORT=${UP_PORT:-18191}
GW_PORT=${GW_PORT:-18192}
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/gateway-bench-common.sh
. "$root/scripts/gateway-bench-common.sh"
bin=${PACELINE_BIN:-$root/target/release/paceline}

for tool in valgrind callgrind_control python3 taskset; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "missing $tool; install it with: apt-get install -y ${tool/callgrind_control/valgrind}" >&2
    exit 1
  }
done
if [ ! -x "$bin" ]; then
  (cd "$root" && cargo build --release -p paceline)
fi

work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT


send() { # send COUNT: one request after another, each answer read whole
  python3 - "$GW_PORT" "$1" "${AUTH:-}" <<'PY'
import re, socket, sys
port, count, auth = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
s = socket.create_connection(("127.0.0.1", port))
extra = f"Authorization: Bearer {auth}\r\n".encode() if auth else b""
req = b"GET /v1/rates HTTP/1.1\r\nHost: bench\r\n" + extra + b"\r\n"
buf = b""
for _ in range(count):
    s.sendall(req)
    while True:
        head, sep, rest = buf.partition(b"\r\n\r\n")
        if sep:
            n = int(re.search(rb"content-length: *(\d+)", head, re.I).group(1))
            if len(rest) >= n:
                buf = rest[n:]
                break
        chunk = s.recv(65536)
        if not chunk:
            sys.exit("the gateway closed the connection")
        buf += chunk
PY
}

count() { # count CONFIG REQUESTS: instructions of one gateway run
  local out="$work/cg.$RANDOM"
  taskset -c 0 valgrind --tool=callgrind \
    --callgrind-out-file="$out" "$bin" gateway --config "$1" >/dev/null 2>&1 &
  local gw=$!
  wait_port "$GW_PORT"
  send 20
  callgrind_control -z "$gw" >/dev/null 2>&1
  send "$2"
  kill "$gw"
  wait "$gw" 2>/dev/null || true
  awk '/^totals:/ {print $2}' "$out"
}

"$bin" demo --upstream-only --listen "127.0.0.1:$UP_PORT" >/dev/null 2>&1 &
wait_port "$UP_PORT"

bench_gateway_config "$GW_PORT" "$UP_PORT" 100000000 100 >"$work/admitted.toml"
bench_gateway_config "$GW_PORT" "$UP_PORT" 20 2 >"$work/429.toml"
shipped_gateway_config "$GW_PORT" "$UP_PORT" >"$work/shipped.toml"
printf '%-12s %14s\n' path "instr/request"
for path in ${PATHS:-admitted 429}; do
  auth=""
  [ "$path" = shipped ] && auth=sk_demo_alice
  a=$(AUTH=$auth count "$work/$path.toml" "$N")
  b=$(AUTH=$auth count "$work/$path.toml" $((2 * N)))
  printf '%-12s %14d\n' "$path" $(((b - a) / N))
done
