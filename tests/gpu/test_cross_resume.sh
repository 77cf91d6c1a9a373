#!/bin/bash
# A training state saved by one backend resumes on the other (CPU and the FP32 GPU build, ATTN=naive),
# on the small GPT-2 of test_gpu_model.sh with a constant LR:
#   reference: the CPU trains 20 steps straight;
#   CPU -> GPU: the CPU trains 10 steps and checkpoints, the GPU resumes from that state to step 20;
#   GPU -> CPU: the GPU trains 10 steps and checkpoints, the CPU resumes from that state to step 20.
# The state holds the fp32 master weights, AdamW's moments and the data position, so each resumed
# run continues the reference run: its loss and gradient norm of steps 11..20 within 1e-4 relative
# (the FP32 builds differ only in the order of fp32 sums).
# Usage: BUILD=dir GPU_ARCH=90 tests/gpu/test_cross_resume.sh   (needs a GPU; scripts/get_data.sh fetches the data)
set -eu
"$(dirname "$0")/../../scripts/get_data.sh" # before any cd: a relative GPT_DATA_DIR is the caller's
. "$(dirname "$0")/../lib/log_compare.sh"
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-.}
ARCH=${GPU_ARCH:-90}
DATA=data/tinyshakespeare
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failed=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; failed=1; }

# The build directories of test_gpu_model.sh (the same flags, so the same objects).
make -j"$(nproc)" --no-print-directory BUILD="$BUILD/model-cpu" ATTN=naive "$BUILD/model-cpu/train_gpt_cpu" >/dev/null
make -j"$(nproc)" --no-print-directory BUILD="$BUILD/model-FP32" ATTN=naive PRECISION=FP32 GPU_ARCH="$ARCH" \
    "$BUILD/model-FP32/train_gpt" >/dev/null
CPU=$BUILD/model-cpu/train_gpt_cpu
GPU=$BUILD/model-FP32/train_gpt

# 2 layers, 64 channels, 4 heads, T = 64, B = 4; a constant LR, so that a run of 10 steps has the
# schedule of the first half of 20; no validation or sampling; a checkpoint at the end of each run.
# The resumed runs get another seed, so that only the state (not a fresh start, which would follow
# the reference just as closely) can make them continue the reference run.
ARGS=(-i "$DATA/tiny_shakespeare_train.bin" -j "$DATA/tiny_shakespeare_val.bin" --layers 2
      --channels 64 --heads 4 --max-seq 64 -b 4 -t 64 -l 1e-3 -k constant -v 0 -s 0 -n 0)
"$CPU" "${ARGS[@]}" --seed 1337 -x 20 -o "$WORK/straight" > "$WORK/straight.out"
# split NAME FIRST SECOND: FIRST trains 10 steps, SECOND resumes from its state to step 20.
split() {
    if ! "$2" "${ARGS[@]}" --seed 1337 -x 10 -o "$WORK/$1" > "$WORK/$1-first.out" 2>&1; then
        fail "$1: the first 10 steps failed: $(tail -n 2 "$WORK/$1-first.out")"; return
    fi
    if ! "$3" "${ARGS[@]}" --seed 4242 -x 20 -y 1 --allow-change steps,seed -o "$WORK/$1" \
        > "$WORK/$1-second.out" 2>&1; then
        fail "$1: the resumed run failed: $(tail -n 2 "$WORK/$1-second.out")"; return
    fi
    if grep -q "resumed from .*state_00000010_00000.bin at step 10" "$WORK/$1-second.out"; then
        pass "$1: resumed at step 10 from the other backend's state"
    else
        fail "$1: no 'resumed from .../state_00000010_00000.bin at step 10' in the resumed run's output"
    fi
}
split cpu-to-gpu "$CPU" "$GPU"
split gpu-to-cpu "$GPU" "$CPU"

LOG=$WORK/straight/log.csv
for run in cpu-to-gpu gpu-to-cpu; do
    if r=$(compare_logs "$LOG" "$WORK/$run/log.csv" train_loss 11 20 1e-4); then pass "$run losses vs CPU straight: $r"; else fail "$run losses vs CPU straight: $r"; fi
    if r=$(compare_logs "$LOG" "$WORK/$run/log.csv" grad_norm 11 20 1e-4); then pass "$run gradient norms vs CPU straight: $r"; else fail "$run gradient norms vs CPU straight: $r"; fi
done
[ $failed = 0 ] && echo "test_cross_resume: all passed" || { echo "test_cross_resume: FAILED"; exit 1; }
