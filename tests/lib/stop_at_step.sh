# shellcheck shell=bash
# Sourced by the tests that stop a training early, once the steps their verdict needs are logged.

# stop_at_step PID LOG STEP [COMMAND...]: waits until the training PID, a child of this shell, has
# written a row after step STEP to LOG (its log.csv): then step STEP's row, validation included, is
# complete. Then kills it with SIGKILL, which stops it at once where SIGTERM would finish the step
# and save a checkpoint, and returns 0. Polls every 0.2 s and runs COMMAND at each poll (a sampler of
# what the run holds meanwhile). Returns 1 if the training ended before writing such a row. Either
# way the caller reaps it with wait.
stop_at_step() {
    local pid=$1 log=$2 step=$3
    shift 3
    while kill -0 "$pid" 2>/dev/null; do
        "$@"
        if awk -F, -v s="$step" 'NR > 1 && $1 + 0 > s { found = 1 } END { exit !found }' "$log" 2>/dev/null; then
            kill -9 "$pid" 2>/dev/null || true
            return 0
        fi
        sleep 0.2
    done
    return 1
}
