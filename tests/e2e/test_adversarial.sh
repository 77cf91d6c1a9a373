#!/usr/bin/env bash
# What an adversarial user tried (issue "a run owns its output directory"): each case below lost or
# silently corrupted work before, and must now end in a clean refusal or the right behaviour.
#  1. two runs in one -o: the second is refused at once, naming the directory and the first's pid;
#  2. a fresh run into a directory holding an earlier run is refused; --overwrite deletes the earlier
#     run, and --keep then counts only the new run's checkpoints;
#  3. one flipped bit in the saved weights or AdamW m: -y 1 names the file and the tensor and falls
#     back to the newest older checkpoint;
#  4. an inf in a weight or a NaN in AdamW v (with their checksums right): the same;
#  5. a vocab.bpe cut at a line boundary: refused by prepare_data and by train_gpt_cpu;
#  6. a NUL byte in a config file: refused naming the file and the line;
#  7. an empty text input to prepare_data: refused like an empty .jsonl, nothing written, no UBSan report;
#  8. a state whose step is beyond -x (1e15, or 20 with -x 10) is refused; one at -x is reported complete.
# Then a kill -9 loop (a few seconds): runs killed at random moments always leave a directory that a
# new run takes over (the lock dies with its holder) and resumes.
# Every case runs even when one fails; the exit status says whether all passed.
# Usage: tests/e2e/test_adversarial.sh DATA_DIR (the directory scripts/get_data.sh fills)
set -uo pipefail
BUILD=${BUILD:-.}
DATA=$(cd "${1:?usage: tests/e2e/test_adversarial.sh DATA_DIR (the directory scripts/get_data.sh fills)}" && pwd)
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2> /dev/null; done; rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
failed=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; failed=$((failed + 1)); }
# exec, so that a run started in the background with ( train ... ) & is the trainer's own pid
train() { exec "$BUILD/train_gpt_cpu" --layers 2 --heads 4 --channels 64 --max-seq 64 -b 4 -t 64 -s 0 -v 0 \
    -i "$DATA/tinyshakespeare/tiny_shakespeare_train.bin" "$@"; }
# run NAME COMMAND...: runs it, output in $tmp/NAME.out, exit status in $status
run() { local name=$1; shift; status=0; ("$@") > "$tmp/$name.out" 2>&1 || status=$?; }
has() { grep -qF -- "$2" "$tmp/$1.out"; } # has NAME TEXT: the output of run NAME holds TEXT
# refused NAME WHAT TEXT...: the run exited 1 and its output holds every TEXT
refused() {
    local name=$1 what=$2; shift 2
    local t
    for t in "$@"; do
        has "$name" "$t" || { fail "$what: exit $status, output lacks '$t': $(tail -n 3 "$tmp/$name.out")"; return; }
    done
    [ "$status" -eq 1 ] && pass "$what: $(grep -m1 'error' "$tmp/$name.out")" || fail "$what: exit status $status"
}
# shellcheck source=tests/lib/run_files.sh
. tests/lib/run_files.sh

# 1. two runs in one -o
d=$tmp/two
(train -x 200 -n 1 -o "$d") > "$tmp/first.out" 2>&1 &
first=$!
pids+=("$first")
for _ in $(seq 100); do [ -s "$d/lock_00000" ] && break; sleep 0.1; done
run second train -x 1 -n 1 --seed 2 -o "$d"
refused second "1. a second run in the same -o" "output directory $d is in use by another run (pid $first"
kill -9 "$first" 2> /dev/null; wait "$first" 2> /dev/null

# 2. a fresh run into a directory holding an earlier run
d=$tmp/earlier
run old train -x 2 -n 1 -o "$d"
run fresh train -x 1 -n 1 --keep 2 --seed 2 -o "$d"
refused fresh "2. a fresh run into an earlier run's directory" \
    "holds an earlier run (log.csv and checkpoints up to step 2)" "--overwrite"
run overwrite train -x 1 -n 1 --keep 2 --seed 2 -o "$d" --overwrite
if [ "$status" -eq 0 ] && [ "$(ls "$d" | grep -c '^state_')" -eq 1 ] && [ -f "$(state_file "$d" 1)" ] &&
    [ "$(wc -l < "$d/log.csv")" -eq 2 ]; then
    pass "2. --overwrite deletes the earlier run: only step 1's checkpoint and log row are left"
else
    fail "2. --overwrite (exit $status) left: $(ls "$d" | tr '\n' ' ')"
fi

# 3. and 4. a damaged latest checkpoint: named, set aside, the older one resumed. Steps 1 and 2 saved.
# damaged NUMBER WHAT EDIT... TEXT: the edit of step 2's state, then -y 1 -x 3
runs=0
damaged() {
    runs=$((runs + 1))
    local number=$1 what=$2 text=${*: -1} d=$tmp/damaged$runs
    run "make$number" train -x 2 -n 1 -o "$d"
    python3 tests/lib/state_file.py "$(state_file "$d" 2)" "${@:3:$#-3}"
    run "resume$number" train -x 3 --allow-change steps -y 1 -o "$d"
    if [ "$status" -eq 0 ] && has "resume$number" "$(state_file "$d" 2): $text" &&
        has "resume$number" "resumed from $(state_file "$d" 1) at step 1" && [ -f "$(state_file "$d" 2).corrupt" ] &&
        [ -f "$(state_file "$d" 3)" ]; then
        pass "$number. $what: $(grep -m1 warning "$tmp/resume$number.out")"
    else
        fail "$number. $what: exit $status: $(tail -n 4 "$tmp/resume$number.out")"
    fi
}
damaged 3 "one flipped bit in a weight" flip master 12345 "checksum mismatch in weight of tensor wte"
damaged 3 "one flipped bit in AdamW m" flip m -1 "checksum mismatch in AdamW m of tensor lnfb"
damaged 4 "an inf in a weight" put master -1 inf "a non-finite value in weight of tensor lnfb at index 63"
damaged 4 "a NaN in AdamW v" put v -70 nan "a non-finite value in AdamW v of tensor lnfw at index 58"

