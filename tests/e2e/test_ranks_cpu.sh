#!/usr/bin/env bash
# Data parallelism of train_gpt_cpu: ranks started by scripts/launch.sh, meeting through a file in
# the output directory and adding over TCP through rank 0 (kernels/cpu/comm.c). The model code that
# train_gpt runs on several GPUs (the data split, the sums, ZeRO's shards, the sums beside the
# backward, the per-rank state, HellaSwag's split) runs here, on a small GPT:
#  1. 2 ranks train the losses of 1 with the same global batch (within 1e-5 relative: the sums over
#     the rows of a batch add in another order); the MFU of 2 ranks is against twice the peak;
#  2. -z 1 (sharded optimizer) trains the bits of -z 0 on 2 and 3 ranks (3: a shard padded), and with
#     --offload 1 too: losses, gradient norms and the model file;
#  3. the gradients summed layer by layer beside the backward (GRAD_SUMS_BESIDE_BACKWARD=1) train the
#     bits of the sums after it: 2 ranks at -z 0, -z 1 and --batch-invariant 2, 3 ranks at -z 1; each
#     with the sums made as soon as they are queued and with them made only at the wait
#     (TCP_SUMS_AT_WAIT=1), the earliest and the latest moments NCCL may make them, so that a
#     gradient written after its sum began, or a sum read before the wait, changes the bits; the
#     start-up line of the ranks says the sums are beside the backward;
#  4. resume on 2 ranks (-z 1): 4 steps and 4 more resumed are the 8 straight, bit for bit; a state of
#     2 ranks is refused on 1;
#  5. HellaSwag on 2 and 3 ranks (each scores its share of 7 examples) gives every ending the score
#     of 1 rank, bit for bit, and the same accuracy;
#  6. the divergence guard decides on every rank alike: a NaN loss (step 3) and a NaN gradient (step
#     5) made on the last rank only are skipped by both ranks (-z 0 and -z 1): the model file and
#     every rank's training state equal across the skipped steps, and the steps after them train on;
#  7. two "hosts": each rank started as a node of its own would start it, with an output directory of
#     its own, the ranks meeting over the TCP rendezvous (MASTER_ADDR=127.0.0.1): the bits of the run
#     of check 1; rank 0 writes log.csv, the model file and its state, rank 1 only its state (and
#     each its options and its lock);
#  8. a rank killed (SIGKILL) in the middle of training stops the other with a message, at once; a
#     rank 0 whose partner never starts gives up after --nccl-timeout.
set -euo pipefail
BUILD=${BUILD:-.}
DATA=$(cd "${1:?usage: tests/e2e/test_ranks_cpu.sh DATA_DIR (the directory scripts/get_data.sh fills)}" && pwd)
cd "$(dirname "$0")/../.."
. tests/lib/log_compare.sh
. tests/lib/hellaswag_compare.sh
. tests/lib/run_files.sh
. tests/lib/mfu.sh
. tests/lib/free_port.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
trap 'echo "FAIL test_ranks_cpu: the command at line $LINENO failed"' ERR
export OMP_NUM_THREADS=1 # one thread a rank: the ranks share the cores
failed=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; failed=1; }
# All steps in the warmup, whose learning rate does not depend on -x (the resume's runs).
COMMON=(--layers 2 --channels 64 --heads 4 --max-seq 64 -t 64 -v 0 -s 0 -l 1e-3 -u 100 --seed 5
        -i "$DATA/tinyshakespeare/tiny_shakespeare_train.bin" -j "$DATA/tinyshakespeare/tiny_shakespeare_val.bin")
run() { # run NRANKS OUTDIR ARGS...
    local n=$1 out=$2
    shift 2
    timeout 300 scripts/launch.sh "$n" "$BUILD/train_gpt_cpu" "${COMMON[@]}" -o "$out" "$@" > "$out.log" 2>&1 ||
        { echo "run failed: $n rank(s) $*"; tail -20 "$out.log"; exit 1; }
}

