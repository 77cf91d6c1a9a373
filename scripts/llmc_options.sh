# shellcheck shell=bash
# Sourced by bench_train.sh and trace_step.sh: how both run llm.c's trainer, a train_gpt2cu built from
# karpathy/llm.c (`make train_gpt2cu USE_CUDNN=1` in a clone of it; nothing of llm.c is in this
# repository), on the model from scratch, data, steps and schedule of our runs: llm.c's defaults are
# ours (LR 3e-4 constant, no warmup or weight decay, clipping at 1). LLMC_ARGS adds options (e.g.
# "-ge 2", its GELU fused into the fc product). llm.c's loader wants B T + 1 tokens even of a
# validation file it never reads, more than tinyshakespeare's has, and -v 0 would divide by zero: so
# the training file stands in, with -v past the last step and -m 0 batches. Run it in a scratch
# folder, where it looks for its tokenizer and HellaSwag files (and finds none: no sampling, no eval).

# set_llmc_options MODEL B T R STEPS TRAIN_FILE OUT: sets the array llmc_options to train_gpt2cu's
# options for MODEL (-e), B x T tokens a step in one micro-batch, recompute level R, STEPS steps on
# TRAIN_FILE, its logs and checkpoints in OUT.
set_llmc_options() {
    # shellcheck disable=SC2034,SC2206 # the caller reads llmc_options; LLMC_ARGS: options, split on purpose
    llmc_options=(-e "$1" -i "$6" -j "$6" -o "$7" -b "$2" -t "$3" -d $(($2 * $3)) -r "$4" -z 0 -x "$5"
        -v 1000000 -m 0 -s 0 -n 0 -h 0 ${LLMC_ARGS:-})
}
