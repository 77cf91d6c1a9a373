#!/bin/bash
# Scaling of train_gpt over the GPUs of one machine: MODEL (d12 by default, GPT-2 124M; d24, d36,
# d48), T = 1024, B (default 64) per GPU, the total batch of llm.c's recipe for that size unless D
# sets it (scripts/run_gpt2_*.sh in karpathy/llm.c: 524,288 tokens a step, 1,048,576 for d48;
# gradient accumulation makes up the rest), BF16, ATTN=flash. A row per number of GPUs (1, 2, 4,
# ... up to the GPUs present, or GPUS="1 2") and ZeRO stage (ZERO="0 1" by default; llm.c's recipes
# run -z 1): ms/step and tokens/s with the gradients summed over the GPUs after the backward (the
# default), scaling efficiency = tokens/s(N) / (N x tokens/s(1 GPU), or a GPU's of the first row
# where GPUS does not start with 1), the same three with each layer's gradients summed beside the
# backward of the layers below (GRAD_SUMS_BESIDE_BACKWARD=1), and each GPU's optimizer memory (from
# the memory plan train_gpt prints).
# SOCKETS=1 forces NCCL onto its socket transport over the loopback interface, as
# tests/gpu/test_two_nodes.sh does: the GPUs then exchange the gradients as two hosts on Ethernet
# would, through the CPUs, instead of over NVLink. SOCKETS="0 1": rows for both transports, the one
# GPU's row (no transport) measured once.
# Usage: GPU_ARCH=90 [MODEL=d48 B=16] [SOCKETS=1|"0 1"] [ZERO=1] [STEPS=6] scripts/bench_multi_gpu.sh
#        (needs GPUs; scripts/get_data.sh fetches the data)
set -eu
"$(dirname "$0")/get_data.sh" # before any cd: a relative GPT_DATA_DIR is the caller's
cd "$(dirname "$0")/.."
ARCH=${GPU_ARCH:-90}
STEPS=${STEPS:-8}
MODEL=${MODEL:-d12} B=${B:-64} ZERO=${ZERO:-0 1}
D=${D:-$([ "$MODEL" = d48 ] && echo 1048576 || echo 524288)}
BUILD=${BUILD:-build/bench-multi}
DATA=data/tinyshakespeare
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
SOCKETS=${SOCKETS:-0}
for s in $SOCKETS; do
    case $s in 0 | 1) ;; *) echo "SOCKETS: 0, 1 or \"0 1\", not \"$SOCKETS\"" >&2; exit 1 ;; esac
done
# transport_env SOCKETS: the environment that puts NCCL on that transport (none: its fastest; "-":
# one GPU, no NCCL)
transport_env() { if [ "$1" = 1 ]; then echo NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo; fi; }
transport_name() { case $1 in 1) echo sockets ;; 0) echo fastest ;; *) echo - ;; esac; }
ngpu=$(nvidia-smi -L | wc -l)
if [ -z "${GPUS:-}" ]; then
    GPUS=1
    for n in 2 4 8 16; do [ $n -le "$ngpu" ] && GPUS="$GPUS $n"; done
fi
make --no-print-directory -s BUILD="$BUILD" PRECISION=BF16 ATTN=flash GPU_ARCH="$ARCH" NCCL=1 "$BUILD/train_gpt"

# median ms of steps 3..STEPS (the first steps include cuBLAS's tuning and NCCL's set-up)
median_ms() { awk -F, 'NR > 3 { print $6 }' "$1" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
optimizer_mib() { sed -n 's/.*optimizer *\([0-9.]*\) MiB.*/\1/p' "$1" | head -1; }
train() { # train OUT NGPUS ZERO [VAR=VALUE]: one run, its log in OUT.log
    local out=$1 n=$2 z=$3
    shift 3
    env "$@" scripts/launch.sh "$n" "$BUILD/train_gpt" -e "$MODEL" -i "$DATA/tiny_shakespeare_train.bin" \
        -j "$DATA/tiny_shakespeare_val.bin" -b "$B" -t 1024 -d "$D" -x "$STEPS" -v 0 -s 0 -n 0 \
        -z "$z" -o "$out" > "$out.log" 2>&1 || { tail -20 "$out.log"; exit 1; }
}
# ms/step, tokens/s and scaling of the run in OUT on N GPUs, against BASE tokens/s a GPU (the first
# row's; 100% where BASE is empty)
measured() { awk -v n="$2" -v ms="$(median_ms "$1/log.csv")" -v d="$D" -v base="${3:-0}" \
    'BEGIN { tps = d / (ms / 1000); printf "%.1f %.0f %.1f%%", ms, tps, base ? 100 * tps / (n * base) : 100 }'; }
echo "$MODEL, B $B, T 1024, $D tokens a step; NCCL over its fastest transport, or sockets over the loopback interface"
printf "%5s %3s %8s %10s %12s %9s %12s %12s %9s %14s\n" GPUs -z NCCL ms/step tokens/s scaling "ms, beside" tokens/s \
    scaling "optimizer MiB"
base=""
for n in $GPUS; do
    # One GPU: nothing to shard, nothing to sum, no transport.
    transports=$([ "$n" = 1 ] && echo - || echo "$SOCKETS") stages=$([ "$n" = 1 ] && echo 0 || echo "$ZERO")
    for s in $transports; do
        read -ra nccl_env <<< "$(transport_env "$s")"
        for z in $stages; do
            run=$WORK/n$n-z$z-s$s
            train "$run" "$n" "$z" "${nccl_env[@]}"
            read -r ms tps scaling <<< "$(measured "$run" "$n" "$base")"
            [ -z "$base" ] && base=$((tps / n))
            beside="- - -"
            if [ "$n" -gt 1 ]; then
                train "$run-beside" "$n" "$z" "${nccl_env[@]}" GRAD_SUMS_BESIDE_BACKWARD=1
                beside=$(measured "$run-beside" "$n" "$base")
            fi
            read -r ms_beside tps_beside scaling_beside <<< "$beside"
            printf "%5d %3d %8s %10s %12s %9s %12s %12s %9s %14s\n" "$n" "$z" "$(transport_name "$s")" "$ms" "$tps" \
                "$scaling" "$ms_beside" "$tps_beside" "$scaling_beside" "$(optimizer_mib "$run.log")"
        done
    done
done
