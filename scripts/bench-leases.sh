#!/usr/bin/env bash
# One hot key through three instances of the Redis store on one Redis:
# decisions per second counted exactly (every decision in Redis, batched)
# and leased (slices of at most MAX_SLICE, default 1,000, decided
# locally), beside a minimal GCRA Lua script on the same single key
# (redis-benchmark, EVALSHA). Starts its own redis-server on a free port
# and stops it. Every mode runs ROUNDS times (default 3), interleaved; the
# table gives the medians, with Redis calls per 1,000 decisions.
#
#   scripts/bench-leases.sh                  # 50 callers, 3 s a run
#   CALLERS=1 SECONDS_PER_RUN=2 scripts/bench-leases.sh
set -euo pipefail
cd "$(dirname "$0")/.."

CALLERS=${CALLERS:-50}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-3}
ROUNDS=${ROUNDS:-3}
INSTANCES=${INSTANCES:-3}
PORT=${PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}

for c in redis-server redis-cli redis-benchmark; do
    command -v "$c" >/dev/null || { echo "$c is missing: apt-get install redis-server redis-tools" >&2; exit 1; }
done
cargo build --release -q -p paceline-redis --example bench-hot-key
BIN=target/release/examples/bench-hot-key

dir=$(mktemp -d)
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --daemonize no --loglevel warning >/dev/null 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" PING >/dev/null 2>&1 && break; sleep 0.05; done

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

field() { sed "s/.* $1=\([0-9.]*\).*/\1/"; }
med() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
declare -A R C
echo "load before: $(uptime)"
for round in $(seq "$ROUNDS"); do
    for mode in exact leased; do
        out=$("$BIN" "redis://127.0.0.1:$PORT" "$mode" "$CALLERS" "$SECONDS_PER_RUN" "$INSTANCES")
        echo "round $round: $out"
        R[$mode]="${R[$mode]:-} $(field per_second <<<"$out")"
        C[$mode]="${C[$mode]:-} $(field calls_per_1000 <<<"$out")"
    done
    g=$(redis-benchmark -p "$PORT" -n $((60000 * SECONDS_PER_RUN)) -c "$CALLERS" --csv EVALSHA "$SHA" 1 hot 100000000 1 |
        awk -F'"' '/,/ { print $4 }' | tail -1)
    echo "round $round: minimal GCRA on one key: $g"
    R[gcra]="${R[gcra]:-} $g"
done
echo "load after:  $(uptime)"
m() { tr ' ' '\n' <<<"$1" | grep -v '^$' | med; }
ex=$(m "${R[exact]}"); le=$(m "${R[leased]}"); gc=$(m "${R[gcra]}")
echo
printf '%-52s %14s %18s\n' "one hot key, $INSTANCES instances, $CALLERS callers" "decisions/s" "Redis calls/1,000"
printf '%-52s %14.0f %18s\n' "minimal GCRA script (EVALSHA, one round trip each)" "$gc" "1000"
printf '%-52s %14.0f %18s\n' "paceline, exact (batched)" "$ex" "$(m "${C[exact]}")"
printf '%-52s %14.0f %18s\n' "paceline, leased" "$le" "$(m "${C[leased]}")"
awk -v l="$le" -v e="$ex" -v g="$gc" 'BEGIN { printf "leased / exact %.1fx, leased / minimal script %.1fx (target: 10x exact)\n", l / e, l / g }'