# 1. 2,048 tokens a step: 1 rank x B 4 x 8 accumulation = 2 ranks x B 4 x 4.
run 1 "$tmp/one" -b 4 -d 2048 -x 8 -n 0
run 2 "$tmp/two" -b 4 -d 2048 -x 8 -n 0 --peak-tflops 0.001
grep -q "2 ranks (torchrun, TCP through rank 0), ZeRO stage 0$" "$tmp/two.log" || fail "2 ranks: no line naming the ranks: $(head -5 "$tmp/two.log")"
if r=$(compare_logs "$tmp/one/log.csv" "$tmp/two/log.csv" train_loss 1 8 1e-5); then pass "1 rank against 2: $r"; else fail "1 rank against 2: $r"; fi
# 6N + 6LCT a token, the ranks' tokens a second against the peak of each (--peak-tflops) times 2
if r=$(check_mfu_log "$tmp/two/log.csv" "$(gpt2_flops_per_token 2 64 64 64 50304)" 0.002 1); then
    pass "2 ranks: the MFU of every step is against 2 x --peak-tflops"
else fail "2 ranks: MFU: $r"; fi

# 2. ZeRO stage 1 against stage 0; 3 ranks at 768 tokens a step (B 2, 2 micro-batches a rank).
run 2 "$tmp/two-z1" -b 4 -d 2048 -x 8 -n 0 -z 1
run 2 "$tmp/two-z1-off" -b 4 -d 2048 -x 8 -n 0 -z 1 --offload 1
run 3 "$tmp/three" -b 2 -d 768 -x 8 -n 0
run 3 "$tmp/three-z1" -b 2 -d 768 -x 8 -n 0 -z 1
for pair in "two two-z1 2 ranks: -z 1" "two-z1 two-z1-off 2 ranks: -z 1 --offload 1" "three three-z1 3 ranks: -z 1"; do
    read -r a b what <<< "$pair"
    if same_bits "$tmp/$a" "$tmp/$b" 8; then pass "$what trains the bits of -z 0 (losses, norms, model file)"
    else fail "$what differs: $(compare_logs "$tmp/$a/log.csv" "$tmp/$b/log.csv" train_loss 1 8 0)"; fi
done

# 3. The sums beside the backward against after it.
run 2 "$tmp/two-bi" -b 4 -d 2048 -x 8 -n 0 --batch-invariant 2
for name in two two-z1 two-bi three-z1; do
    case $name in
        two) ranks=2 args=(-b 4 -d 2048) ;;
        two-z1) ranks=2 args=(-b 4 -d 2048 -z 1) ;;
        two-bi) ranks=2 args=(-b 4 -d 2048 --batch-invariant 2) ;;
        three-z1) ranks=3 args=(-b 2 -d 768 -z 1) ;;
    esac
    for at_wait in 0 1; do # each sum made as soon as it is queued, or only at the wait
        when=$([ $at_wait = 1 ] && echo "at the wait" || echo "at once")
        GRAD_SUMS_BESIDE_BACKWARD=1 TCP_SUMS_AT_WAIT=$at_wait run "$ranks" "$tmp/$name-beside$at_wait" "${args[@]}" -x 8 -n 0
        grep -q "ZeRO stage [01], gradients summed beside the backward$" "$tmp/$name-beside$at_wait.log" ||
            fail "$ranks ranks, ${args[*]}: the ranks' line does not say the sums are beside the backward: $(grep -m1 ' ranks (' "$tmp/$name-beside$at_wait.log")"
        if same_bits "$tmp/$name" "$tmp/$name-beside$at_wait" 8; then
            pass "$ranks ranks, ${args[*]}: the sums beside the backward, made $when, train the bits of the sums after it"
        else
            fail "$ranks ranks, ${args[*]}: the sums beside the backward, made $when, differ: $(compare_logs "$tmp/$name/log.csv" "$tmp/$name-beside$at_wait/log.csv" train_loss 1 8 0)"
        fi
    done
done

# 4. Resume on 2 ranks with -z 1: 4 steps (checkpoint at 4), then resumed to 8.
run 2 "$tmp/split" -b 4 -d 2048 -x 4 -n 4 -z 1
run 2 "$tmp/split" -b 4 -d 2048 -x 8 -n 4 -z 1 -y 1 --allow-change steps
if grep -q "resumed from .*state_00000004_00000.bin at step 4" "$tmp/split.log" && same_bits "$tmp/two-z1" "$tmp/split" 8; then
    pass "2 ranks (-z 1): 4 steps + resume + 4 train the bits of 8 straight"
