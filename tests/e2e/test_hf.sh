#!/usr/bin/env bash
# The Hugging Face import and export (scripts/hf_to_model.py, scripts/model_to_hf.py) on checkpoints the
# test makes itself (tests/lib/hf_reference.py; no network, no transformers), binaries of `make
# test-programs` in BUILD, DATA_DIR prepared by scripts/get_data.sh:
#  1. import: a small GPT-2 in Hugging Face's layout (2 layers, C 64, 4 heads, V 50257, random weights,
#     biases and layer norms) imported; the logits of train_gpt_cpu's forward (tests/lib/dump_logits.c) within
#     1e-5 of a float64 NumPy GPT-2 that reads the Hugging Face tensors; the same reference with one
#     Conv1D weight left untransposed fails (so the check sees orientation mistakes); --bf16 writes
#     version 5, within bf16 rounding; GPT2Model's names (no transformer. prefix, with the attention
#     masks older transformers saved) import to the same bits;
#  2. round trips: export then import gives the model file bit for bit, and the export's tensors are
#     the original checkpoint's bit for bit; a GPT of another size (3 layers, C 48, 3 heads, max T 40)
#     trained from scratch by train_gpt_cpu exports to a checkpoint whose float64 logits match its own,
#     imports back bit for bit (so wte's padded rows are zero after init and training), and the
#     export's config.json and tokenizer files are those transformers reads;
#  3. bad inputs refused with exit status 1, naming the tensor or field, writing no model file.
set -euo pipefail
BUILD=${BUILD:-.}
DATA=$(cd "${1:?usage: tests/e2e/test_hf.sh DATA_DIR (the directory scripts/get_data.sh fills)}" && pwd)
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; exit 1; }
ref() { python3 tests/lib/hf_reference.py "$@"; }
import() { python3 scripts/hf_to_model.py "$@" > "$tmp/log" 2>&1 || fail "hf_to_model.py $*: $(cat "$tmp/log")"; }
export_hf() {
    python3 scripts/model_to_hf.py --vocab "$DATA/gpt2" "$@" > "$tmp/log" 2>&1 ||
        fail "model_to_hf.py $*: $(cat "$tmp/log")"
}
val=$DATA/tinyshakespeare/tiny_shakespeare_val.bin
logits() { # logits MODEL N OUT
    "$BUILD/tests/dump_logits_cpu" "$1" "$val" "$2" "$3" > "$tmp/log" 2>&1 ||
        fail "dump_logits_cpu $*: $(cat "$tmp/log")"
}

# 1. import
ref make "$tmp/hf" --layers 2 --channels 64 --heads 4 --max-seq 32 --seed 1
import "$tmp/hf" -o "$tmp/m.bin"
logits "$tmp/m.bin" 24 "$tmp/m.logits"
ref logits "$tmp/hf" "$val" 24 "$tmp/m.logits" || fail "the imported model's logits"
ref logits "$tmp/hf" "$val" 24 "$tmp/m.logits" --swap-c-proj > "$tmp/out" 2>&1 &&
    fail "a reference with attn.c_proj untransposed passed: $(cat "$tmp/out")"
echo "PASS the reference with attn.c_proj's weight untransposed fails: $(tail -1 "$tmp/out")"
import "$tmp/hf/model.safetensors" -o "$tmp/m16.bin" --bf16
[ "$(od -An -t d4 -j 4 -N 4 "$tmp/m16.bin" | tr -d ' ')" = 5 ] || fail "--bf16 did not write a version 5 model file"
logits "$tmp/m16.bin" 24 "$tmp/m16.logits"
ref logits "$tmp/hf" "$val" 24 "$tmp/m16.logits" --rtol 3e-2 || fail "the bf16 import's logits"
ref edit "$tmp/hf" "$tmp/hf-model" add=lm_head.weight unprefix
import "$tmp/hf-model" -o "$tmp/m-model.bin"
cmp -s "$tmp/m.bin" "$tmp/m-model.bin" || fail "GPT2Model's names (no transformer. prefix) import to other bits"
echo "PASS GPT2Model's names, attention masks and a tied lm_head.weight import to the same model file"

# 2. round trips
export_hf "$tmp/m.bin" -o "$tmp/exp"
ref same "$tmp/hf" "$tmp/exp" || fail "the export of an import is not the original checkpoint"
import "$tmp/exp" -o "$tmp/m2.bin"
cmp -s "$tmp/m.bin" "$tmp/m2.bin" || fail "import(export(m)) differs from m"
echo "PASS import(export(m)) == m bit for bit (L 2, C 64)"
"$BUILD/train_gpt_cpu" --layers 3 --channels 48 --heads 3 --max-seq 40 -t 40 -b 2 -d 80 -x 3 -l 1e-3 -c 0.1 -v 0 -s 0 \
    -i "$DATA/tinyshakespeare/tiny_shakespeare_train.bin" -j "$val" -o "$tmp/run" > "$tmp/log" 2>&1 ||
    fail "train_gpt_cpu: $(cat "$tmp/log")"
trained=$tmp/run/model_00000003.bin
export_hf "$trained" -o "$tmp/exp3"
logits "$trained" 40 "$tmp/t.logits"
ref logits "$tmp/exp3" "$val" 40 "$tmp/t.logits" || fail "the exported model's logits"
import "$tmp/exp3" -o "$tmp/t2.bin"
# The trainer's file carries checksums in header slots 8..25, which the scripts do not write (their
# files load as llm.c's): the rest must be the same bytes.
cmp -s -n 32 "$trained" "$tmp/t2.bin" && cmp -s -i 104 "$trained" "$tmp/t2.bin" ||
    fail "import(export(m)) differs from m for the trained L 3, C 48 model"
