#!/usr/bin/env bash
# The MFU (model FLOPs utilisation) of train_gpt_cpu, on a small GPT-2 (2 layers, C 64, T 32). The
# CPU build has a peak only from --peak-tflops. The FLOPs of a token, 6N + 6LCT, are computed here
# from the model's sizes (tests/lib/mfu.sh: N from the GPT-2 layout, which the trainer's parameter
# count must equal too).
#  1. --peak-tflops F: the start-up line names 6N + 6LCT and F; every step line has 'MFU x.x%';
#     log.csv's last column, mfu, is 6N + 6LCT x tok_per_s / F (a fraction) within 1% on every
#     trained row, the step line's percentage agrees with it, and row 0 (the evaluation before
#     training) leaves it empty;
#  2. `peak-tflops F` in a config file does the same;
#  3. without it (or with 0, the built-in table's, which has no CPU): no MFU on any line, the column
#     in the header and empty on every row;
#  4. a resume into a log.csv written before the column (9 columns) keeps the earlier rows with an
#     empty mfu, every row with the header's 10 columns, and logs the MFU of the new steps; run.conf
#     records the peak, so a second resume without the option still has it;
#  5. a negative, infinite, too large or non-numeric --peak-tflops is refused naming the option (and
#     the config file's line), with exit status 1 and nothing written.
set -euo pipefail
BUILD=${BUILD:-.}
DATA=$(cd "${1:?usage: tests/e2e/test_mfu.sh DATA_DIR (the directory scripts/get_data.sh fills)}" && pwd)
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; exit 1; }
. tests/lib/mfu.sh
L=2 C=64 NH=4 MAXT=64 T=32 VP=50304
small=(--layers "$L" --channels "$C" --heads "$NH" --max-seq "$MAXT" -t "$T" -b 4 -s 0 -v 2 -m 1
       -i "$DATA/tinyshakespeare/tiny_shakespeare_train.bin" -j "$DATA/tinyshakespeare/tiny_shakespeare_val.bin")
N=$(gpt2_parameters $L $C $MAXT $VP)
FPT=$(gpt2_flops_per_token $L $C $MAXT $T $VP)
PEAK=1 # TFLOP/s: the CPU's MFU then reads a few percent

# check_log DIR PEAK FIRST: DIR's log.csv as check_mfu_log checks it
check_log() { check_mfu_log "$1/log.csv" "$FPT" "$2" "$3"; }

# 1. --peak-tflops on the command line
"$BUILD/train_gpt_cpu" "${small[@]}" -x 4 --peak-tflops $PEAK -o "$tmp/peak" > "$tmp/peak.out"
grep -q "^model: L $L, C $C, NH $NH, max T $MAXT, V 50257 (padded $VP), $N parameters" "$tmp/peak.out" ||
    fail "the trainer's parameter count is not this test's $N: $(grep '^model' "$tmp/peak.out")"
want="MFU: $(commas "$FPT") FLOPs per token (6N + 6LCT) against $PEAK TFLOP/s (--peak-tflops)"
grep -qxF "$want" "$tmp/peak.out" || fail "no line '$want': $(grep MFU "$tmp/peak.out" | head -n 3)"
[ "$(grep -c '^step .* | MFU [0-9]*\.[0-9]% | eta ' "$tmp/peak.out")" -eq 4 ] ||
    fail "not 4 step lines with MFU x.x%: $(grep '^step ' "$tmp/peak.out")"
r=$(check_log "$tmp/peak" $PEAK 1) || fail "--peak-tflops $PEAK: $r: $(cat "$tmp/peak/log.csv")"
# the step line's percentage against the row's fraction (the line rounds to 0.1)
paste -d' ' <(sed -n 's/^step *\([0-9]*\)\/4 .* | MFU \([0-9.]*\)% .*/\1 \2/p' "$tmp/peak.out") \
    <(awk -F, 'NR > 1 && $2 != "" { print $1, $NF }' "$tmp/peak/log.csv") |
    awk '{ n++; d = $2 - 100 * $4; if ($1 != $3 || d * d > 0.1 * 0.1) bad++ } END { exit !(n == 4 && !bad) }' ||
    fail "the step lines' MFU disagree with log.csv: $(grep '^step ' "$tmp/peak.out"), $(cat "$tmp/peak/log.csv")"