else
    fail "2-rank resume differs: $(compare_logs "$tmp/two-z1/log.csv" "$tmp/split/log.csv" train_loss 1 8 0)"
fi
status=0
timeout 60 scripts/launch.sh 1 "$BUILD/train_gpt_cpu" "${COMMON[@]}" -o "$tmp/split" -b 4 -d 2048 -x 12 -z 1 -y 1 \
    --allow-change steps > "$tmp/wrong-world.log" 2>&1 || status=$?
if [ $status -ne 0 ] && grep -q "same number of GPUs" "$tmp/wrong-world.log"; then
    pass "a state of 2 ranks is refused on 1: $(grep -m1 error "$tmp/wrong-world.log")"
else
    fail "resume on 1 rank of a 2-rank state: exit $status, $(tail -2 "$tmp/wrong-world.log")"
fi

# 5. HellaSwag on 2 and 3 ranks against 1, from the model of 1. B 4 is one example's 4 endings.
hellaswag_examples_jsonl "$tmp/hs.jsonl"
"$BUILD/prepare_data" --vocab "$DATA/gpt2" --hellaswag "$tmp/hs.jsonl" -o "$tmp/hs.bin" > /dev/null
for n in 1 2 3; do
    run "$n" "$tmp/hs-$n" -e "$tmp/one/model_00000008.bin" -b 4 -x 0 --hellaswag "$tmp/hs.bin" --hellaswag-dump "$tmp/hs-$n.csv"
done
for n in 2 3; do
    # The ranks' files in rank order (rank 0 scores the first examples), under one header.
    { cat "$tmp/hs-$n.csv.rank0"; for ((r = 1; r < n; r++)); do tail -n +2 "$tmp/hs-$n.csv.rank$r"; done; } > "$tmp/hs-$n.csv"
    one=$(hellaswag_accuracy "$tmp/hs-1.log") mine=$(hellaswag_accuracy "$tmp/hs-$n.log")
    if cmp -s "$tmp/hs-1.csv" "$tmp/hs-$n.csv" && [ -n "$one" ] && [ "$one" = "$mine" ]; then
        pass "HellaSwag on $n ranks equals 1: the same scores of every ending ($(($(wc -l < "$tmp/hs-1.csv") - 1)) examples), $one"
    else
        fail "HellaSwag on $n ranks: $(hellaswag_dump_diff "$tmp/hs-1.csv" "$tmp/hs-$n.csv" || echo "other examples"); 1 rank: $one, $n ranks: $mine"
    fi
done

# 6. NaNs on the last rank only.
for z in 0 1; do
    d=$tmp/nan-z$z
    run 2 "$d" -b 4 -d 1024 -x 6 -n 1 -z $z -k constant --inject-nan-loss 3 --inject-nan-grad 5
    why=""
    [ "$(skipped_steps "$d")" = 3,5 ] || why="rank 0 logged skipped steps '$(skipped_steps "$d")' (want 3,5)"
    for step in 3 5; do
        cmp -s "$(model_file "$d" $((step - 1)))" "$(model_file "$d" $step)" || why="the weights changed in skipped step $step"
        cmp -s "$(model_file "$d" $step)" "$(model_file "$d" $((step + 1)))" && why="step $((step + 1)) did not train"
        for rank in 0 1; do
            same_state "$(state_file "$d" $((step - 1)) $rank)" "$(state_file "$d" $step $rank)" ||
                why="rank $rank's optimizer state changed in skipped step $step"
        done
    done
    if [ -z "$why" ]; then pass "2 ranks -z $z, NaNs on rank 1 only: both ranks skip steps 3 and 5, the model file and every rank's state unchanged across them"
    else fail "2 ranks -z $z, NaNs on rank 1 only: $why"; fi
done

