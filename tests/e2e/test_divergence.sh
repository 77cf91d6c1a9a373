#!/usr/bin/env bash
# The divergence guard of train_gpt_cpu (binaries of `make test-programs` in BUILD; DATA_DIR prepared
# by scripts/get_data.sh), on a small GPT (2 layers, C 64, T 64, B 4):
#  1. a NaN loss (step 3) and a NaN gradient (step 5), made by the testing options --inject-nan-*,
#     are skipped: the model file and the training state (history, master weights, AdamW m and v) of
#     the skipped step equal those of the step before, byte for byte; the steps after them train on;
#     the step line and log.csv's column `skipped` say so;
#  2. resuming from the checkpoint of the skipped step 5 continues the straight run bit for bit;
#  3. --max-skips 3 consecutive non-finite steps stop the run (exit 1, a message), write no new
#     checkpoint, set aside the one holding the weights that went bad, and -y 1 resumes from the last
#     good one; a run resumed inside a streak of skips stops where the straight run stops;
#  4. a run that diverges (a learning rate of 10 without clipping from step 11) with --keep 2 keeps
#     the last good checkpoint (step 10), and the issue's example run ends with no checkpoint;
#  5. a model file holding a non-finite weight is never loaded (the message names the tensor and index);
#  6. z-scores: 200 steps of tinyshakespeare whose batch of step 190 is replaced by one rare token
#     repeated: with --skip-loss-z 5 --skip-norm-z 5 only step 190 is skipped (no false alarm in the
#     199 normal steps); resumed from step 180, steps 181..200 and the final model are bit-identical
#     (the z-score history is in the training state); with --skip-norm-z alone the gradient norm's
#     z-score skips step 190 too.
set -euo pipefail
BUILD=${BUILD:-.}
DATA=$(cd "${1:?usage: tests/e2e/test_divergence.sh DATA_DIR (the directory scripts/get_data.sh fills)}" && pwd)
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; exit 1; }
train_bin=$DATA/tinyshakespeare/tiny_shakespeare_train.bin
train() { "$BUILD/train_gpt_cpu" --layers 2 --channels 64 --heads 4 --max-seq 64 -t 64 -b 4 --seed 7 \
    -j "$DATA/tinyshakespeare/tiny_shakespeare_val.bin" -v 0 -s 0 -l 1e-3 -k constant "$@"; }
# shellcheck source=tests/lib/run_files.sh
. tests/lib/run_files.sh
# the log without the timing columns (ms, tok_per_s)
log_values() { cut -d, -f1-5,8 "$1/log.csv"; }

# 1. skipped non-finite steps change nothing
d=$tmp/nan
train -i "$train_bin" -x 8 -n 1 --inject-nan-loss 3 --inject-nan-grad 5 -o "$d" > "$tmp/nan.out"
grep -q "^step *3/8 .*SKIPPED: the loss is nan" "$tmp/nan.out" || fail "step 3 not reported skipped: $(grep '^step *3/' "$tmp/nan.out")"
grep -q "^step *5/8 .*SKIPPED: the gradient norm is nan" "$tmp/nan.out" || fail "step 5 not reported skipped: $(grep '^step *5/' "$tmp/nan.out")"
[ "$(skipped_steps "$d")" = 3,5 ] || fail "log.csv marks steps '$(skipped_steps "$d")' skipped, want 3,5"
for s in 3 5; do
    cmp -s "$(model_file "$d" $((s - 1)))" "$(model_file "$d" $s)" || fail "the weights changed in skipped step $s"
    same_state "$(state_file "$d" $((s - 1)))" "$(state_file "$d" $s)" || fail "the optimizer state or history changed in skipped step $s"
    cmp -s "$(model_file "$d" $s)" "$(model_file "$d" $((s + 1)))" && fail "step $((s + 1)) after the skipped step did not train"
done
echo "PASS NaN loss (step 3) and NaN gradient (step 5) skipped: weights, AdamW state and history bit-identical across them; later steps train"

# 2. resume from the checkpoint of a skipped step
mkdir "$tmp/nan-resumed"
cp "$d/log.csv" "$(model_file "$d" 5)" "$(state_file "$d" 5)" "$tmp/nan-resumed/"
train -i "$train_bin" -x 8 -n 1 --inject-nan-loss 3 --inject-nan-grad 5 -y 1 -o "$tmp/nan-resumed" > "$tmp/nan-resumed.out"
grep -q "resumed from .*state_00000005_00000.bin at step 5" "$tmp/nan-resumed.out" || fail "did not resume at step 5"
diff <(log_values "$d") <(log_values "$tmp/nan-resumed") > "$tmp/diff" || { cat "$tmp/diff"; fail "resumed at the skipped step 5: the log differs"; }
cmp -s "$(model_file "$d" 8)" "$(model_file "$tmp/nan-resumed" 8)" || fail "resumed at the skipped step 5: the final weights differ"
echo "PASS resumed from the checkpoint of skipped step 5: steps 6..8 and the final weights bit-identical"