[ "$(od -An -tx4 -j32 -N4 "$trained" | tr -d ' ')" = 43435243 ] || fail "the trainer's model file has no checksums"
echo "PASS import(export(m)) == m bit for bit but the trainer's checksums (L 3, C 48, max T 40, trained 3 steps)"
python3 - "$tmp/exp3" <<'EOF' || fail "the export's config.json"
import json, sys
c = json.load(open(f"{sys.argv[1]}/config.json"))
want = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_layer=3, n_embd=48, n_head=3,
            n_positions=40, n_ctx=40, vocab_size=50257, activation_function="gelu_new", layer_norm_epsilon=1e-5,
            tie_word_embeddings=True)
bad = {k: c.get(k) for k, v in want.items() if c.get(k) != v}
assert not bad, f"fields {bad}"
for name in ("tokenizer_config.json", "generation_config.json"):
    json.load(open(f"{sys.argv[1]}/{name}"))
print("PASS the export's config.json: " + ", ".join(f"{k} {c[k]}" for k in want))
EOF
cmp -s "$DATA/gpt2/encoder.json" "$tmp/exp3/vocab.json" && cmp -s "$DATA/gpt2/vocab.bpe" "$tmp/exp3/merges.txt" ||
    fail "the export's vocab.json and merges.txt are not GPT-2's encoder.json and vocab.bpe"
echo "PASS the export's vocab.json and merges.txt are GPT-2's"

# 3. bad inputs: refuse CHECKPOINT PATTERN
refuse() {
    local status=0
    python3 scripts/hf_to_model.py "$1" -o "$tmp/bad.bin" > "$tmp/out" 2>&1 || status=$?
    [ "$status" -eq 1 ] || fail "hf_to_model.py $1: exit status $status, not 1: $(cat "$tmp/out")"
    grep -q -- "$2" "$tmp/out" || fail "hf_to_model.py $1: no '$2' in: $(cat "$tmp/out")"
    [ ! -e "$tmp/bad.bin" ] || fail "hf_to_model.py $1 wrote a model file"
    echo "PASS refused: $(cat "$tmp/out")"
}
# Checkpoints changed by one ACTION each (tests/lib/hf_reference.py edit), and what the refusal must name.
cases=(
    "drop=transformer.h.1.mlp.c_fc.bias|tensor transformer.h.1.mlp.c_fc.bias is missing"
    "shape=transformer.h.0.attn.c_attn.weight|tensor transformer.h.0.attn.c_attn.weight has shape (63, 192)"
    "add=transformer.h.0.attn.extra|unexpected tensor transformer.h.0.attn.extra"
    "add=lm_head.weight.x|unexpected tensor lm_head.weight.x"
    "config=n_embd=32|tensor transformer.wte.weight has shape (50257, 64), config.json's .* n_embd 32"
    "config=n_layer=1|unexpected tensor transformer.h.1"
    "config=n_layer=3|tensor transformer.h.2.ln_1.weight is missing"
    "config=n_positions=64|tensor transformer.wpe.weight has shape (32, 64)"
    'config=model_type="llama"|field model_type is '"'llama'"
    'config=architectures=["LlamaForCausalLM"]|field architectures'
    'config=activation_function="relu"|field activation_function'
    "config=layer_norm_epsilon=1e-6|field layer_norm_epsilon"
    "config=n_head=5|field n_head 5 does not divide n_embd 64"
    "config=tie_word_embeddings=false|field tie_word_embeddings"
    "config=vocab_size=70000|field vocab_size is 70000"
)
ref variants "$tmp/hf" "$tmp/variants" "${cases[@]%%|*}"
for i in "${!cases[@]}"; do
    refuse "$tmp/variants/$((i + 1))" "${cases[i]#*|}"
done
rm -rf "$tmp/bad" && cp -r "$tmp/hf" "$tmp/bad" && rm "$tmp/bad/config.json"
refuse "$tmp/bad" "config.json"
echo '{"model_type": "gpt2",' > "$tmp/bad/config.json"
refuse "$tmp/bad" "config.json: not JSON"
cp "$tmp/hf/config.json" "$tmp/bad" && head -c 1000 "$tmp/hf/model.safetensors" > "$tmp/bad/model.safetensors"
refuse "$tmp/bad" "model.safetensors: cannot read it as safetensors"
refuse "$tmp/none" "no such file or directory"

# model_to_hf.py: not a model file, a truncated one
head -c 5000 "$tmp/m.bin" > "$tmp/short.bin"
for input in "$val:wrong magic number" "$tmp/short.bin:but the file has 5000 bytes"; do
    status=0
    python3 scripts/model_to_hf.py "${input%%:*}" -o "$tmp/bad-exp" > "$tmp/out" 2>&1 || status=$?
    [ "$status" -eq 1 ] && grep -q "${input#*:}" "$tmp/out" ||
        fail "model_to_hf.py ${input%%:*}: exit status $status, not 1 with '${input#*:}': $(cat "$tmp/out")"
    [ ! -e "$tmp/bad-exp" ] || fail "model_to_hf.py ${input%%:*} made its output directory"
    echo "PASS refused: $(cat "$tmp/out")"
done
