#!/usr/bin/env bash
# What train_gpt_cpu tells its user, on a small GPT-2 (2 layers, C 64, T 64) and tinyshakespeare:
#  1. --help names the program as it was started (its file name, without the directory);
#  2. start-up: the training and validation files with their token counts (tiktoken's split of
#     tinyshakespeare: 305,260 and 32,768 tokens), a glob with its shard count, a warning when -i is
#     given and -j is not (and none when both are), the schedule line;
#  3. Ctrl-C: the first one says at once that the run stops after this step and saves, and it does
#     (exit status 130, the checkpoint of that step); a second one quits without saving;
#  4. the closing summary against log.csv, computed here with awk: steps, tokens, tokens per second
#     over the steps' times, the last and the best validation loss and their steps, a skipped step
#     (an injected NaN loss), the newest model and state files, the log;
#  5. the ETA of step 5 of 16, with validation, samples and checkpoints every 4 steps, within 25% (and
#     a second for its rounding) of the time the run then took, in one of up to 3 runs.
set -euo pipefail
BUILD=${BUILD:-.}
DATA=$(cd "${1:?usage: tests/e2e/test_messages.sh DATA_DIR (the directory scripts/get_data.sh fills)}" && pwd)
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; exit 1; }
train_file=$DATA/tinyshakespeare/tiny_shakespeare_train.bin
val_file=$DATA/tinyshakespeare/tiny_shakespeare_val.bin
# wait_for PATTERN FILE: until a line of FILE matches, for at most 5 minutes
wait_for() {
    for ((i = 0; i < 6000; i++)); do grep -q "$1" "$2" 2>/dev/null && return 0; sleep 0.05; done
    fail "waited 5 minutes for '$1' in $2: $(tail -n 3 "$2")"
}
small=(--layers 2 --channels 64 --heads 4 --max-seq 64 -t 64 -b 4 -s 0)

# 1. the program's own name
cp "$BUILD/train_gpt_cpu" "$tmp/my_trainer"
"$tmp/my_trainer" --help > "$tmp/help.out"
[ "$(head -n 1 "$tmp/help.out")" = "usage: my_trainer [options]" ] || fail "--help: $(head -n 1 "$tmp/help.out")"
grep -q "a second Ctrl-C quits at once without saving" "$tmp/help.out" || fail "--help does not say what Ctrl-C does"
echo "PASS --help names the program and says what Ctrl-C does"

# 2. start-up lines; -x 0 builds the model and stops
"$BUILD/train_gpt_cpu" "${small[@]}" -x 0 -i "$train_file" -j "$val_file" -o "$tmp/start" > "$tmp/start.out"
grep -qx "train: $train_file, 305,260 tokens" "$tmp/start.out" || fail "no train line: $(head -n 3 "$tmp/start.out")"
grep -qx "val: $val_file, 32,768 tokens" "$tmp/start.out" || fail "no val line: $(head -n 3 "$tmp/start.out")"
grep -q "^warning" "$tmp/start.out" && fail "a warning with both -i and -j given: $(grep warning "$tmp/start.out")"
grep -q "^schedule: 0 tokens (0 epochs), lr 0.0003, warmup 0, then cosine" "$tmp/start.out" ||
    fail "no schedule line: $(grep schedule "$tmp/start.out")"
echo "PASS start-up: the files and their token counts, the schedule, no warning"
mkdir "$tmp/shards"
cp "$train_file" "$tmp/shards/a_train.bin"
cp "$train_file" "$tmp/shards/b_train.bin"
"$BUILD/train_gpt_cpu" "${small[@]}" -x 0 -i "$tmp/shards/*_train.bin" -o "$tmp/glob" > "$tmp/glob.out"
grep -qx "train: $tmp/shards/\*_train.bin (2 shards), 610,520 tokens" "$tmp/glob.out" ||
    fail "no glob line: $(head -n 3 "$tmp/glob.out")"
grep -q "^warning: -i is given but -j is not: the validation loss is measured on the default" "$tmp/glob.out" ||
    fail "no warning for -i without -j: $(head -n 4 "$tmp/glob.out")"
echo "PASS a glob with its shard count, and the warning for -i without -j"

# 3. Ctrl-C. Steps of 16 sequences, so that the signals arrive in the middle of one.
ctrl_c() { # ctrl_c NAME SIGNALS: runs in the background, sends SIGINT SIGNALS times during step 2
    local out=$tmp/$1.out
    "$BUILD/train_gpt_cpu" "${small[@]}" -d 4096 -v 0 -x 50 -i "$train_file" -o "$tmp/$1" > "$out" &
    local pid=$!
    wait_for "^step     1/50" "$out"
    kill -INT "$pid"
    wait_for "Ctrl-C: stopping" "$out"
    [ "$2" -eq 2 ] && kill -INT "$pid"
    status=0; wait "$pid" || status=$?
}
ctrl_c once 1
grep -qx "Ctrl-C: stopping after this step and saving; press Ctrl-C again to quit without saving" "$tmp/once.out" ||
    fail "the first Ctrl-C printed: $(tail -n 4 "$tmp/once.out")"
[ "$status" -eq 130 ] || fail "Ctrl-C: exit status $status, expected 130"
step=$(sed -n 's/^stopped by signal 2 after step \([0-9]*\).*/\1/p' "$tmp/once.out")
[ -n "$step" ] && [ -f "$tmp/once/state_$(printf %08d "$step")_00000.bin" ] ||
    fail "Ctrl-C: no checkpoint: $(ls "$tmp/once")"
