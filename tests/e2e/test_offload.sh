#!/usr/bin/env bash
# --offload with train_gpt_cpu, or the program TRAIN names (tests/gpu/test_offload_gpu.sh runs it with
# train_gpt): model/gpt2.c streams AdamW's state through the device in pieces of
# GPT2_OFFLOAD_PIECE_FLOATS, each slot's in turn (on the GPU copy streams beside the kernels; on the CPU
# copies). A model whose wte (50304 x 320 = 16.1M values) is four pieces:
#  1. --offload 1 trains the bits of --offload 0: the same losses, model file and training state;
#  2. a checkpoint written with offload resumes without it, and one written without it resumes with
#     it, each to the bits of the straight run; an offloaded run killed with -9 at moments and resumed
#     ends on the bits of a straight run;
#  3. too little host memory (--host-memory-limit) is refused before training, naming what it needs;
#     with -z 1, --offload 1 trains the bits of --offload 0;
#  4. --dry-run prints the plan and the choice and exits without creating the output directory.
set -euo pipefail
BUILD=${BUILD:-.}
DATA=$(cd "${1:?usage: tests/e2e/test_offload.sh DATA_DIR (the directory scripts/get_data.sh fills)}" && pwd)
cd "$(dirname "$0")/../.."
TRAIN=${TRAIN:-$BUILD/train_gpt_cpu}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; exit 1; }
args=(--layers 1 --channels 320 --heads 5 --max-seq 32 -t 32 -b 2 --seed 5 -l 1e-3 -c 0.1 -k constant
      -i "$DATA/tinyshakespeare/tiny_shakespeare_train.bin" -v 0 -s 0 -x 4 -n 2)
train() { "$TRAIN" "${args[@]}" "$@"; }
# shellcheck source=tests/lib/same_run.sh
. tests/lib/same_run.sh

# 1. on and off
train --offload 0 -o "$tmp/off" > "$tmp/off.out"
train --offload 1 -o "$tmp/on" > "$tmp/on.out"
grep -q "^offload: AdamW's m, v.* in pinned host memory" "$tmp/on.out" || fail "--offload 1 did not say it offloads"
grep -q "^offload:" "$tmp/off.out" && fail "--offload 0 offloaded"
same_run "$tmp/off" "$tmp/on" 4 "--offload 1 against --offload 0" || exit 1

# 2. resumes across the switch: each run's step-2 checkpoint, resumed the other way
for from in off on; do
    to=$([ $from = off ] && echo 1 || echo 0)
    mkdir "$tmp/$from-resumed"
    cp "$tmp/$from"/{run.conf,log.csv,model_00000002.bin,state_00000002_00000.bin} "$tmp/$from-resumed/"
    awk -F, 'NR == 1 || $1 <= 2' "$tmp/$from/log.csv" > "$tmp/$from-resumed/log.csv"
    "$TRAIN" -y 1 --offload $to -o "$tmp/$from-resumed" > "$tmp/$from-resumed.out" 2>&1 ||
        { cat "$tmp/$from-resumed.out"; fail "resuming the --offload $([ $from = on ] && echo 1 || echo 0) run"; }
    grep -q "resumed from .*state_00000002_00000.bin at step 2" "$tmp/$from-resumed.out" ||
        fail "the --offload $to resume did not start at step 2"
    same_run "$tmp/off" "$tmp/$from-resumed" 4 \
        "written with --offload $([ $from = on ] && echo 1 || echo 0), resumed with --offload $to" || exit 1
done

# 2b. kill -9 at moments of an offloaded run that checkpoints every step (in an update, a save or
# between), resumed each time: it ends on the bits of a straight run without offload
train --offload 0 -x 12 -n 12 -o "$tmp/straight12" > /dev/null
hits=0
for delay in 0.6 1.0 1.5 2.1 2.8; do
    # exec: the background job's pid is the trainer's own
    (exec "$TRAIN" "${args[@]}" --offload 1 -x 12 -n 1 --keep 2 -y 1 -o "$tmp/killed") > /dev/null 2>&1 &
    pid=$!
    sleep "$delay"
    kill -KILL "$pid" 2>/dev/null && hits=$((hits + 1))
    wait "$pid" 2>/dev/null || true
done
[ $hits -gt 0 ] || fail "every offloaded run ended before its kill: the kills tested nothing"
train --offload 1 -x 12 -n 12 --keep 2 -y 1 -o "$tmp/killed" > "$tmp/killed.out" 2>&1 ||
    { tail -3 "$tmp/killed.out"; fail "resuming the offloaded run after kill -9"; }
cmp -s "$tmp/straight12/model_00000012.bin" "$tmp/killed/model_00000012.bin" &&
    cmp -s "$tmp/straight12/state_00000012_00000.bin" "$tmp/killed/state_00000012_00000.bin" ||
    fail "an offloaded run killed $hits times and resumed ends on other bits than a straight run"
echo "PASS an offloaded run killed with -9 $hits times while it ran, resumed each time, ends on the straight run's bits"

# 3. refusals
status=0
train --offload 1 --host-memory-limit 0.01 -o "$tmp/short" > "$tmp/short.out" 2>&1 || status=$?
[ $status = 1 ] && grep -q "needs .* GiB of pinned host memory, and 0.01 GiB are --host-memory-limit" "$tmp/short.out" ||
    { cat "$tmp/short.out"; fail "too little host memory: exit $status"; }
[ -e "$tmp/short/log.csv" ] && fail "too little host memory: the run started"
echo "PASS too little host memory refused before training: $(grep -o "needs.*limit" "$tmp/short.out")"

# 3b. with ZeRO stage 1 (one rank here: the shard is the whole model; in the BF16 build, which keeps
# master weights, saving gathers them through the staging piece, each rank's part uploaded first:
# tests/gpu/test_offload_gpu.sh runs this with it)
train -z 1 --offload 0 -o "$tmp/zero-off" > /dev/null
train -z 1 --offload 1 -o "$tmp/zero-on" > /dev/null
same_run "$tmp/zero-off" "$tmp/zero-on" 4 "-z 1 --offload 1 against -z 1 --offload 0" || exit 1
same_run "$tmp/off" "$tmp/zero-on" 4 "-z 1 --offload 1 against --offload 0" || exit 1

# 4. --dry-run
train --offload 1 --dry-run --memory-limit 4 -o "$tmp/dry" > "$tmp/dry.out"
grep -q "^dry run: B 2, -r 0, offload on" "$tmp/dry.out" || { cat "$tmp/dry.out"; fail "--dry-run's line"; }
grep -q "^  optimizer .*in pinned host memory" "$tmp/dry.out" || fail "--dry-run printed no plan"
[ -e "$tmp/dry" ] && fail "--dry-run created its output directory"
echo "PASS --dry-run: $(grep "^dry run" "$tmp/dry.out")"
echo "test_offload: all passed"
