#!/bin/bash
# The power of a recipe's verdict (scripts/compare_curves.py against recipes/reference/NAME.csv and
# its envelope), on a GPU:
#   - order-only runs (the kernels of other cards, other micro-batches, other tiles, untuned products;
#     each with dQ added by atomics, FLASH_ATTN_DETERMINISTIC=0, so that no two runs sum in the same
#     order) must be judged IDENTICAL or REPRODUCED over the whole recipe;
#   - runs with one thing wrong (lr +-10%, warmup halved, weight decay 0, AdamW beta2 0.99, no gradient
#     clipping, the attention scale 1% high and the layernorm epsilon 1e-3, the last two through
#     make PERTURB=...), each on one of the order-only configurations in turn, must be judged FAIL;
#     they are stopped after STOP steps and judged through that step (compare_curves.py --through-step),
#     which FAILs the whole run too, since every window of the verdict is judged on its own;
#   - the smallest learning-rate change it detects: lr x (1 +- d) for each d of LR_DELTAS.
# Prints a table of the counts and exits 1 when an order-only run FAILs more often than 1 in 20 or an
# error passes more often than 1 in 20.
#   tests/gpu/test_recipe_power.sh     TRIES (20) runs of each error, ORDER_RUNS (20) order-only runs,
#                                  SWEEP_TRIES (10) of each lr change, JOBS at a time;
#                                  NO_BUILD=1 takes the programs already in BUILD/recipe-PRECISION;
#                                  ERRORS="0 1 ..." runs only those of the error list (from 0), so a
#                                  long study can be split over several calls
#   RECIPE=recipes/shakespeare-d12.conf (the default): the BF16 build on the reference's GPU model (an
#     H100/H200), STOP 30 (its order windows end at step 30, the seed windows after it), JOBS 2 (about 35 s
#     per whole run and 8 s per stopped run).
#     With PRECISION=FP16, the FP16 build instead, judged by the envelope's FP16 runs (as a T4's run
#     is; the envelope must hold them: scripts/write_envelope.sh --precision FP16), one order
#     configuration the T4's kernels at 16 GiB in place of the A100's tiles.
#   RECIPE=recipes/ci-tiny.conf: the FP32 build on any GPU against the CPU's reference, whole runs
#     (STOP 0: every window is an order window), JOBS 8, about a second per run.
set -u
"$(dirname "$0")/../../scripts/get_data.sh" || exit 1
cd "$(dirname "$0")/../.." || exit 1
. tests/lib/stop_at_step.sh
BUILD=${BUILD:-.}
ARCH=${GPU_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d .)}
RECIPE=${RECIPE:-recipes/shakespeare-d12.conf}
recipe_name=$(basename "$RECIPE" .conf)
REF=recipes/reference/$recipe_name.csv
# The order-only configurations (ENVIRONMENT|OPTIONS), taken in turn, and the build.
case $recipe_name in
shakespeare-d12)
    PRECISION=${PRECISION:-BF16} STOP=${STOP:-30} JOBS=${JOBS:-2} LR_DELTAS=${LR_DELTAS:-0.01 0.02 0.05}
    case $PRECISION in BF16) fourth="FLASH_ATTN_CONFIG=sm80|" ;; FP16) fourth="KERNEL_PATH=sm75|--memory-limit 16" ;;
    *) echo "FAIL PRECISION=$PRECISION: shakespeare-d12's study is of BF16 or FP16" >&2; exit 1 ;; esac
    orders=(
        "KERNEL_PATH=sm86|--memory-limit 8"
        "KERNEL_PATH=sm86|--memory-limit 24"
        "|--batch-invariant 0 -b 32"
        "$fourth"
        "KERNEL_PATH=sm80|--batch-invariant 0 -b 16"
        "MATMUL_TUNE=0|--batch-invariant 0 -b 64"
        "FLASH_ATTN_CONFIG=sm86|-b 16 -r 1"
    ) ;;
