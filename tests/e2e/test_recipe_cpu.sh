#!/usr/bin/env bash
# The CPU recipe end to end against its committed reference curve and envelope (recipes/ci-tiny.conf,
# recipes/reference/ci-tiny.csv and ci-tiny.envelope.csv, made by train_gpt_cpu) with
# scripts/compare_curves.py: the recipe with another thread count and micro-batch than the
# reference's passes (IDENTICAL or REPRODUCED); a learning rate 1.5 times the recipe's, and weight
# decay 0, FAIL in the first window; a run that stops early FAILs naming the first missing step; an
# envelope of other recipe settings, or one that lacks steps, is refused naming both files; without an
# envelope the recipe's fixed tolerances judge, say so, pass the other threads and B and fail the
# wrong learning rate; unreadable inputs give exit status 2. write_envelope.sh --precision adds runs of
# another precision (from a stand-in train_gpt), and compare_curves.py judges a run of that precision
# by them.
# One whole run of 120 steps; the wrong learning rate and weight decay are stopped after step 10, where
# their verdict is decided; the other cases are judged on these runs' logs. About 2 minutes on 2 cores.
set -euo pipefail
BUILD=${BUILD:-.}
DATA=$(cd "${1:?usage: tests/e2e/test_recipe_cpu.sh DATA_DIR (the directory scripts/get_data.sh fills)}" && pwd)
cd "$(dirname "$0")/../.."
. tests/lib/stop_at_step.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; exit 1; }
ref=recipes/reference/ci-tiny.csv
[ -f recipes/reference/ci-tiny.envelope.csv ] || fail "no envelope recipes/reference/ci-tiny.envelope.csv"
data=(-i "$DATA/tinyshakespeare/tiny_shakespeare_train.bin" -j "$DATA/tinyshakespeare/tiny_shakespeare_val.bin")

# compare RUN_DIR EXPECTED_STATUS [ARGS...]: runs compare_curves.py, prints its output, checks the status
compare() {
    local run=$1 want=$2 status=0
    shift 2
    python3 scripts/compare_curves.py "$run" "$ref" "$@" > "$run.compare" 2>&1 || status=$?
    cat "$run.compare"
    [ "$status" -eq "$want" ] || fail "compare_curves.py $run exited with $status, want $want"
}

# The reference ran 2 threads with B 16 (-b auto). 3 threads rather than 1: on 2 cores 1 thread takes
# twice as long, 3 no longer than 2.
OMP_NUM_THREADS=3 "$BUILD/train_gpt_cpu" -f recipes/ci-tiny.conf "${data[@]}" -b 8 -o "$tmp/order" > "$tmp/order.out"
compare "$tmp/order" 0
grep -Eq "^(IDENTICAL|REPRODUCED):" "$tmp/order.compare" || fail "no IDENTICAL or REPRODUCED line"
[ -s "$tmp/order/compare_ci-tiny.png" ] || fail "no PNG of the curves"
echo "PASS 3 threads and B 8 reproduce the reference curve ($(grep -Eo "^(IDENTICAL|REPRODUCED)" "$tmp/order.compare")), PNG drawn"

# A wrong learning rate must FAIL in steps 0-10, so the run need not go further.
lr=$(python3 -c "print($(sed -n 's/^lr  *//p' recipes/ci-tiny.conf) * 1.5)")
"$BUILD/train_gpt_cpu" -f recipes/ci-tiny.conf "${data[@]}" -l "$lr" -o "$tmp/lr" > "$tmp/lr.out" &
pid=$!
stop_at_step "$pid" "$tmp/lr/log.csv" 10 || fail "the run with lr $lr ended before step 11: $(tail -n 3 "$tmp/lr.out")"
wait "$pid" 2>/dev/null || true # killed: its status says so
compare "$tmp/lr" 1 --through-step 10
grep -Eq "^FAIL: steps 0-10 \(order window\): .* it left at step [0-9]+" "$tmp/lr.compare" ||
    fail "a learning rate 1.5 times the recipe's did not fail in steps 0-10 naming the step"
echo "PASS a learning rate 1.5 times the recipe's ($lr) fails in steps 0-10, naming the step"

# Weight decay 0 moves the first steps' losses by about 2e-5, far less than a wrong learning rate but
# twenty times the order windows' floor (an fp32 ulp of the loss, which the order runs stay under).
"$BUILD/train_gpt_cpu" -f recipes/ci-tiny.conf "${data[@]}" -c 0 -o "$tmp/wd" > "$tmp/wd.out" &
pid=$!
stop_at_step "$pid" "$tmp/wd/log.csv" 10 || fail "the run with weight decay 0 ended before step 11: $(tail -n 3 "$tmp/wd.out")"
wait "$pid" 2>/dev/null || true
compare "$tmp/wd" 1 --through-step 10
grep -Eq "^FAIL: steps 0-10 \(order window\): .*an fp32 ulp of the loss" "$tmp/wd.compare" ||
    fail "weight decay 0 did not fail in steps 0-10 against the fp32 floor"
