#!/usr/bin/env bash
# Dynamic loss scaling (--loss-scale dynamic) with train_gpt_cpu, on a small GPT (2 layers, C 64, T 64,
# B 4). FP32 arithmetic: every backward operation is linear in the gradient it starts from and the
# scale is a power of two, so without an overflow scaling changes no bit; --inject-nan-grad (a NaN
# gradient with a finite loss) stands for an overflow.
#  1. with --loss-scale-growth 2 (the scale doubles during the run) the losses, gradient norms, model
#     file and the training state's arrays equal those of --loss-scale 0; the step line shows the scale;
#  2. overflows at steps 3 and 4 are skipped with their reason, halve the scale twice and do not count
#     toward --max-skips 1: the run ends; the weights do not change in them, the steps after train;
#  3. a run checkpointed every 2 steps, with overflows and growth inside, resumed from a middle
#     checkpoint ends on the bits of the straight run (model file and training state, scale included);
#     resumed with scaling switched on or off (--allow-change loss-scale), the unscaled run's bits;
#  4. an overflow on every step halves the scale 16 times to 1; there the scale has collapsed and the
#     skips count: --max-skips 3 stops the run after step 19 with exit 1, naming the loss scale;
#  5. --loss-scale 7 and --loss-scale-growth 0 are refused with a message, nothing written.
set -euo pipefail
BUILD=${BUILD:-.}
DATA=$(cd "${1:?usage: tests/e2e/test_loss_scale.sh DATA_DIR (the directory scripts/get_data.sh fills)}" && pwd)
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; exit 1; }
train() { "$BUILD/train_gpt_cpu" --layers 2 --channels 64 --heads 4 --max-seq 64 -t 64 -b 4 --seed 7 \
    -i "$DATA/tinyshakespeare/tiny_shakespeare_train.bin" -j "$DATA/tinyshakespeare/tiny_shakespeare_val.bin" \
    -v 0 -s 0 -l 1e-3 -k constant "$@"; }
# shellcheck source=tests/lib/same_run.sh
. tests/lib/same_run.sh # and model_file, state_file
# the log without the timing columns (ms, tok_per_s)
log_values() { cut -d, -f1-5,8 "$1/log.csv"; }
skipped_steps() { awk -F, 'NR > 1 && $8 == 1 { printf "%s%s", sep, $1; sep = "," }' "$1/log.csv"; }
# The scale of a training state: header field 28 (checkpoints/train_state.c, docs/formats.md), the
# bits of a double.
state_scale() { python3 -c 'import struct, sys; print("%.17g" % struct.unpack_from("<d", open(sys.argv[1], "rb").read(), 8 * 28))' "$1"; }
state_field() { python3 -c 'import struct, sys; print(struct.unpack_from("<q", open(sys.argv[1], "rb").read(), 8 * int(sys.argv[2]))[0])' "$1" "$2"; }

# 1. the same bits with and without scaling
train -x 8 -o "$tmp/off" > "$tmp/off.out"
train -x 8 --loss-scale dynamic --loss-scale-growth 2 -o "$tmp/on" > "$tmp/on.out"
diff <(log_values "$tmp/off") <(log_values "$tmp/on") > "$tmp/diff" || { cat "$tmp/diff"; fail "scaled run: the log differs from the unscaled one"; }
cmp -s "$(model_file "$tmp/off" 8)" "$(model_file "$tmp/on" 8)" || fail "scaled run: the model file differs from the unscaled one"
# the states: the same from the step history on (the header holds the scale and the checksum)
cmp -s <(tail -c +513 "$(state_file "$tmp/off" 8)") <(tail -c +513 "$(state_file "$tmp/on" 8)") ||
    fail "scaled run: the training state's history or arrays differ from the unscaled one"
grep -q "^step *1/8 .* | scale 65536$" "$tmp/on.out" || fail "step 1 does not show scale 65536: $(grep '^step *1/' "$tmp/on.out")"
grep -q "^step *8/8 .* | scale 524288$" "$tmp/on.out" || fail "step 8 does not show scale 524288 (grown 3 times): $(grep '^step *8/' "$tmp/on.out")"
[ "$(state_scale "$(state_file "$tmp/on" 8)")" = 1048576 ] || fail "the state of step 8 holds scale $(state_scale "$(state_file "$tmp/on" 8)"), want 1048576"
grep -q "scale" "$tmp/off.out" && fail "--loss-scale 0 shows a scale"
echo "PASS --loss-scale dynamic (growing 65536 -> 1048576 in 8 steps) trains the bits of --loss-scale 0: losses, norms, model file, state arrays"

