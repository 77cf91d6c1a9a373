#!/usr/bin/env bash
# scripts/setup.sh --check: silent with exit 0 where everything is installed (tests/run_cpu_tests.sh
# ran it before any test), and one line per missing piece naming its package, with exit 1, where a
# piece is made to go missing through the variables the Makefile uses (STB_INCLUDE, CUDA_HOME, CC).
set -euo pipefail
setup=$(dirname "$0")/../../scripts/setup.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; exit 1; }

"$setup" --check > "$tmp/out" 2>&1 || fail "setup.sh --check failed: $(cat "$tmp/out")"
[ ! -s "$tmp/out" ] || fail "setup.sh --check printed: $(cat "$tmp/out")"
echo "PASS setup.sh --check finds everything, silently"

# expect_missing VARIABLE=VALUE... -- PATTERN...: one line per PATTERN, in order, and exit 1.
expect_missing() {
    local vars=()
    while [ "$1" != -- ]; do vars+=("$1"); shift; done
    shift
    local status=0
    env "${vars[@]}" "$setup" --check > "$tmp/out" 2>&1 || status=$?
    [ "$status" -eq 1 ] || fail "${vars[*]}: exit status $status, not 1: $(cat "$tmp/out")"
    [ "$(wc -l < "$tmp/out")" -eq $# ] || fail "${vars[*]}: $(wc -l < "$tmp/out") lines, not $#: $(cat "$tmp/out")"
    local line=0
    for pattern in "$@"; do
        line=$((line + 1))
        sed -n "${line}p" "$tmp/out" | grep -q -- "$pattern" ||
            fail "${vars[*]}: line $line lacks '$pattern': $(cat "$tmp/out")"
    done
    echo "PASS ${vars[*]}: $(paste -sd'|' "$tmp/out" | sed 's/|/ | /g')"
}
expect_missing STB_INCLUDE="$tmp/none" -- "^missing: stb_ds.h (not in $tmp/none): package libstb-dev$"
expect_missing CUDA_HOME="$tmp/none" -- "^missing: nvcc (cannot run $tmp/none/bin/nvcc): package cuda-toolkit of NVIDIA"
expect_missing CC="$tmp/none/cc" -- "^missing: C compiler $tmp/none/cc (not found): package gcc$"
expect_missing STB_INCLUDE="$tmp/none" CC="$tmp/none/cc" -- "package gcc$" "package libstb-dev$"

status=0
"$setup" --bogus > "$tmp/out" 2>&1 || status=$?
[ "$status" -eq 2 ] && grep -q "usage: scripts/setup.sh \[--check\]" "$tmp/out" || fail "setup.sh --bogus: exit $status, $(cat "$tmp/out")"
echo "PASS setup.sh --bogus: $(cat "$tmp/out")"