# Ranks started without the launcher, as each node would start its own.
start_rank() { # start_rank RANK OUTDIR ARGS...: in the background, the trainer's pid in $!
    local r=$1 out=$2
    shift 2
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=${LOCAL_RANK:-$r} GPT_RUN_ID=fail$$ "$BUILD/train_gpt_cpu" "${COMMON[@]}" \
        -o "$out" "$@" > "$out.rank$r.log" 2>&1 &
}
# wait_at_most SECONDS PID: its exit status in $status, or 124 after killing it when it runs longer.
wait_at_most() {
    local end=$((SECONDS + $1))
    while kill -0 "$2" 2> /dev/null && [ $SECONDS -lt $end ]; do sleep 0.1; done
    kill -9 "$2" 2> /dev/null && { wait "$2" 2> /dev/null; status=124; return; }
    status=0
    wait "$2" || status=$?
}

# 7. Two hosts.
port=$(free_port)
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port
LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 start_rank 0 "$tmp/host0" -b 4 -d 2048 -x 8 -n 0
pid0=$!
LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 start_rank 1 "$tmp/host1" -b 4 -d 2048 -x 8 -n 0
wait_at_most 120 $!
status1=$status
wait_at_most 60 $pid0
unset MASTER_ADDR MASTER_PORT
files0=$(ls "$tmp/host0" | tr '\n' ' ') || true
files1=$(ls "$tmp/host1" | tr '\n' ' ') || true
if [ $status = 0 ] && [ $status1 = 0 ] && grep -q "^rendezvous: TCP 127.0.0.1:$port$" "$tmp/host0.rank0.log" &&
    same_bits "$tmp/two" "$tmp/host0" 8 && [ "$files0" = "lock_00000 log.csv model_00000008.bin run.conf state_00000008_00000.bin " ] &&
    [ "$files1" = "lock_00001 run.conf state_00000008_00001.bin " ]; then
    pass "2 hosts over the TCP rendezvous: the bits of the launcher's run; rank 0 wrote $files0, rank 1 $files1"
else
    fail "2 hosts: exit $status / $status1, $(grep -m1 "^rendezvous" "$tmp/host0.rank0.log"); rank 0 wrote $files0, rank 1 $files1; $(tail -n 2 "$tmp/host0.rank0.log" "$tmp/host1.rank1.log")"
fi

# 8. Failures.
start_rank 0 "$tmp/kill" -b 4 -x 100000 -n 0 --nccl-timeout 30
pid0=$!
start_rank 1 "$tmp/kill" -b 4 -x 100000 -n 0 --nccl-timeout 30
pid1=$!
disown $pid1 # killed below: no "Killed" line from the shell
for _ in $(seq 600); do [ "$(cat "$tmp/kill/log.csv" 2> /dev/null | wc -l)" -ge 3 ] && break; sleep 0.1; done
t0=$SECONDS
kill -9 $pid1
wait_at_most 60 $pid0
elapsed=$((SECONDS - t0))
if [ $status -ne 0 ] && [ $status -ne 124 ] && [ $elapsed -le 10 ] && grep -q "rank 0 of 2: .*rank 1 failed" "$tmp/kill.rank0.log"; then
    pass "rank 1 killed: rank 0 stopped after ${elapsed} s: $(grep -m1 error "$tmp/kill.rank0.log")"
else
    fail "rank 1 killed: rank 0 exit $status after ${elapsed} s: $(tail -3 "$tmp/kill.rank0.log")"
fi
t0=$SECONDS
start_rank 0 "$tmp/alone" -b 4 -x 10 -n 0 --nccl-timeout 3
wait_at_most 60 $!
elapsed=$((SECONDS - t0))
if [ $status -ne 0 ] && [ $status -ne 124 ] && [ $elapsed -le 30 ] && grep -q "rank 0 of 2: only 1 of 2 ranks joined .*rank 1 is missing" "$tmp/alone.rank0.log"; then
    pass "rank 1 never started: rank 0 gave up after ${elapsed} s: $(grep -m1 error "$tmp/alone.rank0.log")"
else
    fail "rank 1 never started: rank 0 exit $status after ${elapsed} s: $(tail -3 "$tmp/alone.rank0.log")"
fi

[ $failed = 0 ] && echo "test_ranks_cpu: all passed" || { echo "test_ranks_cpu: FAILED"; exit 1; }
