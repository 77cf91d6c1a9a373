#!/bin/bash
# Writes a recipe's envelope: runs of the recipe that differ from its reference only in the order of
# their sums ("order" runs) and runs with other seeds ("seed" runs), which scripts/compare_curves.py
# holds a run against to tell a correct run on another GPU model (REPRODUCED) from a wrong one
# (FAIL).
#
#   scripts/write_envelope.sh RECIPE PROGRAM [JOBS]
#   scripts/write_envelope.sh --precision P RECIPE PROGRAM [JOBS]
#
# RECIPE is recipes/NAME.conf; PROGRAM the train_gpt (on the GPU model that wrote the reference) or
# train_gpt_cpu that trains it; JOBS runs at a time (default 2: one run's start-up beside another's
# steps). Writes recipes/reference/NAME.envelope.csv (kind,run,step,train_loss,val_loss: every run's
# log.csv, its losses as logged) and NAME.envelope.txt (the recipe's settings, which
# compare_curves.py checks, the machine, build, commit and date, and every run's command).
#
# The order runs, on a GPU: the kernels of an RTX 30xx/40xx (KERNEL_PATH=sm86) and of an A100
# (KERNEL_PATH=sm80), the A100's attention tiles alone, dQ added by atomics in another order on
# every run (FLASH_ATTN_DETERMINISTIC=0), and other micro-batches without the recipe's batch
# invariance (other groupings of the gradient sums), one of them with cuBLASLt's untuned choices
# (MATMUL_TUNE=0). On the CPU: other micro-batches and thread counts (which the CPU build sums in
# the same order), the naive attention (ATTN=naive) and other CPUs' instructions (MARCH=x86-64,
# x86-64-v3), built here. The seed runs: seeds 1 to 8. Order runs may give bits that another order
# run gives too (an A100's tiles and an A100's kernels differ only where the GPU has wgmma
# products); each is a configuration a user may run, not a count of distinct curves.
#
# --precision P adds to an envelope already written the runs that judge a run of another precision
# than the reference's (an FP16 run against a BF16 reference, which differs from it from the first
# step by fp16's roundings): PROGRAM a train_gpt built with PRECISION=P, on the reference's GPU model,
# the recipe with its seed in 8 summation orders (FP16 also with a T4's kernels, KERNEL_PATH=sm75, at
# 16 GiB), written as rows of kind P, replacing any the envelope had, and described in NAME.envelope.txt.
set -eu
usage() { echo "usage: scripts/write_envelope.sh [--precision BF16|FP16|FP32] RECIPE PROGRAM [JOBS]" >&2; exit 2; }
PRECISION=""
if [ "${1:-}" = --precision ]; then
    PRECISION=${2:-}
    case $PRECISION in BF16 | FP16 | FP32) ;; *) usage ;; esac
    shift 2
