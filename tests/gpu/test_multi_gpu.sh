#!/bin/bash
# Data parallelism on 2 GPUs (device kind nvidia-h200-x2 or larger): GPT-2 124M, the same global
# batch on 1 and on 2 GPUs through scripts/launch.sh.
#   1. FP32: every one of 20 steps' losses on 2 GPUs within 1e-4 relative of 1 GPU's.
#   2. BF16: every one of 100 steps within 1% relative.
#   3. -z 1 (sharded optimizer) gives the same losses and gradient norms as -z 0, bit for bit, in
#      both precisions: the sum over ranks and the norm are computed the same way in both stages;
#      with --offload 1 besides (BF16), the same bits and model file.
#   4. Resume on 2 GPUs (FP32, -z 1): 10 steps, then 10 more resumed, equal the 20 straight steps
#      bit for bit (losses and the final model file); resuming on 1 GPU is refused clearly.
#   5. HellaSwag on 2 GPUs (each rank scores its share of the examples, --hellaswag-dump writes a
#      file a rank) against 1, from the FP32 model of 1: the same examples, every ending's score
#      within 1e-4 relative in FP32 and 1e-2 in BF16, the same predictions and the same accuracy.
#   6. The gradients summed over the ranks layer by layer beside the backward
#      (GRAD_SUMS_BESIDE_BACKWARD=1) against after the backward in one collective (the default, as in
#      every run above): the same losses, gradient norms and final model file, bit for bit, in FP32
#      at -z 0 and -z 1, in BF16 with --batch-invariant 2, and in a GRADS=BF16 build (bf16
#      gradients) at -z 1.
#   7. train_gpt built without NCCL (NCCL=0: the ranks add over TCP through rank 0,
#      kernels/cpu/comm.c) trains NCCL's bits in FP32 at -z 0 and -z 1 (on 2 ranks both add a + b).
#   8. Failure: a rank killed with SIGKILL in the middle of training makes the other one stop with
#      a message within --nccl-timeout (not a hang); a rank whose partner never starts gives up.
# Usage: BUILD=dir GPU_ARCH=90 tests/gpu/test_multi_gpu.sh   (needs 2 GPUs; scripts/get_data.sh fetches the data)
set -eu
"$(dirname "$0")/../../scripts/get_data.sh" # before any cd: a relative GPT_DATA_DIR is the caller's
. "$(dirname "$0")/../lib/log_compare.sh"
. "$(dirname "$0")/../lib/hellaswag_compare.sh"
. "$(dirname "$0")/../lib/run_files.sh"
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/multi}
ARCH=${GPU_ARCH:-90}
DATA=data/tinyshakespeare
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$WORK"
failed=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; failed=1; }

for p in FP32 BF16; do
    make --no-print-directory -s BUILD="$BUILD/$p" PRECISION=$p GPU_ARCH="$ARCH" NCCL=1 "$BUILD/$p/train_gpt"
done
make --no-print-directory -s BUILD="$BUILD/BF16-grads" PRECISION=BF16 GRADS=BF16 GPU_ARCH="$ARCH" NCCL=1 \
    "$BUILD/BF16-grads/train_gpt"
make --no-print-directory -s BUILD="$BUILD/FP32-tcp" PRECISION=FP32 GPU_ARCH="$ARCH" NCCL=0 "$BUILD/FP32-tcp/train_gpt"
make --no-print-directory -s BUILD="$BUILD/cpu" "$BUILD/cpu/prepare_data"
COMMON=(-e d12 -i "$DATA/tiny_shakespeare_train.bin" -j "$DATA/tiny_shakespeare_val.bin" -t 1024
        -v 0 -s 0 -l 6e-4 -u 700 --seed 1337) # llm.c's GPT-2 124M learning rate recipe, as scripts/parity.sh
