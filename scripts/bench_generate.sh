#!/usr/bin/env bash
# Time per generated token of GPT-2 124M (d12, weights from the seed: the speed does not depend on
# them) for short and long prompts, on the GPU (train_gpt, when nvidia-smi finds one) and on the CPU
# (train_gpt_cpu). Every token runs the forward over the whole context (no key/value cache), so
# the time grows with the context; the table says by how much.
# Usage: GPU_ARCH=90 scripts/bench_generate.sh   (scripts/get_data.sh fetches the data)
set -euo pipefail
"$(dirname "$0")/get_data.sh" # before any cd: a relative GPT_DATA_DIR is the caller's
cd "$(dirname "$0")/.."
DATA=data
BUILD=${BUILD:-build/bench-generate}
ARCH=${GPU_ARCH:-90}
TOKENS=${TOKENS:-32}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

programs=("$BUILD/train_gpt_cpu")
make --no-print-directory -s BUILD="$BUILD" "$BUILD/train_gpt_cpu"
if nvidia-smi -L > /dev/null 2>&1; then
    make --no-print-directory -s BUILD="$BUILD" GPU_ARCH="$ARCH" "$BUILD/train_gpt"
    programs=("$BUILD/train_gpt" "${programs[@]}")
fi
# A model file of d12 from the seed, written by -x 0.
"$BUILD/train_gpt_cpu" -e d12 -b 1 -t 64 -x 0 -v 0 -s 0 -i "$DATA/tinyshakespeare/tiny_shakespeare_train.bin" \
    -o "$WORK/d12" > /dev/null
# Prompts of about 8, 256 and 900 tokens: the start of tinyshakespeare.
printf 'The meaning of life is that we' > "$WORK/p8.txt"
head -c 900 "$DATA/tinyshakespeare/input.txt" > "$WORK/p256.txt"
head -c 3250 "$DATA/tinyshakespeare/input.txt" > "$WORK/p900.txt"

printf '%-28s %-14s %10s %14s\n' program prompt tokens "ms per token"
for program in "${programs[@]}"; do
    for p in p8 p256 p900; do
        "$program" -x 0 -e "$WORK/d12/model_00000000.bin" --vocab "$DATA/gpt2" --prompt-file "$WORK/$p.txt" \
            -g "$TOKENS" --temperature 0 > /dev/null 2> "$WORK/err"
        prompt=$(grep -o 'prompt [0-9]* tokens' "$WORK/err")
        line=$(grep 'ms per token' "$WORK/err")
        n=$(echo "$line" | awk '{ print $2 }')
        ms=$(echo "$line" | awk '{ print $(NF - 3) }')
        printf '%-28s %-14s %10s %14s\n' "$(basename "$program")" "$prompt" "$n" "$ms"
    done
done
