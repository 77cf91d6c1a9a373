#!/usr/bin/env bash
# Prepares the data the trainer and the tests read, in DIR (default: the repository's data/, the
# trainer's default paths):
#   DIR/gpt2/encoder.json, DIR/gpt2/vocab.bpe       GPT-2's vocabulary (to tokenise, to decode samples)
#   DIR/tinyshakespeare/input.txt                   tinyshakespeare
#   DIR/tinyshakespeare/tiny_shakespeare_val.bin    its first 32768 tokens (prepare_data --sections)
#   DIR/tinyshakespeare/tiny_shakespeare_train.bin  the rest
# Usage: [GPT_DATA_DIR=RAW] [BUILD=B] scripts/get_data.sh [DIR]
# The raw files are copied from GPT_DATA_DIR (RAW/gpt2/..., RAW/tinyshakespeare/input.txt) when it is
# set, otherwise downloaded with curl or wget from their public sources, GPT2_URL and SHAKESPEARE_URL
# (variables, so that tests can point them at an address that does not answer). Every raw file must
# have the SHA-256 of scripts/data.sha256, also those already in DIR. Relative paths (GPT_DATA_DIR,
# DIR) are taken from the directory the script is run in. prepare_data is built with make
# ($BUILD/prepare_data, BUILD defaults to the repository root) when the token files are missing.
# Any failure is one line on stderr and exit status 1; nothing half-written keeps a final name.
set -euo pipefail
die() { echo "error: get_data.sh: $*" >&2; exit 1; }

# Resolve the caller's relative paths before moving to the repository root.
raw_dir=""
if [ -n "${GPT_DATA_DIR:-}" ]; then
    raw_dir=$(cd "$GPT_DATA_DIR" 2> /dev/null && pwd) ||
        die "GPT_DATA_DIR=$GPT_DATA_DIR is not a directory (seen from $PWD)"
fi
out=""
if [ $# -gt 0 ]; then
    out=$(mkdir -p "$1" && cd "$1" && pwd) || die "cannot create the directory $1"
fi
cd "$(dirname "$0")/.."
out=${out:-$PWD/data}
BUILD=${BUILD:-.}
GPT2_URL=${GPT2_URL:-https://openaipublic.blob.core.windows.net/gpt-2/models/124M}
SHAKESPEARE_URL=${SHAKESPEARE_URL:-https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt}
SUMS=scripts/data.sha256

# Tests run side by side may call this at once: one at a time (a lock on this script, which leaves
# no file behind), the others then find the files done.
if command -v flock > /dev/null; then
    exec 9< scripts/get_data.sh
    flock 9
fi

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# download URL DEST, or die with the downloader's own reason on the same line.
download() {
    local url=$1 dest=$2 reason
    if command -v curl > /dev/null; then
        reason=$(curl -fsS --connect-timeout 30 --retry 2 -o "$dest" "$url" 2>&1) && return 0
    elif command -v wget > /dev/null; then
        reason=$(wget -nv --timeout=30 --tries=3 -O "$dest" "$url" 2>&1) && return 0
    else
        die "need curl or wget to download $url (apt-get install curl), or set GPT_DATA_DIR to a directory holding the raw files"
    fi
    rm -f "$dest"
    die "cannot download $url (${reason##*$'\n'}); without network access, set GPT_DATA_DIR to a" \
        "directory holding gpt2/encoder.json, gpt2/vocab.bpe and tinyshakespeare/input.txt"
}

# fetch NAME URL: puts RAW/NAME, or else URL, at DIR/NAME, and checks its SHA-256.
fetch() {
    local name=$1 url=$2 dest=$out/$1 want from got
    want=$(awk -v name="$name" '$2 == name { print $1 }' "$SUMS")
    if [ -e "$dest" ]; then
        [ "$(sha256_of "$dest")" = "$want" ] ||
            die "$dest is not the public $name (its SHA-256 differs from $SUMS); delete it to fetch it again"
        return 0
    fi
    mkdir -p "$(dirname "$dest")"
    if [ -n "$raw_dir" ]; then
        from=$raw_dir/$name
        [ -f "$from" ] || die "GPT_DATA_DIR ($raw_dir) has no $name"
        cp "$from" "$dest.partial"
    else
        from=$url
        download "$url" "$dest.partial"
    fi
    got=$(sha256_of "$dest.partial")
    if [ "$got" != "$want" ]; then
        rm -f "$dest.partial"
        die "$from is not the public $name: SHA-256 $got, want $want ($SUMS)"
    fi
    mv "$dest.partial" "$dest"
    echo "get_data.sh: $dest (from $from)"
}

fetch gpt2/encoder.json "$GPT2_URL/encoder.json"
fetch gpt2/vocab.bpe "$GPT2_URL/vocab.bpe"
fetch tinyshakespeare/input.txt "$SHAKESPEARE_URL"

prefix=$out/tinyshakespeare/tiny_shakespeare
if [ -s "${prefix}_train.bin" ] && [ -s "${prefix}_val.bin" ]; then
    echo "get_data.sh: $out holds the vocabulary and tinyshakespeare's tokens"
    exit 0
fi
make --no-print-directory BUILD="$BUILD" "$BUILD/prepare_data" > /dev/null || die "cannot build $BUILD/prepare_data"
"$BUILD/prepare_data" --vocab "$out/gpt2" --sections --val-tokens 32768 -o "$prefix" "$out/tinyshakespeare/input.txt"
