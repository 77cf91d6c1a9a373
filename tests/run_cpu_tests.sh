#!/usr/bin/env bash
# What `make test` runs. First, before building anything, the prerequisites (scripts/setup.sh
# --check) and the data (scripts/get_data.sh: from GPT_DATA_DIR when set, else downloaded); either
# failing stops the run at once with its own lines. Then it builds the test programs and runs every
# CPU test on the data prepared in data/; each test's output goes to the terminal and the run ends
# with "N passed, N failed".
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
# Run from the caller's directory: a relative GPT_DATA_DIR is relative to it.
"$root/scripts/setup.sh" --check || exit 1
"$root/scripts/get_data.sh" || exit 1
cd "$root" || exit 1
BUILD=${BUILD:-.}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
# The builds use every core (MAKE_JOBS sets another number of jobs).
JOBS=${MAKE_JOBS:-$(nproc)}
export BUILD
make --no-print-directory -j"$JOBS" BUILD="$BUILD" test-programs || exit 1
# What scripts/get_data.sh prepares by default, given relative on purpose: tests must take any path.
DATA=data

passed=0; failed=0; failures=""
run() { # run NAME COMMAND...
    local name=$1; shift
    echo "=== $name"
    local t0=${STARTED:-$SECONDS} # STARTED: when the work began, where it ran before this call (the fuzzers)
    if "$@"; then passed=$((passed + 1)); echo "=== $name: ok ($((SECONDS - t0)) s)"
    else failed=$((failed + 1)); failures="$failures $name"; echo "=== $name: FAILED ($((SECONDS - t0)) s)"; fi
}

run kernels_cpu "$BUILD/tests/test_kernels_cpu"
run attention_cpu "$BUILD/tests/test_attention_cpu"
run tokenizer "$BUILD/tests/test_tokenizer" "$DATA"
run jsonl "$BUILD/tests/test_jsonl"
run data "$BUILD/tests/test_data" "$DATA"
run checkpoint "$BUILD/tests/test_checkpoint"
run dist "$BUILD/tests/test_dist"
run memory_fit "$BUILD/tests/test_memory_fit"
run gpt2 "$BUILD/tests/test_gpt2"
run gpu_peaks "$BUILD/tests/test_gpu_peaks"
run launch tests/e2e/test_launch.sh
run setup tests/e2e/test_setup.sh
run get_data tests/e2e/test_get_data.sh "$DATA"
run prepare_data tests/e2e/test_prepare_data.sh "$DATA"
run prepare_jsonl tests/e2e/test_prepare_jsonl.sh "$DATA"
run fineweb_parquet tests/e2e/test_fineweb_parquet.sh "$DATA"
run train_cpu tests/e2e/test_train_cpu.sh "$DATA"
run generate tests/e2e/test_generate.sh "$DATA"
run hellaswag tests/e2e/test_hellaswag.sh "$DATA"
run hf tests/e2e/test_hf.sh "$DATA"
run resume tests/e2e/test_resume.sh "$DATA"
run resume_options tests/e2e/test_resume_options.sh "$DATA"
run ranks_cpu tests/e2e/test_ranks_cpu.sh "$DATA"
run offload tests/e2e/test_offload.sh "$DATA"
run messages tests/e2e/test_messages.sh "$DATA"
run mfu tests/e2e/test_mfu.sh "$DATA"
run divergence tests/e2e/test_divergence.sh "$DATA"
run loss_scale tests/e2e/test_loss_scale.sh "$DATA"
run config tests/e2e/test_config.sh "$DATA"
run recipe_cpu tests/e2e/test_recipe_cpu.sh "$DATA"
run bad_input tests/e2e/test_bad_input.sh "$DATA"
run adversarial tests/e2e/test_adversarial.sh "$DATA"
export FUZZ_VOCAB_DIR=$DATA/gpt2 # for fuzz_tokenizer
# Each fuzzer is one process on one core, so they run JOBS at a time, each for FUZZ_SECONDS (on CI's
# 2 cores that halves their 4 minutes); their outputs are shown in turn once a batch is done.
fuzzers=(fuzz_tokenfile fuzz_modelfile fuzz_statefile fuzz_tokenizer fuzz_jsonl)
fuzz_out=$(mktemp -d)
trap 'rm -rf "$fuzz_out"' EXIT
show() { cat "$1"; return "$2"; } # show OUTPUT STATUS: a finished fuzzer's output and result
for ((i = 0; i < ${#fuzzers[@]}; i += JOBS)); do
    batch=("${fuzzers[@]:i:JOBS}") pids=() started=$SECONDS
    for f in "${batch[@]}"; do
        tests/fuzz/run_fuzzer.sh "$BUILD/fuzz/$f" "$FUZZ_SECONDS" > "$fuzz_out/$f" 2>&1 &
        pids+=($!)
    done
    for k in "${!batch[@]}"; do
        status=0
        wait "${pids[k]}" || status=$?
        STARTED=$started run "${batch[k]}" show "$fuzz_out/${batch[k]}" "$status"
    done
done
run cuda_compile make --no-print-directory -j"$JOBS" BUILD="$BUILD" test-cuda-compile
run wgmma_sass tests/e2e/test_wgmma_sass.sh "$BUILD/cuda-compile"
run offload_plan tests/e2e/test_offload_plan.sh "$BUILD/cuda-compile/BF16/train_gpt-flash" \
    "$BUILD/cuda-compile/BF16-grads/train_gpt-flash"

[ -n "$failures" ] && echo "failed:$failures"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
