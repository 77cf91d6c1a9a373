#!/bin/bash
# The FP16 build (PRECISION=FP16: fp16 parameters and activations, fp32 master weights, dynamic loss
# scaling by default) on a GPU, against the CPU reference trainer on a small GPT-2 (2 layers, C 128,
# 2 heads: head size 64, as GPT-2's, which the tensor-core flash kernels take; T 64, B 4, 20 steps):
#   - the first step's loss within 2e-3 relative of the CPU's (fp16 activations: a few 2^-11
#     roundings per layer, 8 times finer than BF16's 1e-2 of test_gpu_model.sh, with margin), and
#     the loss falling by more than 0.5 in 20 steps; the step lines show the loss scale;
#   - flash against naive attention: the first loss within 2e-3 relative, the 20th within 1e-2;
#   - an sm_75 build (GPU_ARCH=75, no code of this GPU's), whose PTX the driver compiles for this GPU
#     (the T4's instructions: m16n8k8 products, no cp.async, the sm75 tiles), says so at start-up and
#     trains the first loss within 2e-3 of the native build's;
#   - resume: 10 steps, then 10 more from the training state (the loss scale in it) equal 20
#     straight steps bit for bit;
#   - forced overflows (--inject-nan-grad 3,4: a NaN gradient with a finite loss) skip steps 3 and 4
#     with their reason, halve the scale each time, and the run trains on to step 20;
#   - --loss-scale 0 warns that fp16 gradients may underflow;
#   - model files: a bf16 one (version 5, as llm.c writes) loads with the message that its weights
#     were converted to fp16; one holding 70000 (beyond fp16's 65504) is refused naming the tensor
#     and the value.
# Usage: BUILD=dir GPU_ARCH=90 tests/gpu/test_fp16_gpu.sh   (needs a GPU; scripts/get_data.sh fetches the data)
set -eu
"$(dirname "$0")/../../scripts/get_data.sh" # before any cd: a relative GPT_DATA_DIR is the caller's
. "$(dirname "$0")/../lib/log_compare.sh"
BUILD=${BUILD:-.}
ARCH=${GPU_ARCH:-90}
DATA=$(dirname "$0")/../../data/tinyshakespeare
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failed=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; failed=1; }

make --no-print-directory BUILD="$BUILD/model-cpu" ATTN=naive "$BUILD/model-cpu/train_gpt_cpu" >/dev/null
for a in naive flash; do
    make -j"$(nproc)" --no-print-directory BUILD="$BUILD/fp16-$a" ATTN=$a PRECISION=FP16 GPU_ARCH="$ARCH" \
        "$BUILD/fp16-$a/train_gpt" >/dev/null
done
make -j"$(nproc)" --no-print-directory BUILD="$BUILD/fp16-sm75" ATTN=flash PRECISION=FP16 GPU_ARCH=75 \
    "$BUILD/fp16-sm75/train_gpt" >/dev/null
FP16=$BUILD/fp16-flash/train_gpt

ARGS=(-i "$DATA/tiny_shakespeare_train.bin" -j "$DATA/tiny_shakespeare_val.bin" --layers 2
      --channels 128 --heads 2 --max-seq 64 -b 4 -t 64 -x 20 -l 1e-3 -v 0 -s 0 -n 0 --seed 1337)
"$BUILD/model-cpu/train_gpt_cpu" "${ARGS[@]}" -n 20 -o "$WORK/cpu" > "$WORK/cpu.out"
for a in naive flash; do
    "$BUILD/fp16-$a/train_gpt" "${ARGS[@]}" -o "$WORK/$a" > "$WORK/$a.out"
done
"$BUILD/fp16-sm75/train_gpt" "${ARGS[@]}" -x 2 -o "$WORK/sm75" > "$WORK/sm75.out" 2>&1

loss=$(log_column "$WORK/cpu/log.csv" train_loss)
if r=$(compare_logs "$WORK/cpu/log.csv" "$WORK/flash/log.csv" train_loss 1 1 2e-3); then pass "FP16 first loss vs CPU: $r"
else fail "FP16 first loss vs CPU: $r"; fi
first=$(awk -F, -v c="$loss" 'NR == 2 { print $c }' "$WORK/flash/log.csv")
last=$(awk -F, -v c="$loss" 'NR == 21 { print $c }' "$WORK/flash/log.csv")
if awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }'; then pass "FP16 loss falls: $first -> $last"
else fail "FP16 loss does not fall: $first -> $last"; fi
if grep -q '^step .* | scale [0-9]' "$WORK/flash.out"; then pass "FP16 step lines show the loss scale (dynamic by default)"
else fail "FP16 step lines show no loss scale: $(grep -m1 '^step' "$WORK/flash.out")"; fi
if r=$(compare_logs "$WORK/naive/log.csv" "$WORK/flash/log.csv" train_loss 1 1 2e-3) &&
    r20=$(compare_logs "$WORK/naive/log.csv" "$WORK/flash/log.csv" train_loss 20 20 1e-2); then
    pass "FP16 flash vs naive: $r; $r20"
