#!/usr/bin/env bash
# Runs every CPU test (what `make test` runs after building). Each entry is one test program or
# script; its output goes to the terminal and the run ends with "N passed, N failed".
# Needs GPT_DATA_DIR (the GPT-2 vocabulary and tinyshakespeare, see README.md).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-.}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
if [ -z "${GPT_DATA_DIR:-}" ] || [ ! -f "$GPT_DATA_DIR/gpt2/encoder.json" ]; then
    echo "error: set GPT_DATA_DIR to a directory with gpt2/{encoder.json,vocab.bpe} and tinyshakespeare/ (see README.md)" >&2
    exit 1
fi
export GPT_DATA_DIR BUILD

passed=0; failed=0; failures=""
run() { # run NAME COMMAND...
    local name=$1; shift
    echo "=== $name"
    local t0=$SECONDS
    if "$@"; then passed=$((passed + 1)); echo "=== $name: ok ($((SECONDS - t0)) s)"
    else failed=$((failed + 1)); failures="$failures $name"; echo "=== $name: FAILED ($((SECONDS - t0)) s)"; fi
}

run get_data scripts/get_data.sh
run kernels_cpu "$BUILD/tests/test_kernels_cpu"
run attention_cpu "$BUILD/tests/test_attention_cpu"
run tokenizer "$BUILD/tests/test_tokenizer"
run data "$BUILD/tests/test_data"
run checkpoint "$BUILD/tests/test_checkpoint"
run dist "$BUILD/tests/test_dist"
run launch tests/test_launch.sh
run prepare_data tests/test_prepare_data.sh
run train_cpu tests/test_train_cpu.sh
run resume tests/test_resume.sh
run bad_input tests/test_bad_input.sh
for f in fuzz_tokenfile fuzz_modelfile fuzz_tokenizer; do
    run "$f" tests/run_fuzzer.sh "$BUILD/fuzz/$f" "$FUZZ_SECONDS"
done
run cuda_compile make --no-print-directory BUILD="$BUILD" test-cuda-compile

[ -n "$failures" ] && echo "failed:$failures"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