# 3. consecutive skips stop the run
d=$tmp/stop
status=0
train -i "$train_bin" -x 30 -n 2 --max-skips 3 --inject-nan-grad 4-30 -o "$d" > "$tmp/stop.out" 2>&1 || status=$?
[ "$status" -eq 1 ] || fail "3 skipped steps in a row: exit status $status, want 1: $(tail -n 2 "$tmp/stop.out")"
grep -q "error: training diverged: steps 4..6 were all skipped (--max-skips 3)" "$tmp/stop.out" ||
    fail "no clear message: $(tail -n 1 "$tmp/stop.out")"
[ "$(tail -n 1 "$d/log.csv" | cut -d, -f1)" = 6 ] || fail "the run went on after step 6"
[ -e "$(model_file "$d" 6)" ] || [ -e "$(state_file "$d" 6)" ] && fail "a checkpoint of step 6 was written"
[ -e "$(model_file "$d" 4).diverged" ] && [ -e "$(state_file "$d" 4).diverged" ] && [ ! -e "$(state_file "$d" 4)" ] ||
    fail "the checkpoint of step 4 (the weights of step 3) was not set aside: $(ls "$d")"
train -i "$train_bin" -x 4 -y 1 --allow-change steps -o "$d" > "$tmp/stop-resume.out"
grep -q "resumed from .*state_00000002_00000.bin at step 2" "$tmp/stop-resume.out" || fail "-y 1 did not resume from the last good checkpoint (2)"
echo "PASS 3 NaN steps in a row: exit 1 ($(grep -o 'error: training diverged: steps [0-9.]* were all skipped' "$tmp/stop.out")), no checkpoint written, step 4's set aside, -y 1 resumes from step 2"
d=$tmp/streak
train -i "$train_bin" -x 5 --max-skips 3 --inject-nan-grad 4-30 -o "$d" > /dev/null
status=0
train -i "$train_bin" -x 30 -y 1 --allow-change steps --max-skips 3 --inject-nan-grad 4-30 -o "$d" \
    > "$tmp/streak.out" 2>&1 || status=$?
[ "$status" -eq 1 ] && grep -q "steps 4..6 were all skipped" "$tmp/streak.out" ||
    fail "resumed inside a streak of skips: exit $status, $(tail -n 1 "$tmp/streak.out") (want a stop after step 6)"
echo "PASS resumed inside a streak of skips (at step 5): stops after step 6 like the straight run"

# 4. a diverging run keeps the last good checkpoint; the issue's example writes nothing
d=$tmp/keep
train -i "$train_bin" -x 10 -n 5 -o "$d" > /dev/null
good=$(md5sum < "$(model_file "$d" 10)")
status=0
train -i "$train_bin" -x 40 -n 1 --keep 2 -y 1 -l 10 --grad-clip 0 --allow-change x,l,grad-clip -o "$d" \
    > "$tmp/keep.out" 2>&1 || status=$?
[ "$status" -eq 1 ] && grep -q "error: training diverged" "$tmp/keep.out" || fail "lr 10 from step 11: exit $status, $(tail -n 1 "$tmp/keep.out")"
[ "$(md5sum < "$(model_file "$d" 10)")" = "$good" ] && [ -e "$(state_file "$d" 10)" ] || fail "--keep 2 lost the good checkpoint of step 10: $(ls "$d")"
newest=$(ls "$d" | sed -n 's/^\(model\|state\)_0*\([0-9]*\)\(_00000\)\{0,1\}\.bin$/\2/p' | sort -n | tail -n 1)
[ "$newest" = 10 ] || fail "a checkpoint of the diverged weights is left: step $newest ($(ls "$d"))"
train -i "$train_bin" -x 10 -y 1 --allow-change x,l,grad-clip -o "$d" > "$tmp/keep-resume.out"
grep -q "resumed from .*state_00000010_00000.bin" "$tmp/keep-resume.out" || fail "-y 1 did not resume from step 10"
echo "PASS lr 10 from step 11 with --keep 2: $(grep -c SKIPPED "$tmp/keep.out") steps skipped, stopped; step 10's checkpoint kept intact and resumed from"
d=$tmp/issue
status=0
"$BUILD/train_gpt_cpu" --layers 2 --channels 64 --heads 4 -t 64 -b 4 -x 40 -l 10 --grad-clip 0 -n 10 --keep 2 -s 0 \
    -i "$train_bin" -j "$DATA/tinyshakespeare/tiny_shakespeare_val.bin" -o "$d" > "$tmp/issue.out" 2>&1 || status=$?
[ "$status" -eq 1 ] && [ -z "$(ls "$d" | grep -v -e "^log.csv$" -e "^run.conf$" -e "^lock_")" ] || fail "the issue's example: exit $status, files $(ls "$d")"
echo "PASS the issue's example (lr 10, no clipping, -n 10 --keep 2): stopped after step $(tail -n 1 "$d/log.csv" | cut -d, -f1), no diverged checkpoint written"