else fail "FP16 flash vs naive: $r ${r20:-}"; fi
if grep -q 'the sm_75 kernels (compiled from PTX by the driver)' "$WORK/sm75.out" &&
    r=$(compare_logs "$WORK/flash/log.csv" "$WORK/sm75/log.csv" train_loss 1 1 2e-3); then
    pass "FP16 sm_75 build through the driver's JIT: $(grep -o 'FP16, the sm_75 kernels[^|]*' "$WORK/sm75.out" | head -1); $r"
else fail "FP16 sm_75 build through the driver's JIT: ${r:-} $(tail -3 "$WORK/sm75.out")"; fi

# Resume, with a constant learning rate so that -x 10 and -x 20 follow the same schedule.
"$FP16" "${ARGS[@]}" -k constant -o "$WORK/straight" > /dev/null
"$FP16" "${ARGS[@]}" -k constant -x 10 -o "$WORK/split" > /dev/null
"$FP16" "${ARGS[@]}" -k constant -y 1 --allow-change steps -o "$WORK/split" > "$WORK/resume.out"
if grep -q "resumed from" "$WORK/resume.out" &&
    cmp -s <(cut -d, -f1,2,5 "$WORK/straight/log.csv") <(cut -d, -f1,2,5 "$WORK/split/log.csv") &&
    cmp -s "$WORK/straight/model_00000020.bin" "$WORK/split/model_00000020.bin"; then
    pass "FP16 resume continues bit for bit: 20 losses, norms and the final model file"
else fail "FP16 resume differs from 20 straight steps"; fi

# Forced overflows.
skipped=$(log_column "$WORK/cpu/log.csv" skipped)
if "$FP16" "${ARGS[@]}" --inject-nan-grad 3,4 -o "$WORK/overflow" > "$WORK/overflow.out" &&
    grep -q '^step *3/.*SKIPPED: gradient overflow at loss scale [0-9]*: scale halved' "$WORK/overflow.out" &&
    grep -q '^step *4/.*SKIPPED: gradient overflow at loss scale [0-9]*: scale halved' "$WORK/overflow.out" &&
    awk -F, -v c="$skipped" 'NR > 1 && $c == 1 { s[$1] = 1 } END { exit !(s[3] && s[4]) }' "$WORK/overflow/log.csv" &&
    [ "$(tail -n 1 "$WORK/overflow/log.csv" | cut -d, -f1)" = 20 ]; then
    pass "FP16 forced overflows at steps 3 and 4: skipped, the scale halved each time, the run trains on"
else fail "FP16 forced overflows: $(grep -i 'overflow' "$WORK/overflow.out" | head -3)"; fi

if "$FP16" "${ARGS[@]}" -x 1 --loss-scale 0 -o "$WORK/unscaled" 2>&1 | grep -q 'warning: --loss-scale 0 in the FP16 build'; then
    pass "FP16 --loss-scale 0 warns"
else fail "FP16 --loss-scale 0 does not warn"; fi

# Model files from the CPU's 20 steps (fp32, version 3): as bf16 (version 5, without checksums, as
# llm.c writes them), and with one weight of qkvw (tensor 4) set to 70000.
python3 - "$WORK/cpu/model_00000020.bin" "$WORK/bf16.bin" "$WORK/big.bin" <<'EOF'
import array, sys
data = open(sys.argv[1], "rb").read()
header = array.array("i", data[:1024])
header[8:] = array.array("i", [0] * 248)  # no checksums
bits = array.array("I", data[1024:])
bf16 = array.array("i", header)
bf16[1] = 5
open(sys.argv[2], "wb").write(bf16.tobytes() + array.array("H", (b >> 16 for b in bits)).tobytes())
weights = array.array("f", data[1024:])
L, C, maxT, Vp = header[4], header[6], header[2], header[7]
weights[Vp * C + maxT * C + 2 * L * C + 3] = 70000.0  # qkvw[3]
open(sys.argv[3], "wb").write(header.tobytes() + weights.tobytes())
EOF
if "$FP16" "${ARGS[@]}" -e "$WORK/bf16.bin" -x 1 -o "$WORK/from-bf16" > "$WORK/from-bf16.out" 2>&1 &&
    grep -q "model file $WORK/bf16.bin: weights converted to fp16" "$WORK/from-bf16.out"; then
    pass "FP16 loads a bf16 model file: $(grep -o 'weights converted to fp16.*' "$WORK/from-bf16.out")"
else fail "FP16 bf16 model file: $(tail -2 "$WORK/from-bf16.out")"; fi
if ! "$FP16" "${ARGS[@]}" -e "$WORK/big.bin" -x 1 -o "$WORK/from-big" > "$WORK/from-big.out" 2>&1 &&
    grep -q 'weight 70000 (tensor qkvw, index 3) is beyond fp16' "$WORK/from-big.out"; then
    pass "FP16 refuses a weight beyond its range: $(grep -o 'weight 70000.*' "$WORK/from-big.out" | cut -c1-90)"
else fail "FP16 weight beyond range: $(tail -2 "$WORK/from-big.out")"; fi
[ $failed = 0 ] && echo "test_fp16_gpu: all passed" || { echo "test_fp16_gpu: FAILED"; exit 1; }
