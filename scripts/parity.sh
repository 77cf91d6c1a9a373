#!/usr/bin/env bash
# Loss-curve parity of the ATTN=naive and ATTN=flash builds of train_gpt on a GPU: GPT-2 124M from
# the same seed, data and init, T = 1024 on tinyshakespeare, with llm.c's GPT-2 124M recipe for the
# learning rate (peak 6e-4 after a 700-step warmup; WARMUP and LR change it). Writes both log.csv
# files and a PNG of the curves per precision under $OUT_DIR, and fails unless
#   FP32: every one of the first 50 steps agrees within 1e-4 relative;
#   BF16: over STEPS (>= 300) steps, mean |loss difference| <= 0.01 and final val losses within 1%.
# For scale it also prints a control that changes no kernel: the naive build again with half the
# micro-batch and two accumulation steps (the same data, the gradients summed in another order).
# The difference between two correct fp32 programs is rounding, amplified by training; the control
# shows how much of it any change of summation order brings.
# Usage: GPU_ARCH=90 scripts/parity.sh   (needs a GPU; scripts/get_data.sh fetches the data; B=8 keeps it short)
set -euo pipefail
"$(dirname "$0")/get_data.sh" # before any cd: a relative GPT_DATA_DIR is the caller's
cd "$(dirname "$0")/.."
ARCH=${GPU_ARCH:-90}
BUILD=${BUILD:-build/parity}
OUT_DIR=${OUT_DIR:-$BUILD/out}
STEPS=${STEPS:-300}
B=${B:-8}
WARMUP=${WARMUP:-700}
LR=${LR:-6e-4}
DATA=data/tinyshakespeare
mkdir -p "$OUT_DIR"
for p in FP32 BF16; do
    steps=$STEPS; [ $p = FP32 ] && steps=50
    for run in naive flash control; do
        # the control's validation reads as many sequences in twice the batches of half the size
        a=$run batch=(-b "$B" -m 4); [ $run = control ] && a=naive batch=(-b $((B / 2)) -d $((B * 1024)) -m 8)
        make --no-print-directory -s BUILD="$BUILD/$a-$p" ATTN=$a PRECISION=$p GPU_ARCH="$ARCH" "$BUILD/$a-$p/train_gpt"
        "$BUILD/$a-$p/train_gpt" -e d12 --seed 1337 -i "$DATA/tiny_shakespeare_train.bin" \
            -j "$DATA/tiny_shakespeare_val.bin" "${batch[@]}" -t 1024 -x "$steps" -l "$LR" -u "$WARMUP" \
            -v "$steps" -s 0 -n 0 -o "$OUT_DIR/$run-$p" > "$OUT_DIR/$run-$p.out"
    done
    python3 scripts/plot_loss.py "$OUT_DIR/naive-$p/log.csv" "$OUT_DIR/flash-$p/log.csv" \
        --labels "naive $p" "flash $p" -o "$OUT_DIR/parity-$p.png" > /dev/null
done
# columns: step, A's train and val loss, B's train and val loss
losses() { paste -d, <(cut -d, -f1-3 "$OUT_DIR/$1/log.csv") <(cut -d, -f2,3 "$OUT_DIR/$2/log.csv"); }
# fp32_worst A B: the worst relative loss difference over the first 50 steps.
fp32_worst() {
    losses "$1-FP32" "$2-FP32" | awk -F, '
        NR > 1 && $2 != "" && $4 != "" && $1 <= 50 { rel = ($2 - $4) / $2; if (rel < 0) rel = -rel; if (rel > w) { w = rel; at = $1 }; n++ }
        END { printf "%d %.2e %d\n", n, w, at }'
}
# bf16_stats A B: mean |loss difference| over the steps, and the final val losses.
bf16_stats() {
    losses "$1-BF16" "$2-BF16" | awk -F, -v steps="$STEPS" '
        NR > 1 && $2 != "" && $4 != "" { d = $2 - $4; if (d < 0) d = -d; sum += d; n++ }
        NR > 1 && $1 == steps { va = $3; vb = $5 }
        END { printf "%d %.4f %.4f %.4f\n", n, n ? sum / n : 1, va, vb }'
}
status=0
read -r n w at <<< "$(fp32_worst naive flash)"
read -r cn cw cat <<< "$(fp32_worst naive control)"
ok=$(awk -v n="$n" -v w="$w" 'BEGIN { print (n >= 50 && w <= 1e-4) ? 1 : 0 }')
printf "%s FP32: %d steps, worst relative loss difference naive vs flash %s at step %d (limit 1e-4); control naive vs naive with accumulation %s at step %d\n" \
    "$([ "$ok" = 1 ] && echo PASS || echo FAIL)" "$n" "$w" "$at" "$cw" "$cat"
[ "$ok" = 1 ] || status=1
read -r n mean va vb <<< "$(bf16_stats naive flash)"
read -r cn cmean cva cvb <<< "$(bf16_stats naive control)"
ok=$(awk -v n="$n" -v steps="$STEPS" -v m="$mean" -v a="$va" -v b="$vb" \
    'BEGIN { r = (a - b) / a; if (r < 0) r = -r; print (n >= steps && m <= 0.01 && r <= 0.01) ? 1 : 0 }')
printf "%s BF16: %d steps, mean |loss difference| naive vs flash %s (limit 0.01), final val %s vs %s (limit 1%%); control %s, final val %s\n" \
    "$([ "$ok" = 1 ] && echo PASS || echo FAIL)" "$n" "$mean" "$va" "$vb" "$cmean" "$cvb"
[ "$ok" = 1 ] || status=1
exit $status
