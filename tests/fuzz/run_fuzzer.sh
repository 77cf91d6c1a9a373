#!/usr/bin/env bash
# Runs a libFuzzer harness for a bounded time from a fresh corpus directory; fails on any crash,
# sanitizer report or leak.
set -euo pipefail
fuzzer=$1; seconds=$2
corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
"$fuzzer" -max_total_time="$seconds" -artifact_prefix="$(dirname "$fuzzer")/" "$corpus" 2>&1 | tail -n 3
