#!/bin/bash
# Two nodes simulated on one host with 2 GPUs (a 2-GPU device kind): each rank is started as
# a node of its own would start it, with RANK 0 or 1, WORLD_SIZE 2, LOCAL_RANK 0 and
# LOCAL_WORLD_SIZE 1, one GPU (CUDA_VISIBLE_DEVICES 0 or 1) and an output directory of its own. The
# ranks meet over the TCP rendezvous at MASTER_ADDR=127.0.0.1, and NCCL is kept off NVLink, shared
# memory and InfiniBand (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1), on its socket
# transport over the loopback interface (NCCL_SOCKET_IFNAME=lo), as between two hosts on Ethernet.
#   1. GPT-2 124M, the same global batch on 1 GPU and on the 2 nodes: FP32 20 steps within 1e-4
#      relative, BF16 100 steps within 1% (tests/gpu/test_multi_gpu.sh's tolerances).
#   2. Files: rank 0's directory holds log.csv, the model file and rank 0's training state; rank 1's
#      holds rank 1's training state (and each its options, run.conf, and its lock, lock_RANK). Rank 0
#      prints the rendezvous it used, and NCCL (NCCL_DEBUG=INFO) names only its socket transport for
#      the channels.
#   3. Resume (FP32), each rank from its own directory: 10 steps, then 10 more with -y 1, equal the
#      20 straight steps bit for bit (losses, norms, the final model file); when rank 1 lacks its
#      newest state, both ranks resume from the newest step that both have and still end bit for bit.
#   4. Failures: rank 1 killed with SIGKILL while training stops rank 0 with a message within
#      --nccl-timeout; rank 1 given the wrong MASTER_PORT: both ranks stop within --nccl-timeout,
#      rank 1 naming the address it could not reach, rank 0 the ranks missing.
# Usage: BUILD=dir GPU_ARCH=90 tests/gpu/test_two_nodes.sh   (needs 2 GPUs; scripts/get_data.sh fetches the data)
set -eu
"$(dirname "$0")/../../scripts/get_data.sh" # before any cd: a relative GPT_DATA_DIR is the caller's
. "$(dirname "$0")/../lib/log_compare.sh"
. "$(dirname "$0")/../lib/free_port.sh"
. "$(dirname "$0")/../lib/run_files.sh"
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/multi}
ARCH=${GPU_ARCH:-90}
DATA=data/tinyshakespeare
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$WORK"
failed=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; failed=1; }

for p in FP32 BF16; do
    make --no-print-directory -s BUILD="$BUILD/$p" PRECISION=$p GPU_ARCH="$ARCH" NCCL=1 "$BUILD/$p/train_gpt"
done
COMMON=(-e d12 -i "$DATA/tiny_shakespeare_train.bin" -j "$DATA/tiny_shakespeare_val.bin" -t 1024
        -v 0 -s 0 -l 6e-4 -u 700 --seed 1337 -b 4 -d 16384) # as tests/gpu/test_multi_gpu.sh


one_gpu() { # one_gpu PRECISION OUTDIR ARGS...
    local p=$1 out=$2
    shift 2
    CUDA_VISIBLE_DEVICES=0 "$BUILD/$p/train_gpt" "${COMMON[@]}" -o "$out" "$@" > "$out.log" 2>&1 ||
        { echo "1-GPU run failed: $p $*"; tail -20 "$out.log"; return 1; }
}

# start_node RANK PRECISION OUTDIR PORT ARGS...: starts one rank in the background as its own node would
# (pid in $!), with its output in OUTDIR.log.
start_node() {
    local r=$1 p=$2 out=$3 port=$4
    shift 4
    env RANK="$r" WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 CUDA_VISIBLE_DEVICES="$r" \
        MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
        NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=INFO \
        "$BUILD/$p/train_gpt" "${COMMON[@]}" -o "$out" "$@" > "$out.log" 2>&1 &
}

# two_nodes PRECISION BASE ARGS...: rank 0 in BASE-0, rank 1 in BASE-1; fails unless both succeed.
two_nodes() {
    local p=$1 base=$2 port pid0 pid1 s0=0 s1=0
    shift 2
    port=$(free_port)
    start_node 0 "$p" "$base-0" "$port" "$@"
    pid0=$!
    start_node 1 "$p" "$base-1" "$port" "$@"
    pid1=$!
    wait $pid0 || s0=$?
    wait $pid1 || s1=$?
    [ $s0 = 0 ] && [ $s1 = 0 ] && return
    echo "2-node run failed ($p $*): rank 0 exit $s0, rank 1 exit $s1"
    tail -n 5 "$base-0.log" "$base-1.log"
    return 1
}

# 1. Losses: 1 GPU x B 4 x 4 accumulation = 2 nodes x B 4 x 2.
one_gpu FP32 "$WORK/fp32-1" -x 20
two_nodes FP32 "$WORK/fp32-2" -x 20
if r=$(compare_logs "$WORK/fp32-1/log.csv" "$WORK/fp32-2-0/log.csv" train_loss 1 20 1e-4); then pass "FP32 1 GPU vs 2 nodes: $r"
else fail "FP32 1 GPU vs 2 nodes: $r"; fi
one_gpu BF16 "$WORK/bf16-1" -x 100
two_nodes BF16 "$WORK/bf16-2" -x 100
if r=$(compare_logs "$WORK/bf16-1/log.csv" "$WORK/bf16-2-0/log.csv" train_loss 1 100 1e-2); then pass "BF16 1 GPU vs 2 nodes: $r"
else fail "BF16 1 GPU vs 2 nodes: $r"; fi

