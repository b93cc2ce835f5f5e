#!/usr/bin/env bash
# Decisions per second against one local redis-server, at 1 and 50
# concurrent callers: plain INCR (the physical limit), a minimal GCRA Lua
# script through EVALSHA (both with redis-benchmark, random keys), and the
# paceline Redis store (the Free plan: burst and daily, one atomic call per
# batch). Starts its own redis-server on a free port and stops it.
#
# Then the server side alone (our function and a floor of MGET + SET per
# key, many decisions a call, driven by redis-benchmark), which tells the
# server's share from our client's.
#
# Prints the machine's load before and after, the table, the ratio of
# ours to the minimal script at each concurrency (the target is 2.2), how
# many decisions each of our calls carried, and the server's own CPU time
# per decision (INFO commandstats: the commands' own time), the client's
# CPU per decision, and the server process's whole CPU per decision
# (/proc: system calls included), figures the machine's load moves less.
#
# Every row is measured ROUNDS times (default 3), the rows interleaved, and
# each figure printed is the median of its rounds (this machine's speed
# moves from minute to minute); the ratio of each round is printed too.
#
#   scripts/bench-redis.sh              # 200,000 requests per run, release build
#   N=2000 PROFILE=dev SECONDS_PER_RUN=1 ROUNDS=1 scripts/bench-redis.sh   # a tiny run
set -euo pipefail
cd "$(dirname "$0")/.."

N=${N:-200000}
PROFILE=${PROFILE:-release}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
ROUNDS=${ROUNDS:-3}
# shellcheck source=scripts/redis-bench-common.sh
. scripts/redis-bench-common.sh
redis_bench_start

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

build_bench_redis

rps() { # the requests per second redis-benchmark printed
    awk -F'"' '/,/ { print $4 }' | tail -1
}

bench_ref() { # CALLERS ARGS...: redis-benchmark's rate and the server's usec
    local c=$1; shift
    cli CONFIG RESETSTAT >/dev/null
    redis-benchmark -p "$PORT" -n "$N" -c "$c" -r 100000 --csv "$@" | rps
}

# The server side alone, driven by redis-benchmark (whose client costs far
# less than a real store's): our function with B decisions a call, and a
# floor any Lua store with one row per key pays (an MGET of the B rows and
# a SET ... PX of each, no arithmetic), 4 connections, random keys.
B=20
FLOOR='local v = redis.call("MGET", unpack(KEYS))
for i = 1, #KEYS do redis.call("SET", KEYS[i], "0123456789abcdefghij", "PX", "86400000") end
return #v'
FSHA=$(cli SCRIPT LOAD "$FLOOR")
keys=(); args=()
# one operation (a check costing one request), its index once a decision
for _ in $(seq "$B"); do keys+=('pl:{__rand_int__}:f'); done
ops=$(printf '\001%.0s' $(seq "$B"))
args=(1 "$ops" c 0 1 0)
batched() { # ARGS...: decisions per second (calls per second x B)
    cli CONFIG RESETSTAT >/dev/null
    redis-benchmark -p "$PORT" -n "$((N / B))" -c 4 -r 100000 --csv "$@" | rps |
        awk -v b="$B" '{ printf "%d", $1 * b }'
}