echo "PASS --peak-tflops $PEAK: 6N + 6LCT = $FPT named, mfu = 6N + 6LCT x tok_per_s / peak within 1% on every row ($(awk -F, 'NR == 3 { print $NF }' "$tmp/peak/log.csv") at step 2), the step lines agree"

# 2. from a config file
printf 'peak-tflops 0.5 # a slower card\n' > "$tmp/peak.conf"
"$BUILD/train_gpt_cpu" "${small[@]}" -x 2 -f "$tmp/peak.conf" -o "$tmp/conf" > "$tmp/conf.out"
grep -q "^MFU: .* against 0.5 TFLOP/s (--peak-tflops)$" "$tmp/conf.out" || fail "config file: $(grep MFU "$tmp/conf.out")"
r=$(check_log "$tmp/conf" 0.5 1) || fail "peak-tflops 0.5 in a config file: $r"
echo "PASS peak-tflops in a config file"

# 3. without a peak
for args in "" "--peak-tflops 0"; do
    # shellcheck disable=SC2086 # args: none, or an option and its value
    "$BUILD/train_gpt_cpu" "${small[@]}" -x 2 $args -o "$tmp/none" --overwrite > "$tmp/none.out"
    grep -q MFU "$tmp/none.out" && fail "'$args' on the CPU: $(grep MFU "$tmp/none.out")"
    r=$(check_log "$tmp/none" 1 0) || fail "'$args': $r: $(cat "$tmp/none/log.csv")"
done
echo "PASS without --peak-tflops (or with 0) the CPU prints no MFU and leaves the column empty"

# 4. a resume into an older log.csv (9 columns), with the peak given then recorded
"$BUILD/train_gpt_cpu" "${small[@]}" -x 3 -o "$tmp/resume" > /dev/null
cut -d, -f1-9 "$tmp/resume/log.csv" > "$tmp/old.csv"
cp "$tmp/old.csv" "$tmp/resume/log.csv"
"$BUILD/train_gpt_cpu" -y 1 -o "$tmp/resume" -x 5 --allow-change steps --peak-tflops $PEAK > "$tmp/resume.out"
r=$(check_log "$tmp/resume" $PEAK 4) || fail "resumed: $r: $(cat "$tmp/resume/log.csv")"
[ "$(head -n 5 "$tmp/resume/log.csv" | cut -d, -f1-9)" = "$(head -n 5 "$tmp/old.csv")" ] ||
    fail "the earlier rows changed: $(cat "$tmp/resume/log.csv")"
grep -qx "peak-tflops $PEAK" "$tmp/resume/run.conf" || fail "run.conf: $(cat "$tmp/resume/run.conf")"
"$BUILD/train_gpt_cpu" -y 1 -o "$tmp/resume" -x 6 --allow-change steps > "$tmp/resume2.out"
r=$(check_log "$tmp/resume" $PEAK 4) || fail "resumed again without --peak-tflops: $r: $(cat "$tmp/resume/log.csv")"
echo "PASS a resume into a 9-column log.csv: the earlier rows kept with an empty mfu, the new ones with theirs, the peak recorded in run.conf"

# 5. refused values
refused() { # refused WHERE WANT ARGS...: exit status 1, WANT in the message, no output directory
    local where=$1 want=$2 status=0
    shift 2
    "$BUILD/train_gpt_cpu" "${small[@]}" -x 1 -o "$tmp/refused" "$@" > "$tmp/refused.out" 2>&1 || status=$?
    if [ "$status" -ne 1 ] || ! grep -qF -- "$where" "$tmp/refused.out" || ! grep -qF -- "$want" "$tmp/refused.out"; then
        fail "$*: exit status $status, $(cat "$tmp/refused.out")"
    fi
    [ ! -e "$tmp/refused" ] || fail "$*: wrote $(ls "$tmp/refused")"
}
refused "--peak-tflops" "-1 is outside" --peak-tflops -1
refused "--peak-tflops" "'abc' is not a number" --peak-tflops abc
refused "--peak-tflops" "'' is not a number" --peak-tflops ""
refused "--peak-tflops" "'inf' is not a number" --peak-tflops inf
refused "--peak-tflops" "1e+07 is outside" --peak-tflops 1e7
printf 'peak-tflops -2\n' > "$tmp/bad.conf"
refused "peak-tflops in $tmp/bad.conf line 1" "-2 is outside" -f "$tmp/bad.conf"
echo "PASS negative, infinite, too large and non-numeric peaks refused, also from a config file"
