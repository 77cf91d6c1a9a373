#!/usr/bin/env bash
# HellaSwag (binaries of `make test-programs` in BUILD; DATA_DIR prepared by scripts/get_data.sh):
#  1. prepare_data --hellaswag on hand-made examples (unicode escaped and raw, a long ending, empty
#     and blank endings, equal endings, quotes and backslashes, a CRLF line, other fields in any order)
#     writes byte for byte what an independent Python writer of llm.c's format writes
#     (tests/lib/hellaswag_writer.py) from tokens that decode to exactly the texts; standard input equals
#     the file; malformed examples are refused naming the file, the line and the problem;
#  2. train_gpt_cpu --hellaswag on a small trained GPT: every ending's score (--hellaswag-dump) within
#     1e-4 relative of a float64 NumPy GPT-2 reading the model file (tests/lib/hellaswag_reference.py),
#     the same predicted endings and accuracy; the scores do not depend on -b;
#  3. a training run reports the accuracy at the start, every -v steps and at the end, in the step
#     output and in log.csv's column hellaswag (empty at the other steps), the last one in the
#     closing summary; --hellaswag-limit.
# Corrupted evaluation files are refused in tests/e2e/test_bad_input.sh.
set -euo pipefail
BUILD=${BUILD:-.}
DATA=$(cd "${1:?usage: tests/e2e/test_hellaswag.sh DATA_DIR (the directory scripts/get_data.sh fills)}" && pwd)
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; exit 1; }
prep() { "$BUILD/prepare_data" --vocab "$DATA/gpt2" "$@" > "$tmp/log" || fail "prepare_data $*: $(cat "$tmp/log")"; }

# 1. the file
python3 - "$tmp/examples.jsonl" <<'EOF'
import json, sys
long_ending = " ".join(f"then the {w} climbs another ladder of {n} rungs" for n, w in enumerate(["cat", "dog", "owl", "fox", "bee", "elk"]))
examples = [
    # hellaswag.py's own example, with all of HellaSwag's fields
    {"ind": 24, "activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he",
     "ctx": "A man is sitting on a roof. he", "split": "val", "split_type": "indomain", "label": 3,
     "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.", "is holding a rubik's cube.",
                 "starts pulling up roofing on a roof."], "source_id": "activitynet~v_-JhWjGDPHMY"},
    {"ctx": "Le caf\u00e9 est ferm\u00e9; \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "label": 2,
     "endings": ["\U0001F600 smiles \U0001F1EB\U0001F1F7", "na\u00efve r\u00e9sum\u00e9", "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \U0001D11E",
                 "\u05e2\u05d1\u05e8\u05d9\u05ea and \u0627\u0644\u0639\u0631\u0628\u064a\u0629"]},
    {"ctx": "ROMEO: What say you, my lord? JULIET:", "label": 1,
     "endings": ["I say nothing.", long_ending, "Good night, good night!", "Wherefore art thou?"]},
    {"ctx": "She opens the door and", "label": 0, "endings": ["", "   ", "\tlooks\nout", "walks in."]},
    {"ctx": "The two twins are", "label": 1, "endings": ["exactly alike.", "the same.", "the same.", "different."]},
    {"ctx": 'He said "stop" and typed C:\\path\\to', "label": 2,
     "endings": ['"go"', "\\n is a newline", 'a \\"quote\\" and a / slash', "nothing"]},
    {"endings": ["mat.", "hat.", "cat.", "bat."], "n": 1.5e3, "meta": {"a": [1, None, True, False, {}]},
     "label": 3, "ctx": "The cat sat on the "},
    {"ctx": "It's 3.14159 o'clock; we'll've sold 1,000,000", "label": 1,
     "endings": ["widgets.", "apples and pears.", "it's", "'s"]},
    {"ctx": " ".join(["Once upon a time there was a kingdom by the sea."] * 8), "label": 2,
     "endings": ["The end.", "And then?", "Nobody knew.", "It rained."]},
    {"ctx": "Finally,", "label": 0, "endings": ["yes.", "no.", "maybe.", "later."]},
]
with open(sys.argv[1], "w", encoding="utf-8", newline="") as f:
    for i, ex in enumerate(examples):
        end = "\r\n" if i == 6 else "\n"
        f.write(json.dumps(ex, ensure_ascii=i % 2 == 0) + end)  # \u escapes and raw UTF-8
