# shellcheck shell=bash
# Sourced by the tests of bit-exact training (resume, offload): two runs that must be one.
# shellcheck source=tests/lib/run_files.sh
. "$(dirname "${BASH_SOURCE[0]}")/run_files.sh"

# same_run DIR_A DIR_B STEP WHAT: the two runs' log.csv rows with a train loss have the same step,
# train loss and gradient norm, and their model files and training states of step STEP are the same
# bytes. Prints PASS WHAT, or FAIL WHAT and the difference and returns 1.
same_run() {
    local a=$1 b=$2 step=$3 what=$4 diffs
    run_losses() { awk -F, 'NR > 1 && $2 != "" { print $1, $2, $5 }' "$1/log.csv"; } # step, loss, norm
    if ! diffs=$(diff <(run_losses "$a") <(run_losses "$b")); then
        echo "$diffs"; echo "FAIL $what: losses or gradient norms differ"; return 1
    fi
    cmp -s "$(model_file "$a" "$step")" "$(model_file "$b" "$step")" || { echo "FAIL $what: the model files of step $step differ"; return 1; }
    cmp -s "$(state_file "$a" "$step")" "$(state_file "$b" "$step")" || { echo "FAIL $what: the training states of step $step differ"; return 1; }
    echo "PASS $what: $(run_losses "$a" | wc -l) identical losses and norms, the same model file and training state at step $step"
}
