#!/usr/bin/env bash
# Decisions per second against one local redis-server at 50 concurrent
# callers, random keys out of 100,000: the paceline Redis store (exact, the
# Free plan: a token bucket of 20 per 2 s and a daily quota of 10,000; the
# bench-redis example of paceline-redis) against the `limitador` crate's
# Redis storage checking the same two limits per key (limitador counts
# fixed windows: 20 in each 2 s window and 10,000 a day), each caller one
# check at a time, through `AsyncRedisStorage`, limitador's Redis storage.
# Its `CachedRedisStorage` (counters kept in the process, flushed to Redis
# every second, not exact) is not measured: in limitador 0.14.0 it
# deadlocks within a second at 50 concurrent callers.
#
# The limitador side is crates/paceline-redis/bench-limitador, a workspace
# of its own (the workspace's builds and tests never compile it). Its first
# build compiles RocksDB (limitador's Redis storage does not build without
# its disk storage) and needs libclang: apt-get install libclang-dev.
#
# Starts its own redis-server on a free loopback port and stops it. Every
# row is measured ROUNDS times (default 3), the rows interleaved (their
# order swapped every other round) and the database flushed before each;
# the figures printed are the medians of the rounds, and each round's ratio
# is printed as it ends. Per row it also prints the scripts or functions
# Redis ran per decision (`EVALSHA`, `FCALL`: one call can carry many
# decisions), the commands those ran plus any sent alone (`INFO
# commandstats`), the redis-server process's CPU per decision (/proc) and
# the client process's own. A run not over a minute after its time fails
# the script.
#
#   scripts/bench-limitador.sh                               # 5 s per run
#   ROUNDS=1 SECONDS_PER_RUN=2 scripts/bench-limitador.sh    # a smoke run
set -euo pipefail
cd "$(dirname "$0")/.."

CALLERS=${CALLERS:-50}
KEYS=${KEYS:-100000}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
ROUNDS=${ROUNDS:-3}

# shellcheck source=scripts/redis-bench-common.sh
. scripts/redis-bench-common.sh
redis_bench_start

PROFILE=release build_bench_redis
cargo build --release -q --manifest-path crates/paceline-redis/bench-limitador/Cargo.toml \
    --target-dir "$(target_dir)/bench-limitador"
THEIRS=$(target_dir)/bench-limitador/release/paceline-bench-limitador

# the top-level scripts and functions run since the last CONFIG RESETSTAT
# (commands inside them are counted in commandstats too, each as its own)
SCRIPTS='^cmdstat_(evalsha|evalsha_ro|eval|eval_ro|fcall|fcall_ro)$'
# the commands of the measuring itself
OWN='^cmdstat_(info|config|flushdb|ping|client|hello|select)$'
calls() { # "scripts commands": what Redis ran since the last CONFIG RESETSTAT
    cli INFO commandstats | tr -d '\r' | awk -F'[:,=]' -v s="$SCRIPTS" -v o="$OWN" '
        /^cmdstat_/ && $1 !~ o { if ($1 ~ s) n += $3; else m += $3 }
        END { printf "%d %d\n", n, m }'
}

run() { # NAME COMMAND...: one row's run, its figures put under NAME
    local name=$1; shift
    cli FLUSHDB >/dev/null
    cli CONFIG RESETSTAT >/dev/null
    local t0 t1 out n s m
    t0=$(ticks)
    if ! out=$(timeout "$LIMIT" "$@"); then
        echo "$name: failed or still running after $LIMIT s" >&2
        exit 1
    fi
    t1=$(ticks)
    echo "  $name: $out" >&2
    n=$(field decisions <<<"$out")
    read -r s m <<<"$(calls)"
    put "$name" "$(field per_second <<<"$out")"
    put "$name.scripts" "$(per "$s" "$n")"
    put "$name.commands" "$(per "$m" "$n")"
    put "$name.server" "$(tick_us "$t0" "$t1" "$n")"
    put "$name.client" "$(field cpu_us <<<"$out")"
    if [ "$(field errors <<<"$out")" != 0 ]; then echo "  $name: errors in this run" >&2; fi
}

url="redis://127.0.0.1:$PORT"
LIMIT=$(awk -v s="$SECONDS_PER_RUN" 'BEGIN { printf "%d", s + 60 }')
row_run() {
    case "$1" in
        ours) run ours "$BIN" "$url" "$CALLERS" "$SECONDS_PER_RUN" "$KEYS" ;;
        async) run async "$THEIRS" "$url" "$CALLERS" "$SECONDS_PER_RUN" "$KEYS" ;;
    esac
}
last() { echo "${M[$1]##* }"; } # a metric's value in the latest round

echo "load before: $(uptime)"
for round in $(seq "$ROUNDS"); do
    order=(ours async)
    if [ $((round % 2)) = 0 ]; then order=(async ours); fi
    echo "round $round: ${order[*]}" >&2
    for r in "${order[@]}"; do row_run "$r"; done
    echo "round $round: paceline / limitador async $(ratio "$(last ours)" "$(last async)")" >&2
done
echo "load after:  $(uptime)"
echo
fmt() { printf '%-44s %11s %9s %9s %10s %10s\n' "$@"; }
fmt "at $CALLERS callers, $KEYS keys (median of $ROUNDS)" "decisions/s" "scripts" "commands" "server us" "client us"
show() { # NAME LABEL
    fmt "$2" "$(med "$1")" "$(med "$1.scripts")" "$(med "$1.commands")" "$(med "$1.server")" "$(med "$1.client")"
}
show ours "paceline store (exact, Free plan)"
show async "limitador AsyncRedisStorage"
echo
echo "paceline / limitador AsyncRedisStorage (target 2.0): $(ratio "$(med ours)" "$(med async)")"
echo "(per decision: scripts or functions Redis ran, the commands they ran"
echo " and any sent alone, redis-server's CPU and the client's, in us)"
