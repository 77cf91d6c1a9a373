#!/usr/bin/env bash
# prepare_data on tinyshakespeare's input.txt writes exactly tiktoken's GPT-2 encoding of it (the facts
# in tests/lib/tinyshakespeare_tokens.txt, compared by tests/lib/check_tokens.sh), the comparison catches a
# change of one token and names its block, and bad invocations stop with a clear message.
# Usage: tests/e2e/test_prepare_data.sh DATA_DIR (the directory scripts/get_data.sh fills)
set -euo pipefail
DATA=${1:?usage: tests/e2e/test_prepare_data.sh DATA_DIR (the directory scripts/get_data.sh fills)}
BUILD=${BUILD:-.}
check_tokens=$(dirname "$0")/../lib/check_tokens.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; exit 1; }

input=$DATA/tinyshakespeare/input.txt
"$BUILD/prepare_data" --vocab "$DATA/gpt2" --sections --val-tokens 32768 -o "$tmp/tiny_shakespeare" "$input"
"$check_tokens" "$tmp/tiny_shakespeare" || fail "prepare_data's tokens are not tiktoken's"

# expect_mismatch WHAT PATTERN: check_tokens.sh must reject $tmp/changed_{val,train}.bin, saying PATTERN.
expect_mismatch() {
    if "$check_tokens" "$tmp/changed" > "$tmp/out" 2>&1; then fail "check_tokens.sh accepted $1"; fi
    grep -q -- "$2" "$tmp/out" || fail "check_tokens.sh on $1 said: $(cat "$tmp/out")"
    echo "PASS check_tokens.sh rejects $1: $(grep FAIL "$tmp/out")"
}
# Token 100000 of the training split (block 98304..102399) becomes the next id.
cp "$tmp/tiny_shakespeare_val.bin" "$tmp/changed_val.bin"
cp "$tmp/tiny_shakespeare_train.bin" "$tmp/changed_train.bin"
offset=$((1024 + 2 * 100000))
token=$(od -An -t u2 -j "$offset" -N 2 "$tmp/changed_train.bin")
token=$(((token + 1) % 50257))
printf "\\$(printf %03o $((token & 255)))\\$(printf %03o $((token >> 8)))" |
    dd of="$tmp/changed_train.bin" bs=1 seek="$offset" conv=notrunc status=none
expect_mismatch "one changed token" "changed_train.bin .*: first difference in tokens 98304 to 102399$"
# A training split of the wrong length: the validation tokens in its place.
cp "$tmp/tiny_shakespeare_val.bin" "$tmp/changed_train.bin"
expect_mismatch "a split of another length" "changed_train.bin .*: first difference in tokens 0 to 4095; it has 32768 tokens, want 305260$"

# bad invocations: each must exit non-zero with a message naming the problem
expect_error() { # expect_error PATTERN COMMAND...
    local pattern=$1; shift
    if "$@" >"$tmp/out" 2>&1; then fail "'$*' succeeded"; fi
    grep -q -- "$pattern" "$tmp/out" || fail "'$*' said: $(cat "$tmp/out")"
    echo "PASS '$*': $(head -n 1 "$tmp/out")"
}
expect_error "missing.txt" "$BUILD/prepare_data" --vocab "$DATA/gpt2" -o "$tmp/x" "$tmp/missing.txt"
expect_error "encoder.json" "$BUILD/prepare_data" --vocab "$tmp" -o "$tmp/x" "$input"
expect_error "--bogus" "$BUILD/prepare_data" --bogus
echo "tiny" > "$tmp/tiny.txt"
: > "$tmp/empty.txt"; : > "$tmp/empty.jsonl"
expect_error "holds no documents" "$BUILD/prepare_data" --vocab "$DATA/gpt2" -o "$tmp/x" "$tmp/empty.txt"
expect_error "holds no documents" "$BUILD/prepare_data" --vocab "$DATA/gpt2" -o "$tmp/x" "$tmp/empty.jsonl"
# vocab.bpe cut at a line boundary: every line is a good merge, but too few of them
mkdir "$tmp/cut"; cp "$DATA/gpt2/encoder.json" "$tmp/cut/"; head -n 30000 "$DATA/gpt2/vocab.bpe" > "$tmp/cut/vocab.bpe"
expect_error "vocab.bpe: 29999 merges, but none makes token" \
    "$BUILD/prepare_data" --vocab "$tmp/cut" -o "$tmp/x" "$tmp/tiny.txt"
expect_error "val" "$BUILD/prepare_data" --vocab "$DATA/gpt2" --val-tokens 1000 -o "$tmp/x" "$tmp/tiny.txt"