fi
[ $# -ge 2 ] && [ $# -le 3 ] || usage
RECIPE=$1 PROGRAM=$2 JOBS=${3:-2}
[ -f "$RECIPE" ] || { echo "error: no recipe $RECIPE" >&2; exit 2; }
[ -x "$PROGRAM" ] || { echo "error: $PROGRAM is not a program (build it first)" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
name=$(basename "$RECIPE" .conf)
out=$(cd "$(dirname "$RECIPE")" && pwd)/reference/$name
[ -f "$out.csv" ] || { echo "error: no reference $out.csv to write the envelope of" >&2; exit 2; }
recipe_path=$(cd "$(dirname "$RECIPE")" && pwd)/$(basename "$RECIPE")
settings=$(cd "$root/scripts" &&
    python3 -c "import sys; from compare_curves import recipe_settings; print(recipe_settings(sys.argv[1]))" "$recipe_path")
if [ -n "$PRECISION" ]; then
    [ "$(basename "$PROGRAM")" != train_gpt_cpu ] ||
        { echo "error: --precision: train_gpt_cpu trains in FP32 only; give a train_gpt built with PRECISION=$PRECISION" >&2; exit 2; }
    [ -f "$out.envelope.csv" ] && [ -f "$out.envelope.txt" ] ||
        { echo "error: --precision adds to an envelope: $out.envelope.csv and .txt must exist (write it first)" >&2; exit 2; }
    grep -qx "settings: $settings" "$out.envelope.txt" ||
        { echo "error: $out.envelope.txt was written for other settings of $RECIPE than it has now: write the envelope again first" >&2; exit 2; }
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# Each run: KIND|LABEL|ENVIRONMENT|OPTIONS (PROGRAM=... in ENVIRONMENT picks another program).
if [ -n "$PRECISION" ]; then
    P=$PRECISION
    runs=(
        "$P|$P||"
        "$P|$P, RTX 30xx/40xx kernels, 8 GiB|KERNEL_PATH=sm86|--memory-limit 8"
        "$P|$P, A100 kernels|KERNEL_PATH=sm80|"
        "$P|$P, A100 attention tiles, atomic dQ|FLASH_ATTN_CONFIG=sm80 FLASH_ATTN_DETERMINISTIC=0|"
        "$P|$P, B 32 not batch-invariant||--batch-invariant 0 -b 32"
        "$P|$P, B 16 -r 1 not batch-invariant||--batch-invariant 0 -b 16 -r 1"
        "$P|$P, B 16 not batch-invariant, untuned|MATMUL_TUNE=0|--batch-invariant 0 -b 16"
    )
    if [ "$P" = FP16 ]; then runs+=("$P|$P, T4 kernels, 16 GiB|KERNEL_PATH=sm75|--memory-limit 16")
    else runs+=("$P|$P, RTX 30xx/40xx kernels, atomic dQ|KERNEL_PATH=sm86 FLASH_ATTN_DETERMINISTIC=0|"); fi
    machine=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -n 1)
    build="$PROGRAM, $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'CUDA ?')"
elif [ "$(basename "$PROGRAM")" = train_gpt_cpu ]; then
    # build NAME MAKE-VARIABLES...: a train_gpt_cpu of other flags in $WORK/NAME
    build() {
        local dir=$WORK/$1; shift
        make --no-print-directory -C "$root" -j"$(nproc)" BUILD="$dir" "$@" "$dir/train_gpt_cpu" > "$dir.log" 2>&1 ||
            { cat "$dir.log"; exit 1; }
    }
    build naive ATTN=naive
    build x86-64 MARCH=x86-64
    build x86-64-v3 MARCH=x86-64-v3
    build x86-64-v3-naive MARCH=x86-64-v3 ATTN=naive
    runs=(
        "order|B 8, 1 thread|OMP_NUM_THREADS=1|-b 8"
        "order|B 4, 3 threads|OMP_NUM_THREADS=3|-b 4"
        "order|naive attention|PROGRAM=$WORK/naive/train_gpt_cpu|"
        "order|naive attention, B 2, 1 thread|OMP_NUM_THREADS=1 PROGRAM=$WORK/naive/train_gpt_cpu|-b 2"
        "order|x86-64 (no FMA)|PROGRAM=$WORK/x86-64/train_gpt_cpu|"
        "order|x86-64-v3 (AVX2, FMA)|PROGRAM=$WORK/x86-64-v3/train_gpt_cpu|"
        "order|x86-64-v3, B 2, 1 thread|OMP_NUM_THREADS=1 PROGRAM=$WORK/x86-64-v3/train_gpt_cpu|-b 2"
        "order|x86-64-v3, naive attention|PROGRAM=$WORK/x86-64-v3-naive/train_gpt_cpu|"
    )
    machine="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores"
    build="train_gpt_cpu (fp32), $(${CC:-gcc} --version | head -n 1)"
else
    runs=(
        "order|RTX 30xx/40xx kernels, 24 GiB|KERNEL_PATH=sm86|--memory-limit 24"
        "order|RTX 30xx/40xx kernels, atomic dQ|KERNEL_PATH=sm86 FLASH_ATTN_DETERMINISTIC=0|"
        "order|A100 kernels|KERNEL_PATH=sm80|"
        "order|A100 attention tiles|FLASH_ATTN_CONFIG=sm80|"
        "order|atomic dQ|FLASH_ATTN_DETERMINISTIC=0|"
        "order|B 64 not batch-invariant||--batch-invariant 0 -b 64"
        "order|B 16 -r 1 not batch-invariant||--batch-invariant 0 -b 16 -r 1"
        "order|B 32 not batch-invariant, untuned|MATMUL_TUNE=0|--batch-invariant 0 -b 32"
    )
    machine=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -n 1)
    build="$PROGRAM, $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'CUDA ?')"
fi
[ -n "$PRECISION" ] || for seed in 1 2 3 4 5 6 7 8; do runs+=("seed|seed $seed||--seed $seed"); done

