#!/usr/bin/env bash
# Starts N local ranks of a command, one process per GPU, as torchrun would:
#     scripts/launch.sh N CMD ARGS...        e.g.  scripts/launch.sh 8 ./train_gpt -i ... -o out
# Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and GPT_RUN_ID (one value per
# launch, which names rank 0's id file so that a file of an earlier run is never read); it uses GPU
# LOCAL_RANK among those CUDA_VISIBLE_DEVICES shows, which is left as it is. Unless OMP_NUM_THREADS
# is set, N ranks get nproc / N OpenMP threads each (at least 1). Every line a rank prints starts
# with "[rank R] " (stdout to stdout, stderr to stderr). SIGINT and SIGTERM go to all ranks. When a
# rank fails, the others get SIGTERM, then SIGKILL after LAUNCH_GRACE_SECONDS (default 30), and the
# launcher exits with the failed rank's status.
#
# The ranks meet through a file in the output directory (or --nccl-dir), unless MASTER_ADDR and
# MASTER_PORT are set in the environment: then over TCP (docs/several-gpus.md).
#
# Several nodes: not this script (its ranks are those of one machine). With Slurm no launcher is
# needed; srun starts one task per GPU and train_gpt reads SLURM_PROCID / SLURM_NTASKS /
# SLURM_LOCALID itself. With MASTER_ADDR (rank 0's node) and MASTER_PORT exported the ranks meet
# over TCP, and the output directory may be each node's own; without them it must be on a file
# system that all nodes share, since rank 0 then hands its id over through a file there:
#     #SBATCH --nodes=4 --ntasks-per-node=8 --gpus-per-node=8
#     export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
#     export MASTER_PORT=$((20000 + SLURM_JOB_ID % 12000))   # below the ephemeral ports (docs/several-gpus.md)
#     srun ./train_gpt -i "data/fineweb_train_*.bin" -j data/fineweb_val_000000.bin -o runs/gpt2_d12
set -u

usage() {
    echo "usage: $0 N CMD [ARGS...]   (N: number of local ranks, a positive integer)" >&2
    exit 2
}
[ $# -ge 2 ] || usage
nranks=$1
shift
[[ $nranks =~ ^0*[1-9][0-9]{0,3}$ ]] || usage # 1 to 9999
nranks=$((10#$nranks))
grace=${LAUNCH_GRACE_SECONDS:-30}
if ! [[ $grace =~ ^[0-9]+$ ]]; then
    echo "$0: LAUNCH_GRACE_SECONDS=$grace is not a number of seconds" >&2
    exit 2
fi

# Job control puts each rank in its own process group, so a signal reaches a rank and all of its
# children, and background ranks do not start with SIGINT ignored.
set -m

# Copies lines with the rank's prefix (a last line without a newline gets one). The prefixers
# ignore SIGINT and SIGTERM, so they keep printing what a rank writes while it shuts down; each
# ends when its rank's end of the pipe closes.
prefix() {
    trap '' INT TERM
    local line
    while IFS= read -r line || [ -n "$line" ]; do printf '[rank %s] %s\n' "$1" "$line"; done
}

pids=()       # rank -> pid (also its process group), while it runs
prefixers=()
signal=""        # the signal that asked the launcher to stop, if any
failed_rank=""   # the first rank that failed, and its status
failed_status=0
deadline=""      # when ranks still running get SIGKILL

# Sends a signal to every rank still running and starts the grace period.
stop_ranks() {
    local r
    for r in "${!pids[@]}"; do kill "-$1" -- "-${pids[r]}" 2> /dev/null; done
    [ -n "$deadline" ] || deadline=$((SECONDS + grace))
}
trap 'signal=INT; stop_ranks INT' INT
trap 'signal=TERM; stop_ranks TERM' TERM

GPT_RUN_ID=$(date +%Y%m%d-%H%M%S)-$$-$RANDOM
export WORLD_SIZE=$nranks LOCAL_WORLD_SIZE=$nranks GPT_RUN_ID
# Each rank's share of the cores for OpenMP (train_gpt_cpu's kernels), unless OMP_NUM_THREADS is set:
# N ranks of every core each would crowd them.
if [ -z "${OMP_NUM_THREADS:-}" ] && [ "$nranks" -gt 1 ]; then
    cores=$(nproc)
    export OMP_NUM_THREADS=$((cores > nranks ? cores / nranks : 1))
fi
for ((r = 0; r < nranks; r++)); do
    [ -z "$signal" ] || break # stopped while starting: start no more
    exec {out}> >(prefix "$r")
    prefixers+=($!)
    exec {err}> >(prefix "$r" >&2)
    prefixers+=($!)
    RANK=$r LOCAL_RANK=$r "$@" >&"$out" 2>&"$err" {out}>&- {err}>&- &
    pids[r]=$!
    exec {out}>&- {err}>&-
done
groups=("${pids[@]}")
# bash reports a killed background job on stderr with its whole command line, a confusing extra
# line: from here on the launcher's own messages go to $log and bash's notices are dropped.
exec {log}>&2 2> /dev/null

while [ ${#pids[@]} -gt 0 ]; do
    running=" $(jobs -pr | tr '\n' ' ') "
    for r in "${!pids[@]}"; do
        [[ $running == *" ${pids[r]} "* ]] && continue
        wait "${pids[r]}"
        status=$?
        unset "pids[r]"
        if [ "$status" -ne 0 ] && [ -z "$failed_rank$signal" ]; then
            failed_rank=$r
            failed_status=$status
            if [ "$status" -gt 128 ]; then how="was killed by signal $(kill -l "$status")"
            else how="exited with status $status"; fi
            echo "launch.sh: rank $r $how; stopping the other ranks" >&"$log"
            stop_ranks TERM
        fi
    done
    if [ -n "$deadline" ] && [ ${#pids[@]} -gt 0 ] && [ "$SECONDS" -gt "$deadline" ]; then
        echo "launch.sh: ranks ${!pids[*]} still running ${grace} s after being asked to stop; sending SIGKILL" >&"$log"
        stop_ranks KILL
        deadline=$((SECONDS + grace)) # in case one is stuck in the kernel
    fi
    sleep 0.1
done
# A process a rank left behind in its group would keep the rank's output pipe open for ever.
for pid in "${groups[@]}"; do kill -KILL -- "-$pid"; done
wait "${prefixers[@]}" # for the last lines of every rank

if [ -n "$signal" ]; then exit $((128 + $(kill -l "$signal"))); fi
exit "$failed_status"
