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

export CARGO_TERM_COLOR=never
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy --all-targets -D warnings"
cargo clippy --workspace --all-targets --all-features -- -D warnings
echo "== cargo test"
cargo test --workspace --all-features --no-fail-fast 2>&1 | tee target/test-output.txt
# One closing line for the whole run, summed over every test binary.
awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "%d passed, %d failed, %d skipped\n", p, f, i }' target/test-output.txt