# 5. a non-finite weight is never loaded: wpe[5] of a model file set to NaN, in our file (its checksum
# then fails) and in llm.c's layout (no checksums: slots 8..25 zero), and nothing is written
train -i "$train_bin" -x 0 -o "$tmp/init" > /dev/null
cp "$(model_file "$tmp/init" 0)" "$tmp/nan_model.bin"
wpe=$((1024 + 4 * (50304 * 64 + 5)))
printf '\x00\x00\xc0\x7f' | dd of="$tmp/nan_model.bin" bs=1 seek=$wpe conv=notrunc 2> /dev/null
cp "$tmp/nan_model.bin" "$tmp/nan_llmc.bin"
dd if=/dev/zero of="$tmp/nan_llmc.bin" bs=1 seek=32 count=72 conv=notrunc 2> /dev/null
for f in nan_model:"checksum mismatch in tensor wpe" nan_llmc:"a non-finite value in tensor wpe at index 5"; do
    status=0
    "$BUILD/train_gpt_cpu" -e "$tmp/${f%%:*}.bin" -t 64 -b 4 -x 0 -v 0 -s 0 -i "$train_bin" -o "$tmp/${f%%:*}" \
        > "$tmp/nan_save.out" 2>&1 || status=$?
    [ "$status" -eq 1 ] && grep -qF "${f%%:*}.bin: ${f#*:}" "$tmp/nan_save.out" ||
        fail "a NaN weight: exit $status, $(tail -n 1 "$tmp/nan_save.out")"
    [ ! -e "$tmp/${f%%:*}" ] || fail "files written despite the NaN weight: $(ls "$tmp/${f%%:*}")"
    echo "PASS a NaN weight is never loaded: $(grep error "$tmp/nan_save.out")"
done

# 6. z-scores. The batch of step 190 is tokens 189*256 .. 189*256+256: all 50000 (bytes 0x50 0xc3).
spiked=$tmp/spiked.bin
cp "$train_bin" "$spiked"
for _ in $(seq 257); do printf '\x50\xc3'; done | dd of="$spiked" bs=1 seek=$((1024 + 2 * 189 * 256)) conv=notrunc 2> /dev/null
z=(--skip-loss-z 5 --skip-norm-z 5)
d=$tmp/z
train -i "$spiked" -x 200 -n 180 "${z[@]}" -o "$d" > "$tmp/z.out"
[ "$(skipped_steps "$d")" = 190 ] || fail "z-scores: skipped steps '$(skipped_steps "$d")', want 190 only: $(grep SKIPPED "$tmp/z.out")"
grep -q "^step *190/200 .*SKIPPED: the loss z-score .* is above --skip-loss-z 5" "$tmp/z.out" || fail "step 190: $(grep '^step *190/' "$tmp/z.out")"
grep -q "^step *128/200 .*| z window 127/128" "$tmp/z.out" && grep -q "^step *129/200 .*| z loss" "$tmp/z.out" ||
    fail "the z-scores do not start once the 128-step window is full"
worst=$(grep '| z loss' "$tmp/z.out" | grep -v SKIPPED | sed 's/.*| z loss \([-0-9.]*\) norm \([-0-9.]*\).*/\1\n\2/' | sort -g | tail -n 1)
echo "PASS z-scores: of 200 steps only the spike (step 190: $(grep -o 'z loss [-0-9.]* norm [-0-9.]*' <<< "$(grep '^step *190/' "$tmp/z.out")")) skipped; largest z-score of the other steps $worst"
mkdir "$tmp/z-resumed"
cp "$d/log.csv" "$(model_file "$d" 180)" "$(state_file "$d" 180)" "$tmp/z-resumed/"
train -i "$spiked" -x 200 -n 180 -y 1 "${z[@]}" -o "$tmp/z-resumed" > /dev/null
diff <(log_values "$d") <(log_values "$tmp/z-resumed") > "$tmp/diff" || { cat "$tmp/diff"; fail "resumed at step 180: the log differs"; }
cmp -s "$(model_file "$d" 200)" "$(model_file "$tmp/z-resumed" 200)" || fail "resumed at step 180: the final weights differ"
echo "PASS resumed at step 180: steps 181..200 (the z-skip of step 190 included) and the final weights bit-identical"
mkdir "$tmp/z-norm"
cp "$(state_file "$d" 180)" "$tmp/z-norm/"
train -i "$spiked" -x 191 -y 1 --skip-norm-z 5 -o "$tmp/z-norm" > "$tmp/z-norm.out"
grep -q "^step *190/191 .*SKIPPED: the gradient norm z-score .* is above --skip-norm-z 5" "$tmp/z-norm.out" ||
    fail "--skip-norm-z alone: $(grep '^step *190/' "$tmp/z-norm.out")"
[ "$(skipped_steps "$tmp/z-norm")" = 190 ] || fail "--skip-norm-z alone skipped steps '$(skipped_steps "$tmp/z-norm")', want 190"
echo "PASS --skip-norm-z alone skips step 190 by the gradient norm's z-score"
