# shellcheck shell=bash
# Sourced by the tests that look at a run's files: their names, as the trainer writes them.

# model_file DIR STEP, state_file DIR STEP: the model file and rank 0's training state of step STEP in
# the output directory DIR
model_file() { printf '%s/model_%08d.bin' "$1" "$2"; }
state_file() { printf '%s/state_%08d_00000.bin' "$1" "$2"; }
