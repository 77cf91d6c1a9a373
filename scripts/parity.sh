#!/usr/bin/env bash
# Loss-curve parity of the ATTN=naive and ATTN=flash builds of train_gpt on a GPU: GPT-2 124M from
# the same seed, data and init, T = 1024 on tinyshakespeare. Writes both log.csv files and a PNG of
# the curves per precision under $OUT_DIR, and fails unless
#   FP32: every one of the first 50 steps agrees within 1e-4 relative;
#   BF16: over STEPS (>= 300) steps, mean |loss difference| <= 0.01 and final val losses within 1%.
# Usage: GPU_ARCH=90 scripts/parity.sh   (needs GPT_DATA_DIR and a GPU; B=8 keeps it short)
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=${GPU_ARCH:-90}
BUILD=${BUILD:-build/parity}
OUT_DIR=${OUT_DIR:-$BUILD/out}
STEPS=${STEPS:-300}
B=${B:-8}
DATA=${GPT_DATA_DIR:?set GPT_DATA_DIR}/tinyshakespeare
mkdir -p "$OUT_DIR"
for p in FP32 BF16; do
    for a in naive flash; do
        make --no-print-directory -s BUILD="$BUILD/$a-$p" ATTN=$a PRECISION=$p GPU_ARCH="$ARCH" "$BUILD/$a-$p/train_gpt"
        steps=$STEPS; [ $p = FP32 ] && steps=50
        "$BUILD/$a-$p/train_gpt" -e d12 --seed 1337 -i "$DATA/tiny_shakespeare_train.bin" \
            -j "$DATA/tiny_shakespeare_val.bin" -b "$B" -t 1024 -x "$steps" -l 6e-4 -u 20 \
            -v "$steps" -m 4 -s 0 -n 0 -o "$OUT_DIR/$a-$p" > "$OUT_DIR/$a-$p.out"
    done
    python3 scripts/plot_loss.py "$OUT_DIR/naive-$p/log.csv" "$OUT_DIR/flash-$p/log.csv" \
        --labels "naive $p" "flash $p" -o "$OUT_DIR/parity-$p.png" > /dev/null
done
status=0
paste -d, "$OUT_DIR/naive-FP32/log.csv" "$OUT_DIR/flash-FP32/log.csv" | awk -F, '
    NR > 1 && $2 != "" && $9 != "" { rel = ($2 - $9) / $2; if (rel < 0) rel = -rel; if (rel > w) w = rel; n++ }
    END { ok = n >= 50 && w <= 1e-4
          printf "%s FP32: %d steps, worst relative loss difference %.2e (limit 1e-4)\n", ok ? "PASS" : "FAIL", n, w
          exit !ok }' || status=1
paste -d, "$OUT_DIR/naive-BF16/log.csv" "$OUT_DIR/flash-BF16/log.csv" | awk -F, -v steps="$STEPS" '
    NR > 1 && $2 != "" && $9 != "" { d = $2 - $9; if (d < 0) d = -d; sum += d; n++ }
    NR > 1 && $1 == steps { va = $3; vb = $10 }
    END { mean = n ? sum / n : 1; rel = (va - vb) / va; if (rel < 0) rel = -rel
          ok = n >= steps && mean <= 0.01 && rel <= 0.01
          printf "%s BF16: %d steps, mean |loss difference| %.4f (limit 0.01), final val %.4f vs %.4f (%.2f%%, limit 1%%)\n", ok ? "PASS" : "FAIL", n, mean, va, vb, 100 * rel
          exit !ok }' || status=1
exit $status
