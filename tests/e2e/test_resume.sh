#!/usr/bin/env bash
# Bit-exact resume of train_gpt_cpu:
#  1. 20 steps straight == 10 steps + checkpoint + resume + 10 steps (same losses, same final weights);
#  2. the same after a SIGTERM in the middle of a run (cosine schedule, shuffled data, validation);
#  3. a kill -9 at random moments of a run that checkpoints every step always leaves a state that
#     resumes.
set -euo pipefail
BUILD=${BUILD:-.}
DATA=$(cd "${1:?usage: tests/e2e/test_resume.sh DATA_DIR (the directory scripts/get_data.sh fills)}" && pwd)
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; exit 1; }
# exec, so that a run started in the background with ( train ... ) & is the trainer's own pid
train() { exec "$BUILD/train_gpt_cpu" --layers 2 --channels 64 --heads 4 --max-seq 64 -t 64 -b 4 --seed 3 \
    -i "$DATA/tinyshakespeare/tiny_shakespeare_train.bin" -j "$DATA/tinyshakespeare/tiny_shakespeare_val.bin" \
    -s 0 -l 1e-3 "$@"; }
# shellcheck source=tests/lib/same_run.sh
. tests/lib/same_run.sh

# 1. constant LR so that a run of 10 steps has the same schedule as the first half of 20
(train -k constant -v 0 -x 20 -o "$tmp/straight") > /dev/null
(train -k constant -v 0 -x 10 -o "$tmp/split") > /dev/null
(train -k constant -v 0 -x 20 -y 1 --allow-change steps -o "$tmp/split") > "$tmp/split.out"
grep -q "resumed from .*state_00000010_00000.bin at step 10" "$tmp/split.out" || fail "did not resume at step 10"
same_run "$tmp/straight" "$tmp/split" 20 "10 + resume + 10 steps" || exit 1

# 2. SIGTERM in the middle; cosine schedule, shuffle and validation every 4 steps
opts=(-k cosine -u 3 -q 0.1 --shuffle 1 -v 4 -m 2 -x 20)
(train "${opts[@]}" -o "$tmp/straight2") > /dev/null
(train "${opts[@]}" -o "$tmp/term") > "$tmp/term.out" &
pid=$!
while [ "$(cat "$tmp/term/log.csv" 2>/dev/null | wc -l)" -lt 8 ]; do sleep 0.05; done
kill -TERM "$pid"
status=0; wait "$pid" || status=$?
[ "$status" -eq 143 ] || fail "SIGTERM: exit status $status, expected 143"
step=$(sed -n 's/^stopped by signal 15 after step \([0-9]*\).*/\1/p' "$tmp/term.out")
[ -n "$step" ] && [ "$step" -lt 20 ] || fail "SIGTERM: no checkpoint before the end (step '$step')"
echo "PASS SIGTERM after step $step: checkpoint written, exit status 143"
(train "${opts[@]}" -y 1 -o "$tmp/term") > /dev/null
same_run "$tmp/straight2" "$tmp/term" 20 "SIGTERM at step $step + resume" || exit 1

# 3. kill -9 at random moments while checkpointing every step
rm -rf "$tmp/kill"
for delay in 0.7 1.1 1.6 2.2 2.9; do
    (train -v 0 -x 40 -n 1 --keep 2 -y 1 -o "$tmp/kill") > /dev/null &
    pid=$!
    sleep "$delay"
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
done
(train -v 0 -x 40 -n 1 --keep 2 -y 1 -o "$tmp/kill") > "$tmp/kill.out" || fail "resume after kill -9 failed: $(tail -n 3 "$tmp/kill.out")"
n=$(ls "$tmp/kill" | grep -c '^state_')
[ "$n" -le 2 ] || fail "--keep 2 left $n state files (temporary ones included): $(ls "$tmp/kill")"
echo "PASS kill -9 during checkpointing: always resumable ($(grep -c resumed "$tmp/kill.out") resume), $n state files kept"
