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
# Then docs/options.md's table of the d24 and d48 plans at B 16 (gradients, and the totals at -r 0 and
# -r 1 of each build given) against what the same dry runs print, so that the documented sizes follow
# the code.
set -euo pipefail
BIN=${1:?usage: tests/e2e/test_offload_plan.sh TRAIN_GPT (a CUDA BF16 build) [TRAIN_GPT made with GRADS=BF16]}
BIN_GRADS_FP32=$BIN BIN_GRADS_BF16=${2:-}
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

# "GRADIENTS TOTAL" in MiB, as BIN's dry run of MODEL at B 16, -r R prints them: mib BIN MODEL R
mib() {
    "$1" -e "$2" -b 16 -t 1024 -r "$3" --memory-limit 120 --dry-run -o "$tmp/never" |
        awk '$1 == "gradients" { g = $2 } $1 == "total" { t = $2 } END { print g, t }'
}
doc=$(dirname "$0")/../../docs/options.md
for model in d24 d48; do
    # | d24 (350M) | GRADIENTS MiB | GRADS=BF16's MiB (SCRATCH) | R0 to R0_BF16 MiB | R1 to R1_BF16 MiB |
    row=$(grep -E "^\| $model \([0-9.]+[MB]\) \| [0-9,.]+ MiB \|" "$doc" | cut -d'|' -f3- | tr -d ',') ||
        { fail "options.md has no plan row for $model"; continue; }
    read -r grads grads_bf16 _ r0 r0_bf16 r1 r1_bf16 <<< "$(grep -oE '[0-9]+\.[0-9]+' <<< "$row" | tr '\n' ' ')"
    documented="$grads $r0 / $grads $r1"
    printed="$(mib "$BIN_GRADS_FP32" $model 0) / $(mib "$BIN_GRADS_FP32" $model 1)"
    if [ -n "$BIN_GRADS_BF16" ]; then
        documented+=", GRADS=BF16 $grads_bf16 $r0_bf16 / $grads_bf16 $r1_bf16"
        printed+=", GRADS=BF16 $(mib "$BIN_GRADS_BF16" $model 0) / $(mib "$BIN_GRADS_BF16" $model 1)"
    fi
    if [ "$printed" = "$documented" ]; then echo "PASS options.md's $model plans at B 16 (-r 0 / -r 1) are the dry run's: $printed MiB"
    else fail "options.md's $model plans at B 16: $documented MiB, the dry run prints $printed MiB"; fi
done

[ $failed = 0 ] && echo "test_offload_plan: all passed" || { echo "test_offload_plan: FAILED"; exit 1; }
