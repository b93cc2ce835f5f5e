#!/usr/bin/env bash
# The whole test suite: formatting, lints, and every test of the workspace.
# Installs what the tests need when it is missing (Debian packages).
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkg() { # need_pkg COMMAND PACKAGE
    if ! command -v "$1" >/dev/null 2>&1; then
        echo "installing $2 (for $1)"
        if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
        $SUDO apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$2" >/dev/null
    fi
}

# The peers of crates/paceline/tests/peers.rs: rate limiters nobody here
# wrote. nginx from Debian; express and express-rate-limit from npm, into
# target/peers (nothing global), only when missing.
need_pkg /usr/sbin/nginx nginx
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
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy --all-targets -D warnings"
cargo clippy --workspace --all-targets --all-features -- -D warnings
echo "== cargo test"
cargo test --workspace --all-features --no-fail-fast 2>&1 | tee target/test-output.txt
# One closing line for the whole run, summed over every test binary.
awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "%d passed, %d failed, %d skipped\n", p, f, i }' target/test-output.txt
