#!/usr/bin/env bash
# Checks the files of deploy/ with the tools that read them, where those
# tools are installed, and says what it skipped otherwise:
#
#   systemd-analyze verify   the unit (Debian package systemd)
#   promtool check rules     the alert rules (Debian package prometheus)
#   promtool test rules      the rules' unit tests (prometheus)
#   hadolint                 the Dockerfile (not in Debian; optional)
#
# crates/paceline/tests/deploy.rs parses every file without these tools
# (and checks every metric name against a running gateway):
#   cargo test -p paceline --test deploy
#
# Usage: deploy/check.sh [PACELINE_BINARY]
#   PACELINE_BINARY: the built binary the unit's ExecStart is pointed at
#   for systemd-analyze (which wants it to exist); by default
#   ${CARGO_TARGET_DIR:-target}/debug/paceline, else /usr/local/bin/paceline,
#   else /bin/true (the command lines are then checked for form only).
# Exits 1 when a check that ran failed; skipped checks do not fail.
set -uo pipefail
cd "$(dirname "$0")/.."

failed=0
ran=()
skipped=()

have() { command -v "$1" >/dev/null 2>&1; }

check() { # check NAME COMMAND...
    local name="$1"
    shift
    local out
    if out=$("$@" 2>&1); then
        echo "ok: $name"
        ran+=("$name")
    else
        echo "FAILED: $name"
        printf '%s\n' "$out" | sed 's/^/  /'
        failed=$((failed + 1))
    fi
}

# ---------------------------------------------------------------------------
# the systemd unit
# ---------------------------------------------------------------------------
if have systemd-analyze; then
    bin="${1:-}"
    if [ -z "$bin" ]; then
        target="${CARGO_TARGET_DIR:-target}"
        for b in "$target/debug/paceline" "$target/release/paceline" /usr/local/bin/paceline; do
            if [ -x "$b" ]; then bin="$b"; break; fi
        done
    fi
    [ -n "$bin" ] || bin=/bin/true
    case "$bin" in /*) ;; *) bin="$(pwd)/$bin" ;; esac
    # a copy whose ExecStart names a binary that exists here (verify
    # refuses a missing one); every other line as shipped
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    sed "s#/usr/local/bin/paceline#$bin#g" deploy/systemd/paceline-gateway.service \
        >"$tmp/paceline-gateway.service"
    # systemd-analyze prints its complaints and may still exit 0: any
    # output about the unit is a failure
    verify() {
        local out
        out=$(systemd-analyze verify --man=no "$tmp/paceline-gateway.service" 2>&1)
        local rc=$?
        out=$(printf '%s\n' "$out" | grep -F 'paceline-gateway.service' || true)
        [ -n "$out" ] && printf '%s\n' "$out"
        [ "$rc" -eq 0 ] && [ -z "$out" ]
    }
    check "systemd-analyze verify deploy/systemd/paceline-gateway.service (ExecStart: $bin)" verify
    if systemd-analyze security --help 2>/dev/null | grep -q -- '--offline'; then
        score=$(systemd-analyze security --offline=yes "$tmp/paceline-gateway.service" 2>/dev/null |
            sed -n 's/.*Overall exposure level for [^:]*: //p')
        [ -n "$score" ] && echo "   systemd-analyze security: $score"
    fi
else
    skipped+=("systemd-analyze verify (install the Debian package systemd)")
fi

# ---------------------------------------------------------------------------
# the Prometheus rules
# ---------------------------------------------------------------------------
if have promtool; then
    check "promtool check rules deploy/prometheus/paceline-alerts.yml" \
        promtool check rules deploy/prometheus/paceline-alerts.yml
    check "promtool test rules deploy/prometheus/paceline-alerts.test.yml" \
        promtool test rules deploy/prometheus/paceline-alerts.test.yml
else
    skipped+=("promtool check rules, promtool test rules (install the Debian package prometheus)")
fi

# ---------------------------------------------------------------------------
# the Dockerfile
# ---------------------------------------------------------------------------
if have hadolint; then
    check "hadolint deploy/Dockerfile" hadolint deploy/Dockerfile
else
    skipped+=("hadolint deploy/Dockerfile (not packaged by Debian; tests/deploy.rs parses it)")
fi

# ---------------------------------------------------------------------------
echo "deploy/check.sh: ${#ran[@]} passed, $failed failed, ${#skipped[@]} skipped"
for s in "${skipped[@]}"; do
    echo "  skipped: $s"
done
[ "$failed" -eq 0 ]