ci-tiny)
    PRECISION=FP32 STOP=${STOP:-0} JOBS=${JOBS:-8} LR_DELTAS=${LR_DELTAS:-0.0001 0.001 0.01}
    orders=(
        "KERNEL_PATH=sm86|"
        "KERNEL_PATH=sm80|-b 4"
        "|-b 8"
        "MATMUL_TUNE=0|-b 2"
        "KERNEL_PATH=sm86|-b 1"
        "|-b 4 -r 1"
        "MATMUL_TUNE=0 KERNEL_PATH=sm80|-b 8 -r 2"
    ) ;;
*) echo "FAIL no order-only configurations for the recipe $RECIPE" >&2; exit 1 ;;
esac
TRIES=${TRIES:-20} ORDER_RUNS=${ORDER_RUNS:-20} SWEEP_TRIES=${SWEEP_TRIES:-10}
LR=$(sed -n 's/^lr  *//p' "$RECIPE") WARMUP=$(sed -n 's/^warmup  *//p' "$RECIPE")
WORK=${POWER_WORK:-$(mktemp -d)}
mkdir -p "$WORK"

# The errors: NAME|PERTURB build|OPTIONS
errors=(
    "lr +10%||-l $(python3 -c "print($LR * 1.1)")"
    "lr -10%||-l $(python3 -c "print($LR * 0.9)")"
    "warmup halved||-u $((WARMUP / 2))"
    "weight decay 0||-c 0"
    "AdamW beta2 0.99||--beta2 0.99"
    "no gradient clipping||--grad-clip 0"
    "attention scale 1% high|attn-scale|"
    "layernorm eps 1e-3|ln-eps|"
)
ERRORS=${ERRORS:-${!errors[*]}}
for e in $ERRORS; do
    case $e in '' | *[!0-9]*) ;; *) [ -n "${errors[e]:-}" ] && continue ;; esac
    echo "FAIL ERRORS=\"$ERRORS\": no error '$e' (0 to $((${#errors[@]} - 1)))"; exit 1
done

for p in "" attn-scale ln-eps; do
    [ "${NO_BUILD:-0}" = 1 ] && break
    make --no-print-directory -j"$(nproc)" BUILD="$BUILD/recipe-$PRECISION" PRECISION=$PRECISION GPU_ARCH="$ARCH" \
        ${p:+PERTURB=$p} train_gpt > "$WORK/build$p.log" 2>&1 || { tail -n 20 "$WORK/build$p.log"; exit 1; } &
done
wait
bin() { echo "$BUILD/recipe-$PRECISION${1:+/perturb-$1}/train_gpt"; }
for p in "" attn-scale ln-eps; do [ -x "$(bin "$p")" ] || { echo "FAIL no $(bin "$p")"; exit 1; }; done

