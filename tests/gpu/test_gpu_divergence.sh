#!/bin/bash
# The divergence guard of train_gpt on GPUs, BF16 and FP32 builds (the checks of
# tests/e2e/test_divergence.sh that depend on the backend), on a small GPT-2 (2 layers, C 64, 2 heads (the
# BF16 flash kernels need a head size of 32, 64 or 128), T 64, B 4):
#   1 GPU: a NaN loss (step 3) and a NaN gradient (step 5), made by --inject-nan-loss/-grad, are
#          skipped: the model file and the training state (fp32 master weights, AdamW m and v, history)
#          of the skipped step equal those of the step before byte for byte, and the steps after them
#          train on; resuming from the checkpoint of the skipped step 5 continues bit for bit (in BF16
#          this also shows that the bf16 weights did not change in the skipped step: the resumed run
#          rebuilds them from the master weights); 3 NaN steps in a row stop the run (exit 1).
#   2 GPUs (when there are 2, through scripts/launch.sh, -z 0 and -z 1): the NaNs are made on rank 1
#          only; rank 0 reports the same two skips; every rank's state (with -z 0 the whole optimizer
#          state, the same on both ranks; with -z 1 each rank's shard) and the model file stay
#          byte for byte across each skipped step. A rank deciding alone would apply the update of
#          step 3, whose NaN it never saw.
# Then it prints the cost of the guard: GPT-2 124M (BF16, B 16, T 1024) median ms per step of steps
# 131..160 (the z-scores start at step 129) with the z-scores off (the guard's default: non-finite
# and --max-loss checks) and on. With BASELINE_REV=<git revision before the guard> it also builds
# that revision (git archive) and times it the same way.
# Usage: BUILD=dir GPU_ARCH=90 tests/gpu/test_gpu_divergence.sh   (needs a GPU; scripts/get_data.sh fetches the data)
set -eu
"$(dirname "$0")/../../scripts/get_data.sh" # before any cd: a relative GPT_DATA_DIR is the caller's
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-.}
ARCH=${GPU_ARCH:-90}
DATA=data/tinyshakespeare
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failed=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; failed=1; }

for p in FP32 BF16; do
    make --no-print-directory -s BUILD="$BUILD/div-$p" PRECISION=$p GPU_ARCH="$ARCH" "$BUILD/div-$p/train_gpt"
done
ARGS=(-i "$DATA/tiny_shakespeare_train.bin" --layers 2 --channels 64 --heads 2 --max-seq 64 -b 4 -t 64
      -l 1e-3 -k constant -v 0 -s 0 --seed 1337)
NAN=(--inject-nan-loss 3 --inject-nan-grad 5)
model() { printf '%s/model_%08d.bin' "$1" "$2"; }
state() { printf '%s/state_%08d_%05d.bin' "$1" "$2" "${3:-0}"; }
# same_state A B: equal from byte 513 on (all but the 512-byte header: step, rank, data position)
same_state() { cmp -s <(tail -c +513 "$1") <(tail -c +513 "$2"); }
skipped_steps() { awk -F, 'NR > 1 && $8 == 1 { printf "%s%s", sep, $1; sep = "," }' "$1/log.csv"; }
log_values() { cut -d, -f1-5,8 "$1/log.csv"; } # without the timing columns
# unchanged DIR RANKS: the model file and each rank's state equal across the skipped steps 3 and 5,
# and changed by the steps after them
unchanged() {
    local d=$1 ranks=$2 s r
    for s in 3 5; do
        cmp -s "$(model "$d" $((s - 1)))" "$(model "$d" $s)" || { echo "the weights changed in skipped step $s"; return 1; }
        cmp -s "$(model "$d" $s)" "$(model "$d" $((s + 1)))" && { echo "step $((s + 1)) did not train"; return 1; }
        for ((r = 0; r < ranks; r++)); do
            same_state "$(state "$d" $((s - 1)) $r)" "$(state "$d" $s $r)" ||
                { echo "rank $r's optimizer state changed in skipped step $s"; return 1; }
        done
    done
}

