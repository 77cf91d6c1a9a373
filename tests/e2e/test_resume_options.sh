#!/usr/bin/env bash
# The options a run records in its output directory (run.conf), on a small GPT-2 (2 layers, C 64):
#  1. a run's checkpoint of step 3, resumed with -y 1 -o DIR alone, trains steps 4..6 bit for bit as
#     the straight run did (log.csv and the final model file): every option came from run.conf;
#  2. options that change the run (-x, -l, -b without --batch-invariant) given on resume with other
#     values are refused, naming each with its recorded value, and nothing is written; the same value
#     spelled otherwise (-l 0.001 for 1e-3) and options that change no bits (-v, -n, -r) are taken;
#  3. --allow-change steps extends -x: the learning rate from the resumed step on follows the cosine
#     over the new length (computed here), and run.conf records the new -x; an --allow-change entry
#     that names no option is refused.
set -euo pipefail
BUILD=${BUILD:-.}
DATA=$(cd "${1:?usage: tests/e2e/test_resume_options.sh DATA_DIR (the directory scripts/get_data.sh fills)}" && pwd)
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; exit 1; }
bin=$BUILD/train_gpt_cpu
"$bin" --layers 2 --channels 64 --heads 4 --max-seq 64 -t 64 -b 4 -x 6 -n 3 -l 1e-3 -u 1 -q 0.1 -v 2 -m 1 -s 0 \
    -i "$DATA/tinyshakespeare/tiny_shakespeare_train.bin" -j "$DATA/tinyshakespeare/tiny_shakespeare_val.bin" \
    -o "$tmp/straight" > /dev/null
# at_step_3 NAME: a copy of the straight run as it was after step 3 (its checkpoint of step 6 removed)
at_step_3() {
    cp -r "$tmp/straight" "$tmp/$1"
    rm "$tmp/$1/model_00000006.bin" "$tmp/$1/state_00000006_00000.bin"
}
losses() { cut -d, -f1-5 "$1/log.csv"; }

# 1. -y 1 -o DIR alone
at_step_3 alone
"$bin" -y 1 -o "$tmp/alone" > "$tmp/alone.out" || fail "-y 1 -o DIR alone: $(tail -n 2 "$tmp/alone.out")"
grep -qx "resuming with the options recorded in $tmp/alone/run.conf" "$tmp/alone.out" ||
    fail "$(head -n 2 "$tmp/alone.out")"
grep -q "resumed from .*state_00000003_00000.bin at step 3" "$tmp/alone.out" || fail "did not resume at step 3"
diff <(losses "$tmp/straight") <(losses "$tmp/alone") > "$tmp/diff" ||
    { cat "$tmp/diff"; fail "-y 1 -o DIR alone: log.csv differs"; }
cmp "$tmp/straight/model_00000006.bin" "$tmp/alone/model_00000006.bin" || fail "-y 1 -o DIR alone: the model differs"
echo "PASS -y 1 -o DIR alone resumes with the recorded options: steps 4..6 bit for bit"

# 2. refused, taken
at_step_3 refused
cp "$tmp/refused/log.csv" "$tmp/log.before"
status=0
"$bin" -y 1 -o "$tmp/refused" -x 8 -l 2e-3 -b 2 -v 1 > "$tmp/refused.out" 2>&1 || status=$?
[ "$status" -eq 1 ] || fail "changed -x, -l and -b: exit status $status, want 1"
for want in "-x 8 (recorded: 6)" "-l 0.002 (recorded: 0.001)" "-b 2 (recorded: 4)" "--allow-change batch,steps,lr"; do
    grep -qF -- "$want" "$tmp/refused.out" || fail "the refusal lacks '$want': $(cat "$tmp/refused.out")"
done
grep -q -- "-v" <(grep -o "changes options recorded in [^:]*: .*\. They" "$tmp/refused.out") &&
    fail "-v, which changes no bits, was refused: $(cat "$tmp/refused.out")"
cmp -s "$tmp/log.before" "$tmp/refused/log.csv" && [ ! -e "$tmp/refused/model_00000006.bin" ] ||
    fail "a refused resume wrote files: $(ls "$tmp/refused")"
echo "PASS refused, naming each: $(sed -n 's/.*run\.conf: \(.*\)\. They.*/\1/p' "$tmp/refused.out")"
"$bin" -y 1 -o "$tmp/refused" -l 0.001 -v 1 -n 1 -r 1 > "$tmp/taken.out" 2>&1 ||
    fail "-l 0.001 -v 1 -n 1 -r 1: $(tail -n 2 "$tmp/taken.out")"
diff <(cut -d, -f1,2,4,5 "$tmp/straight/log.csv") <(cut -d, -f1,2,4,5 "$tmp/refused/log.csv") > "$tmp/diff" ||
    { cat "$tmp/diff"; fail "-l 0.001 -v 1 -n 1 -r 1 changed the training"; }
[ -e "$tmp/refused/model_00000005.bin" ] || fail "-n 1 was not taken: $(ls "$tmp/refused")"
echo "PASS taken: -l 0.001 (the recorded 1e-3), -v 1, -n 1, -r 1; the same losses"

# 3. --allow-change steps
at_step_3 longer
"$bin" -y 1 -o "$tmp/longer" -x 8 --allow-change steps > "$tmp/longer.out" ||
    fail "--allow-change steps: $(tail -n 2 "$tmp/longer.out")"
note="--allow-change: -x is 8 from the resumed step on (6 in $tmp/longer/run.conf); the learning-rate schedule is"
grep -qF -- "$note recomputed" "$tmp/longer.out" || fail "no note of the change: $(head -n 2 "$tmp/longer.out")"
# The rate of step s (log.csv's row s) is the cosine at s - 1: warmup 1, from 1e-3 to 1e-4 over steps 1..8.
awk -F, 'NR > 1 && $4 != "" { s = $1 - 1; max = ($1 <= 3 ? 6 : 8); p = (s - 1) / (max - 1)
    want = (s < 1) ? 1e-3 : 1e-4 + 0.5 * 9e-4 * (1 + cos(3.14159265358979 * p))
    if ((($4 - want) / want) ^ 2 > 1e-10) { print "step " $1 ": lr " $4 ", want " want; bad = 1 } } END { exit bad }' \
    "$tmp/longer/log.csv" || fail "the learning rates do not follow the schedule of -x 6 then -x 8"
[ "$(tail -n 1 "$tmp/longer/log.csv" | cut -d, -f1)" = 8 ] || fail "the run did not go on to step 8"
grep -qx "steps 8" "$tmp/longer/run.conf" || fail "run.conf does not record -x 8: $(cat "$tmp/longer/run.conf")"
echo "PASS --allow-change steps: steps 4..8 on the cosine of -x 8, run.conf records it"
status=0
"$bin" -y 1 -o "$tmp/longer" --allow-change stepz > "$tmp/bad.out" 2>&1 || status=$?
[ "$status" -eq 1 ] && grep -q "option --allow-change: 'stepz' is not an option a run records" "$tmp/bad.out" ||
    fail "--allow-change stepz: exit $status, $(cat "$tmp/bad.out")"
echo "PASS --allow-change of an unknown name is refused"