EOF
prep --hellaswag "$tmp/examples.jsonl" -o "$tmp/hellaswag.bin"
cp "$tmp/log" "$tmp/hellaswag.log"
grep -q "10 examples" "$tmp/hellaswag.log" || fail "prepare_data said: $(cat "$tmp/hellaswag.log")"
python3 tests/lib/hellaswag_writer.py texts "$tmp/examples.jsonl" "$tmp/texts.jsonl"
prep --format jsonl -o "$tmp/texts" "$tmp/texts.jsonl"
python3 tests/lib/hellaswag_writer.py write "$DATA/gpt2" "$tmp/examples.jsonl" "$tmp/texts_train.bin" "$tmp/reference.bin" ||
    fail "the tokens of the texts"
cmp "$tmp/hellaswag.bin" "$tmp/reference.bin" || fail "prepare_data --hellaswag differs from the Python writer of llm.c's format"
echo "PASS prepare_data --hellaswag equals the independent writer of llm.c's format byte for byte ($(wc -c < "$tmp/hellaswag.bin") bytes, 10 examples): $(cat "$tmp/hellaswag.log")"
prep --hellaswag - -o "$tmp/stdin.bin" < "$tmp/examples.jsonl"
cmp -s "$tmp/hellaswag.bin" "$tmp/stdin.bin" || fail "standard input differs from the file"
echo "PASS standard input equals the file"