# one NAME ORDER_INDEX PERTURB STOP OPTIONS...: the recipe in $WORK/NAME on order configuration
# ORDER_INDEX with dQ by atomics, stopped after step STOP (0: run it all), then its verdict in
# $WORK/NAME.verdict (the word) and $WORK/NAME.cmp (the whole comparison)
one() {
    local name=$1 order=${orders[$2]} perturb=$3 stop=$4; shift 4
    local envs=${order%%|*} options=${order#*|}
    # shellcheck disable=SC2086 # the options are words
    env FLASH_ATTN_DETERMINISTIC=0 $envs "$(bin "$perturb")" -f "$RECIPE" $options "$@" -o "$WORK/$name" \
        > "$WORK/$name.out" 2>&1 &
    local pid=$!
    if [ "$stop" -gt 0 ]; then stop_at_step "$pid" "$WORK/$name/log.csv" "$stop"; fi
    wait "$pid" 2>/dev/null
    rm -f "$WORK/$name"/*.bin # the log is what is judged; a d12's last checkpoint is 1.7 GB
    local through=()
    [ "$stop" -gt 0 ] && through=(--through-step "$stop")
    python3 scripts/compare_curves.py "$WORK/$name" "$REF" "${through[@]}" -o "$WORK/$name.png" > "$WORK/$name.cmp" 2>&1
    sed -n 's/^\(IDENTICAL\|REPRODUCED\|FAIL\):.*/\1/p' "$WORK/$name.cmp" > "$WORK/$name.verdict"
    [ -s "$WORK/$name.verdict" ] || echo "ERROR" > "$WORK/$name.verdict"
    local why
    why=$(grep -m1 '^FAIL:' "$WORK/$name.cmp" | cut -c7-160)
    echo "$name ($envs $options $* ${perturb:+PERTURB=$perturb}): $(cat "$WORK/$name.verdict") $why"
}
# queue NAME ...: one NAME ... with at most JOBS at a time
running=0
queue() {
    if [ "$running" -ge "$JOBS" ]; then wait -n; running=$((running - 1)); fi
    one "$@" &
    running=$((running + 1))
}

for ((t = 0; t < ORDER_RUNS; t++)); do queue "order-$t" $((t % ${#orders[@]})) "" 0; done
for e in $ERRORS; do
    IFS='|' read -r _ perturb options <<< "${errors[e]}"
    # shellcheck disable=SC2086
    for ((t = 0; t < TRIES; t++)); do queue "error-$e-$t" $(((t + e) % ${#orders[@]})) "$perturb" "$STOP" $options; done
done
for d in $LR_DELTAS; do
    for sign in + -; do
        lr=$(python3 -c "print($LR * (1 $sign $d))")
        for ((t = 0; t < SWEEP_TRIES; t++)); do queue "lr$sign$d-$t" $((t % ${#orders[@]})) "" "$STOP" -l "$lr"; done
    done
done
wait

# count PREFIX: "passed failed unjudged" over $WORK/PREFIX*.verdict (unjudged: the comparison could
# not be made, e.g. the run died before its first step)
count() {
    local pass=0 fail=0 none=0
    for f in "$WORK"/"$1"*.verdict; do
        [ -f "$f" ] || continue
        case $(cat "$f") in IDENTICAL | REPRODUCED) pass=$((pass + 1)) ;; FAIL) fail=$((fail + 1)) ;; *) none=$((none + 1)) ;; esac
    done
    echo "$pass $fail $none"
}
status=0
printf '\n%-36s %5s %5s %5s %8s  %s\n' "runs" "tries" "PASS" "FAIL" "unjudged" "wanted"
# row LABEL PREFIX WANTED: a line of the table; a run that could not be judged fails the test
row() {
    local p f n
    read -r p f n <<< "$(count "$2")"
    printf '%-36s %5d %5d %5d %8d  %s\n' "$1" $((p + f + n)) "$p" "$f" "$n" "$3"
    [ "$n" -eq 0 ] || status=1
    case $3 in
    PASS*) [ $((20 * f)) -le $((p + f)) ] || status=1 ;;
    FAIL*) [ $((20 * p)) -le $((p + f)) ] || status=1 ;;
    esac
}
echo "$RECIPE, PRECISION=$PRECISION, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
row "order only (whole recipe)" order- "PASS in 19 of 20"
upto=$STOP
[ "$STOP" -gt 0 ] || upto="the end"
for e in $ERRORS; do row "${errors[e]%%|*} (steps 0-$upto)" "error-$e-" "FAIL in 19 of 20"; done
for d in $LR_DELTAS; do
    for sign in + -; do row "lr x (1 $sign $d) (steps 0-$upto)" "lr$sign$d-" "(the smallest change it sees)"; done
done
echo "runs and comparisons: $WORK"
[ "$status" -eq 0 ] && echo "test_recipe_power: passed" || echo "test_recipe_power: FAILED"
exit "$status"