for p in FP32 BF16; do
    bin=$BUILD/div-$p/train_gpt
    d=$WORK/$p
    if ! "$bin" "${ARGS[@]}" "${NAN[@]}" -x 8 -n 1 -o "$d" > "$d.out" 2>&1; then
        fail "$p 1 GPU: the run failed: $(tail -n 2 "$d.out")"; continue
    fi
    if [ "$(skipped_steps "$d")" = 3,5 ] && r=$(unchanged "$d" 1); then
        pass "$p 1 GPU: steps 3 (NaN loss) and 5 (NaN gradient) skipped, weights and optimizer state bit-identical across them"
    else fail "$p 1 GPU: skipped steps '$(skipped_steps "$d")' (want 3,5); ${r:-}"; fi
    mkdir "$d-resumed"
    cp "$d/log.csv" "$(model "$d" 5)" "$(state "$d" 5)" "$d-resumed/"
    "$bin" "${ARGS[@]}" "${NAN[@]}" -x 8 -n 1 -y 1 -o "$d-resumed" > "$d-resumed.out" 2>&1 || true
    if cmp -s <(log_values "$d") <(log_values "$d-resumed") && cmp -s "$(model "$d" 8)" "$(model "$d-resumed" 8)"; then
        pass "$p 1 GPU: resumed from the skipped step 5, steps 6..8 and the final weights bit-identical"
    else fail "$p 1 GPU: resumed from the skipped step 5, the run differs: $(diff <(log_values "$d") <(log_values "$d-resumed") | head -4 | tr '\n' ' ')"; fi
    status=0
    "$bin" "${ARGS[@]}" --inject-nan-grad 4-30 --max-skips 3 -x 30 -o "$d-stop" > "$d-stop.out" 2>&1 || status=$?
    if [ $status -eq 1 ] && grep -q "steps 4..6 were all skipped" "$d-stop.out"; then
        pass "$p 1 GPU: 3 NaN steps in a row stop the run: $(grep -o 'error: training diverged: steps [0-9.]* were all skipped' "$d-stop.out")"
    else fail "$p 1 GPU: 3 NaN steps in a row: exit $status, $(tail -n 1 "$d-stop.out")"; fi
done

if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    for p in FP32 BF16; do
        for z in 0 1; do
            d=$WORK/$p-2gpu-z$z
            if ! scripts/launch.sh 2 "$BUILD/div-$p/train_gpt" "${ARGS[@]}" "${NAN[@]}" -x 8 -n 1 -z $z -o "$d" > "$d.out" 2>&1; then
                fail "$p 2 GPUs -z $z: the run failed: $(tail -n 3 "$d.out")"; continue
            fi
            r=""
            if [ "$(skipped_steps "$d")" != 3,5 ]; then r="rank 0 logged skipped steps '$(skipped_steps "$d")' (want 3,5)"
            elif ! r=$(unchanged "$d" 2); then :
            elif [ $z = 0 ]; then
                for s in 3 5 8; do same_state "$(state "$d" $s 0)" "$(state "$d" $s 1)" || r="the ranks' states differ at step $s"; done
            fi
            if [ -z "$r" ]; then pass "$p 2 GPUs -z $z, NaNs on rank 1 only: both ranks skip steps 3 and 5, every rank's state and the model file bit-identical across them"
            else fail "$p 2 GPUs -z $z: $r"; fi
        done
    done
else
    echo "SKIP 2-GPU checks: $(nvidia-smi -L | wc -l) GPU(s)"
fi

# The cost of the guard on GPT-2 124M: median ms per step of steps 131..160.
median_ms() { awk -F, '$1 > 130 { print $6 }' "$1/log.csv" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
D12=(-e d12 -i "$DATA/tiny_shakespeare_train.bin" -b 16 -t 1024 -x 160 -v 0 -s 0 -n 0)
bin=$BUILD/div-BF16/train_gpt
"$bin" "${D12[@]}" -o "$WORK/d12-guard" > /dev/null
"$bin" "${D12[@]}" --skip-loss-z 5 --skip-norm-z 5 -o "$WORK/d12-z" > /dev/null
baseline="(BASELINE_REV not set)"
if [ -n "${BASELINE_REV:-}" ]; then
    if mkdir "$WORK/baseline" && git archive "$BASELINE_REV" | tar -x -C "$WORK/baseline" &&
       make -C "$WORK/baseline" --no-print-directory -s BUILD=build GPU_ARCH="$ARCH" build/train_gpt; then
        "$WORK/baseline/build/train_gpt" "${D12[@]}" -o "$WORK/d12-baseline" > /dev/null
        baseline="$(median_ms "$WORK/d12-baseline") ms at $BASELINE_REV (before the guard)"
    else baseline="(could not build $BASELINE_REV)"; fi
fi
echo "guard cost, GPT-2 124M BF16 B 16 T 1024, median of steps 131..160: $(median_ms "$WORK/d12-guard") ms with the default guard," \
     "$(median_ms "$WORK/d12-z") ms with --skip-loss-z 5 --skip-norm-z 5, $baseline"

[ $failed = 0 ] && echo "test_gpu_divergence: all passed" || { echo "test_gpu_divergence: FAILED"; exit 1; }
