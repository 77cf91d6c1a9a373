#!/usr/bin/env bash
# scripts/get_data.sh: with a relative GPT_DATA_DIR, run from another directory, it prepares the
# same files as in DATA_DIR; without GPT_DATA_DIR and without network (its URLs pointed at a local
# port where nothing answers) it stops with exactly one line; a raw file that is not the public one,
# or a GPT_DATA_DIR that is no directory, is one line naming it.
# Usage: tests/e2e/test_get_data.sh DATA_DIR (the directory scripts/get_data.sh fills)
set -euo pipefail
DATA=$(cd "${1:?usage: tests/e2e/test_get_data.sh DATA_DIR (the directory scripts/get_data.sh fills)}" && pwd)
get_data=$(cd "$(dirname "$0")/../../scripts" && pwd)/get_data.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; exit 1; }
raw_files=(gpt2/encoder.json gpt2/vocab.bpe tinyshakespeare/input.txt)

# raw DIR: a copy of the raw files, as a user's GPT_DATA_DIR holds them.
raw() {
    for f in "${raw_files[@]}"; do
        mkdir -p "$1/$(dirname "$f")"
        cp "$DATA/$f" "$1/$f"
    done
}

# expect_one_line WHAT PATTERN COMMAND...: COMMAND fails and says exactly one line, matching PATTERN.
expect_one_line() {
    local what=$1 pattern=$2; shift 2
    if "$@" > "$tmp/out" 2>&1; then fail "$what: get_data.sh succeeded"; fi
    [ "$(wc -l < "$tmp/out")" -eq 1 ] || fail "$what: get_data.sh said $(wc -l < "$tmp/out") lines: $(cat "$tmp/out")"
    grep -q -- "$pattern" "$tmp/out" || fail "$what: get_data.sh said: $(cat "$tmp/out")"
    echo "PASS $what: $(cat "$tmp/out")"
}

# 1. A relative GPT_DATA_DIR and a relative output directory, from a directory of the caller's.
raw "$tmp/raw"
mkdir "$tmp/caller"
(cd "$tmp/caller" && GPT_DATA_DIR=../raw "$get_data" out) > "$tmp/relative.out" ||
    fail "relative GPT_DATA_DIR: $(cat "$tmp/relative.out")"
for f in "${raw_files[@]}" tinyshakespeare/tiny_shakespeare_val.bin tinyshakespeare/tiny_shakespeare_train.bin; do
    cmp "$tmp/caller/out/$f" "$DATA/$f" || fail "relative GPT_DATA_DIR: out/$f differs from $DATA/$f"
done
echo "PASS GPT_DATA_DIR=../raw from another directory prepares the same files"
# Run again, it keeps them (and checks their sums) without GPT_DATA_DIR, so without network.
(cd "$tmp/caller" && env -u GPT_DATA_DIR "$get_data" out) > /dev/null || fail "a second run fetched again"
echo "PASS a second run keeps the files"

# 2. No GPT_DATA_DIR and no network: one line, and no file left behind.
offline=(env -u GPT_DATA_DIR GPT2_URL=http://127.0.0.1:9 SHAKESPEARE_URL=http://127.0.0.1:9/input.txt)
expect_one_line "no GPT_DATA_DIR, no network" "cannot download http://127.0.0.1:9/encoder.json.*set GPT_DATA_DIR" \
    "${offline[@]}" "$get_data" "$tmp/offline"
[ -z "$(find "$tmp/offline" -type f)" ] || fail "no network: files left in $tmp/offline: $(find "$tmp/offline" -type f)"

# 3. A GPT_DATA_DIR whose encoder.json is not the public one, and one that does not exist.
raw "$tmp/damaged"
printf '\0' | dd of="$tmp/damaged/gpt2/encoder.json" bs=1 seek=100 conv=notrunc status=none
expect_one_line "a damaged raw file" "damaged/gpt2/encoder.json is not the public gpt2/encoder.json: SHA-256" \
    env GPT_DATA_DIR="$tmp/damaged" "$get_data" "$tmp/from_damaged"
[ -z "$(find "$tmp/from_damaged" -type f)" ] || fail "the damaged encoder.json was kept"
expect_one_line "a missing GPT_DATA_DIR" "GPT_DATA_DIR=$tmp/nothing is not a directory" \
    env GPT_DATA_DIR="$tmp/nothing" "$get_data" "$tmp/from_nothing"
