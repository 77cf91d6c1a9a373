#!/bin/bash
# Scaling of train_gpt over the GPUs of one machine: MODEL (d12 by default, GPT-2 124M; d24, d36,
# d48), T = 1024, B (default 64) per GPU, 524288 tokens per step (gradient accumulation makes up the
# rest), BF16, ATTN=flash. One row per number of GPUs (1, 2, 4, ... up to the GPUs present, or
# GPUS="1 2"): ms/step and tokens/s with the gradients summed over the GPUs after the backward (the
# default), scaling efficiency = tokens/s(N) / (N x tokens/s(1)), the same three with each layer's
# gradients summed beside the backward of the layers below (GRAD_SUMS_BESIDE_BACKWARD=1), and each
# GPU's optimizer memory with -z 0 and -z 1 (from the memory plan train_gpt prints).
# SOCKETS=1 forces NCCL onto its socket transport over the loopback interface, as
# tests/gpu/test_two_nodes.sh does: the GPUs then exchange the gradients as two hosts on Ethernet
# would, through the CPUs, instead of over NVLink.
# Usage: GPU_ARCH=90 [MODEL=d48 B=16] [SOCKETS=1] scripts/bench_multi_gpu.sh
#        (needs GPUs; scripts/get_data.sh fetches the data)
set -eu
"$(dirname "$0")/get_data.sh" # before any cd: a relative GPT_DATA_DIR is the caller's
cd "$(dirname "$0")/.."
ARCH=${GPU_ARCH:-90}
STEPS=${STEPS:-8}
MODEL=${MODEL:-d12} B=${B:-64}
BUILD=${BUILD:-build/bench-multi}
DATA=data/tinyshakespeare
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
transport="its fastest transport"
if [ "${SOCKETS:-0}" = 1 ]; then
    export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo
    transport="sockets over the loopback interface"
fi
ngpu=$(nvidia-smi -L | wc -l)
if [ -z "${GPUS:-}" ]; then
    GPUS=1
    for n in 2 4 8 16; do [ $n -le "$ngpu" ] && GPUS="$GPUS $n"; done
fi
make --no-print-directory -s BUILD="$BUILD" PRECISION=BF16 ATTN=flash GPU_ARCH="$ARCH" NCCL=1 "$BUILD/train_gpt"

# median ms of steps 3..STEPS (the first steps include cuBLAS heuristics and NCCL set-up)
median_ms() { awk -F, 'NR > 3 { print $6 }' "$1" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
tokens_per_s() { awk -v ms="$1" 'BEGIN { printf "%.0f", 524288 / (ms / 1000) }'; }
optimizer_mib() { sed -n 's/.*optimizer *\([0-9.]*\) MiB.*/\1/p' "$1" | head -1; }
train() { # train OUT NGPUS ZERO [VAR=VALUE]: one run, its log in OUT.log
    local out=$1 n=$2 z=$3
    shift 3
    env "$@" scripts/launch.sh "$n" "$BUILD/train_gpt" -e "$MODEL" -i "$DATA/tiny_shakespeare_train.bin" \
        -j "$DATA/tiny_shakespeare_val.bin" -b "$B" -t 1024 -d 524288 -x "$STEPS" -v 0 -s 0 -n 0 \
        -z "$z" -o "$out" > "$out.log" 2>&1 || { tail -20 "$out.log"; exit 1; }
}
echo "$MODEL, B $B, T 1024, 524288 tokens a step, NCCL over $transport"
printf "%5s %10s %12s %9s %12s %12s %9s %14s %14s\n" GPUs ms/step tokens/s scaling "ms, beside" "tokens/s" scaling \
    "optim -z 0 MiB" "optim -z 1 MiB"
base=""
for n in $GPUS; do
    train "$WORK/n$n-z0" "$n" 0
    ms=$(median_ms "$WORK/n$n-z0/log.csv")
    tps=$(tokens_per_s "$ms")
    [ -z "$base" ] && base=$tps
    beside="- - -" z1=$(optimizer_mib "$WORK/n$n-z0.log")
    if [ "$n" -gt 1 ]; then
        train "$WORK/n$n-beside" "$n" 0 GRAD_SUMS_BESIDE_BACKWARD=1
        ms_beside=$(median_ms "$WORK/n$n-beside/log.csv")
        tps_beside=$(tokens_per_s "$ms_beside")
        beside=$(awk -v n="$n" -v ms="$ms_beside" -v tps="$tps_beside" -v base="$base" \
            'BEGIN { printf "%.1f %.0f %.1f%%", ms, tps, 100 * tps / (n * base) }')
        train "$WORK/n$n-z1" "$n" 1
        z1=$(optimizer_mib "$WORK/n$n-z1.log")
    fi
    read -r ms_beside tps_beside scaling_beside <<< "$beside"
    awk -v n="$n" -v ms="$ms" -v tps="$tps" -v base="$base" -v mb="$ms_beside" -v tb="$tps_beside" \
        -v sb="$scaling_beside" -v z0="$(optimizer_mib "$WORK/n$n-z0.log")" -v z1="$z1" \
        'BEGIN { printf "%5d %10.1f %12.0f %8.1f%% %12s %12s %9s %14s %14s\n",
                 n, ms, tps, 100 * tps / (n * base), mb, tb, sb, z0, z1 }'
done
