#!/usr/bin/env bash
# End-to-end tests of train_gpt_cpu on tinyshakespeare (DATA_DIR, prepared by scripts/get_data.sh):
#  1. loss-curve parity: the ATTN=naive and ATTN=flash builds, same seed, data and init, a small GPT
#     (2 layers, 4 heads, C 64, T 64) for 50 steps: every step's loss within 1e-4 relative;
#  2. learning: 200 steps lower the validation loss well below its starting value;
#  3. sampling prints decoded text, and -s 0 never samples;
#  4. a model file written at init loads back bit-identical;
#  5. --batch-invariant: micro-batches of 8, 2 and 1 sequences (the same 8 per step) train to the same
#     model file bit for bit with groups of 1, B 4 and 2 with groups of 2; without the option B 8 and
#     B 1 differ (so the option is what makes them equal); a -b or -d the groups do not divide is
#     refused;
#  6. recompute: -r 1 (GELU) and -r 2 (GELU and layernorms) train the model file and losses of -r 0
#     bit for bit (the backward rebuilds those activations with the forward's own kernels);
#  7. the head's slices (8192 tokens, model/config.h): a micro-batch of 160 sequences of 64 tokens
#     runs the head in two slices (128 + 32 sequences), and with --batch-invariant 32 trains the
#     bits of five micro-batches of 32 (one slice each); without the option its losses stay within
#     1e-5 of them.
set -euo pipefail
BUILD=${BUILD:-.}
DATA=$(cd "${1:?usage: tests/e2e/test_train_cpu.sh DATA_DIR (the directory scripts/get_data.sh fills)}" && pwd)
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; exit 1; }

for attn in naive flash; do
    make --no-print-directory -s BUILD="$BUILD/variants/$attn" ATTN="$attn" "$BUILD/variants/$attn/train_gpt_cpu"
done
small=(--layers 2 --channels 64 --heads 4 --max-seq 64 -t 64 -b 4 --seed 7
       -i "$DATA/tinyshakespeare/tiny_shakespeare_train.bin" -j "$DATA/tinyshakespeare/tiny_shakespeare_val.bin")

# 1. parity
for attn in naive flash; do
    "$BUILD/variants/$attn/train_gpt_cpu" "${small[@]}" -x 50 -l 1e-3 -v 0 -s 0 -o "$tmp/$attn" > "$tmp/$attn.out"
    grep -q "$attn attention" "$tmp/$attn.out" || fail "the $attn build does not report $attn attention"
    grep -q "generating" "$tmp/$attn.out" && fail "-s 0 sampled"
done
echo "PASS -s 0 never samples"
# step and naive loss, then flash loss
paste -d, <(cut -d, -f1,2 "$tmp/naive/log.csv") <(cut -d, -f2 "$tmp/flash/log.csv") | awk -F, '
    NR == 1 { next }
    { step = $1; a = $2; b = $3; if (a == "" || b == "") next
      rel = (a - b) / a; if (rel < 0) rel = -rel
      printf "step %3d  naive %.7f  flash %.7f  rel diff %.2e\n", step, a, b, rel
      if (rel > worst) worst = rel; n++ }
    END { if (n < 50) { print "FAIL parity: only " n " steps"; exit 1 }
          if (worst > 1e-4) { printf "FAIL parity: worst relative difference %.2e > 1e-4\n", worst; exit 1 }
          printf "PASS parity naive vs flash: %d steps, worst relative difference %.2e <= 1e-4\n", n, worst }'

python3 scripts/plot_loss.py "$tmp/naive/log.csv" "$tmp/flash/log.csv" --labels naive flash -o "$tmp/parity.png"
[ "$(head -c 4 "$tmp/parity.png" | tail -c 3)" = "PNG" ] || fail "plot_loss.py wrote no PNG"
echo "PASS plot_loss.py drew both curves into a PNG"

# 2. learning + 3. sampling
"$BUILD/train_gpt_cpu" "${small[@]}" -x 200 -l 1e-3 -v 200 -m 8 -s 200 -g 24 \
    --vocab "$DATA/gpt2" -o "$tmp/learn" > "$tmp/learn.out"
first=$(awk -F, '$1 == 0 { print $3 }' "$tmp/learn/log.csv")
last=$(awk -F, '$1 == 200 { print $3 }' "$tmp/learn/log.csv")
echo "validation loss: $first at step 0 -> $last at step 200"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 3.0) }' || fail "validation loss did not fall by 3 nats"
echo "PASS learning: validation loss $first -> $last"
sample=$(awk '/^generating:/ { g = 1; next } g == 1 && /^---$/ { g = 2; next } g == 2 { print; exit }' "$tmp/learn.out")
[ -n "$sample" ] || fail "no sample printed"
echo "$sample" | grep -q '<[0-9]*>' && fail "sample printed token ids instead of text: $sample"
echo "PASS sampling printed decoded text: $sample"

# 4. model file round trip
"$BUILD/train_gpt_cpu" "${small[@]}" -x 0 -v 0 -s 0 -o "$tmp/init" > /dev/null
"$BUILD/train_gpt_cpu" -e "$tmp/init/model_00000000.bin" -t 64 -b 4 -x 0 -v 0 -s 0 \
    -i "$DATA/tinyshakespeare/tiny_shakespeare_train.bin" -o "$tmp/reload" > /dev/null
cmp "$tmp/init/model_00000000.bin" "$tmp/reload/model_00000000.bin" || fail "model file changed on reload"
echo "PASS model file written at init loads back bit-identical"