# 5. vocab.bpe cut at a line boundary
mkdir "$tmp/cut"
cp "$DATA/gpt2/encoder.json" "$tmp/cut/"
head -n 30000 "$DATA/gpt2/vocab.bpe" > "$tmp/cut/vocab.bpe"
printf 'Hello world, cut short.' > "$tmp/hello.txt"
run cut_prepare "$BUILD/prepare_data" --vocab "$tmp/cut" -o "$tmp/cut/x" "$tmp/hello.txt"
refused cut_prepare "5. prepare_data with a vocab.bpe cut short" \
    "$tmp/cut/vocab.bpe: 29999 merges, but none makes token"
run cut_train train -x 0 -e "$tmp/earlier/model_00000001.bin" --prompt "Hello" \
    --vocab "$tmp/cut" -o "$tmp/cut_out"
refused cut_train "5. train_gpt_cpu with a vocab.bpe cut short" "$tmp/cut/vocab.bpe: 29999 merges, but none makes token"

# 6. a NUL byte in a config file
printf 'layers 2\0foo bar\n' > "$tmp/nul1.conf"
run nul1 train -f "$tmp/nul1.conf" -x 0 -o "$tmp/nul1"
refused nul1 "6. a NUL byte inside an option line" "$tmp/nul1.conf line 1: a NUL byte"
printf 'seed 1\nlr 5e-4\0lr 1e-1\n' > "$tmp/nul2.conf"
run nul2 train -f "$tmp/nul2.conf" -x 0 -o "$tmp/nul2"
refused nul2 "6. a NUL byte hiding a second option" "$tmp/nul2.conf line 2: a NUL byte"

# 7. an empty text input, under UBSan where the sanitizer build exists
prep=$BUILD/prepare_data
[ -x "$BUILD/san/prepare_data" ] && prep=$BUILD/san/prepare_data
: > "$tmp/empty.txt"
: > "$tmp/empty.jsonl"
run empty_jsonl "$prep" --vocab "$DATA/gpt2" -o "$tmp/ej" "$tmp/empty.jsonl"
run empty_text "$prep" --vocab "$DATA/gpt2" -o "$tmp/et" "$tmp/empty.txt"
if has empty_text "Sanitizer" || has empty_text "runtime error"; then fail "7. empty text input: sanitizer report"
elif ls "$tmp"/et_* > /dev/null 2>&1; then fail "7. empty text input: wrote $(ls "$tmp"/et_*)"
else refused empty_text "7. an empty text input, like an empty .jsonl" "$(tail -n 1 "$tmp/empty_jsonl.out")"
fi

# 8. impossible steps: 1e15 (checksum right), 20 with -x 10; a run at its -x is complete
d=$tmp/steps
run steps train -x 2 -n 1 -o "$d"
run beyond train -x 1 --allow-change steps -y 1 -o "$d"
refused beyond "8. a checkpoint beyond -x" "$(state_file "$d" 2) is at step 2, beyond the run's 1 steps (-x)"
run complete train -x 2 -y 1 -o "$d"
if [ "$status" -eq 0 ] && has complete "already complete"; then
    pass "8. a run at its -x: $(grep -m1 complete "$tmp/complete.out")"
else
    fail "8. a run at its -x: exit $status, $(tail -n 2 "$tmp/complete.out")"
fi
python3 tests/lib/state_file.py "$(state_file "$d" 2)" set-step 1000000000000000
run absurd train -x 10 --allow-change steps -y 1 -o "$d"
refused absurd "8. a step of 1e15" "holds the impossible step 1000000000000000 (-x allows at most"

# kill -9 at random moments, for a few seconds, of runs resuming a checkpoint of step 1; then a new
# run takes the directory over and resumes the newest checkpoint
d=$tmp/kill
run kill_start train -x 1 -n 1 -o "$d"
end=$((SECONDS + 8))
kills=0
while [ "$SECONDS" -lt "$end" ]; do
    (train -x 1000 --allow-change steps -n 1 --keep 2 -y 1 -o "$d") > /dev/null 2>&1 &
    p=$!
    sleep "$((RANDOM % 3)).$((RANDOM % 10))"
    kill -9 "$p" 2> /dev/null && kills=$((kills + 1))
    wait "$p" 2> /dev/null
done
latest=$(ls "$d" | sed -n 's/^state_0*\([0-9][0-9]*\)_00000.bin$/\1/p' | sort -n | tail -n 1)
latest=${latest:-0}
run after_kill train -x $((latest + 1)) --allow-change steps -n 1 --keep 2 -y 1 -o "$d"
if [ "$status" -eq 0 ] && ! has after_kill "warning" && [ "$latest" -ge 1 ] &&
    [ -f "$(state_file "$d" $((latest + 1)))" ]; then
    pass "kill -9 $kills times: the lock died with each run; resumed from step $latest to $((latest + 1))"
else
    fail "after $kills kills -9: exit $status, $(tail -n 3 "$tmp/after_kill.out")"
fi

[ "$failed" -eq 0 ] && echo "all adversarial cases passed" || echo "$failed adversarial case(s) failed"
[ "$failed" -eq 0 ]
