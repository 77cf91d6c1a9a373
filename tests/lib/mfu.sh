# shellcheck shell=bash
# Sourced by the tests of the MFU (tests/e2e/test_mfu.sh, tests/gpu/test_gpu_model.sh): the training
# FLOPs of a token computed from a GPT-2's sizes, and the check of log.csv's mfu column.

# gpt2_parameters L C MAXT VP: the parameters of GPT-2's layout: wte (VP x C), wpe (MAXT x C), per
# block 12C^2 + 13C (two layernorms 4C, qkv 3C^2 + 3C, projection C^2 + C, fc 4C^2 + 4C, fc
# projection 4C^2 + C), the final layernorm 2C.
gpt2_parameters() { echo $(($4 * $2 + $3 * $2 + $1 * (12 * $2 * $2 + 13 * $2) + 2 * $2)); }

# gpt2_flops_per_token L C MAXT T VP: 6N + 6LCT, forward and backward of every parameter and causal
# attention at sequence length T.
gpt2_flops_per_token() { echo $((6 * $(gpt2_parameters "$1" "$2" "$3" "$5") + 6 * $1 * $2 * $4)); }

# commas N: N with a comma between thousands, as the trainer prints counts.
commas() { local n=$1 out=""; while [ ${#n} -gt 3 ]; do out=",${n: -3}$out"; n=${n:0:${#n}-3}; done; echo "$n$out"; }

# check_mfu_log LOG FLOPS_PER_TOKEN PEAK_TFLOPS FIRST: the rows of LOG (a log.csv of one GPU) from
# step FIRST on have mfu = FLOPS_PER_TOKEN x tok_per_s / PEAK within 1%, and there is such a row; the
# rows before FIRST (all of them when FIRST is 0) and row 0 (no training) have an empty one; every row
# has the header's columns, mfu the last. Prints what is wrong; returns 1 then.
check_mfu_log() {
    awk -F, -v fpt="$2" -v peak="$3" -v first="$4" '
        NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; columns = NF; if ($NF != "mfu") { print "header: " $0; bad++ }; next }
        NF != columns { printf "row %s has %d columns, the header %d\n", $1, NF, columns; bad++ }
        first == 0 || $1 < first || $(c["train_loss"]) == "" {
            if ($(c["mfu"]) != "") { printf "step %s: mfu %s where none is due\n", $1, $(c["mfu"]); bad++ }; next }
        { n++; want = fpt * $(c["tok_per_s"]) / (peak * 1e12); got = $(c["mfu"])
          if (got == "" || (got - want) ^ 2 > (0.01 * want) ^ 2) { printf "step %s: mfu %s, want %.4g\n", $1, got, want; bad++ } }
        END { if (first > 0 && n == 0) { print "no row with an MFU"; bad++ }; exit bad > 0 }' "$1"
}