expect_error() { # expect_error PATTERN LINE...: prepare_data --hellaswag on these lines must refuse them
    local pattern=$1; shift
    if [ $# -gt 0 ]; then printf '%s\n' "$@" > "$tmp/bad.jsonl"; else : > "$tmp/bad.jsonl"; fi
    if "$BUILD/prepare_data" --vocab "$DATA/gpt2" --hellaswag "$tmp/bad.jsonl" -o "$tmp/bad.bin" > "$tmp/err" 2>&1; then
        fail "accepted: $*"
    fi
    grep -q -- "$pattern" "$tmp/err" || fail "'$*' said: $(cat "$tmp/err")"
    [ ! -e "$tmp/bad.bin" ] && ! ls "$tmp"/bad.bin.tmp.* > /dev/null 2>&1 || fail "output left behind: $*"
    echo "PASS refused: $(cat "$tmp/err")"
}
good='{"ctx": "A b", "label": 0, "endings": ["c", "d", "e", "f"]}'
expect_error "bad.jsonl line 3: column 1: expected a JSON object" "$good" "$good" "not JSON"
expect_error "bad.jsonl line 2: label 4 is not 0..3" "$good" '{"ctx": "A b", "label": 4, "endings": ["c", "d", "e", "f"]}'
expect_error "line 1: column 11: field \"label\" is a string, not an integer" '{"label": "2", "ctx": "A", "endings": ["c", "d", "e", "f"]}'
expect_error "line 1: column 11: field \"label\" is a number with a fraction" '{"label": 2.0, "ctx": "A", "endings": ["c", "d", "e", "f"]}'
expect_error "line 1: 3 endings, but llm.c's format holds 4" '{"ctx": "A b", "label": 0, "endings": ["c", "d", "e"]}'
expect_error "line 1: column 60: field \"endings\" has more than 4 elements" '{"ctx": "A b", "label": 0, "endings": ["c", "d", "e", "f", "g"]}'
expect_error "line 1: column 45: element 2 of field \"endings\" is a number" '{"ctx": "A b", "label": 0, "endings": ["c", 7, "e", "f"]}'
expect_error "line 1: column 1: no field \"ctx\"" '{"label": 0, "endings": ["c", "d", "e", "f"]}'
expect_error "line 1: the context is empty" '{"ctx": "", "label": 0, "endings": ["c", "d", "e", "f"]}'
expect_error "bad.jsonl holds no examples"
if "$BUILD/prepare_data" --vocab "$DATA/gpt2" --hellaswag "$tmp/examples.jsonl" --shard-tokens 10 -o "$tmp/x.bin" > "$tmp/err" 2>&1 ||
   ! grep -q -- "--shard-tokens does not apply to --hellaswag" "$tmp/err"; then fail "--shard-tokens with --hellaswag: $(cat "$tmp/err")"; fi
echo "PASS refused: $(cat "$tmp/err")"

# 2. scores against the float64 reference
train=$BUILD/train_gpt_cpu
tokens=(-i "$DATA/tinyshakespeare/tiny_shakespeare_train.bin" -j "$DATA/tinyshakespeare/tiny_shakespeare_val.bin")
"$train" --layers 2 --channels 64 --heads 4 --max-seq 128 -t 64 -b 4 -x 40 -l 1e-3 -v 0 -s 0 --seed 7 "${tokens[@]}" \
    -o "$tmp/m" > /dev/null
model=$tmp/m/model_00000040.bin
for b in 4 1 3; do
    "$train" -e "$model" -t 128 -b $b -x 0 -v 0 -s 0 "${tokens[@]}" --hellaswag "$tmp/hellaswag.bin" \
        --hellaswag-dump "$tmp/scores$b.csv" -o "$tmp/eval$b" > "$tmp/eval$b.out" || fail "evaluation -b $b: $(cat "$tmp/eval$b.out")"
done
python3 tests/lib/hellaswag_reference.py "$model" "$tmp/hellaswag.bin" "$tmp/scores4.csv" 1e-4 | tee "$tmp/reference.out"
right=$(sed -n 's|^PASS .*accuracy \([0-9]*\)/10$|\1|p' "$tmp/reference.out")
grep -q "^step 0: hellaswag [0-9.]* ($right/10)" "$tmp/eval4.out" ||
    fail "the step output lacks the reference's accuracy $right/10: $(grep hellaswag "$tmp/eval4.out")"
echo "PASS the step output reports the reference's accuracy: $(grep '^step 0:' "$tmp/eval4.out")"
for b in 1 3; do cmp -s "$tmp/scores4.csv" "$tmp/scores$b.csv" || fail "-b $b gave other scores than -b 4"; done
echo "PASS -b 1 and -b 3 (an example's rows over two forwards) give the scores of -b 4 bit for bit"

# 3. during training: at the start, every -v steps and at the end
"$train" -e "$model" -t 128 -b 4 -x 5 -v 2 -m 1 -s 0 "${tokens[@]}" --hellaswag "$tmp/hellaswag.bin" --hellaswag-limit 6 \
    --hellaswag-dump "$tmp/train_scores.csv" -o "$tmp/train" > "$tmp/train.out"
log=$tmp/train/log.csv
head -1 "$log" | tr , '\n' | grep -qx hellaswag || fail "log.csv has no column hellaswag: $(head -1 "$log")"
col=$(head -1 "$log" | tr , '\n' | grep -nx hellaswag | cut -d: -f1)
evaluated=$(awk -F, -v c="$col" 'NR > 1 && $c != "" { printf "%s%s", sep, $1; sep = "," }' "$log")
[ "$evaluated" = 0,2,4,5 ] || fail "hellaswag logged at steps '$evaluated', want 0,2,4,5: $(cat "$log")"
for s in 0 2 4 5; do
    grep -q "^step $s: val loss [0-9.]* | hellaswag [0-9.]* ([0-9]/6)$" "$tmp/train.out" || fail "no accuracy at step $s: $(cat "$tmp/train.out")"
done
[ "$(cut -d, -f1 "$tmp/train_scores.csv" | sort -u | tr '\n' ' ')" = "0 2 4 5 step " ] &&
    [ "$(cut -d, -f2 "$tmp/train_scores.csv" | sort -u | tr '\n' ' ')" = "0 1 2 3 4 5 example " ] ||
    fail "--hellaswag-dump of a run with --hellaswag-limit 6: $(cat "$tmp/train_scores.csv")"
python3 scripts/plot_loss.py "$log" -o "$tmp/plot.png" > /dev/null || fail "plot_loss.py on a log with the column hellaswag"
want="hellaswag: $(awk -F, -v c="$col" 'NR > 1 && $c != "" { last = $c } END { print last }' "$log") at step 5"
grep -qx "$want" "$tmp/train.out" || fail "the summary lacks '$want': $(grep '^hellaswag' "$tmp/train.out")"
echo "PASS accuracy at steps 0, 2, 4 and 5 of -x 5 -v 2 in the output and log.csv ($(grep '^step 5:' "$tmp/train.out")), the 6 examples of --hellaswag-limit 6"