# 2. Who writes what, and the rendezvous printed.
if [ "$(ls "$WORK/fp32-2-0" | tr '\n' ' ')" = "lock_00000 log.csv model_00000020.bin run.conf state_00000020_00000.bin " ] &&
   [ "$(ls "$WORK/fp32-2-1" | tr '\n' ' ')" = "lock_00001 run.conf state_00000020_00001.bin " ]; then
    pass "files: rank 0 writes log.csv, the model, the options, its state and lock; rank 1 its options, state and lock"
else
    fail "files: rank 0 wrote $(ls "$WORK/fp32-2-0" | tr '\n' ' '); rank 1 $(ls "$WORK/fp32-2-1" | tr '\n' ' ')"
fi
if grep -q "^rendezvous: TCP 127.0.0.1:[0-9]*$" "$WORK/fp32-2-0.log"; then pass "rank 0 prints: $(grep -m1 ^rendezvous "$WORK/fp32-2-0.log")"
else fail "rank 0 does not print the TCP rendezvous: $(grep -m1 ^rendezvous "$WORK/fp32-2-0.log")"; fi
# NCCL_DEBUG=INFO names the transport of every channel: sockets only, as between two hosts.
if grep -q "via NET/Socket" "$WORK/fp32-2-0.log" && ! grep -qE "via (P2P|SHM)|NET/IB" "$WORK"/fp32-2-*.log; then
    pass "NCCL ran over sockets only: $(grep -m1 "via NET/Socket" "$WORK/fp32-2-0.log")"
else
    fail "NCCL transports: $(grep -hE -m3 "via " "$WORK"/fp32-2-*.log | tr '\n' ' ')"
fi

# 3. Resume, each rank from its own directory.
two_nodes FP32 "$WORK/straight" -x 20 -n 10 --keep 0
two_nodes FP32 "$WORK/split" -x 10 -n 10 --keep 0
# all 20 steps are warmup (-u 700): -x changes no LR
two_nodes FP32 "$WORK/split" -x 20 -n 10 --keep 0 -y 1 --allow-change steps
if same_bits "$WORK/straight-0" "$WORK/split-0" 20; then
    pass "2-node resume continues bit for bit: losses, norms and the final model file"
else
    fail "2-node resume differs: $(compare_logs "$WORK/straight-0/log.csv" "$WORK/split-0/log.csv" train_loss 1 20 0)"
fi
# Rank 1 has lost its newest state (step 20): both resume from step 10.
cp -r "$WORK/split-0" "$WORK/lost-0"
cp -r "$WORK/split-1" "$WORK/lost-1"
rm "$WORK/lost-1/state_00000020_00001.bin"
two_nodes FP32 "$WORK/lost" -x 20 -n 10 --keep 0 -y 1
if grep -q "resumed from .*state_00000010_00000.bin at step 10" "$WORK/lost-0.log" &&
   cmp -s "$WORK/straight-0/model_00000020.bin" "$WORK/lost-0/model_00000020.bin"; then
    pass "a rank without the newest state: both resume from step 10 and end bit for bit"
else
    fail "a rank without the newest state: $(grep -m1 -e resumed -e error "$WORK/lost-0.log" "$WORK/lost-1.log")"
fi

# 4. Failures.
port=$(free_port)
start_node 0 BF16 "$WORK/kill-0" "$port" -x 100000 -n 0 --nccl-timeout 20
pid0=$!
start_node 1 BF16 "$WORK/kill-1" "$port" -x 100000 -n 0 --nccl-timeout 20
pid1=$!
for _ in $(seq 240); do grep -q "^step *20/" "$WORK/kill-0.log" 2> /dev/null && break; sleep 0.5; done # both training
t0=$(date +%s)
kill -9 $pid1
status=0
wait $pid0 || status=$?
elapsed=$(( $(date +%s) - t0 ))
wait $pid1 2> /dev/null || true
if [ $status -ne 0 ] && [ $elapsed -le 60 ] && grep -q "rank 0 of 2" "$WORK/kill-0.log"; then
    pass "rank 1 killed: rank 0 stopped after ${elapsed} s: $(grep -m1 error "$WORK/kill-0.log")"
else
    fail "rank 1 killed: rank 0 exit $status after ${elapsed} s: $(tail -3 "$WORK/kill-0.log")"
fi

port=$(free_port)
wrong=$(free_port)
t0=$(date +%s)
start_node 0 BF16 "$WORK/port-0" "$port" -x 10 --nccl-timeout 10
pid0=$!
start_node 1 BF16 "$WORK/port-1" "$wrong" -x 10 --nccl-timeout 10
pid1=$!
s0=0
s1=0
wait $pid0 || s0=$?
wait $pid1 || s1=$?
elapsed=$(( $(date +%s) - t0 ))
if [ $s0 -ne 0 ] && [ $s1 -ne 0 ] && [ $elapsed -le 40 ] &&
   grep -q "only 1 of 2 ranks joined at port $port" "$WORK/port-0.log" &&
   grep -q "could not reach rank 0 at 127.0.0.1:$wrong" "$WORK/port-1.log"; then
    pass "wrong MASTER_PORT on rank 1: both stopped within ${elapsed} s: $(grep -m1 error "$WORK/port-1.log")"
else
    fail "wrong MASTER_PORT on rank 1: exits $s0 and $s1 after ${elapsed} s: $(tail -n 2 "$WORK/port-0.log" "$WORK/port-1.log")"
fi

[ $failed = 0 ] && echo "test_two_nodes: all passed" || { echo "test_two_nodes: FAILED"; exit 1; }