run() { # run NGPUS PRECISION OUTDIR ARGS...
    local n=$1 p=$2 out=$3
    shift 3
    scripts/launch.sh "$n" "$BUILD/$p/train_gpt" "${COMMON[@]}" -o "$out" "$@" > "$out.log" 2>&1 ||
        { echo "run failed: $n GPU(s) $p $*"; tail -20 "$out.log"; return 1; }
}

# 1. FP32, 16384 tokens per step: 1 GPU x B 4 x 4 accumulation = 2 GPUs x B 4 x 2.
run 1 FP32 "$WORK/fp32-1" -b 4 -d 16384 -x 20 -n 0
run 2 FP32 "$WORK/fp32-2" -b 4 -d 16384 -x 20 -n 0
if r=$(compare_logs "$WORK/fp32-1/log.csv" "$WORK/fp32-2/log.csv" train_loss 1 20 1e-4); then pass "FP32 1 vs 2 GPUs: $r"; else fail "FP32 1 vs 2 GPUs: $r"; fi

# 2. BF16, the same 16384 tokens per step, 100 steps (4.5 epochs of tinyshakespeare). The training
# file holds 74 batches of B 4, an even number: each epoch, every rank reads 37 of them. (With an odd
# number, 2 GPUs leave one batch of each epoch unread and from the second epoch on the data differ
# from 1 GPU's; data/dataloader.h says why.)
run 1 BF16 "$WORK/bf16-1" -b 4 -d 16384 -x 100 -n 0
run 2 BF16 "$WORK/bf16-2" -b 4 -d 16384 -x 100 -n 0
if r=$(compare_logs "$WORK/bf16-1/log.csv" "$WORK/bf16-2/log.csv" train_loss 1 100 1e-2); then pass "BF16 1 vs 2 GPUs: $r"; else fail "BF16 1 vs 2 GPUs: $r"; fi

# 3. ZeRO stage 1 against stage 0.
run 2 FP32 "$WORK/fp32-2z1" -b 4 -d 16384 -x 20 -n 0 -z 1
run 2 BF16 "$WORK/bf16-2z1" -b 4 -d 16384 -x 100 -n 0 -z 1
for p in fp32 bf16; do
    if same_columns "$WORK/$p-2" "$WORK/$p-2z1"; then pass "$p -z 1 equals -z 0 on 2 GPUs: losses and norms bit for bit"
    else fail "$p -z 1 differs from -z 0: $(compare_logs "$WORK/$p-2/log.csv" "$WORK/$p-2z1/log.csv" train_loss 1 20 0)"; fi
done
grep -h "optimizer" "$WORK/fp32-2.log" "$WORK/fp32-2z1.log" | head -2
# ... and with each rank's shard of AdamW's state offloaded (BF16: its master weights too, gathered
# from the host for the final model file): the same bits, model file included.
run 2 BF16 "$WORK/bf16-2z1off" -b 4 -d 16384 -x 100 -n 0 -z 1 --offload 1
if same_bits "$WORK/bf16-2z1" "$WORK/bf16-2z1off" 100; then
    pass "bf16 -z 1 --offload 1 equals -z 1 on 2 GPUs: losses, norms and the model file bit for bit"
else fail "bf16 -z 1 --offload 1 differs from -z 1 on 2 GPUs"; fi

# 4. Resume on 2 GPUs with -z 1: 10 steps (checkpoint at 10), then resumed to 20.
run 2 FP32 "$WORK/resume" -b 4 -d 16384 -x 20 -n 10 -z 1 --keep 0
mkdir -p "$WORK/split"
run 2 FP32 "$WORK/split" -b 4 -d 16384 -x 10 -n 10 -z 1
# All 20 steps are warmup (-u 700), whose learning rate does not depend on -x.
run 2 FP32 "$WORK/split" -b 4 -d 16384 -x 20 -n 10 -z 1 -y 1 --allow-change steps
if same_bits "$WORK/resume" "$WORK/split" 20; then
    pass "2-GPU resume (-z 1) continues bit for bit: losses, norms and the final model file"
else
    fail "2-GPU resume differs: $(compare_logs "$WORK/resume/log.csv" "$WORK/split/log.csv" train_loss 1 20 0)"
