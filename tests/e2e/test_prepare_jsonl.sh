#!/usr/bin/env bash
# prepare_data on real-corpus inputs: JSONL (escapes, surrogate pairs, empty and very long texts,
# CRLF, other fields), standard input, llm.c-named shards, 1 and 2 threads, and malformed lines.
# The references are independent of the JSONL path: Python's json module writes the lines, and the
# same texts go through prepare_data's plain-text path (each file one document), which
# tests/e2e/test_prepare_data.sh checks against tiktoken; tinyshakespeare's sections written as JSONL
# must give exactly tiktoken's tokens (tests/lib/check_tokens.sh).
# Usage: tests/e2e/test_prepare_jsonl.sh DATA_DIR (the directory scripts/get_data.sh fills)
set -euo pipefail
DATA=${1:?usage: tests/e2e/test_prepare_jsonl.sh DATA_DIR (the directory scripts/get_data.sh fills)}
BUILD=${BUILD:-.}
check_tokens=$(dirname "$0")/../lib/check_tokens.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; exit 1; }
prep() { "$BUILD/prepare_data" --vocab "$DATA/gpt2" "$@" > "$tmp/log" || fail "prepare_data $*: $(cat "$tmp/log")"; }
ntokens() { od -An -t d4 -j 8 -N 4 "$1" | tr -d ' '; } # the header's token count
same() { # same WHAT FILE REFERENCE
    cmp -s "$2" "$3" || fail "$1: $2 differs from $3"
    echo "PASS $1"
}
no_temporary_files() { ! ls "$tmp"/out/*.tmp.* > /dev/null 2>&1 || fail "$1: temporary files left: $(ls "$tmp"/out)"; }

# The documents: every JSON escape, \u00e9, emoji (surrogate pairs with ensure_ascii), an empty text,
# a 5 MB text (an 8 MB line), a NUL, and other fields of every type around the text field.
python3 - "$tmp" "$DATA/tinyshakespeare/input.txt" <<'EOF'
import json, os, sys
d = sys.argv[1]
os.makedirs(f"{d}/docs")
docs = ["Hello, world.", 'quote " backslash \\ slash / tab \t newline \n CR \r form \f bell \b.',
        "caf\u00e9 na\u00efve \u20ac", "emoji \U0001F600 flags \U0001F1EB\U0001F1F7 and \U0001D11E", "",
        " ".join(f"word{i} \u00e9t\u00e9\n" for i in range(300000)), "nul \x00 inside", "\u65e5\u672c\u8a9e"]
for i, text in enumerate(docs):
    with open(f"{d}/docs/{i:03d}.txt", "wb") as f:
        f.write(text.encode("utf-8"))
def write(name, end="\n", **dumps):
    with open(f"{d}/{name}", "w", encoding="utf-8", newline="") as f:
        for i, text in enumerate(docs):
            row = {"id": f"<urn:{i}>", "n": -1.5e3, "meta": {"text": "not this", "a": [1, None, True, False, {}]},
                   "text": text, "score": 0.9}
            f.write(json.dumps(row, **dumps) + end)
write("docs.jsonl")                          # ASCII only: \u escapes, surrogate pairs
write("docs_crlf.jsonl", end="\r\n")
write("docs_utf8.jsonl", ensure_ascii=False) # raw UTF-8, escapes only where JSON needs them
with open(f"{d}/content.data", "w") as f:
    for text in docs:
        f.write(json.dumps({"content": text}) + "\n")
# tinyshakespeare's sections (as the recipe splits them) as JSONL, and 70000 short documents
# (more than one batch of prepare_data's) for the thread test.
text = open(sys.argv[2], encoding="utf-8").read()
parts = text.split("\n\n")
with open(f"{d}/shakespeare.jsonl", "w") as f:
    for i, part in enumerate(parts):
        f.write(json.dumps({"text": part + ("\n\n" if i + 1 < len(parts) else "")}) + "\n")
with open(f"{d}/many.jsonl", "w") as f:
    for i in range(70000):
        f.write(json.dumps({"text": parts[i % len(parts)][: 20 + i % 50] + f" {i}"}) + "\n")
EOF
mkdir "$tmp/out"
o=$tmp/out

prep -o "$o/ref" "$tmp"/docs/*.txt
prep -o "$o/jsonl" "$tmp/docs.jsonl"
same "JSONL (escapes, surrogate pairs, empty and 5 MB texts) equals the texts as files" "$o/jsonl_train.bin" "$o/ref_train.bin"
prep -o "$o/crlf" "$tmp/docs_crlf.jsonl"
same "JSONL with CRLF line ends" "$o/crlf_train.bin" "$o/ref_train.bin"
prep -o "$o/utf8" "$tmp/docs_utf8.jsonl"
same "JSONL with raw UTF-8" "$o/utf8_train.bin" "$o/ref_train.bin"
prep --format jsonl --text-field content -o "$o/field" "$tmp/content.data"
same "--format jsonl --text-field content" "$o/field_train.bin" "$o/ref_train.bin"
prep --format jsonl -o "$o/stdin" - < "$tmp/docs.jsonl"
same "standard input equals the file" "$o/stdin_train.bin" "$o/ref_train.bin"
[ "$(ntokens "$o/ref_train.bin")" -gt 600000 ] || fail "the reference has only $(ntokens "$o/ref_train.bin") tokens"

# tinyshakespeare as JSONL: tiktoken's tokens, on 2 threads.
OMP_NUM_THREADS=2 prep --val-tokens 32768 -o "$o/tiny" "$tmp/shakespeare.jsonl"
"$check_tokens" "$o/tiny" || fail "tinyshakespeare's sections as JSONL are not tiktoken's tokens"
prep --format jsonl --val-tokens 32768 -o "$o/tiny_stdin" - < "$tmp/shakespeare.jsonl"
same "standard input, --val-tokens" "$o/tiny_stdin_train.bin" "$o/tiny_train.bin"

# 1 and 2 threads: byte-identical, over several batches.
OMP_NUM_THREADS=1 prep -o "$o/one" "$tmp/many.jsonl"
OMP_NUM_THREADS=2 prep -o "$o/two" "$tmp/many.jsonl"
grep -q "70000 documents.*on 2 thread" "$tmp/log" || fail "the 2-thread run said: $(cat "$tmp/log")"
same "1 and 2 threads give the same tokens (70000 documents)" "$o/two_train.bin" "$o/one_train.bin"

# Shards: llm.c's names, the first one validation, exactly N tokens each but the last, and together
# the unsharded output. 338028 tokens: 100000 leaves a short last shard; 169014 divides exactly.
prep -o "$o/whole" "$tmp/shakespeare.jsonl"
OMP_NUM_THREADS=2 prep --shard-tokens 100000 -o "$o/shard" "$tmp/shakespeare.jsonl"
[ "$(cd "$o" && echo shard_*)" = "shard_train_000001.bin shard_train_000002.bin shard_train_000003.bin shard_val_000000.bin" ] ||
    fail "shard names: $(cd "$o" && echo shard_*)"
for s in val_000000 train_000001 train_000002; do
    [ "$(ntokens "$o/shard_$s.bin")" = 100000 ] || fail "shard_$s.bin has $(ntokens "$o/shard_$s.bin") tokens, not 100000"
done
[ "$(ntokens "$o/shard_train_000003.bin")" = 38028 ] || fail "the last shard has $(ntokens "$o/shard_train_000003.bin") tokens, not 38028"
for s in val_000000 train_000001 train_000002 train_000003; do tail -c +1025 "$o/shard_$s.bin"; done > "$tmp/joined"
tail -c +1025 "$o/whole_train.bin" > "$tmp/whole"
same "shards of 100000 tokens (100000 x 3 + 38028) joined equal the unsharded file" "$tmp/joined" "$tmp/whole"
prep --shard-tokens 169014 -o "$o/half" "$tmp/shakespeare.jsonl"
[ "$(cd "$o" && echo half_*)" = "half_train_000001.bin half_val_000000.bin" ] || fail "exact halves: $(cd "$o" && echo half_*)"
cat <(tail -c +1025 "$o/half_val_000000.bin") <(tail -c +1025 "$o/half_train_000001.bin") > "$tmp/joined"
same "2 shards of exactly 169014 tokens, no empty third" "$tmp/joined" "$tmp/whole"

# Malformed lines: refused naming the file, the line and the problem, leaving no file behind; or
# skipped with --skip-bad-lines.
expect_error() { # expect_error PATTERN ARGS...
    local pattern=$1; shift
    if "$BUILD/prepare_data" --vocab "$DATA/gpt2" "$@" > "$tmp/err" 2>&1 < "${stdin:-/dev/null}"; then fail "'$*' succeeded"; fi
    grep -q -- "$pattern" "$tmp/err" || fail "'$*' said: $(cat "$tmp/err")"
    echo "PASS '$*': $(grep error "$tmp/err")"
}
{ head -n 2 "$tmp/docs.jsonl"; echo "this is not JSON"; tail -n +3 "$tmp/docs.jsonl"; } > "$tmp/bad.jsonl"
expect_error "bad.jsonl line 3: column 1: expected a JSON object" -o "$o/bad" "$tmp/bad.jsonl"
{ head -n 4 "$tmp/docs.jsonl"; echo '{"text": "lone \udc00"}'; } > "$tmp/surrogate.jsonl"
expect_error "surrogate.jsonl line 5: column 16: lone low surrogate" -o "$o/bad" "$tmp/surrogate.jsonl"
stdin=$tmp/bad.jsonl expect_error "standard input line 3: column 1" --format jsonl -o "$o/bad" -
! ls "$o"/bad* > /dev/null 2>&1 || fail "output left by a refused input: $(ls "$o"/bad*)"
no_temporary_files "a refused line"
echo "PASS no output file is left by a refused input"
prep --skip-bad-lines -o "$o/skip" "$tmp/bad.jsonl"
grep -q "skipped 1 bad line" "$tmp/log" || fail "--skip-bad-lines said: $(cat "$tmp/log")"
same "--skip-bad-lines skips the line and counts it" "$o/skip_train.bin" "$o/ref_train.bin"
# A bad line after a first batch (65536 documents) was encoded into full shards: those stay, complete
# and as a good run writes them; the shard being filled is never left half-written.
prep --shard-tokens 100000 -o "$o/many" "$tmp/many.jsonl"
{ cat "$tmp/many.jsonl"; echo '{"text": 1}'; } > "$tmp/late.jsonl"
expect_error "late.jsonl line 70001: column 10: field \"text\" is a number, not a string" --shard-tokens 100000 -o "$o/late" "$tmp/late.jsonl"
late=$(cd "$o" && ls late_* 2> /dev/null | wc -l)
[ "$late" -ge 2 ] && [ "$late" -lt "$(cd "$o" && ls many_* | wc -l)" ] || fail "after a late bad line: $(cd "$o" && echo late_*)"
for f in "$o"/late_*; do
    cmp -s "$f" "$o/many_${f#"$o"/late_}" || fail "$f differs from the good run's"
    [ "$(ntokens "$f")" = 100000 ] || fail "$f has $(ntokens "$f") tokens"
done
no_temporary_files "a late bad line"
echo "PASS a bad line after $late full shards leaves them complete and nothing half-written"

expect_error "exclude each other" --shard-tokens 1000 --val-tokens 10 -o "$o/x" "$tmp/docs.jsonl"
expect_error "given 2 times" --format jsonl -o "$o/x" - -
expect_error "--format must be text or jsonl" --format csv -o "$o/x" "$tmp/docs.jsonl"
expect_error "no documents" -o "$o/x" /dev/null --format jsonl
expect_error "option --shard-tokens: 0 is outside" --shard-tokens 0 -o "$o/x" "$tmp/docs.jsonl"
