#!/usr/bin/env bash
# Compares the token files PREFIX_val.bin and PREFIX_train.bin with tiktoken's GPT-2 encoding of
# tinyshakespeare, known only by the facts in tests/lib/tinyshakespeare_tokens.txt: per split, the token
# count and the SHA-256 of all its tokens, then the SHA-256 of each block of 4096 tokens, so that a
# difference is located to its block.
#   tests/lib/check_tokens.sh PREFIX           one line per split (PASS, or FAIL with the count and the
#                                          first differing block); exit 1 on any difference
#   tests/lib/check_tokens.sh --print PREFIX   prints the facts of PREFIX's files (how the facts were made)
set -euo pipefail
FACTS=$(dirname "$0")/tinyshakespeare_tokens.txt
BLOCK=4096

die() { echo "error: check_tokens.sh: $*" >&2; exit 1; }

# facts SPLIT FILE: "SPLIT all COUNT SHA256" for the whole token stream (the uint16 tokens after the
# 1024-byte header), then "SPLIT FIRST COUNT SHA256" for each block.
facts() {
    local split=$1 file=$2 magic version n
    [ -f "$file" ] || die "$file: no such file"
    read -r magic version n < <(od -An -t d4 -N 12 "$file") # x86 and arm64 are little endian like the file
    [ "$magic" = 20240520 ] && [ "$version" = 1 ] || die "$file: not a version 1 token file"
    [ "$(stat -c %s "$file")" -eq $((1024 + 2 * n)) ] || die "$file: its size disagrees with the $n tokens of its header"
    echo "$split all $n $(tail -c +1025 "$file" | sha256sum | cut -d' ' -f1)"
    tail -c +1025 "$file" | split -b $((2 * BLOCK)) --filter=sha256sum - |
        awk -v split_name="$split" -v n="$n" -v block="$BLOCK" '{
            first = (NR - 1) * block
            print split_name, first, (n - first < block ? n - first : block), $1 }'
}

# check SPLIT FILE
check() {
    local split=$1 file=$2 want got want_n got_n where
    want=$(grep "^$split " "$FACTS") || die "$FACTS has no facts for $split"
    got=$(facts "$split" "$file")
    if [ "$got" = "$want" ]; then
        echo "PASS $file: its $(echo "$got" | head -n 1 | cut -d' ' -f3) tokens are tiktoken's"
        return 0
    fi
    want_n=$(echo "$want" | head -n 1 | cut -d' ' -f3)
    got_n=$(echo "$got" | head -n 1 | cut -d' ' -f3)
    # The first block whose line differs; paste leaves the fields of a missing line empty.
    where=$(paste -d' ' <(echo "$want" | tail -n +2) <(echo "$got" | tail -n +2) |
        awk '$4 != $8 { if ($2 == "") print $6, $6 + $7 - 1; else print $2, $2 + $3 - 1; exit }')
    [ "$got_n" = "$want_n" ] || where="$where; it has $got_n tokens, want $want_n"
    echo "FAIL $file differs from tiktoken's encoding ($FACTS): first difference in tokens ${where/ / to }"
    return 1
}

if [ "${1:-}" = --print ] && [ $# -eq 2 ]; then
    facts val "$2_val.bin"
    facts train "$2_train.bin"
elif [ $# -eq 1 ] && [ "${1:0:1}" != - ]; then
    status=0
    check val "$1_val.bin" || status=1
    check train "$1_train.bin" || status=1
    exit $status
else
    die "usage: tests/lib/check_tokens.sh [--print] PREFIX (checks or prints PREFIX_val.bin and PREFIX_train.bin)"
fi
