#!/usr/bin/env bash
# prepare_data on tinyshakespeare's input.txt reproduces the reference token files (tiktoken's GPT-2
# encoding) byte for byte, and rejects bad invocations with a clear message.
set -euo pipefail
BUILD=${BUILD:-.}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ref=$GPT_DATA_DIR/tinyshakespeare
"$BUILD/prepare_data" --vocab "$GPT_DATA_DIR/gpt2" --sections --val-tokens 32768 \
    -o "$tmp/tiny_shakespeare" "$ref/input.txt"
for split in train val; do
    if cmp "$tmp/tiny_shakespeare_$split.bin" "$ref/tiny_shakespeare_$split.bin"; then
        echo "PASS prepare_data $split.bin identical to the reference"
    else
        echo "FAIL prepare_data $split.bin differs from the reference"; exit 1
    fi
done
# bad invocations: each must exit non-zero with a message naming the problem
expect_error() { # expect_error PATTERN COMMAND...
    local pattern=$1; shift
    if "$@" >"$tmp/out" 2>&1; then echo "FAIL '$*' succeeded"; exit 1; fi
    if grep -q -- "$pattern" "$tmp/out"; then echo "PASS '$*': $(head -n 1 "$tmp/out")"
    else echo "FAIL '$*' said: $(cat "$tmp/out")"; exit 1; fi
}
expect_error "missing.txt" "$BUILD/prepare_data" --vocab "$GPT_DATA_DIR/gpt2" -o "$tmp/x" "$tmp/missing.txt"
expect_error "encoder.json" "$BUILD/prepare_data" --vocab "$tmp" -o "$tmp/x" "$ref/input.txt"
expect_error "--bogus" "$BUILD/prepare_data" --bogus
echo "tiny" > "$tmp/tiny.txt"
expect_error "val" "$BUILD/prepare_data" --vocab "$GPT_DATA_DIR/gpt2" --val-tokens 1000 -o "$tmp/x" "$tmp/tiny.txt"