# 2. overflows are skipped, halve the scale, and do not stop the run
d=$tmp/overflow
train -x 8 -n 1 --loss-scale dynamic --loss-scale-growth 100 --max-skips 1 --inject-nan-grad 3,4 -o "$d" > "$tmp/overflow.out" 2>&1 ||
    { tail -n 3 "$tmp/overflow.out"; fail "2 overflows with --max-skips 1 stopped the run"; }
grep -q "^step *3/8 .* | scale 65536 | SKIPPED: gradient overflow at loss scale 65536: scale halved to 32768$" "$tmp/overflow.out" ||
    fail "step 3: $(grep '^step *3/' "$tmp/overflow.out")"
grep -q "^step *4/8 .* | scale 32768 | SKIPPED: gradient overflow at loss scale 32768: scale halved to 16384$" "$tmp/overflow.out" ||
    fail "step 4: $(grep '^step *4/' "$tmp/overflow.out")"
grep -q "^step *5/8 .* | scale 16384$" "$tmp/overflow.out" || fail "step 5: $(grep '^step *5/' "$tmp/overflow.out")"
[ "$(skipped_steps "$d")" = 3,4 ] || fail "log.csv marks steps '$(skipped_steps "$d")' skipped, want 3,4"
for s in 3 4; do
    cmp -s "$(model_file "$d" 2)" "$(model_file "$d" $s)" || fail "the weights changed in the overflow step $s"
done
cmp -s "$(model_file "$d" 4)" "$(model_file "$d" 5)" && fail "step 5 after the overflows did not train"
[ "$(tail -n 1 "$d/log.csv" | cut -d, -f1)" = 8 ] || fail "the run did not reach step 8"
echo "PASS overflows at steps 3 and 4: skipped (weights unchanged), scale 65536 -> 32768 -> 16384, not counted by --max-skips 1, the run ends"

# 3. resume from a middle checkpoint: the scale, its growth count and the overflow count carry over
# growth 2: 65536 for steps 1-2, 131072 for 3-4, the overflows at 4 and 5 halve it to 32768 for 6-7,
# 65536 for 8-9, 131072 for 10; the checkpoint of step 4 lies between the two overflows
args=(-x 10 -n 2 --loss-scale dynamic --loss-scale-growth 2 --max-skips 1 --inject-nan-grad 4,5)
train "${args[@]}" -o "$tmp/straight" > "$tmp/straight.out"
mkdir "$tmp/resumed"
cp "$tmp/straight"/{run.conf,model_00000004.bin,state_00000004_00000.bin} "$tmp/resumed/"
awk -F, 'NR == 1 || $1 <= 4' "$tmp/straight/log.csv" > "$tmp/resumed/log.csv"
train "${args[@]}" -y 1 -o "$tmp/resumed" > "$tmp/resumed.out" 2>&1 || { tail -n 3 "$tmp/resumed.out"; fail "resuming at step 4"; }
grep -q "resumed from .*state_00000004_00000.bin at step 4" "$tmp/resumed.out" || fail "did not resume at step 4"
[ "$(state_scale "$(state_file "$tmp/straight" 4)")" = 65536 ] || fail "the state of step 4 holds scale $(state_scale "$(state_file "$tmp/straight" 4)"), want 65536"
[ "$(state_field "$(state_file "$tmp/straight" 4)" 30)" = 1 ] || fail "the state of step 4 holds $(state_field "$(state_file "$tmp/straight" 4)" 30) overflow skips, want 1"
same_run "$tmp/straight" "$tmp/resumed" 10 "resumed from step 4 (inside an overflow streak, after growth) against the straight run" || exit 1
grep -q "^step *5/10 .* | scale 65536 | SKIPPED: gradient overflow" "$tmp/resumed.out" || fail "resumed step 5: $(grep '^step *5/' "$tmp/resumed.out")"
grep -q "^step *10/10 .* | scale 131072$" "$tmp/resumed.out" || fail "resumed step 10: $(grep '^step *10/' "$tmp/resumed.out")"

