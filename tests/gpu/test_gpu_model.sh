#!/bin/bash
# Whole-model checks on a GPU: the CUDA trainer against the CPU reference trainer on the same small
# GPT-2, the same data and the same seed.
#   FP32: the loss of every one of 20 steps and the gradient norm (all gradients at once) within
#         1e-4 relative of the CPU's.
#   BF16: the first step's loss within 1e-2 relative (bf16 activations: a few 2^-8 roundings per
#         layer), and the loss still falling after 20 steps.
#   --batch-invariant 1: B 16, 4 and 1 train the same model file bit for bit (see below).
#   -r 1 and -r 2 train the model file and losses of -r 0 bit for bit.
#   Tuned matmuls train the bits of untuned ones (MATMUL_TUNE=0).
#   Generation and HellaSwag scores of the 20-step model against the CPU's (see below).
#   MFU: the peak the start-up line names is the built-in table's for this GPU (an H200's: 989.4
#         TFLOP/s dense BF16, 67 FP32), and log.csv's mfu is 6N + 6LCT (computed here) x tok_per_s /
#         that peak within 1%; a GPU not in the table says 'MFU n/a' and logs none.
# Usage: BUILD=dir GPU_ARCH=90 tests/gpu/test_gpu_model.sh   (needs a GPU; scripts/get_data.sh fetches the data)
set -eu
"$(dirname "$0")/../../scripts/get_data.sh" # before any cd: a relative GPT_DATA_DIR is the caller's
. "$(dirname "$0")/../lib/log_compare.sh"
. "$(dirname "$0")/../lib/mfu.sh"
. "$(dirname "$0")/../lib/hellaswag_compare.sh"
BUILD=${BUILD:-.}
ARCH=${GPU_ARCH:-90}
PREPARED=$(dirname "$0")/../../data
DATA=$PREPARED/tinyshakespeare
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failed=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; failed=1; }

make --no-print-directory BUILD="$BUILD/model-cpu" ATTN=naive "$BUILD/model-cpu/train_gpt_cpu" \
    "$BUILD/model-cpu/prepare_data" >/dev/null
for p in FP32 BF16; do
    make --no-print-directory BUILD="$BUILD/model-$p" ATTN=naive PRECISION=$p GPU_ARCH="$ARCH" \
        "$BUILD/model-$p/train_gpt" >/dev/null
done

# 2 layers, 64 channels, 4 heads, T = 64, B = 4, 20 steps, no validation, sampling or checkpoints.
ARGS=(-i "$DATA/tiny_shakespeare_train.bin" -j "$DATA/tiny_shakespeare_val.bin" --layers 2
      --channels 64 --heads 4 --max-seq 64 -b 4 -t 64 -x 20 -l 1e-3 -v 0 -s 0 -n 0 --seed 1337)
"$BUILD/model-cpu/train_gpt_cpu" "${ARGS[@]}" -o "$WORK/cpu" > "$WORK/cpu.out"
for p in FP32 BF16; do
    "$BUILD/model-$p/train_gpt" "${ARGS[@]}" -o "$WORK/$p" > "$WORK/$p.out"
done