# 5. batch invariance
for b in 8 2 1; do
    "$BUILD/train_gpt_cpu" "${small[@]}" -b $b -d 512 -x 6 -l 1e-3 -v 3 -m 1 -s 0 --batch-invariant 1 \
        -o "$tmp/inv$b" > "$tmp/inv$b.out"
    grep -q "gradients summed per group of sequences" "$tmp/inv$b.out" || fail "--batch-invariant 1 not reported"
done
for b in 2 1; do
    cmp -s "$tmp/inv8/model_00000006.bin" "$tmp/inv$b/model_00000006.bin" ||
        fail "--batch-invariant 1: B $b trained other weights than B 8"
    [ "$(cut -d, -f1,3 "$tmp/inv8/log.csv")" = "$(cut -d, -f1,3 "$tmp/inv$b/log.csv")" ] ||
        fail "--batch-invariant 1: B $b has other validation losses than B 8"
done
echo "PASS --batch-invariant 1: B 8, 2 and 1 train the same weights and validation losses, bit for bit"
"$BUILD/train_gpt_cpu" "${small[@]}" -b 4 -d 512 -x 6 -l 1e-3 -v 0 -s 0 --batch-invariant 2 -o "$tmp/inv2g" > /dev/null
cmp -s "$tmp/inv2/model_00000006.bin" "$tmp/inv2g/model_00000006.bin" &&
    fail "--batch-invariant 2 at B 4 trained the bits of groups of one sequence: the groups are not used"
"$BUILD/train_gpt_cpu" "${small[@]}" -b 2 -d 512 -x 6 -l 1e-3 -v 0 -s 0 --batch-invariant 2 -o "$tmp/inv2g2" > /dev/null
cmp -s "$tmp/inv2g/model_00000006.bin" "$tmp/inv2g2/model_00000006.bin" ||
    fail "--batch-invariant 2: B 4 and B 2 trained other weights"
echo "PASS --batch-invariant 2: B 4 and 2 train the same weights, other bits than groups of one sequence"
for bad in "-b 4 --batch-invariant 8:-b 4 is not a multiple of --batch-invariant 8" \
           "-b 4 --batch-invariant 3:--batch-invariant 3 does not divide the 8 sequences"; do
    if "$BUILD/train_gpt_cpu" "${small[@]}" -d 512 ${bad%%:*} -o "$tmp/bad" > "$tmp/bad.out" 2>&1; then
        fail "${bad%%:*} was accepted"
    fi
    grep -qF -e "${bad#*:}" "$tmp/bad.out" || fail "${bad%%:*}: $(tail -1 "$tmp/bad.out")"
done
echo "PASS a -b or -d that --batch-invariant's groups do not divide is refused"
for b in 8 1; do
    "$BUILD/train_gpt_cpu" "${small[@]}" -b $b -d 512 -x 6 -l 1e-3 -v 0 -s 0 -o "$tmp/var$b" > /dev/null
done
cmp -s "$tmp/var8/model_00000006.bin" "$tmp/var1/model_00000006.bin" &&
    fail "without --batch-invariant B 8 and B 1 trained the same bits: the check above proves nothing"
echo "PASS without --batch-invariant, B 8 and B 1 differ in the last bits (as expected)"

# 6. recompute levels
for r in 1 2; do
    "$BUILD/train_gpt_cpu" "${small[@]}" -b 8 -d 512 -x 6 -l 1e-3 -v 0 -s 0 -r $r -o "$tmp/r$r" > /dev/null
    cmp -s "$tmp/var8/model_00000006.bin" "$tmp/r$r/model_00000006.bin" || fail "-r $r trained other weights than -r 0"
    [ "$(cut -d, -f1,2 "$tmp/var8/log.csv")" = "$(cut -d, -f1,2 "$tmp/r$r/log.csv")" ] ||
        fail "-r $r logged other train losses than -r 0"
done
echo "PASS -r 1 and -r 2 train the weights and losses of -r 0 bit for bit"

# 7. head slices
wide=(--layers 1 --channels 16 --heads 2 --max-seq 64 -t 64 --seed 7 -d 10240 -x 2 -l 1e-3 -v 0 -s 0
      -i "$DATA/tinyshakespeare/tiny_shakespeare_train.bin")
"$BUILD/train_gpt_cpu" "${wide[@]}" -b 160 --batch-invariant 32 -o "$tmp/head160" > /dev/null
"$BUILD/train_gpt_cpu" "${wide[@]}" -b 32 --batch-invariant 32 -o "$tmp/head32" > /dev/null
cmp -s "$tmp/head160/model_00000002.bin" "$tmp/head32/model_00000002.bin" ||
    fail "--batch-invariant 32: B 160 (two head slices) trained other weights than B 32 (one)"
"$BUILD/train_gpt_cpu" "${wide[@]}" -b 160 -o "$tmp/head160any" > /dev/null
awk -F, 'NR == FNR { if (FNR > 1) want[$1] = $2; next }
         FNR > 1 { d = $2 - want[$1]; if (d < 0) d = -d; if (d > 1e-5 * want[$1]) bad = 1; n++ }
         END { exit bad || n != 2 }' "$tmp/head32/log.csv" "$tmp/head160any/log.csv" ||
    fail "B 160 without --batch-invariant: train losses beyond 1e-5 of B 32's: $(cat "$tmp/head160any/log.csv")"
echo "PASS the head in two slices of a micro-batch trains the bits of one slice per micro-batch (--batch-invariant 32)"