# 3b. scaling switched on or off at a resume (--allow-change loss-scale): on, the scale starts at
# 2^16; off, it is dropped; either way the bits of the unscaled run
train -x 8 -n 4 -o "$tmp/off4" > /dev/null
train -x 8 -n 4 --loss-scale dynamic -o "$tmp/on4" > /dev/null
for from in off4 on4; do
    to=$([ $from = off4 ] && echo dynamic || echo 0)
    r=$tmp/$from-to-$to
    mkdir "$r"
    cp "$tmp/$from"/{run.conf,model_00000004.bin,state_00000004_00000.bin} "$r/"
    awk -F, 'NR == 1 || $1 <= 4' "$tmp/$from/log.csv" > "$r/log.csv"
    train -x 8 -n 4 --loss-scale $to --allow-change loss-scale -y 1 -o "$r" > "$r.out" 2>&1 ||
        { tail -n 3 "$r.out"; fail "resuming the $from run with --loss-scale $to"; }
    cmp -s "$(model_file "$tmp/off4" 8)" "$(model_file "$r" 8)" &&
        cmp -s <(tail -c +513 "$(state_file "$tmp/off4" 8)") <(tail -c +513 "$(state_file "$r" 8)") ||
        fail "the $from run resumed with --loss-scale $to ends on other bits than the unscaled run"
    if [ $to = dynamic ]; then
        grep -q "^step *5/8 .* | scale 65536$" "$r.out" || fail "switched on: step 5: $(grep '^step *5/' "$r.out")"
    else
        grep -q "| scale" "$r.out" && fail "switched off: a step line shows a scale"
    fi
done
echo "PASS scaling switched on and off at a resume (--allow-change loss-scale): on from 65536, off dropped, the unscaled run's bits"

# 4. collapse: an overflow at scale 1 counts
d=$tmp/collapse
status=0
train -x 40 --loss-scale dynamic --max-skips 3 --inject-nan-grad 1-40 -o "$d" > "$tmp/collapse.out" 2>&1 || status=$?
[ "$status" -eq 1 ] || fail "overflows on every step: exit status $status, want 1: $(tail -n 2 "$tmp/collapse.out")"
grep -q "^step *16/40 .* | scale 2 | SKIPPED: gradient overflow at loss scale 2: scale halved to 1$" "$tmp/collapse.out" ||
    fail "step 16: $(grep '^step *16/' "$tmp/collapse.out")"
grep -q "^step *17/40 .* | scale 1 | SKIPPED: gradient overflow at loss scale 1: the loss scale has collapsed" "$tmp/collapse.out" ||
    fail "step 17: $(grep '^step *17/' "$tmp/collapse.out")"
[ "$(tail -n 1 "$d/log.csv" | cut -d, -f1)" = 19 ] || fail "the run stopped after step $(tail -n 1 "$d/log.csv" | cut -d, -f1), want 19"
grep -q "error: training diverged: steps 1..19 were all skipped (--max-skips 3)" "$tmp/collapse.out" ||
    fail "no clear message: $(tail -n 1 "$tmp/collapse.out")"
grep -q "the loss scale is 1 after step 19 (its floor), and 16 of the skips were overflows" "$tmp/collapse.out" ||
    fail "the message does not name the loss scale: $(tail -n 1 "$tmp/collapse.out")"
echo "PASS overflows on every step: the scale halves 16 times to 1, then 3 counted skips stop the run (exit 1) naming the loss scale"

# 5. bad values
for bad in "--loss-scale 7" "--loss-scale-growth 0"; do
    status=0
    # shellcheck disable=SC2086
    train -x 2 $bad -o "$tmp/bad" > "$tmp/bad.out" 2>&1 || status=$?
    [ "$status" -ne 0 ] && grep -q "^error: option ${bad%% *}" "$tmp/bad.out" ||
        fail "$bad: exit $status, $(tail -n 1 "$tmp/bad.out")"
    [ -e "$tmp/bad" ] && fail "$bad: wrote $tmp/bad"
done
echo "PASS --loss-scale 7 and --loss-scale-growth 0 refused with a message, nothing written"
