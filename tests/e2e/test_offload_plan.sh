#!/usr/bin/env bash
# What -b auto chooses for GPT-2's sizes on consumer cards, from train_gpt's own plan (--dry-run, which
# touches no GPU, so this runs where there is none): the CUDA BF16 flash build given as the argument
# (make test passes the one test-cuda-compile built). T 1024, 64 sequences per step:
#  - d24 at 8 GiB, d36 at 12 GiB, d48 at 16 and 24 GiB fit, with AdamW's state offloaded (d24 could
#    run B 1 -r 0 without it, but --offload auto offloads where that quadruples B: B 8 -r 2);
#  - d48 at 141 GiB does not offload, nor d24 at 8 GiB where the host cannot hold its state
#    (--host-memory-limit 2): B 1 -r 0 then;
#  - d48 at 16 GiB with --offload 0 is refused, the advice naming --offload auto;
#  - d48 at 16 GiB with too little host memory (--host-memory-limit 8) is refused naming what it needs.
# With a second argument, the same build made with GRADS=BF16 (bf16 gradients): d36 at 12 GiB fits B 8
# -r 2 offloaded, its head in slices of 1024 tokens (B 8 fits only with them), d48 at 16 GiB B 4 -r 1.
# A dry run plans for a host of --host-memory-limit GiB (64 here, so that the test does not depend on
# this machine's; d48's offloaded state needs 17.4).
set -euo pipefail
BIN=${1:?usage: tests/e2e/test_offload_plan.sh TRAIN_GPT (a CUDA BF16 build) [TRAIN_GPT made with GRADS=BF16]}
BIN_GRADS_BF16=${2:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
fail() { echo "FAIL $*"; failed=1; }
plan() { "$BIN" -t 1024 -d 65536 --dry-run --host-memory-limit 64 -o "$tmp/never" "$@"; }

# check_fits "MODEL GIB WANT [HOST LIMIT]"...: each fits at GIB, its dry run's line holding WANT (_ for
# spaces)
check_fits() {
    local case model gib want host out line
    for case in "$@"; do
        read -r model gib want host <<< "$case"
        want=${want//_/ }
        # shellcheck disable=SC2086 # the host limit is two words or none
        out=$(plan -e "$model" --memory-limit "$gib" $host 2>&1) || { fail "$BUILD_NAME: $model at $gib GiB: $out"; continue; }
        line=$(grep "^dry run:" <<< "$out")
        if grep -q "does not fit" <<< "$line" || ! grep -q "$want" <<< "$line"; then
            fail "$BUILD_NAME: $model at $gib GiB${host:+ $host}: $line (want $want)"
        else echo "PASS $BUILD_NAME: $model at $gib GiB${host:+ $host}: ${line#dry run: }"; fi
    done
}
BUILD_NAME=GRADS=FP32
check_fits "d24 8 B_8,_-r_2,_offload_on" "d36 12 offload_on" "d48 16 offload_on" "d48 24 offload_on" \
    "d48 141 offload_off" "d24 8 B_1,_-r_0,_offload_off --host-memory-limit 2"
[ -e "$tmp/never" ] && fail "--dry-run created its output directory"

status=0
out=$(plan -e d48 --memory-limit 16 --offload 0 2>&1) || status=$?
[ $status = 1 ] && grep -q "does not fit.*--offload auto" <<< "$out" &&
    echo "PASS d48 at 16 GiB with --offload 0 refused: ${out##*what would fit: }" ||
    fail "d48 at 16 GiB --offload 0: exit $status: $out"
status=0
out=$(plan -e d48 --memory-limit 16 --host-memory-limit 8 2>&1) || status=$?
[ $status = 1 ] && grep -q "needs 17.41 GiB of pinned host memory, and 8.00 GiB are --host-memory-limit" <<< "$out" &&
    echo "PASS too little host memory refused: ${out##*error: }" || fail "d48 at 16 GiB, 8 GiB of host: exit $status: $out"

if [ -n "$BIN_GRADS_BF16" ]; then
    BIN=$BIN_GRADS_BF16 BUILD_NAME=GRADS=BF16
    check_fits "d36 12 B_8,_-r_2,_offload_on,_head_slices_of_1024_tokens" "d48 16 B_4,_-r_1,_offload_on"
fi

[ $failed = 0 ] && echo "test_offload_plan: all passed" || { echo "test_offload_plan: FAILED"; exit 1; }
