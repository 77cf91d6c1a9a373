#!/usr/bin/env bash
# Prepares the data the trainer reads by default:
#   data/gpt2/encoder.json, data/gpt2/vocab.bpe        GPT-2's vocabulary (to decode samples)
#   data/tinyshakespeare/tiny_shakespeare_val.bin      the first 32768 tokens of tinyshakespeare
#   data/tinyshakespeare/tiny_shakespeare_train.bin    the rest
# The raw files are copied from $GPT_DATA_DIR (gpt2/ and tinyshakespeare/input.txt) when it is set,
# otherwise downloaded from their public sources with curl or wget. prepare_data is built with make
# when needed ($BUILD/prepare_data, BUILD defaults to the repository root). Files already there are
# kept, so running it again does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-.}
GPT2_URL=https://openaipublic.blob.core.windows.net/gpt-2/models/124M
SHAKESPEARE_URL=https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt

die() { echo "error: get_data.sh: $*" >&2; exit 1; }

# fetch NAME URL DEST: puts $GPT_DATA_DIR/NAME, or else URL, at DEST unless DEST is already there.
fetch() {
    local name=$1 url=$2 dest=$3 download_failed=""
    [ -s "$dest" ] && return 0
    mkdir -p "$(dirname "$dest")"
    if [ -n "${GPT_DATA_DIR:-}" ]; then
        [ -s "$GPT_DATA_DIR/$name" ] || die "GPT_DATA_DIR is set to '$GPT_DATA_DIR' but it has no $name"
        cp "$GPT_DATA_DIR/$name" "$dest.partial"
    elif command -v curl > /dev/null || command -v wget > /dev/null; then
        if command -v curl > /dev/null; then
            curl -fsSL --retry 3 -o "$dest.partial" "$url" || download_failed=1
        else
            wget -q --tries=3 -O "$dest.partial" "$url" || download_failed=1
        fi
        if [ -n "$download_failed" ]; then
            rm -f "$dest.partial"
            die "cannot download $url (or set GPT_DATA_DIR to a directory holding $name)"
        fi
    else
        die "need curl or wget to download $url (or set GPT_DATA_DIR to a directory holding $name)"
    fi
    mv "$dest.partial" "$dest" # only complete files ever get the final name
    echo "get_data.sh: $dest"
}

fetch gpt2/encoder.json "$GPT2_URL/encoder.json" data/gpt2/encoder.json
fetch gpt2/vocab.bpe "$GPT2_URL/vocab.bpe" data/gpt2/vocab.bpe
fetch tinyshakespeare/input.txt "$SHAKESPEARE_URL" data/tinyshakespeare/input.txt

out=data/tinyshakespeare/tiny_shakespeare
if [ -s "${out}_train.bin" ] && [ -s "${out}_val.bin" ]; then
    echo "get_data.sh: ${out}_{train,val}.bin already prepared"
    exit 0
fi
make --no-print-directory BUILD="$BUILD" "$BUILD/prepare_data" > /dev/null || die "cannot build $BUILD/prepare_data"
"$BUILD/prepare_data" --vocab data/gpt2 --sections --val-tokens 32768 -o "$out" data/tinyshakespeare/input.txt
