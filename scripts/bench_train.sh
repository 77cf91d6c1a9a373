#!/bin/bash
# Training speed of train_gpt on a GPT-2 model from scratch at T = 1024 on one GPU: tokens/s, ms/step,
# MFU and peak GPU memory, one row per configuration: BF16 naive B = 32 and 64, BF16 flash B = 32 and
# 64, FP32 naive B = 16. MODEL=d12 (the default, GPT-2 124M), d24 (350M), d36 (774M) or d48 (1.5B)
# picks the model for every row, ours, llm.c's and PyTorch's. RUNS="BF16 flash 64,..." picks other
# rows; a fourth field is the recompute level (-r, default 0):
# RUNS="BF16 flash 64 0,BF16 flash 64 1,BF16 flash 64 2" for the -r 0/1/2 table;
# RUNS="" for none (llm.c's or PyTorch's rows alone).
# Usage: GPU_ARCH=90 PEAK_TFLOPS=989 scripts/bench_train.sh   (needs a GPU; scripts/get_data.sh fetches the data)
# PEAK_TFLOPS is the GPU's dense bf16 peak (989 for H100/H200 SXM); the FP32 row uses it too, so
# its MFU reads as a fraction of the bf16 peak. Timing: the median ms of steps FIRST..STEPS (default
# 3..12: the first steps include cuBLAS heuristics and allocation), and their mean. A card held at its
# power cap in training runs its first second or so faster, until the cap takes hold (docs/performance.md,
# How to compare): FIRST=11 STEPS=40 times the sustained step, as issue 18's table of llm.c did (the
# mean of steps 11-40).
# Then PyTorch's rows, measured in the same run (scripts/bench_train_torch.py: the same GPT-2 124M
# with torch.compile, causal SDPA, bf16 autocast, fused AdamW), attn torch-BACKEND:
# TORCH_RUNS="flash 32,flash 64,cudnn 32,cudnn 64" (the default; empty: none) lists "backend B"
# pairs, backend one of flash, cudnn, efficient, default (PyTorch's own choice). Without a torch that
# imports and sees a GPU they are skipped with a line saying why. Their ms/step and mean are of the
# same steps FIRST..STEPS (here the first steps include compilation), MFU the same formula, and peak_MiB the
# same nvidia-smi sampling of the GPU's used memory as our rows (so both include the CUDA context);
# PyTorch's own torch.cuda.max_memory_allocated / max_memory_reserved follow each torch row.
# Every row also has the card's mean power (nvidia-smi's power.draw) and SM clock over its timed
# steps, and their product with the mean step, the joules a step: a card held at its power cap runs
# a step in about its energy over the cap's watts, so two programs on one card differ by their
# joules at the same watts (docs/performance.md). The samples counted are
# those between the ends of steps FIRST - 1 and STEPS, as each program's step lines arrive.
set -eu
export LC_ALL=C # EPOCHREALTIME's and the tables' decimal point
[ -n "${EPOCHREALTIME:-}" ] || { echo "bench_train.sh: needs bash 5 (EPOCHREALTIME)" >&2; exit 1; }
"$(dirname "$0")/get_data.sh" # before any cd: a relative GPT_DATA_DIR is the caller's
ARCH=${GPU_ARCH:-90}
PEAK_TFLOPS=${PEAK_TFLOPS:-989}
STEPS=${STEPS:-12}
FIRST=${FIRST:-3}
[ "$FIRST" -ge 2 ] && [ "$FIRST" -le "$STEPS" ] || { echo "bench_train.sh: FIRST=$FIRST must be in 2..STEPS=$STEPS" >&2; exit 1; }
# The model's layers, channels and heads (train_gpt's -e presets, which llm.c's -e dN shares) and its
# parameters, the vocabulary padded to 50,304 as both programs hold it.
MODEL=${MODEL:-d12}
case $MODEL in
    d12) L=12 C=768 NH=12 ;;
    d24) L=24 C=1024 NH=16 ;;
    d36) L=36 C=1280 NH=20 ;;
    d48) L=48 C=1600 NH=25 ;;
    *) echo "bench_train.sh: MODEL=$MODEL is none of d12, d24, d36, d48" >&2; exit 1 ;;
esac
T=1024
PARAMS=$((50304 * C + 1024 * C + L * (12 * C * C + 13 * C) + 2 * C))
BUILD=${BUILD:-build/bench}
DATA=$(dirname "$0")/../data/tinyshakespeare
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

