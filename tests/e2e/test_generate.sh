#!/usr/bin/env bash
# Text generation from a prompt (train_gpt_cpu -x 0 --prompt), on a small GPT trained for 60 steps
# (binaries of `make test-programs` in BUILD; DATA_DIR prepared by scripts/get_data.sh):
#  1. greedy tokens equal the argmax of the logits computed independently (tests/unit/test_generate.c);
#  2. the same seed gives the same text, another seed other text; top-k 1 gives the greedy text;
#  3. the text starts with the prompt, and nothing is written to the output directory.
# Bad prompts and models are refused in tests/e2e/test_bad_input.sh.
set -euo pipefail
BUILD=${BUILD:-.}
DATA=$(cd "${1:?usage: tests/e2e/test_generate.sh DATA_DIR (the directory scripts/get_data.sh fills)}" && pwd)
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; exit 1; }

train=$BUILD/train_gpt_cpu
"$train" --layers 2 --channels 64 --heads 4 --max-seq 64 -t 64 -b 4 -x 60 -l 1e-3 -v 0 -s 0 --seed 7 \
    -i "$DATA/tinyshakespeare/tiny_shakespeare_train.bin" -o "$tmp/m" > /dev/null
model=$tmp/m/model_00000060.bin

# 1. greedy against the argmax of an independent forward
"$BUILD/tests/test_generate_cpu" "$model" "$DATA/tinyshakespeare/tiny_shakespeare_val.bin" | grep -v '^ '

# 2. and 3. through the program
gen() { # gen OUT ARGS...: the text on stdout, the rest on OUT.err
    local out=$1; shift
    "$train" -x 0 -e "$model" --vocab "$DATA/gpt2" -g 32 "$@" > "$out" 2> "$out.err" || { cat "$out.err"; fail "generation $*"; }
}
prompt="First Citizen:"
gen "$tmp/a" --prompt "$prompt" --seed 5 --top-k 50
gen "$tmp/b" --prompt "$prompt" --seed 5 --top-k 50
gen "$tmp/c" --prompt "$prompt" --seed 6 --top-k 50
cmp -s "$tmp/a" "$tmp/b" || fail "seed 5 gave two different texts"
cmp -s "$tmp/a" "$tmp/c" && fail "seeds 5 and 6 gave the same text: $(cat "$tmp/a")"
echo "PASS the same seed gives the same text, another seed another: $(head -c 60 "$tmp/a" | tr '\n' '|')"
gen "$tmp/greedy" --prompt "$prompt" --temperature 0
gen "$tmp/top1" --prompt "$prompt" --top-k 1 --seed 9
cmp -s "$tmp/greedy" "$tmp/top1" || fail "top-k 1 differs from greedy: $(cat "$tmp/top1") vs $(cat "$tmp/greedy")"
echo "PASS top-k 1 gives the greedy text: $(tr '\n' '|' < "$tmp/greedy")"
gen "$tmp/nucleus" --prompt "$prompt" --top-p 0.9 --seed 5
printf '%s' "$prompt" > "$tmp/prompt.txt"
gen "$tmp/from_file" --prompt-file "$tmp/prompt.txt" --temperature 0
cmp -s "$tmp/greedy" "$tmp/from_file" || fail "--prompt-file differs from --prompt"
for f in a greedy nucleus; do
    [ "$(head -c ${#prompt} "$tmp/$f")" = "$prompt" ] || fail "$f does not start with the prompt"
    [ "$(wc -c < "$tmp/$f")" -gt $((${#prompt} + 1)) ] || fail "$f has no continuation"
done
grep -q "ms per token" "$tmp/a.err" || fail "no time per token reported"
echo "PASS the text starts with the prompt; --prompt-file and --top-p work; $(grep 'ms per token' "$tmp/a.err")"
before=$(ls -l "$tmp/m")
gen "$tmp/from_dir" -o "$tmp/m" -e d12 --prompt "$prompt" --temperature 0 # the newest model file in -o
cmp -s "$tmp/greedy" "$tmp/from_dir" || fail "-o DIR generation differs from -e of its model file"
[ "$before" = "$(ls -l "$tmp/m")" ] || fail "generation changed the output directory"
echo "PASS -o DIR loads its newest model file, and generation writes nothing there"