echo "PASS weight decay 0 fails in steps 0-10, against the fp32 floor"

head -n 60 "$tmp/order/log.csv" > "$tmp/short.csv"
compare "$tmp/short.csv" 1
grep -q "^FAIL: the run lacks step 59 " "$tmp/short.csv.compare" || fail "a run that stops at step 58 is not refused naming step 59"
echo "PASS a run that stops early fails, naming its first missing step"

# Envelopes that do not fit the reference, and a reference without one
mkdir -p "$tmp/recipes/reference"
sed 's/^lr .*/lr 2e-3/' recipes/ci-tiny.conf > "$tmp/recipes/ci-tiny.conf"
cp "$ref" recipes/reference/ci-tiny.envelope.* "$tmp/recipes/reference/"
status=0
python3 scripts/compare_curves.py "$tmp/order" "$tmp/recipes/reference/ci-tiny.csv" > "$tmp/changed.out" 2>&1 || status=$?
cat "$tmp/changed.out"
[ "$status" -eq 2 ] && grep -q "envelope .*ci-tiny.envelope.csv was written for other settings of .*ci-tiny.conf.* the reference .*ci-tiny.csv" "$tmp/changed.out" ||
    fail "an envelope of other recipe settings gave status $status"
cp recipes/ci-tiny.conf "$tmp/recipes/ci-tiny.conf"
grep -v "^order,[^,]*,117," recipes/reference/ci-tiny.envelope.csv > "$tmp/recipes/reference/ci-tiny.envelope.csv"
status=0
python3 scripts/compare_curves.py "$tmp/order" "$tmp/recipes/reference/ci-tiny.csv" > "$tmp/lacking.out" 2>&1 || status=$?
cat "$tmp/lacking.out"
[ "$status" -eq 2 ] && grep -q "does not fit the reference .*ci-tiny.csv: its order run .* has no train loss at step 117" "$tmp/lacking.out" ||
    fail "an envelope that lacks a step gave status $status"
rm "$tmp/recipes/reference/ci-tiny.envelope.csv"
status=0
python3 scripts/compare_curves.py "$tmp/order" "$tmp/recipes/reference/ci-tiny.csv" > "$tmp/none.out" 2>&1 || status=$?
cat "$tmp/none.out"
[ "$status" -eq 0 ] && grep -q "^warning: no envelope" "$tmp/none.out" ||
    fail "without an envelope, the run of 3 threads and B 8 was not passed by the fixed tolerances with a warning (status $status)"
status=0
python3 scripts/compare_curves.py "$tmp/lr" "$tmp/recipes/reference/ci-tiny.csv" --through-step 10 > "$tmp/none-lr.out" 2>&1 || status=$?
cat "$tmp/none-lr.out"
[ "$status" -eq 1 ] && grep -q "^warning: no envelope" "$tmp/none-lr.out" && grep -q "^FAIL: mean |train loss difference|" "$tmp/none-lr.out" ||
    fail "without an envelope, the wrong learning rate was not failed by the fixed tolerances with a warning (status $status)"
echo "PASS envelopes that do not fit are refused naming both files; without one the fixed tolerances judge, saying so, and pass 3 threads and B 8 but not the wrong learning rate"

cut -d, -f1,2 "$tmp/order/log.csv" > "$tmp/noval.csv"
compare "$tmp/noval.csv" 2
grep -q "no column val_loss" "$tmp/noval.csv.compare" || fail "a log without val_loss is not named"
status=0
python3 scripts/compare_curves.py "$tmp/order" "$tmp/order/log.csv" > "$tmp/norecipe.out" 2>&1 || status=$?
[ "$status" -eq 2 ] && grep -q "cannot read" "$tmp/norecipe.out" || fail "a reference without its recipe gave status $status"
echo "PASS unreadable inputs give status 2 and name the problem"

# A run of another precision than the reference's. write_envelope.sh --precision adds runs of that
# precision to an envelope; here a stand-in train_gpt writes them without training: the reference's
# losses moved by 1e-4 to 8e-4 (a different amount for each of its option sets), and "FP16" in its
# run.conf as train_gpt writes it. Then a run of that size of difference must be REPRODUCED as an
# FP16 run (judged by the FP16 runs), FAIL as an FP32 run (the reference's own precision: the fp32
# floor), be refused as a BF16 run (the envelope has no BF16 runs), and a run 0.01 off FAIL as FP16.
mkdir -p "$tmp/fake" "$tmp/prec/recipes/reference"
cat > "$tmp/fake/train_gpt" << 'FAKE'
#!/usr/bin/env python3
import csv, os, sys, zlib
args = sys.argv[1:]
out = args[args.index("-o") + 1]
reference = os.environ["FAKE_REFERENCE"]
options = [a for i, a in enumerate(args) if a not in ("-f", "-o") and (i == 0 or args[i - 1] not in ("-f", "-o"))]
config = " ".join(options) + " " + " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                                                                if k in ("KERNEL_PATH", "MATMUL_TUNE", "FLASH_ATTN_CONFIG"))
delta = 1e-4 * (1 + zlib.crc32(config.encode()) % 8)
os.makedirs(out, exist_ok=True)
with open(reference, newline="") as f, open(os.path.join(out, "log.csv"), "w", newline="") as g:
    w = csv.writer(g, lineterminator="\n")
    w.writerow(["step", "train_loss", "val_loss"])
    for row in csv.DictReader(f):
        w.writerow([row["step"]] + [f"{float(row[c]) + delta:.9g}" if row[c] else "" for c in ("train_loss", "val_loss")])