LOG=$WORK/cpu/log.csv
loss=$(log_column "$LOG" train_loss)
if r=$(compare_logs "$LOG" "$WORK/FP32/log.csv" train_loss 1 20 1e-4); then pass "FP32 losses of 20 steps vs CPU: $r"; else fail "FP32 losses vs CPU: $r"; fi
if r=$(compare_logs "$LOG" "$WORK/FP32/log.csv" grad_norm 1 20 1e-4); then pass "FP32 gradient norms of 20 steps vs CPU: $r"; else fail "FP32 gradient norms vs CPU: $r"; fi
if r=$(compare_logs "$LOG" "$WORK/BF16/log.csv" train_loss 1 1 1e-2); then pass "BF16 first loss vs CPU: $r"; else fail "BF16 first loss vs CPU: $r"; fi
first=$(awk -F, -v c="$loss" 'NR == 2 { print $c }' "$WORK/BF16/log.csv")
last=$(awk -F, -v c="$loss" 'NR == 21 { print $c }' "$WORK/BF16/log.csv")
if awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }'; then pass "BF16 loss falls: $first -> $last"; else fail "BF16 loss does not fall: $first -> $last"; fi
# MFU of the runs above (L 2, C 64, max T 64, T 64).
FPT=$(gpt2_flops_per_token 2 64 64 64 50304)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader -i "${CUDA_VISIBLE_DEVICES:-0}" | head -n 1)
for p in FP32 BF16; do
    line=$(grep '^MFU' "$WORK/$p.out" || true)
    peak=$(sed -n 's/^MFU: [0-9,]* FLOPs per token (6N + 6LCT) against \([0-9.]*\) TFLOP\/s, the .*/\1/p' <<< "$line")
    want=$(case "$gpu/$p" in "NVIDIA H200/BF16") echo 989.4 ;; "NVIDIA H200/FP32") echo 67 ;; esac)
    if [ -n "$peak" ]; then
        if ! grep -q "^MFU: $(commas "$FPT") FLOPs per token" <<< "$line"; then fail "$p MFU: not $FPT FLOPs per token: $line"
        elif [ -n "$want" ] && [ "$peak" != "$want" ]; then fail "$p MFU on $gpu: peak $peak TFLOP/s, want $want"
        elif r=$(check_mfu_log "$WORK/$p/log.csv" "$FPT" "$peak" 1); then pass "$p MFU on $gpu: $line; log.csv's mfu within 1%"
        else fail "$p MFU on $gpu: $r"; fi
    elif grep -qx "MFU n/a: no $p peak known for $gpu; pass --peak-tflops" <<< "$line" && [ -z "$want" ] &&
        [ "$(grep -c '^step .* | MFU n/a | ' "$WORK/$p.out")" -eq 20 ] && r=$(check_mfu_log "$WORK/$p/log.csv" "$FPT" 1 0); then
        pass "$p MFU on $gpu, which the table lacks: n/a on the lines, none in log.csv"
    else
        fail "$p MFU on $gpu: '$line' ${r:-}"
    fi
done
# BF16 resume: 10 steps, then 10 more resumed from the training state, equal 20 straight steps bit
# for bit (the bf16 weights are rebuilt from the master weights with the saved step's stochastic
# rounding). A constant learning rate, so that -x 10 and -x 20 follow the same schedule.
"$BUILD/model-BF16/train_gpt" "${ARGS[@]}" -k constant -o "$WORK/bf16-straight" > /dev/null
"$BUILD/model-BF16/train_gpt" "${ARGS[@]}" -k constant -x 10 -o "$WORK/bf16-split" > /dev/null
"$BUILD/model-BF16/train_gpt" "${ARGS[@]}" -k constant -y 1 --allow-change steps -o "$WORK/bf16-split" \
    > "$WORK/bf16-resume.out"
if grep -q "resumed from" "$WORK/bf16-resume.out" &&
   cmp -s <(cut -d, -f1,2,5 "$WORK/bf16-straight/log.csv") <(cut -d, -f1,2,5 "$WORK/bf16-split/log.csv") &&
   cmp -s "$WORK/bf16-straight/model_00000020.bin" "$WORK/bf16-split/model_00000020.bin"; then
    pass "BF16 resume continues bit for bit: 20 losses, norms and the final model file"
else
    fail "BF16 resume differs from 20 straight steps: $(paste -d, <(cut -d, -f1,2 "$WORK/bf16-straight/log.csv") <(cut -d, -f2 "$WORK/bf16-split/log.csv") | awk -F, 'NR > 1 && $2 != $3 { print "step " $1 ": " $2 " vs " $3; exit }')"
