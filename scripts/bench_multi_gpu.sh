#!/bin/bash
# Scaling of train_gpt over the GPUs of one machine: GPT-2 124M (d12), T = 1024, B = 64 per GPU,
# 524288 tokens per step (gradient accumulation makes up the rest), BF16, ATTN=flash. One row per
# number of GPUs (1, 2, 4, ... up to the GPUs present, or GPUS="1 2"): ms/step, tokens/s, scaling
# efficiency = tokens/s(N) / (N x tokens/s(1)), and each GPU's optimizer memory with -z 0 and -z 1
# (from the memory plan train_gpt prints).
# Usage: GPU_ARCH=90 scripts/bench_multi_gpu.sh   (needs GPUs; scripts/get_data.sh fetches the data)
set -eu
"$(dirname "$0")/get_data.sh" # before any cd: a relative GPT_DATA_DIR is the caller's
cd "$(dirname "$0")/.."
ARCH=${GPU_ARCH:-90}
STEPS=${STEPS:-8}
BUILD=${BUILD:-build/bench-multi}
DATA=data/tinyshakespeare
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
ngpu=$(nvidia-smi -L | wc -l)
if [ -z "${GPUS:-}" ]; then
    GPUS=1
    for n in 2 4 8 16; do [ $n -le "$ngpu" ] && GPUS="$GPUS $n"; done
fi
make --no-print-directory -s BUILD="$BUILD" PRECISION=BF16 ATTN=flash GPU_ARCH="$ARCH" NCCL=1 "$BUILD/train_gpt"

# median ms of steps 3..STEPS (the first steps include cuBLAS heuristics and NCCL set-up)
median_ms() { awk -F, 'NR > 3 { print $6 }' "$1" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
optimizer_mib() { sed -n 's/.*optimizer *\([0-9.]*\) MiB.*/\1/p' "$1" | head -1; }
printf "%5s %4s %8s %10s %12s %10s %14s %14s\n" GPUs B T ms/step tokens/s scaling "optim -z 0 MiB" "optim -z 1 MiB"
base=""
for n in $GPUS; do
    for z in 0 1; do
        [ $z = 1 ] && [ $n = 1 ] && continue
        out=$WORK/n$n-z$z
        scripts/launch.sh "$n" "$BUILD/train_gpt" -e d12 -i "$DATA/tiny_shakespeare_train.bin" \
            -j "$DATA/tiny_shakespeare_val.bin" -b 64 -t 1024 -d 524288 -x "$STEPS" -v 0 -s 0 -n 0 \
            -z $z -o "$out" > "$out.log" 2>&1 || { tail -20 "$out.log"; exit 1; }
    done
    ms=$(median_ms "$WORK/n$n-z0/log.csv")
    tps=$(awk -v ms="$ms" 'BEGIN { printf "%.0f", 524288 / (ms / 1000) }')
    [ -z "$base" ] && base=$tps
    z1=$([ "$n" = 1 ] && optimizer_mib "$WORK/n1-z0.log" || optimizer_mib "$WORK/n$n-z1.log")
    awk -v n="$n" -v ms="$ms" -v tps="$tps" -v base="$base" -v z0="$(optimizer_mib "$WORK/n$n-z0.log")" -v z1="$z1" \
        'BEGIN { printf "%5d %4d %8d %10.1f %12.0f %9.1f%% %14s %14s\n", n, 64, 1024, ms, tps, 100 * tps / (n * base), z0, z1 }'
done
