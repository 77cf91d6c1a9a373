#!/usr/bin/env bash
# scripts/launch.sh with tiny bash ranks: the variables every rank gets, the output prefixes, a
# failing rank's status and the stop of the others within the grace period, signals to the
# launcher, and bad arguments. Every launch runs under `timeout`, so a hang fails instead of blocking.
# shellcheck disable=SC2016 # the ranks' commands are in single quotes: each rank expands its own
set -u
cd "$(dirname "$0")/../.." || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
launch=scripts/launch.sh
passed=0
failed=0

check() { # check NAME CONDITION-STATUS DETAIL
    if [ "$2" -eq 0 ]; then passed=$((passed + 1)); echo "PASS $1"
    else failed=$((failed + 1)); echo "FAIL $1: $3"; fi
}

now_ms() { local t=${EPOCHREALTIME/./}; echo $((10#$t / 1000)); }

# Runs the launcher with stdout and stderr in $tmp/out and $tmp/err; sets status and elapsed (ms).
run_launch() {
    local t0
    t0=$(now_ms)
    timeout 20 "$launch" "$@" > "$tmp/out" 2> "$tmp/err"
    status=$?
    elapsed=$(($(now_ms) - t0))
}

# 1 if any process whose pid a rank wrote to $tmp/pid.* still exists.
leftovers() {
    local f
    for f in "$tmp"/pid.*; do
        [ -e "$f" ] && kill -0 "$(cat "$f")" 2> /dev/null && return 0
    done
    return 1
}

# ---- variables and prefixes --------------------------------------------------------------
export CUDA_VISIBLE_DEVICES=5,7
rank_cmd='echo "vars $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $CUDA_VISIBLE_DEVICES $GPT_RUN_ID"; echo "to stderr $RANK" >&2; printf "no newline $RANK"'
run_launch 3 bash -c "$rank_cmd"
check "3 ranks exit 0" "$status" "status $status, stderr: $(cat "$tmp/err")"
run_id=$(sed -n 's/^\[rank 0\] vars .* //p' "$tmp/out")
for r in 0 1 2; do
    grep -qxF "[rank $r] vars $r 3 $r 3 5,7 $run_id" "$tmp/out"
    check "rank $r: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, CUDA_VISIBLE_DEVICES, GPT_RUN_ID on stdout" $? "$(cat "$tmp/out")"
    grep -qxF "[rank $r] to stderr $r" "$tmp/err"
    check "rank $r: stderr prefixed on stderr" $? "$(cat "$tmp/err")"
    grep -qxF "[rank $r] no newline $r" "$tmp/out"
    check "rank $r: last line without newline prefixed" $? "$(cat "$tmp/out")"
done
lines=$(wc -l < "$tmp/out")
[ "$lines" -eq 6 ] && ! grep -q "to stderr" "$tmp/out" && ! grep -qv '^\[rank [0-2]\] ' "$tmp/out"
check "stdout holds only the 6 prefixed stdout lines" $? "$lines lines: $(cat "$tmp/out")"
[ -n "$run_id" ]
check "GPT_RUN_ID is set" $? "empty"
run_launch 1 bash -c 'echo "$GPT_RUN_ID"'
other_id=$(sed 's/^\[rank 0\] //' "$tmp/out")
[ -n "$other_id" ] && [ "$other_id" != "$run_id" ]
check "GPT_RUN_ID differs between launches" $? "'$run_id' then '$other_id'"

cores=$(nproc)
run_launch 2 bash -c 'echo "threads $OMP_NUM_THREADS"'
want=$((cores > 2 ? cores / 2 : 1))
grep -qxF "[rank 1] threads $want" "$tmp/out"
check "2 ranks on $cores cores: OMP_NUM_THREADS $want each" $? "$(cat "$tmp/out")"
OMP_NUM_THREADS=3 run_launch 2 bash -c 'echo "threads $OMP_NUM_THREADS"'
grep -qxF "[rank 0] threads 3" "$tmp/out"
check "OMP_NUM_THREADS set by the caller is kept" $? "$(cat "$tmp/out")"
run_launch 1 bash -c 'echo "threads ${OMP_NUM_THREADS-unset}"'
grep -qxF "[rank 0] threads ${OMP_NUM_THREADS-unset}" "$tmp/out"
check "1 rank: OMP_NUM_THREADS left as it was" $? "$(cat "$tmp/out")"

# ---- a failing rank stops the others -----------------------------------------------------
export LAUNCH_GRACE_SECONDS=2
run_launch 3 bash -c 'echo $$ > '"$tmp"'/pid.$RANK; if [ "$RANK" = 1 ]; then sleep 0.3; echo bye >&2; exit 7; fi; exec sleep 60'
[ "$status" -eq 7 ]
check "failing rank's status 7 propagates" $? "status $status"
grep -q "rank 1 exited with status 7" "$tmp/err" && grep -qxF "[rank 1] bye" "$tmp/err"
check "message names the failed rank" $? "$(cat "$tmp/err")"
[ "$elapsed" -lt 5000 ] && ! leftovers
check "sleeping ranks stopped by SIGTERM at once" $? "$elapsed ms, leftovers: $(leftovers && echo yes)"
rm -f "$tmp"/pid.*

# Ranks that ignore SIGTERM get SIGKILL after LAUNCH_GRACE_SECONDS.
run_launch 3 bash -c 'echo $$ > '"$tmp"'/pid.$RANK; if [ "$RANK" = 2 ]; then sleep 0.3; exit 4; fi; trap "" TERM; exec sleep 60'
[ "$status" -eq 4 ] && grep -q "sending SIGKILL" "$tmp/err"
check "ranks ignoring SIGTERM are killed" $? "status $status, stderr: $(cat "$tmp/err")"
[ "$elapsed" -ge 1900 ] && [ "$elapsed" -lt 6000 ] && ! leftovers
check "SIGKILL after the grace period of 2 s" $? "$elapsed ms, leftovers: $(leftovers && echo yes)"
rm -f "$tmp"/pid.*

# A rank killed by a signal is reported as such.
run_launch 2 bash -c 'if [ "$RANK" = 0 ]; then kill -SEGV $$; fi; exec sleep 60'
[ "$status" -eq 139 ] && grep -q "rank 0 was killed by signal SEGV" "$tmp/err"
check "rank killed by SIGSEGV: status 139 and message" $? "status $status, stderr: $(cat "$tmp/err")"

# ---- signals to the launcher -------------------------------------------------------------
# set -m: a background job of a script would otherwise start with SIGINT ignored.
set -m
timeout 20 "$launch" 2 bash -c 'echo $$ > '"$tmp"'/pid.$RANK; exec sleep 60' > "$tmp/out" 2> "$tmp/err" &
launcher=$!
sleep 0.5
t0=$(now_ms)
kill -TERM "$launcher"
wait "$launcher"
status=$?
elapsed=$(($(now_ms) - t0))
[ "$status" -eq 143 ] && [ "$elapsed" -lt 3000 ] && ! leftovers
check "SIGTERM to the launcher stops all ranks (status 143)" $? "status $status after $elapsed ms, leftovers: $(leftovers && echo yes)"
rm -f "$tmp"/pid.*

timeout 20 "$launch" 2 bash -c 'trap "echo rank \$RANK got SIGINT; exit 0" INT; sleep 60 & wait' > "$tmp/out" 2> "$tmp/err" &
launcher=$!
sleep 0.5
kill -INT "$launcher"
wait "$launcher"
status=$?
[ "$status" -eq 130 ] && grep -qxF "[rank 0] rank 0 got SIGINT" "$tmp/out" && grep -qxF "[rank 1] rank 1 got SIGINT" "$tmp/out"
check "SIGINT forwarded to every rank (status 130)" $? "status $status, stdout: $(cat "$tmp/out")"
set +m

# ---- bad arguments -----------------------------------------------------------------------
for n in 0 -1 abc "" 2.5 100000; do
    run_launch "$n" true
    [ "$status" -eq 2 ] && grep -q "usage" "$tmp/err"
    check "bad N '$n': usage and exit 2" $? "status $status, stderr: $(cat "$tmp/err")"
done
run_launch 2
[ "$status" -eq 2 ] && grep -q "usage" "$tmp/err"
check "no command: usage and exit 2" $? "status $status"
LAUNCH_GRACE_SECONDS=soon run_launch 2 true
[ "$status" -eq 2 ] && grep -q "LAUNCH_GRACE_SECONDS=soon" "$tmp/err"
check "bad LAUNCH_GRACE_SECONDS named" $? "status $status, stderr: $(cat "$tmp/err")"

echo "launch: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