with open(os.path.join(out, "run.conf"), "w") as g:
    g.write("# precision FP16: the build that trained it\n")
FAKE
chmod +x "$tmp/fake/train_gpt"
cp recipes/ci-tiny.conf "$tmp/prec/recipes/"
cp "$ref" recipes/reference/ci-tiny.txt recipes/reference/ci-tiny.envelope.* "$tmp/prec/recipes/reference/"
penv=$tmp/prec/recipes/reference/ci-tiny.envelope
for pass in 1 2; do # twice: the second replaces the first's FP16 runs
    FAKE_REFERENCE=$ref scripts/write_envelope.sh --precision FP16 "$tmp/prec/recipes/ci-tiny.conf" "$tmp/fake/train_gpt" 4 \
        > "$tmp/prec/write.out" 2>&1 || fail "write_envelope.sh --precision FP16: $(tail -n 5 "$tmp/prec/write.out")"
done
[ "$(grep -c '^order,' "$penv.csv")" = "$(grep -c '^order,' recipes/reference/ci-tiny.envelope.csv)" ] &&
    [ "$(grep -c '^seed,' "$penv.csv")" = "$(grep -c '^seed,' recipes/reference/ci-tiny.envelope.csv)" ] &&
    [ "$(python3 -c 'import csv, sys; print(len({r["run"] for r in csv.DictReader(open(sys.argv[1])) if r["kind"] == "FP16"}))' \
        "$penv.csv")" = 8 ] &&
    [ "$(grep -c '^FP16,' "$penv.csv")" = $((8 * $(tail -n +2 "$ref" | wc -l))) ] &&
    [ "$(grep -c '^FP16 runs:' "$penv.txt")" = 1 ] && [ "$(grep -c '^  FP16|' "$penv.txt")" = 8 ] &&
    grep -q "^settings: " "$penv.txt" || fail "write_envelope.sh --precision FP16 twice: $(grep -c '^FP16,' "$penv.csv") FP16 rows; $(cat "$penv.txt")"
status=0
scripts/write_envelope.sh --precision FP16 "$tmp/prec/recipes/ci-tiny.conf" "$BUILD/train_gpt_cpu" > "$tmp/prec/cpu.out" 2>&1 || status=$?
[ "$status" -eq 2 ] && grep -q "train_gpt_cpu trains in FP32 only" "$tmp/prec/cpu.out" || fail "--precision with train_gpt_cpu: status $status"
echo "PASS write_envelope.sh --precision FP16 adds 8 FP16 runs, keeps the order and seed runs, replaces its own on a second call; refuses train_gpt_cpu"

# judge PRECISION OFFSET STATUS PATTERN: a run of the reference's losses plus OFFSET, trained in PRECISION
judge() {
    local d=$tmp/prec/run-$1-$2 status=0
    mkdir -p "$d"
    awk -F, -v o="$2" 'BEGIN { OFS = "," } NR == 1 { print; next } { for (i = 2; i <= 3; i++) if ($i != "") $i = sprintf("%.9g", $i + o); print }' \
        "$ref" > "$d/log.csv"
    printf '# precision %s: the build that trained it\n' "$1" > "$d/run.conf"
    python3 scripts/compare_curves.py "$d" "$tmp/prec/recipes/reference/ci-tiny.csv" -o "$d.png" > "$d.out" 2>&1 || status=$?
    [ "$status" -eq "$3" ] && grep -q "$4" "$d.out" || fail "a $1 run $2 off: status $status, want $3 and '$4': $(tail -n 4 "$d.out")"
}
judge FP16 6e-4 0 "^REPRODUCED: within the envelope of the FP16 runs early"
judge FP16 0.01 1 "^FAIL: steps 0-10 (order window): .*(3 x the largest of 8 FP16 runs)"
judge FP32 6e-4 1 "^FAIL: steps 0-10 (order window): .*an fp32 ulp of the loss"
judge BF16 6e-4 2 "trained in BF16 (its run.conf), the reference .* in FP32: .* it has no BF16 runs"
echo "PASS a run of another precision is judged by the envelope's runs of that precision: 6e-4 off REPRODUCED as FP16, FAIL as FP32 (the reference's), refused as BF16 (no such runs); 0.01 off FAIL as FP16"
