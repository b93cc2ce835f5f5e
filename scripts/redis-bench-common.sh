# Sourced by the Redis benchmark scripts (bench-redis.sh, bench-limitador.sh):
# what they share. Run from the repository's root, under set -euo pipefail.

# redis_bench_start: a redis-server of its own on 127.0.0.1:$PORT (a free
# port unless PORT is set), no persistence, in a directory of its own; its
# process id in $pid. Both go at exit.
redis_bench_start() {
    local c
    for c in redis-server redis-cli redis-benchmark; do
        command -v "$c" >/dev/null || { echo "$c is missing: apt-get install redis-server redis-tools" >&2; exit 1; }
    done
    PORT=${PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
    dir=$(mktemp -d)
    redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --daemonize no --loglevel warning >/dev/null 2>&1 &
    pid=$!
    trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
    for _ in $(seq 100); do redis-cli -p "$PORT" PING >/dev/null 2>&1 && break; sleep 0.05; done
}

# target_dir: cargo's target directory ($CARGO_TARGET_DIR or target/), as
# an absolute path.
target_dir() {
    local t=${CARGO_TARGET_DIR:-target}
    case "$t" in /*) ;; *) t="$(pwd)/$t" ;; esac
    echo "$t"
}

# build_bench_redis: the bench-redis example of paceline-redis, in
# $PROFILE (release unless set); its path in $BIN.
build_bench_redis() {
    if [ "${PROFILE:-release}" = release ]; then
        cargo build --release -q -p paceline-redis --example bench-redis
        BIN=$(target_dir)/release/examples/bench-redis
    else
        cargo build -q -p paceline-redis --example bench-redis
        BIN=$(target_dir)/debug/examples/bench-redis
    fi
}

cli() { redis-cli -p "$PORT" "$@"; }

stat() { # FIELD COMMAND: usec (5) or usec_per_call (7) in INFO commandstats
    cli INFO commandstats | tr -d '\r' | awk -F'[:,=]' -v c="cmdstat_$2" -v f="$1" '$1 == c { print $f; x=1 } END { if (!x) print 0 }'
}
usec() { stat 5 "$1"; }
upc() { stat 7 "$1"; }

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }

per() { # usec per decision: total usec / decisions
    awk -v u="$1" -v n="$2" 'BEGIN { if (n > 0) printf "%.2f", u / n; else print "-" }'
}

# field NAME: the value of NAME=... in the line on standard input (the
# benchmark examples print one line of such fields)
field() { sed -nE "s/(^|.* )$1=([^ ]*).*/\2/p"; }

ours() { # CALLERS: "rate decisions calls usec cpu" of the paceline store
    cli CONFIG RESETSTAT >/dev/null
    local out
    out=$("$BIN" "redis://127.0.0.1:$PORT" "$1" "$SECONDS_PER_RUN")
    echo "$out" >&2
    echo "$(field per_second <<<"$out") $(field decisions <<<"$out") $(field calls <<<"$out") $(usec fcall) $(field cpu_us <<<"$out")"
}

ticks() { # the server's CPU time so far (user + system), in clock ticks
    awk '{ print $14 + $15 }' "/proc/$pid/stat"
}
tick_us() { # TICKS_BEFORE TICKS_AFTER DECISIONS: the server's CPU us per decision
    awk -v a="$1" -v b="$2" -v n="$3" -v hz="$(getconf CLK_TCK)" 'BEGIN { if (n > 0) printf "%.2f", (b - a) * 1e6 / hz / n; else print "-" }'
}

declare -A M # metric -> its value in each round, space-separated
put() { M[$1]="${M[$1]:-} $2"; }
med() { # the median of a metric's rounds
    tr ' ' '\n' <<<"${M[$1]:-}" | grep -v '^$' | grep -v '^-$' | sort -g |
        awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
