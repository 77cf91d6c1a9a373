#!/usr/bin/env bash
# Config files (-f FILE / --config FILE) of train_gpt_cpu: `name value` lines with blank lines and
# comments are read; an option after -f overrides the file's, one before it is overridden; the long
# form, --config=FILE and -fFILE work; a value that only looks like -f (--prompt -f) is not read as
# one; an unknown option, a missing value, a bad value (from the existing option checks) and a
# nested config and a NUL byte are refused naming the file and the line, with exit status 1. Runs use -x 0 on a
# tiny model: they build it and stop.
set -euo pipefail
BUILD=${BUILD:-.}
DATA=$(cd "${1:?usage: tests/e2e/test_config.sh DATA_DIR (the directory scripts/get_data.sh fills)}" && pwd)
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; exit 1; }
bin="$BUILD/train_gpt_cpu"
data=(-i "$DATA/tinyshakespeare/tiny_shakespeare_train.bin" -j "$DATA/tinyshakespeare/tiny_shakespeare_val.bin" -v 0 -s 0 -x 0)

cat > "$tmp/small.conf" <<'CONF'
# a small model

layers 2          # two blocks
channels 64
  heads 4
seq-len 32
total-batch 256
out OUT
CONF
sed -i "s|OUT|$tmp/out|" "$tmp/small.conf"
# model LAYERS ARGS...: runs with ARGS and checks the model line's layer count and T 32
model() {
    local want=$1; shift
    "$bin" "${data[@]}" --overwrite "$@" > "$tmp/run.out" || fail "train_gpt_cpu $* exited with $?"
    grep -q "^model: L $want, C 64, NH 4" "$tmp/run.out" || fail "$*: want L $want: $(grep '^model' "$tmp/run.out")"
    grep -q "^batch: B [0-9]* x T 32 .* = 256 tokens per step" "$tmp/run.out" || fail "$*: $(grep '^batch' "$tmp/run.out")"
}
model 2 -f "$tmp/small.conf"
[ -f "$tmp/out/log.csv" ] || fail "the file's output directory was not used"
echo "PASS the file's options are read (comments, blank lines, indentation)"
model 3 -f "$tmp/small.conf" --layers 3
model 2 --layers 5 -f "$tmp/small.conf"
echo "PASS an option after -f overrides the file's, one before it is overridden"
model 3 --config "$tmp/small.conf" --layers 3
model 2 --config="$tmp/small.conf"
model 2 "-f$tmp/small.conf"
model 3 --conf "$tmp/small.conf" --layers 3
echo "PASS --config FILE, --config=FILE, -fFILE and an abbreviation work"
status=0
"$bin" --prompt -f -x 0 -o "$tmp/empty" > "$tmp/prompt.out" 2>&1 || status=$?
grep -q "needs a trained model" "$tmp/prompt.out" || fail "--prompt -f read -f as a config file: $(cat "$tmp/prompt.out")"
echo "PASS a value -f is a value, not a config file"

# refused FILE_TEXT EXPECTED...: the file is refused, exit status 1, the message has every EXPECTED
refused() {
    printf '%b' "$1" > "$tmp/bad.conf"; shift
    local status=0
    "$bin" "${data[@]}" -f "$tmp/bad.conf" > "$tmp/bad.out" 2>&1 || status=$?
    [ "$status" -eq 1 ] || fail "$(cat "$tmp/bad.conf") gave exit status $status"
    for want in "$@"; do
        grep -qF -- "$want" "$tmp/bad.out" || fail "message '$(cat "$tmp/bad.out")' lacks '$want'"
    done
    echo "PASS refused: $(head -c 200 "$tmp/bad.out")"
}
refused 'layers 2\n\nfoo 3\n' "$tmp/bad.conf line 3" "unknown option 'foo'"
refused '# lr\nlr\n' "$tmp/bad.conf line 2" "option 'lr' has no value"
refused 'seed 1\nlr fast\n' "lr in $tmp/bad.conf line 2" "'fast' is not a number"
refused 'recompute 3\n' "recompute in $tmp/bad.conf line 1" "outside 0..2"
refused 'schedule wavy\n' "schedule in $tmp/bad.conf line 1" "unknown schedule 'wavy'"
refused 'help 1\n' "$tmp/bad.conf line 1" "unknown option 'help'"
refused "config $tmp/small.conf\n" "$tmp/bad.conf line 1" "cannot read another"
refused 'layers 2\0foo bar\n' "$tmp/bad.conf line 1" "a NUL byte"
refused 'seed 1\n\nlr 5e-4\0lr 1e-1\n' "$tmp/bad.conf line 3" "a NUL byte"
status=0
"$bin" -f "$tmp/missing.conf" > "$tmp/missing.out" 2>&1 || status=$?
[ "$status" -eq 1 ] && grep -q "cannot read config file $tmp/missing.conf" "$tmp/missing.out" || fail "a missing file: $(cat "$tmp/missing.out")"
echo "PASS a missing config file is named"