echo "load before: $(uptime)"
for round in $(seq "$ROUNDS"); do
    t0=$(ticks); put incr1 "$(bench_ref 1 INCR 'k:__rand_int__')"; put uincr1 "$(upc incr)"
    t1=$(ticks); put incr50 "$(bench_ref 50 INCR 'k:__rand_int__')"; put uincr50 "$(upc incr)"
    t2=$(ticks); put g1 "$(bench_ref 1 EVALSHA "$SHA" 1 'g:__rand_int__' 20 2)"; put ug1 "$(upc evalsha)"
    t3=$(ticks); put g50 "$(bench_ref 50 EVALSHA "$SHA" 1 'g:__rand_int__' 20 2)"; put ug50 "$(upc evalsha)"
    t4=$(ticks); read -r p1 n1 c1 u1 cpu1 <<<"$(ours 1)"
    t5=$(ticks); read -r p50 n50 c50 u50 cpu50 <<<"$(ours 50)"
    t6=$(ticks)
    put p1 "$p1"; put p50 "$p50"; put cpu1 "$cpu1"; put cpu50 "$cpu50"
    put per1 "$(ratio "$n1" "$c1")"; put per50 "$(ratio "$n50" "$c50")"
    put f1 "$(per "$u1" "$n1")"; put f50 "$(per "$u50" "$n50")"
    put sincr1 "$(tick_us "$t0" "$t1" "$N")"; put sincr50 "$(tick_us "$t1" "$t2" "$N")"
    put sg1 "$(tick_us "$t2" "$t3" "$N")"; put sg50 "$(tick_us "$t3" "$t4" "$N")"
    put sp1 "$(tick_us "$t4" "$t5" "$n1")"; put sp50 "$(tick_us "$t5" "$t6" "$n50")"
    # the function the store loaded (its name carries the version)
    fn=$(cli FUNCTION LIST | tr -d '\r' | grep -m1 '^paceline_v[0-9]*_run$' || true)
    if [ -n "$fn" ]; then
        put fn4 "$(batched FCALL "$fn" "$B" "${keys[@]}" T 1000 30000 1 't,20,2,0,0,r;f,10000,86400,0,0,r' "${args[@]}")"
        put ufn4 "$(per "$(usec fcall)" "$((N / B * B))")"
    fi
    put floor4 "$(batched EVALSHA "$FSHA" "$B" "${keys[@]}")"; put ufloor4 "$(per "$(usec evalsha)" "$((N / B * B))")"
    echo "round $round: ours / minimal script $(ratio "$p1" "${M[g1]##* }") at 1 caller, $(ratio "$p50" "${M[g50]##* }") at 50" >&2
done
echo "load after:  $(uptime)"
echo
row() { printf '%-44s %10s %10s\n' "$@"; }
row "decisions per second (median of $ROUNDS)" "1 caller" "50 callers"
row "INCR (the physical limit)" "$(med incr1)" "$(med incr50)"
row "minimal GCRA (EVALSHA)" "$(med g1)" "$(med g50)"
row "paceline store (Free plan)" "$(med p1)" "$(med p50)"
row "paceline / minimal GCRA (target 2.2)" "$(ratio "$(med p1)" "$(med g1)")" "$(ratio "$(med p50)" "$(med g50)")"
row "INCR / minimal GCRA (one round trip each)" "$(ratio "$(med incr1)" "$(med g1)")" "$(ratio "$(med incr50)" "$(med g50)")"
row "paceline decisions per Redis call" "$(med per1)" "$(med per50)"
echo
row "the server side alone ($B decisions a call)" "per second" "us each"
row "paceline function (redis-benchmark, -c 4)" "$(med fn4)" "$(med ufn4)"
row "floor: MGET + SET per key, no arithmetic" "$(med floor4)" "$(med ufloor4)"
row "paceline function / minimal GCRA at 50" "$(ratio "$(med fn4)" "$(med g50)")" ""
echo
row "Redis CPU per decision (us, commandstats)" "1 caller" "50 callers"
row "INCR" "$(med uincr1)" "$(med uincr50)"
row "minimal GCRA (EVALSHA, script time)" "$(med ug1)" "$(med ug50)"
row "paceline store (FCALL time / decisions)" "$(med f1)" "$(med f50)"
row "paceline client's own CPU per decision (us)" "$(med cpu1)" "$(med cpu50)"
echo
row "redis-server CPU per decision (us, /proc)" "1 caller" "50 callers"
row "INCR" "$(med sincr1)" "$(med sincr50)"
row "minimal GCRA (EVALSHA)" "$(med sg1)" "$(med sg50)"
row "paceline store" "$(med sp1)" "$(med sp50)"