fi
status=0
scripts/launch.sh 1 "$BUILD/FP32/train_gpt" "${COMMON[@]}" -o "$WORK/split" -b 4 -d 16384 -x 30 -z 1 -y 1 \
    --allow-change steps \
    > "$WORK/wrong-world.log" 2>&1 || status=$?
if [ $status -ne 0 ] && grep -q "same number of GPUs" "$WORK/wrong-world.log"; then
    pass "resume of a 2-GPU state on 1 GPU is refused: $(grep -m1 error "$WORK/wrong-world.log")"
else
    fail "resume on 1 GPU of a 2-GPU state: exit $status, $(tail -2 "$WORK/wrong-world.log")"
fi

# 5. HellaSwag on 2 GPUs against 1, from the FP32 model of 1. B 4 is one example's 4 endings a
# forward, on either split.
hellaswag_examples_jsonl "$WORK/hs.jsonl"
"$BUILD/cpu/prepare_data" --vocab data/gpt2 --hellaswag "$WORK/hs.jsonl" -o "$WORK/hs.bin" > /dev/null
for p in FP32 BF16; do
    tolerance=$([ $p = FP32 ] && echo 1e-4 || echo 1e-2)
    for n in 1 2; do
        run "$n" "$p" "$WORK/hs-$p-$n" -e "$WORK/fp32-1/model_00000020.bin" -t 64 -b 4 -x 0 --hellaswag "$WORK/hs.bin" \
            --hellaswag-dump "$WORK/hs-$p-$n.csv"
    done
    # The ranks' files in rank order (rank 0 scores the first examples), under one header.
    { cat "$WORK/hs-$p-2.csv.rank0"; tail -n +2 "$WORK/hs-$p-2.csv.rank1"; } > "$WORK/hs-$p-2.csv"
    if r=$(hellaswag_dump_diff "$WORK/hs-$p-1.csv" "$WORK/hs-$p-2.csv"); then same_examples=0; else same_examples=1; fi
    read -r worst other examples <<< "$r"
    one=$(hellaswag_accuracy "$WORK/hs-$p-1.log") two=$(hellaswag_accuracy "$WORK/hs-$p-2.log")
    if [ $same_examples = 0 ] && [ "$other" = 0 ] && [ -n "$one" ] && [ "$one" = "$two" ] &&
        awk -v w="$worst" -v t="$tolerance" 'BEGIN { exit !(w <= t) }'; then
        pass "$p HellaSwag on 2 GPUs equals 1: $examples examples, worst relative difference of the scores $worst (<= $tolerance), the same predictions, $one"
    else
        fail "$p HellaSwag on 2 GPUs: $([ $same_examples = 1 ] && echo "the dumps list other examples; ")worst relative difference $worst (tolerance $tolerance), $other other predictions; 1 GPU: $one, 2 GPUs: $two"
    fi
done

# 6. The sums beside the backward against after it. Every step here has 2 micro-batches a rank, so
# the sums start in the second backward only. FP32 at -z 0 and -z 1 against the runs of checks 1
# and 3; with --batch-invariant, wte's gradient is completed (the encoder's share added) before its
# sum; with bf16 gradients, each layer's are folded into bf16 before theirs.
GRAD_SUMS_BESIDE_BACKWARD=1 run 2 FP32 "$WORK/fp32-2-beside" -b 4 -d 16384 -x 20 -n 0
GRAD_SUMS_BESIDE_BACKWARD=1 run 2 FP32 "$WORK/fp32-2z1-beside" -b 4 -d 16384 -x 20 -n 0 -z 1
run 2 BF16 "$WORK/bf16-bi" -b 4 -d 16384 -x 20 -n 0 --batch-invariant 2
GRAD_SUMS_BESIDE_BACKWARD=1 run 2 BF16 "$WORK/bf16-bi-beside" -b 4 -d 16384 -x 20 -n 0 --batch-invariant 2
run 2 BF16-grads "$WORK/bf16g-z1" -b 4 -d 16384 -x 20 -n 0 -z 1
GRAD_SUMS_BESIDE_BACKWARD=1 run 2 BF16-grads "$WORK/bf16g-z1-beside" -b 4 -d 16384 -x 20 -n 0 -z 1
for pair in "fp32-2 FP32 -z 0" "fp32-2z1 FP32 -z 1" "bf16-bi BF16 --batch-invariant 2" "bf16g-z1 GRADS=BF16 -z 1"; do
    read -r name what <<< "$pair"
    steps=$(tail -n 1 "$WORK/$name/log.csv" | cut -d, -f1)
    if same_bits "$WORK/$name" "$WORK/$name-beside" "$steps"; then
        pass "$what on 2 GPUs: the sums beside the backward train the bits of the sums after it (losses, norms, model file)"
    else
        r=$(compare_logs "$WORK/$name-beside/log.csv" "$WORK/$name/log.csv" train_loss 1 "$steps" 0)
        fail "$what on 2 GPUs: the sums beside the backward differ from after it: $r"
    fi
