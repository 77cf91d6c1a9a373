# shellcheck shell=bash
# Sourced by the tests that look at a run's files: their names, as the trainer writes them.

# model_file DIR STEP, state_file DIR STEP [RANK]: the model file and the training state of rank RANK
# (default 0) of step STEP in the output directory DIR
model_file() { printf '%s/model_%08d.bin' "$1" "$2"; }
state_file() { printf '%s/state_%08d_%05d.bin' "$1" "$2" "${3:-0}"; }
# same_state A B: two training states equal from byte 513 on (all but the 512-byte header: step, data
# position, ...)
same_state() { cmp -s <(tail -c +513 "$1") <(tail -c +513 "$2"); }
# same_bits DIR_A DIR_B STEP: two runs with the same steps, losses and gradient norms, bit for bit
# (same_columns, from tests/lib/log_compare.sh, which the caller sources too), and the same model file
# of step STEP
same_bits() { same_columns "$1" "$2" && cmp -s "$(model_file "$1" "$3")" "$(model_file "$2" "$3")"; }
# skipped_steps DIR: the steps log.csv marks skipped, as "3,5"
skipped_steps() { awk -F, 'NR > 1 && $8 == 1 { printf "%s%s", sep, $1; sep = "," }' "$1/log.csv"; }
