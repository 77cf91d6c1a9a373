#!/usr/bin/env bash
# The CPU recipe end to end against its committed reference curve (recipes/ci-tiny.conf,
# recipes/reference/ci-tiny.csv, made by train_gpt_cpu, fp32 and deterministic) with
# scripts/compare_curves.py: the recipe passes; the same recipe with another seed, and with another
# learning rate, fails on the curve (not on missing steps); a run that stops early fails; inputs
# that cannot be read give exit status 2. About 4.5 minutes on 2 cores (three runs of 120 steps).
set -euo pipefail
BUILD=${BUILD:-.}
DATA=$(cd "${1:?usage: tests/test_recipe_cpu.sh DATA_DIR (the directory scripts/get_data.sh fills)}" && pwd)
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; exit 1; }
ref=recipes/reference/ci-tiny.csv
data=(-i "$DATA/tinyshakespeare/tiny_shakespeare_train.bin" -j "$DATA/tinyshakespeare/tiny_shakespeare_val.bin")

# compare RUN_DIR EXPECTED_STATUS: runs compare_curves.py, prints its output, checks the status
compare() {
    local status=0
    python3 scripts/compare_curves.py "$1" "$ref" > "$1.compare" 2>&1 || status=$?
    cat "$1.compare"
    [ "$status" -eq "$2" ] || fail "compare_curves.py $1 exited with $status, want $2"
}

"$BUILD/train_gpt_cpu" -f recipes/ci-tiny.conf "${data[@]}" -o "$tmp/recipe" > "$tmp/recipe.out"
compare "$tmp/recipe" 0
grep -q "^PASS" "$tmp/recipe.compare" || fail "no PASS line"
[ -s "$tmp/recipe/compare_ci-tiny.png" ] || fail "no PNG of the curves"
echo "PASS the CPU recipe reproduces its reference curve, PNG drawn"

for variant in "seed:--seed 7" "lr:--lr 2e-3"; do
    name=${variant%%:*}
    # shellcheck disable=SC2086 # the option and its value are two words
    "$BUILD/train_gpt_cpu" -f recipes/ci-tiny.conf "${data[@]}" ${variant#*:} -o "$tmp/$name" > "$tmp/$name.out"
    compare "$tmp/$name" 1
    grep -Eq "^FAIL: (mean \|train loss difference\||val loss of step)" "$tmp/$name.compare" ||
        fail "another $name failed for another reason than its curve"
    echo "PASS another $name (${variant#*:}) fails the verdict on its curve"
done

head -n 60 "$tmp/recipe/log.csv" > "$tmp/short.csv"
compare "$tmp/short.csv" 1
grep -q "^FAIL: the run lacks" "$tmp/short.csv.compare" || fail "a run that stops at step 58 is not refused for its missing steps"
echo "PASS a run that stops early fails"

cut -d, -f1,2 "$tmp/recipe/log.csv" > "$tmp/noval.csv"
compare "$tmp/noval.csv" 2
grep -q "no column val_loss" "$tmp/noval.csv.compare" || fail "a log without val_loss is not named"
status=0
python3 scripts/compare_curves.py "$tmp/recipe" "$tmp/recipe/log.csv" > "$tmp/norecipe.out" 2>&1 || status=$?
[ "$status" -eq 2 ] && grep -q "cannot read the recipe" "$tmp/norecipe.out" || fail "a reference without its recipe gave status $status"
echo "PASS unreadable inputs give status 2 and name the problem"