done

# 7. Without NCCL, against the NCCL runs of checks 1 and 3.
run 2 FP32-tcp "$WORK/fp32-2-tcp" -b 4 -d 16384 -x 20 -n 0
run 2 FP32-tcp "$WORK/fp32-2z1-tcp" -b 4 -d 16384 -x 20 -n 0 -z 1
for name in fp32-2 fp32-2z1; do
    if same_bits "$WORK/$name" "$WORK/$name-tcp" 20; then
        pass "$name: NCCL=0 (TCP through rank 0) trains the bits of NCCL on 2 GPUs (losses, norms, model file)"
    else
        fail "$name: NCCL=0 differs from NCCL: $(compare_logs "$WORK/$name/log.csv" "$WORK/$name-tcp/log.csv" train_loss 1 20 0)"
    fi
done

# 8. Failures, without the launcher (which would stop the other rank itself).
start_rank() { # start_rank RANK OUTDIR ARGS...: in the background, pid in $!
    local r=$1 out=$2
    shift 2
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r GPT_RUN_ID=fail$$ "$BUILD/BF16/train_gpt" "${COMMON[@]}" -o "$out" \
        --nccl-timeout 20 "$@" > "$out.rank$r.log" 2>&1 &
}
start_rank 0 "$WORK/kill" -b 4 -x 100000 -n 0
pid0=$!
start_rank 1 "$WORK/kill" -b 4 -x 100000 -n 0
pid1=$!
sleep 25 # both ranks are training
t0=$(date +%s)
kill -9 $pid1
status=0
wait $pid0 || status=$?
elapsed=$(( $(date +%s) - t0 ))
wait $pid1 2>/dev/null || true
if [ $status -ne 0 ] && [ $elapsed -le 60 ] && grep -q "rank 0 of 2" "$WORK/kill.rank0.log"; then
    pass "rank 1 killed: rank 0 stopped after ${elapsed} s: $(grep -m1 error "$WORK/kill.rank0.log")"
else
    fail "rank 1 killed: rank 0 exit $status after ${elapsed} s: $(tail -3 "$WORK/kill.rank0.log")"
fi
t0=$(date +%s)
status=0
start_rank 0 "$WORK/alone" -b 4 -x 10 -n 0
wait $! || status=$?
elapsed=$(( $(date +%s) - t0 ))
if [ $status -ne 0 ] && [ $elapsed -le 60 ] && grep -q "rank 0 of 2" "$WORK/alone.rank0.log"; then
    pass "rank 1 never started: rank 0 gave up after ${elapsed} s: $(grep -m1 error "$WORK/alone.rank0.log")"
else
    fail "rank 1 never started: rank 0 exit $status after ${elapsed} s: $(tail -3 "$WORK/alone.rank0.log")"
fi

[ $failed = 0 ] && echo "test_multi_gpu: all passed" || { echo "test_multi_gpu: FAILED"; exit 1; }