fi
# --batch-invariant: micro-batches of 16, 4 and 1 sequences (the same 16 per step) train the same
# model file bit for bit in both precisions; without the option B 16 and B 1 differ, so the option is
# what makes them equal.
for p in FP32 BF16; do
    for b in 16 4 1; do
        "$BUILD/model-$p/train_gpt" "${ARGS[@]}" -b $b -d 1024 -x 8 --batch-invariant 1 -o "$WORK/inv-$p-$b" > /dev/null
    done
    "$BUILD/model-$p/train_gpt" "${ARGS[@]}" -b 16 -d 1024 -x 8 -o "$WORK/var-$p-16" > /dev/null
    "$BUILD/model-$p/train_gpt" "${ARGS[@]}" -b 1 -d 1024 -x 8 -o "$WORK/var-$p-1" > /dev/null
    m=model_00000008.bin
    if cmp -s "$WORK/inv-$p-16/$m" "$WORK/inv-$p-4/$m" && cmp -s "$WORK/inv-$p-16/$m" "$WORK/inv-$p-1/$m"; then
        pass "$p --batch-invariant 1: B 16, 4 and 1 train the same model file bit for bit (8 steps)"
    else
        fail "$p --batch-invariant 1: B 16, 4 and 1 train different weights"
    fi
    if cmp -s "$WORK/var-$p-16/$m" "$WORK/var-$p-1/$m"; then
        fail "$p without --batch-invariant, B 16 and B 1 trained the same bits: the check above proves nothing"
    else
        pass "$p without --batch-invariant, B 16 and B 1 differ in the last bits (as expected)"
    fi
    # Recompute rebuilds GELU (-r 1) and the layernorms (-r 2) with the forward's own kernels (the
    # fused residual + layernorm is one kernel with layernorm_forward), so every level trains the
    # bits of -r 0.
    for r in 1 2; do
        "$BUILD/model-$p/train_gpt" "${ARGS[@]}" -b 16 -d 1024 -x 8 -r $r -o "$WORK/r$r-$p" > /dev/null
        if cmp -s "$WORK/var-$p-16/$m" "$WORK/r$r-$p/$m" &&
            [ "$(cut -d, -f1,2 "$WORK/var-$p-16/log.csv")" = "$(cut -d, -f1,2 "$WORK/r$r-$p/log.csv")" ]; then
            pass "$p -r $r trains the model file and losses of -r 0 bit for bit"
        else
            fail "$p -r $r trains other bits than -r 0"
        fi
    done
done

# cuBLASLt's algorithms are tuned per product shape (kernels/cuda/matmul.cu), but only among those
# that compute the bits of its heuristic's first choice: at GPT-2 124M's widths (C 768, the whole
# vocabulary; 2 layers, T 256, B 16) the tuned run and MATMUL_TUNE=0 train the same model file and
# losses, while the tuning picked another algorithm than the first for some shapes (printed).
for p in FP32 BF16; do
    WIDE=("${ARGS[@]}" --channels 768 --heads 12 --max-seq 256 -t 256 -b 16 -x 4)
    MATMUL_TUNE=0 "$BUILD/model-$p/train_gpt" "${WIDE[@]}" -o "$WORK/untuned-$p" > /dev/null
    MATMUL_TUNE=2 "$BUILD/model-$p/train_gpt" "${WIDE[@]}" -o "$WORK/tuned-$p" > /dev/null 2> "$WORK/tuned-$p.err"
    others=$(grep -c "^matmul .*: candidate [2-9]" "$WORK/tuned-$p.err" || true)
    if cmp -s "$WORK/untuned-$p/model_00000004.bin" "$WORK/tuned-$p/model_00000004.bin" &&
        [ "$(cut -d, -f1,2 "$WORK/untuned-$p/log.csv")" = "$(cut -d, -f1,2 "$WORK/tuned-$p/log.csv")" ]; then
        pass "$p tuned matmuls train the bits of MATMUL_TUNE=0 ($others of $(grep -c "^matmul " "$WORK/tuned-$p.err") tuned shapes on another algorithm)"
    else
        fail "$p tuned matmuls train other bits than MATMUL_TUNE=0"
    fi
done

# Generation: greedy tokens against the argmax of an independent forward on the GPU (tests/unit/test_generate.c;
# a logit within the tolerance of the largest counts as a tie, which another sequence length may order
# differently), and the FP32 build's greedy and sampled texts equal to the CPU's, from the CPU's model file.
MODEL=$WORK/cpu/model_00000020.bin
PROMPT=(-x 0 -e "$MODEL" --vocab "$PREPARED/gpt2" --prompt "ROMEO:" --temperature 0 -g 40)
"$BUILD/model-cpu/train_gpt_cpu" "${PROMPT[@]}" > "$WORK/greedy-cpu.txt" 2> /dev/null
for p in FP32 BF16; do
    tolerance=$([ $p = FP32 ] && echo 1e-4 || echo 5e-2)
    make --no-print-directory BUILD="$BUILD/model-$p" ATTN=naive PRECISION=$p GPU_ARCH="$ARCH" \
        "$BUILD/model-$p/tests/test_generate" >/dev/null
    if r=$("$BUILD/model-$p/tests/test_generate" "$MODEL" "$DATA/tiny_shakespeare_val.bin" --tolerance $tolerance | grep -E '^(PASS|FAIL)'); then
        echo "$r" | grep -q FAIL && fail "$p greedy generation: $r" || pass "$p greedy generation: $r"
    else fail "$p test_generate did not run"; fi
    "$BUILD/model-$p/train_gpt" "${PROMPT[@]}" > "$WORK/greedy-$p.txt" 2> "$WORK/greedy-$p.err"
    "$BUILD/model-$p/train_gpt" "${PROMPT[@]}" --temperature 1 --seed 5 > "$WORK/sampled-$p.txt" 2> /dev/null
