#!/usr/bin/env bash
# Decisions per second against one local redis-server, at 1 and 50
# concurrent callers: plain INCR (the physical limit), a minimal GCRA Lua
# script through EVALSHA (both with redis-benchmark, random keys), and the
# paceline Redis store (the Free plan: burst and daily, one atomic call per
# batch). Starts its own redis-server on a free port and stops it.
#
#   scripts/bench-redis.sh              # 200,000 requests per run, release build
#   N=2000 PROFILE=dev SECONDS_PER_RUN=1 scripts/bench-redis.sh   # a tiny run
set -euo pipefail
cd "$(dirname "$0")/.."

N=${N:-200000}
PROFILE=${PROFILE:-release}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
PORT=${PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}

for c in redis-server redis-cli redis-benchmark; do
    command -v "$c" >/dev/null || { echo "$c is missing: apt-get install redis-server redis-tools" >&2; exit 1; }
done

dir=$(mktemp -d)
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --daemonize no --loglevel warning >/dev/null 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" PING >/dev/null 2>&1 && break; sleep 0.05; done

# the minimal GCRA: one key, TIME, GET, SET with a TTL
GCRA='local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local q, w = tonumber(ARGV[1]), tonumber(ARGV[2]) * 1000000
local e = w / q
local tat = tonumber(redis.call("GET", KEYS[1])) or now
if tat < now then tat = now end
if tat + e - now > w then return 0 end
redis.call("SET", KEYS[1], tat + e, "PX", math.ceil(w / 1000))
return 1'
SHA=$(redis-cli -p "$PORT" SCRIPT LOAD "$GCRA")

if [ "$PROFILE" = release ]; then
    cargo build --release -q -p paceline-redis --example bench-redis
    BIN=target/release/examples/bench-redis
else
    cargo build -q -p paceline-redis --example bench-redis
    BIN=target/debug/examples/bench-redis
fi

rps() { # the requests per second redis-benchmark printed
    awk -F'"' '/,/ { print $4 }' | tail -1
}

printf '%-28s %10s %10s\n' "what" "1 caller" "50 callers"
incr1=$(redis-benchmark -p "$PORT" -n "$N" -c 1 -r 100000 --csv INCR 'k:__rand_int__' | rps)
incr50=$(redis-benchmark -p "$PORT" -n "$N" -c 50 -r 100000 --csv INCR 'k:__rand_int__' | rps)
printf '%-28s %10s %10s\n' "INCR" "$incr1" "$incr50"
g1=$(redis-benchmark -p "$PORT" -n "$N" -c 1 -r 100000 --csv EVALSHA "$SHA" 1 'g:__rand_int__' 20 2 | rps)
g50=$(redis-benchmark -p "$PORT" -n "$N" -c 50 -r 100000 --csv EVALSHA "$SHA" 1 'g:__rand_int__' 20 2 | rps)
printf '%-28s %10s %10s\n' "minimal GCRA (EVALSHA)" "$g1" "$g50"
p1=$("$BIN" "redis://127.0.0.1:$PORT" 1 "$SECONDS_PER_RUN" | sed 's/.*per_second=\([0-9]*\).*/\1/')
p50=$("$BIN" "redis://127.0.0.1:$PORT" 50 "$SECONDS_PER_RUN" | sed 's/.*per_second=\([0-9]*\).*/\1/')
printf '%-28s %10s %10s\n' "paceline store (Free plan)" "$p1" "$p50"