echo "PASS Ctrl-C: the message at once, a checkpoint of step $step, exit status 130"
ctrl_c twice 2
[ "$status" -eq 130 ] || fail "a second Ctrl-C: exit status $status, expected 130"
ls "$tmp/twice" | grep -q '^state_' && fail "a second Ctrl-C saved a checkpoint: $(ls "$tmp/twice")"
grep -q "^stopped by signal" "$tmp/twice.out" && fail "a second Ctrl-C let the run finish its step"
echo "PASS a second Ctrl-C quits without saving"

# 4. the summary of 7 steps, validation every 2 (so the last one is off the cadence), step 3 skipped
"$BUILD/train_gpt_cpu" "${small[@]}" -x 7 -v 2 -m 1 -n 3 --inject-nan-loss 3 -l 1e-3 -o "$tmp/sum" > "$tmp/sum.out"
log=$tmp/sum/log.csv
line() { grep "^$1" "$tmp/sum.out" || fail "no line '$1' in: $(tail -n 8 "$tmp/sum.out")"; }
want=$(awk -F, 'NR > 1 && $2 != "" { n++ }
    END { printf "summary: %d steps (0 to %d) %d tokens in ", n, n, 256 * n }' "$log")
[ "$(line summary: | sed 's/ in .*/ in /' | tr -d ,)" = "$want" ] || fail "'$(line summary:)', want '$want...'"
rate=$(line summary: | sed -n 's/.*: \([0-9,]*\) tokens\/s over .*/\1/p' | tr -d ,)
awk -F, -v rate="$rate" 'NR > 1 && $2 != "" { n++; ms += $6 } END {
    want = 256 * n / (ms / 1000); exit !(rate > 0 && rate / want > 0.99 && rate / want < 1.01) }' "$log" ||
    fail "tokens/s $rate is not 1792 tokens over the sum of log.csv's ms"
want=$(awk -F, 'NR > 1 && $3 != "" { last = $3; at = $1; if (best == "" || $3 + 0 < best + 0) { best = $3; bat = $1 } }
    END { printf "validation loss: %s at step %d, the best %s at step %d", last, at, best, bat }' "$log")
[ "$(line "validation loss:")" = "$want" ] || fail "'$(line "validation loss:")', want '$want'"
[ "$(line "skipped steps:")" = "skipped steps: 1 of 7" ] || fail "'$(line "skipped steps:")', want 1 of 7"
[ "$(line "model file:")" = "model file: $tmp/sum/model_00000007.bin" ] || fail "$(line "model file:")"
[ "$(line "training state:")" = "training state: $tmp/sum/state_00000007_00000.bin" ] ||
    fail "$(line "training state:")"
[ "$(line "log:")" = "log: $log" ] || fail "$(line "log:")"
[ -f "$tmp/sum/model_00000007.bin" ] && [ -f "$tmp/sum/state_00000007_00000.bin" ] || fail "$(ls "$tmp/sum")"
echo "PASS the summary agrees with log.csv: $(line summary:)"

# 5. the ETA. Validations of 8 batches make evaluation a large part of the time, so an ETA of the
# steps alone would be far off. A prediction from the first steps is only as good as the machine is
# steady: other work starting or stopping beside the run (make -j, a CI host) moves it by more than
# 25%, so a miss is tried again, up to 3 runs; a wrong formula misses in every one.
stamp() { while IFS= read -r l; do echo "$EPOCHREALTIME $l"; done; } # each line with its time
eta_check() {
    rm -rf "$tmp/eta"
    "$BUILD/train_gpt_cpu" "${small[@]}" -d 1024 -x 16 -v 4 -m 8 -s 4 -g 16 -n 4 --vocab "$DATA/gpt2" -o "$tmp/eta" |
        stamp > "$tmp/eta.out"
    at5=$(grep -m 1 "^[0-9.]* step     5/16 " "$tmp/eta.out") || fail "no line of step 5: $(head -n 20 "$tmp/eta.out")"
    eta=$(sed -n 's/.* | eta \([0-9]*\)m\([0-9]*\)s.*/\1 \2/p' <<< "$at5")
    [ -n "$eta" ] || fail "no ETA in '$at5'"
    awk -v t5="${at5%% *}" -v end="$(tail -n 1 "$tmp/eta.out" | cut -d' ' -f1)" -v eta="$eta" -F, '
        NR > 1 && $1 >= 2 && $1 <= 5 && $2 != "" { ms += $6; n++ }
        END { split(eta, e, " "); predicted = 60 * e[1] + e[2]; actual = end - t5
              printf "ETA at step 5: %d s predicted, %.1f s taken (the steps alone: %.1f s)\n", predicted, actual,
                  ms / n * 11 / 1000
              d = predicted - actual; exit !(d * d <= (0.25 * actual + 1) ^ 2) }' "$tmp/eta/log.csv" >> "$tmp/eta.txt"
}
: > "$tmp/eta.txt"
eta_check || eta_check || eta_check || fail "3 runs: $(cat "$tmp/eta.txt")"
echo "PASS $(tail -n 1 "$tmp/eta.txt")$([ "$(wc -l < "$tmp/eta.txt")" -gt 1 ] && echo " (run $(wc -l < "$tmp/eta.txt") of 3)")"
