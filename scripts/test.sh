#!/usr/bin/env bash
# The whole test suite: formatting, lints, and every test of the workspace.
# Installs what the tests need when it is missing (Debian packages).
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkg() { # need_pkg COMMAND PACKAGE [APT-OPTION...]
    if ! command -v "$1" >/dev/null 2>&1; then
        echo "installing $2 (for $1)"
        if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
        $SUDO apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${@:3}" "$2" >/dev/null
    fi
}

# The peers of crates/paceline/tests/peers.rs: rate limiters nobody here
# wrote. nginx from Debian; express and express-rate-limit from npm, into
# target/peers (nothing global), only when missing.
need_pkg /usr/sbin/nginx nginx
# the proxies of crates/paceline-gateway/tests/check.rs (nginx above too)
need_pkg caddy caddy
# the TLS tests of crates/paceline-gateway/tests/tls.rs
need_pkg curl curl
need_pkg openssl openssl
# the checks of deploy/ (deploy/check.sh, crates/paceline/tests/deploy.rs)
need_pkg systemd-analyze systemd
# (only for its promtool: none of the exporters it recommends)
need_pkg promtool prometheus --no-install-recommends
need_pkg node nodejs
need_pkg chromium chromium
need_pkg redis-server redis-server
need_npm_peers() {
    local dir=target/peers
    if [ ! -d "$dir/node_modules/express-rate-limit" ] || [ ! -d "$dir/node_modules/express" ]; then
        need_pkg npm npm
        echo "installing express and express-rate-limit (npm, into $dir)"
        mkdir -p "$dir"
        [ -f "$dir/package.json" ] || echo '{"name": "paceline-peers", "private": true}' > "$dir/package.json"
        (cd "$dir" && npm install --no-audit --no-fund --silent express@5.3.0 express-rate-limit@8.7.5 >/dev/null)
    fi
}
mkdir -p target
need_npm_peers

export CARGO_TERM_COLOR=never
# No incremental files: a test run builds each crate once (they took 4.8 GB
# of the 16 GB a full-debug-information build of the tests used).
export CARGO_INCREMENTAL=0
echo "== disk before the build: $(df -h . | awk 'NR==2 { print $4 " free of " $2 }')"
echo "== cargo fmt --check"
cargo fmt --all -- --check
(cd examples-outside/sdk-user && cargo fmt -- --check)
echo "== cargo clippy --all-targets -D warnings"
cargo clippy --workspace --all-targets --all-features -- -D warnings
echo "== what the binary is built from: no test code"
# the release binary links only what it runs: no certificate maker, bench
# or property-test crate, no debugging recorder
test_code=$(cargo tree -p paceline -e normal,features --prefix none \
    | grep -E '^(rcgen|criterion|proptest) |metrics-util feature "debugging"' | sort -u || true)
if [ -n "$test_code" ]; then
    echo "the paceline binary depends on test code:"
    echo "$test_code"
    exit 1
