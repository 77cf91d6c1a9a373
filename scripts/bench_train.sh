#!/bin/bash
# Training speed of train_gpt on GPT-2 124M (d12) at T = 1024 on one GPU: tokens/s, ms/step, MFU
# and peak GPU memory, one row per configuration: BF16 naive B = 32 and 64, BF16 flash B = 32 and 64,
# FP32 naive B = 16. RUNS="BF16 flash 64 ..." picks other rows.
# Usage: GPU_ARCH=90 PEAK_TFLOPS=989 scripts/bench_train.sh   (needs a GPU; scripts/get_data.sh fetches the data)
# PEAK_TFLOPS is the GPU's dense bf16 peak (989 for H100/H200 SXM); the FP32 row uses it too, so
# its MFU reads as a fraction of the bf16 peak. Timing: the median ms of steps 3..STEPS (the
# first steps include cuBLAS heuristics and allocation).
set -eu
"$(dirname "$0")/get_data.sh" # before any cd: a relative GPT_DATA_DIR is the caller's
ARCH=${GPU_ARCH:-90}
PEAK_TFLOPS=${PEAK_TFLOPS:-989}
STEPS=${STEPS:-12}
BUILD=${BUILD:-build/bench}
DATA=$(dirname "$0")/../data/tinyshakespeare
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

RUNS=${RUNS:-"BF16 naive 32,BF16 naive 64,BF16 flash 32,BF16 flash 64,FP32 naive 16"}
IFS=, read -r -a runs <<< "$RUNS"
for run in "${runs[@]}"; do
    set -- $run
    make --no-print-directory BUILD="$BUILD/$1-$2" ATTN=$2 PRECISION=$1 GPU_ARCH="$ARCH" "$BUILD/$1-$2/train_gpt" >/dev/null
done

# FLOPs per token (forward + backward, as train.c counts them): 6 x parameters + 6 x L x C x T for
# causal attention.
L=12 C=768 T=1024 PARAMS=124475904
FLOPS_PER_TOKEN=$((6 * PARAMS + 6 * L * C * T))
printf "%-6s %-6s %4s %8s %10s %12s %6s %10s\n" precision attn B T ms/step tokens/s MFU peak_MiB
for run in "${runs[@]}"; do
    set -- $run
    p=$1 attn=$2 B=$3 out=$WORK/$p-$attn-$B
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$WORK/mem" &
    smi=$!
    "$BUILD/$p-$attn/train_gpt" -e d12 -i "$DATA/tiny_shakespeare_train.bin" -j "$DATA/tiny_shakespeare_val.bin" \
        -b "$B" -t $T -x "$STEPS" -v 0 -s 0 -n 0 -o "$out" > "$out.log" 2>&1 || { cat "$out.log"; exit 1; }
    kill "$smi"; wait "$smi" 2>/dev/null || true
    peak=$(sort -n "$WORK/mem" | tail -1)
    ms=$(awk -F, 'NR > 3 { print $6 }' "$out/log.csv" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
    awk -v p="$p" -v a="$attn" -v B="$B" -v T=$T -v ms="$ms" -v f=$FLOPS_PER_TOKEN -v peak_tf="$PEAK_TFLOPS" -v mem="$peak" 'BEGIN {
        tps = B * T / (ms / 1000); mfu = tps * f / (peak_tf * 1e12)
        printf "%-6s %-6s %4d %8d %10.1f %12.0f %5.1f%% %10s\n", p, a, B, T, ms, tps, 100 * mfu, mem }'
done