RUNS=${RUNS-"BF16 naive 32,BF16 naive 64,BF16 flash 32,BF16 flash 64,FP32 naive 16"}
IFS=, read -r -a runs <<< "$RUNS"
for run in "${runs[@]}"; do
    # shellcheck disable=SC2086 # "precision attn B", split on purpose
    set -- $run
    make --no-print-directory BUILD="$BUILD/$1-$2" ATTN="$2" PRECISION="$1" GPU_ARCH="$ARCH" "$BUILD/$1-$2/train_gpt" >/dev/null
done

# FLOPs per token (forward + backward, as train.c counts them): 6 x parameters + 6 x L x C x T for
# causal attention.
FLOPS_PER_TOKEN=$((6 * PARAMS + 6 * L * C * T))
# stamp: each line of stdin after the time it arrived (seconds since the epoch).
stamp() { while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done; }
# run_stamped LOG CMD...: CMD's output, line by line as it comes, stamped into LOG; CMD's status.
run_stamped() {
    local log=$1
    shift
    stdbuf -oL "$@" 2>&1 | stamp > "$log"
    return "${PIPESTATUS[0]}"
}
# unstamped LOG: LOG's lines as the program wrote them.
unstamped() { cut -d' ' -f2- "$1"; }
# nvidia-smi samples the GPU's used memory, power and SM clock every 100 ms from start_smi to
# stop_smi, each sample stamped as it arrives.
start_smi() {
    nvidia-smi --query-gpu=memory.used,power.draw,clocks.sm --format=csv,noheader,nounits -lms 100 \
        > >(stamp > "$WORK/smi") &
    smi=$!
}
# stop_smi LOG: sets peak, the most memory used in the run, and watts and mhz, the means over the
# samples from the end of step FIRST - 1 to the end of step STEPS as LOG's stamped step lines ("step
# N/M ...", which all three programs print) place them ("-" without such steps or samples).
stop_smi() {
    kill "$smi"
    wait "$smi" 2>/dev/null || true
    sleep 0.2 # stamp's last lines
    read -r peak watts mhz < <(awk -v first="$FIRST" -v last="$STEPS" '
        FNR == NR { if ($2 == "step") { split($3, s, "/"); if (s[1] == first - 1) t0 = $1; if (s[1] == last) t1 = $1 }
                    next }
        { sub(/,/, "", $2); sub(/,/, "", $3); if ($2 + 0 > peak) peak = $2 + 0 }
        t1 && $1 >= t0 && $1 <= t1 && $3 ~ /^[0-9.]+$/ { w += $3; f += $4; n++ }
        END { if (n) printf "%d %.0f %.0f\n", peak, w / n, f / n; else printf "%d - -\n", peak }' "$1" "$WORK/smi")
}
# timing TIMES: sets ms and mean, the median (the lower middle) and the mean of the step times TIMES
# (one per line).
timing() {
    ms=$(sort -g <<< "$1" | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
    mean=$(awk '{ s += $1 } END { print s / NR }' <<< "$1")
}
# row PRECISION ATTN B MS MEAN [NOTE]: one line of the table (tokens/s and MFU from MS, the median;
# peak, watts and mhz from stop_smi; joules a step from watts and MEAN).
row() {
    awk -v p="$1" -v a="$2" -v B="$3" -v T=$T -v ms="$4" -v mean="$5" -v f=$FLOPS_PER_TOKEN -v peak_tf="$PEAK_TFLOPS" \
        -v mem="$peak" -v w="$watts" -v mhz="$mhz" -v note="${6:-}" 'BEGIN {
        tps = B * T / (ms / 1000); mfu = tps * f / (peak_tf * 1e12); j = w == "-" ? "-" : sprintf("%.1f", w * mean / 1000)
        printf "%-6s %-15s %4d %8d %10.1f %8.1f %12.0f %5.1f%% %10s %5s %5s %7s%s\n", p, a, B, T, ms, mean, tps, 100 * mfu,
            mem, w, mhz, j, note }'
}
echo "$MODEL ($PARAMS parameters), steps $FIRST..$STEPS timed: ms/step is their median, mean their mean"
printf "%-6s %-15s %4s %8s %10s %8s %12s %6s %10s %5s %5s %7s\n" precision attn B T ms/step mean tokens/s MFU peak_MiB W MHz J/step
for run in "${runs[@]}"; do
    # shellcheck disable=SC2086
    set -- $run
    p=$1 attn=$2 B=$3 r=${4:-0} out=$WORK/$p-$attn-$B-r$r
    start_smi
    run_stamped "$out.log" "$BUILD/$p-$attn/train_gpt" -e "$MODEL" -i "$DATA/tiny_shakespeare_train.bin" \
        -j "$DATA/tiny_shakespeare_val.bin" -b "$B" -t $T -r "$r" -x "$STEPS" -v 0 -s 0 -n 0 -o "$out" ||
        { stop_smi "$out.log"; unstamped "$out.log"; exit 1; }
    stop_smi "$out.log"
    timing "$(awk -F, -v first="$FIRST" 'NR > 1 && $1 >= first && $6 != "" { print $6 }' "$out/log.csv")"
    row "$p" "$attn" "$B" "$ms" "$mean" "$([ "$r" = 0 ] || echo "  -r $r")"
done

# llm.c's rows, where LLMC names a train_gpt2cu built from karpathy/llm.c, run as llmc_options.sh
# says: LLMC_RUNS="B r,..." (default "64 0,64 1"), the same model, data, steps and schedule as our
# rows, its ms per step read from its printed step lines, which time each step as our log.csv does.
if [ -n "${LLMC:-}" ]; then
    # shellcheck source=scripts/llmc_options.sh
    . "$(dirname "$0")/llmc_options.sh"
    llmc=$(realpath "$LLMC") data=$(realpath "$DATA")
    IFS=, read -r -a llmc_runs <<< "${LLMC_RUNS:-64 0,64 1}"
    for run in "${llmc_runs[@]}"; do
        # shellcheck disable=SC2086 # "B r"
        set -- $run
        B=$1 r=$2 out=$WORK/llmc-$1-r$2
        start_smi
        set_llmc_options "$MODEL" "$B" $T "$r" "$STEPS" "$data/tiny_shakespeare_train.bin" "$out"
        (cd "$WORK" && run_stamped "$out.log" "$llmc" "${llmc_options[@]}") ||
            { stop_smi "$out.log"; unstamped "$out.log" | tail -20; exit 1; }
        stop_smi "$out.log"
        # "step   12/40 | ... | 115.81 ms | ...": the step number and the field before "ms".
        times=$(awk -v first="$FIRST" '/^step +[0-9]+\/[0-9]+ \|/ {
            split($2, s, "/"); for (i = 3; i < NF; i++) if ($(i + 1) == "ms" && s[1] >= first) print $i }' <(unstamped "$out.log"))
        [ -n "$times" ] || { echo "bench_train.sh: no step times in the output of $LLMC:"; unstamped "$out.log" | tail -20; exit 1; }
        timing "$times"
        row BF16 llm.c "$B" "$ms" "$mean" "$([ "$r" = 0 ] || echo "  -r $r")${LLMC_ARGS:+  $LLMC_ARGS}"
    done
fi
# PyTorch's rows: the script prints "RESULT ms_per_step MS tokens_per_s TPS max_allocated_MiB A
# max_reserved_MiB R" as its last line.
TORCH_RUNS=${TORCH_RUNS-"flash 32,flash 64,cudnn 32,cudnn 64"}
[ -n "$TORCH_RUNS" ] || exit 0
if ! why=$(python3 -c "import torch; assert torch.cuda.is_available(), 'torch ' + torch.__version__ + ' sees no CUDA GPU'" 2>&1); then
    echo "PyTorch reference skipped: ${why##*$'\n'}"
    exit 0
fi
# A run that fails (a backend this GPU or build lacks, out of memory) gets a row with the last line of
# its output, the others still run, and the script exits 1 at the end.
IFS=, read -r -a torch_runs <<< "$TORCH_RUNS"
status=0
for run in "${torch_runs[@]}"; do
    # shellcheck disable=SC2086 # "backend B"
    set -- $run
    backend=$1 B=$2 out=$WORK/torch-$1-$2.log
    start_smi
    if run_stamped "$out" python3 "$(dirname "$0")/bench_train_torch.py" --data "$DATA/tiny_shakespeare_train.bin" \
        --batch "$B" --seq $T --steps "$STEPS" --first "$FIRST" --sdpa-backend "$backend" \
        --layers $L --channels $C --heads $NH; then
        stop_smi "$out"
        read -r _ _ ms _ _ _ alloc _ reserved _ mean < <(unstamped "$out" | grep '^RESULT ' | tail -1)
        row BF16 "torch-$backend" "$B" "$ms" "$mean" "  (torch max allocated $alloc MiB, reserved $reserved MiB)"
    else
        stop_smi "$out"
        printf "%-6s %-15s %4d %8d  failed: %s\n" BF16 "torch-$backend" "$B" $T "$(unstamped "$out" | tail -1)"
        status=1
    fi
done
exit $status