fi
echo "== cargo test"
cargo test --workspace --all-features --no-fail-fast 2>&1 | tee target/test-output.txt
# The SDK as a new user meets it: examples-outside/sdk-user, a crate outside
# the workspace on the reqwest, reqwest-middleware, hyper and tower versions
# `cargo add` picks, runs the README's example (and the same through the
# tower adapter) against `paceline demo --no-race` on a free loopback port. It
# shares the workspace's target directory, so only the crates whose
# features differ build again (13 s on a quiet 2-core machine).
echo "== deploy/ (systemd-analyze verify, promtool check/test rules)"
deploy/check.sh
echo "== the client README's example, from a crate outside the workspace"
sdk_user() {
    local dir="${CARGO_TARGET_DIR:-target}"
    case "$dir" in /*) ;; *) dir="$(pwd)/$dir" ;; esac
    cargo build -q -p paceline --bin paceline
    (cd examples-outside/sdk-user && CARGO_TARGET_DIR="$dir" cargo build -q)
    "$dir/debug/paceline" demo --no-race --listen 127.0.0.1:0 >"$dir/sdk-user-demo.txt" 2>&1 &
    local demo=$!
    local url=""
    for _ in $(seq 100); do
        url=$(sed -n 's/^paceline demo: gateway on //p' "$dir/sdk-user-demo.txt")
        [ -n "$url" ] && break
        sleep 0.1
    done
    local ok=0
    if [ -n "$url" ] && PACELINE_URL="$url" timeout 60 "$dir/debug/sdk-user" >"$dir/sdk-user.txt" 2>&1 \
        && tail -n 1 "$dir/sdk-user.txt" | grep -qx '60 labels created, 0 failed' \
        && PACELINE_URL="$url" timeout 60 "$dir/debug/sdk-user-tower" >>"$dir/sdk-user.txt" 2>&1 \
        && tail -n 1 "$dir/sdk-user.txt" | grep -qx '30 of 30 quotes through tower'; then
        ok=1
    fi
    kill "$demo" 2>/dev/null || true
    wait "$demo" 2>/dev/null || true
    if [ "$ok" = 1 ]; then
        echo "sdk-user, against $url:"
        tail -n 2 "$dir/sdk-user.txt" | sed 's/^/  /'
    else
        echo "sdk-user: FAILED (the demo: $dir/sdk-user-demo.txt; the example's output:)"
        tail -n 20 "$dir/sdk-user.txt" 2>/dev/null || true
        return 1
    fi
}
sdk_user
# The noisy-neighbour bound is about what users run, a release build (in
# the debug run above it is ignored, so it counts once as skipped there and
# once here). It runs alone, after the rest, since it measures latency.
# Leased budgets across three gateway processes on one redis-server offer
# 15,000 requests a second, which a debug build cannot: they run here too.
echo "== noisy neighbour, leases across processes (release; disk: $(df -h . | awk 'NR==2 { print $4 " free" }'))"
cargo test --release -p paceline-gateway --features redis --test noisy --test leases_processes \
    -- --ignored --nocapture 2>&1 | tee -a target/test-output.txt
# One closing line for the whole run, summed over every test binary.
awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "%d passed, %d failed, %d skipped\n", p, f, i }' target/test-output.txt

# ---------------------------------------------------------------------------
# Fuzzing: the targets of fuzz/ (a workspace of its own at the root, so
# the builds above never compile it): `parse` (rate-limit answers), `config`
# (the gateway's file, as `paceline gateway --check` reads it), `identity`
# (keys and client addresses from hostile heads), `forwarded` (the
# original request `paceline check` reads from a proxy's fields) and `rls`
# (envoyproxy/ratelimit's YAML, as `paceline rls --check` reads it). Each
# runs for FUZZ_SECONDS (60 by default; 0 skips this step) from its committed seeds
# (fuzz/seeds/) and what earlier runs found (target/fuzz-corpus/). A crash
# or a hang fails the script; the input is kept in fuzz/artifacts/.
# cargo-fuzz needs -Z flags: RUSTC_BOOTSTRAP=1 allows them on stable.
# From cold (no cargo-fuzz, no fuzz build; crates already downloaded) the
# step took 354 s on a quiet 2-core machine: installing cargo-fuzz 36 s,
# the build 132 s, the three runs 3 min; 977 s with the cores shared with
# other builds (load average 6-10).
# ---------------------------------------------------------------------------
fuzz_seconds="${FUZZ_SECONDS:-60}"
if [ "$fuzz_seconds" -gt 0 ]; then
    echo "== cargo fuzz (${fuzz_seconds} s per target)"
    fuzz_start=$(date +%s)
    if ! cargo fuzz --version >/dev/null 2>&1; then
        echo "installing cargo-fuzz"
        cargo install cargo-fuzz --locked
    fi
    fuzz_dir="${CARGO_TARGET_DIR:-target}"
    case "$fuzz_dir" in /*) ;; *) fuzz_dir="$(pwd)/$fuzz_dir" ;; esac
    fuzz_passed=0
    fuzz_failed=0
    export RUSTC_BOOTSTRAP=1
    cargo fuzz build -O --target-dir "$fuzz_dir/fuzz"
    for t in parse config identity forwarded rls; do
        mkdir -p "$fuzz_dir/fuzz-corpus/$t"
        if cargo fuzz run -O --target-dir "$fuzz_dir/fuzz" "$t" \
            "$fuzz_dir/fuzz-corpus/$t" "fuzz/seeds/$t" -- \
            -max_total_time="$fuzz_seconds" -timeout=10 -max_len=8192 \
            >"$fuzz_dir/fuzz-$t.txt" 2>&1; then
            fuzz_passed=$((fuzz_passed + 1))
            echo "fuzz $t: ok, $(grep -m1 -o 'Done [0-9]* runs' "$fuzz_dir/fuzz-$t.txt" || echo 'runs unknown')"
        else
            fuzz_failed=$((fuzz_failed + 1))
            echo "fuzz $t: FAILED (last lines of $fuzz_dir/fuzz-$t.txt):"
            grep -v '# Uses:' "$fuzz_dir/fuzz-$t.txt" | tail -n 25
        fi
    done
    echo "fuzz: $fuzz_passed passed, $fuzz_failed failed ($((fuzz_passed + fuzz_failed)) targets, ${fuzz_seconds} s each, $(($(date +%s) - fuzz_start)) s in all)"
    [ "$fuzz_failed" -eq 0 ]
fi