# run INDEX: one run of the list into $WORK/INDEX
run() {
    local kind label envs options program=$PROGRAM
    IFS='|' read -r kind label envs options <<< "${runs[$1]}"
    local assignments=()
    for a in $envs; do
        case $a in PROGRAM=*) program=${a#PROGRAM=} ;; *) assignments+=("$a") ;; esac
    done
    # shellcheck disable=SC2086 # the options are words
    if ! env "${assignments[@]}" "$program" -f "$RECIPE" $options -o "$WORK/$1" > "$WORK/$1.out" 2>&1; then
        echo "FAIL: run '$label' ($envs $program -f $RECIPE $options) exited with an error:" >&2
        tail -n 5 "$WORK/$1.out" >&2
        return 1
    fi
    rm -f "$WORK/$1"/*.bin # only the log is kept: a GPT-2 124M's last checkpoint is 1.7 GB
    local trained
    trained=$(cd "$root/scripts" &&
        python3 -c "import sys; from compare_curves import run_precision; print(run_precision(sys.argv[1]) or '')" "$WORK/$1/log.csv")
    if [ -n "$PRECISION" ] && [ "$trained" != "$PRECISION" ]; then
        echo "FAIL: run '$label': $program trains in ${trained:-an unknown precision}, not $PRECISION" >&2
        return 1
    fi
    echo "$kind|$label|$envs|$options|$(sed -n 's/^-b auto: \(B [0-9]*, -r [0-9]\).*/\1/p' "$WORK/$1.out")" > "$WORK/$1.done"
    echo "done: $kind run '$label'"
}
running=0
for i in "${!runs[@]}"; do
    if [ "$running" -ge "$JOBS" ]; then wait -n || true; running=$((running - 1)); fi
    run "$i" &
    running=$((running + 1))
done
wait
for i in "${!runs[@]}"; do [ -f "$WORK/$i.done" ] || { echo "error: not every run finished; nothing written" >&2; exit 1; }; done

python3 - "$WORK" "${#runs[@]}" "$out.envelope.csv" "$PRECISION" <<'EOF'
import csv, sys
work, count, path, precision = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
kept = []
if precision:  # the envelope's other kinds stay, its runs of this precision are replaced
    with open(path, newline="") as f:
        kept = [row for row in csv.reader(f)][1:]
    kept = [row for row in kept if row[0] != precision]
with open(path + ".tmp", "w", newline="") as f:
    out = csv.writer(f, lineterminator="\n")
    out.writerow(["kind", "run", "step", "train_loss", "val_loss"])
    out.writerows(kept)
    for i in range(count):
        kind, label = open(f"{work}/{i}.done").read().split("|")[:2]
        with open(f"{work}/{i}/log.csv", newline="") as log:
            for row in csv.DictReader(log):
                out.writerow([kind, label, row["step"], row["train_loss"], row["val_loss"]])
EOF
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$root" diff --quiet HEAD 2>/dev/null || commit="$commit plus uncommitted work of $(date +%F)"
if [ -n "$PRECISION" ]; then
    # The description so far, less an earlier block of this precision's runs, then this block.
    awk -v head="$PRECISION runs:" 'index($0, head) == 1 { skip = 1; next } skip && /^  / { next } { skip = 0; print }' \
        "$out.envelope.txt"
    echo "$PRECISION runs: scripts/write_envelope.sh --precision $PRECISION $RECIPE $PROGRAM $JOBS on $machine, $build," \
        "commit $commit, $(date +%F); $PROGRAM -f $RECIPE with (kind | label | environment | options | what -b auto picked):"
    for i in "${!runs[@]}"; do echo "  $(cat "$WORK/$i.done")"; done
else
    echo "recipe: $name"
    echo "settings: $settings"
    echo "machine: $machine"
    echo "build: $build"
    echo "commit: $commit"
    echo "date: $(date +%F)"
    echo "written by: scripts/write_envelope.sh $RECIPE $PROGRAM $JOBS"
    echo "runs: $PROGRAM -f $RECIPE with (kind | label | environment | options | what -b auto picked):"
    for i in "${!runs[@]}"; do echo "  $(cat "$WORK/$i.done")"; done
fi > "$out.envelope.txt.tmp"
mv "$out.envelope.csv.tmp" "$out.envelope.csv"
mv "$out.envelope.txt.tmp" "$out.envelope.txt"
echo "wrote $out.envelope.csv and $out.envelope.txt (${#runs[@]} runs)"