done
# The model of 20 steps is greedy for newlines; sampling (the same seed, so the same random numbers)
# also compares the probabilities of the other tokens.
"$BUILD/model-cpu/train_gpt_cpu" "${PROMPT[@]}" --temperature 1 --seed 5 > "$WORK/sampled-cpu.txt" 2> /dev/null
for mode in greedy sampled; do
    if cmp -s "$WORK/$mode-cpu.txt" "$WORK/$mode-FP32.txt"; then pass "FP32 $mode text equals the CPU's: $(tr '\n' '|' < "$WORK/$mode-cpu.txt")"
    else fail "FP32 $mode text differs from the CPU's: $(tr '\n' '|' < "$WORK/$mode-FP32.txt") vs $(tr '\n' '|' < "$WORK/$mode-cpu.txt")"; fi
done
echo "BF16 greedy text: $(tr '\n' '|' < "$WORK/greedy-BF16.txt"); sampled: $(tr '\n' '|' < "$WORK/sampled-BF16.txt")"
# HellaSwag: every ending's score (--hellaswag-dump) on the GPU against the CPU's, on the model of 20
# steps: FP32 within 1e-4 relative and the same predicted endings, BF16 within 1e-2 (bf16 activations;
# a near tie may then pick another ending, so its accuracy is printed, not compared).
hellaswag_examples_jsonl "$WORK/hs.jsonl"
"$BUILD/model-cpu/prepare_data" --vocab "$PREPARED/gpt2" --hellaswag "$WORK/hs.jsonl" -o "$WORK/hs.bin" > /dev/null
HS=(-e "$MODEL" -t 64 -b 4 -x 0 -v 0 -s 0 -i "$DATA/tiny_shakespeare_train.bin" --hellaswag "$WORK/hs.bin")
"$BUILD/model-cpu/train_gpt_cpu" "${HS[@]}" --hellaswag-dump "$WORK/hs-cpu.csv" -o "$WORK/hs-cpu" > "$WORK/hs-cpu.out"
for p in FP32 BF16; do
    tolerance=$([ $p = FP32 ] && echo 1e-4 || echo 1e-2)
    "$BUILD/model-$p/train_gpt" "${HS[@]}" --hellaswag-dump "$WORK/hs-$p.csv" -o "$WORK/hs-$p" > "$WORK/hs-$p.out"
    if r=$(hellaswag_dump_diff "$WORK/hs-cpu.csv" "$WORK/hs-$p.csv"); then same_examples=0; else same_examples=1; fi
    read -r worst other n <<< "$r"
    accuracy="CPU $(hellaswag_accuracy "$WORK/hs-cpu.out"), $p $(hellaswag_accuracy "$WORK/hs-$p.out")"
    if [ $same_examples = 0 ] && awk -v w="$worst" -v t="$tolerance" 'BEGIN { exit !(w <= t) }' &&
        { [ $p = BF16 ] || [ "$other" = 0 ]; }; then
        pass "$p HellaSwag scores of $n examples vs CPU: worst relative difference $worst (<= $tolerance), $other other predictions; $accuracy"
    else fail "$p HellaSwag scores vs CPU: $([ $same_examples = 1 ] && echo "the dumps list other examples; ")worst relative difference $worst (tolerance $tolerance), $other other predictions; $accuracy"; fi
done
[ $failed = 0 ] && echo "test_gpu_model: all passed" || { echo "test_gpu_model: FAILED"; exit 1; }
