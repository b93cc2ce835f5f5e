#!/usr/bin/env bash
# `paceline rls` decisions per second and p99 latency, at 1 and 50
# concurrent gRPC streams (one HTTP/2 connection, as Envoy's rate-limit
# filter keeps), on the memory store and on Redis, beside a floor: a gRPC
# server of the same library answering OK without deciding, driven by the
# same load generator (crates/paceline-rls/examples/rls-bench.rs).
#
# Each call is one descriptor (remote_address) over 1,000 addresses in
# turn, under a limit none of them reaches: every decision is a real
# check-and-charge (on Redis with a deadline of 1 s, so that no decision
# is a fail-open pass). Starts its own redis-server and servers on free
# loopback ports and stops them.
#
#   scripts/bench-rls.sh                          # 10 s per run, release build (the recorded run)
#   SECONDS_PER_RUN=2 PROFILE=dev scripts/bench-rls.sh   # a smoke run
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE=${PROFILE:-release}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-10}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

command -v redis-server >/dev/null || { echo "redis-server is missing: apt-get install redis-server" >&2; exit 1; }

if [ "$PROFILE" = release ]; then
    cargo build --release -q -p paceline --bin paceline
    cargo build --release -q -p paceline-rls --example rls-bench
    DIR=target/release
else
    cargo build -q -p paceline --bin paceline
    cargo build -q -p paceline-rls --example rls-bench
    DIR=target/debug
fi
PACELINE=$DIR/paceline
LOAD=$DIR/examples/rls-bench

work=$(mktemp -d)
# every process started, one pid a line (`start` runs in a subshell, so
# the list lives in a file)
cleanup() {
    while read -r p; do kill "$p" 2>/dev/null || true; done < "$work/pids"
    sleep 0.2
    rm -rf "$work"
}
: > "$work/pids"
trap cleanup EXIT

cat > "$work/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 1000000000
YAML

# start CMD... ; waits for the line naming the address, prints it
start() {
    local log="$work/$1.log"; shift
    "$@" >"$log" 2>&1 &
    echo $! >> "$work/pids"
    for _ in $(seq 200); do
        local a
        a=$(grep -o 'listening on [0-9.:]*' "$log" | head -1 | cut -d' ' -f3 || true)
        if [ -n "$a" ]; then echo "$a"; return; fi
        sleep 0.05
    done
    echo "did not start: $*" >&2; cat "$log" >&2; exit 1
}

REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" --loglevel warning >/dev/null 2>&1 &
echo $! >> "$work/pids"
for _ in $(seq 100); do redis-cli -p "$REDIS_PORT" PING >/dev/null 2>&1 && break; sleep 0.05; done

MEM=$(start memory "$PACELINE" rls --config "$work/bench.yaml" --listen 127.0.0.1:0)
RED=$(PACELINE_KEY_HASH_SECRET=bench-secret-of-16-bytes start redis "$PACELINE" rls --config "$work/bench.yaml" --listen 127.0.0.1:0 --redis-url "redis://127.0.0.1:$REDIS_PORT" --redis-deadline-ms 1000)
FLOOR=$(start floor "$LOAD" floor --listen 127.0.0.1:0)

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); ${SECONDS_PER_RUN} s per run; profile $PROFILE"
printf '%-10s %8s %14s %8s %8s %8s\n' server streams decisions/s p50_us p99_us errors
for streams in 1 50; do
    for row in "floor $FLOOR" "memory $MEM" "redis $RED"; do
        set -- $row
        out=$("$LOAD" load --addr "$2" --streams "$streams" --seconds "$SECONDS_PER_RUN")
        read -r _ rate _ p50 _ p99 _ _ _ _ _ errors <<<"$out"
        printf '%-10s %8s %14s %8s %8s %8s\n' "$1" "$streams" "$rate" "$p50" "$p99" "$errors"
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
