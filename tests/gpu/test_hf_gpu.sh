#!/usr/bin/env bash
# The Hugging Face export and import against transformers itself, on a GPU machine with PyTorch,
# transformers and safetensors (tests/lib/hf_transformers_check.py is transformers' side):
#  1. a d12 (GPT-2 124M) trained 30 steps by train_gpt (FP32 and BF16 builds) exports; transformers
#     loads the export with no missing or unexpected tensor, its tokenizer round-trips the tokens, and
#     its fp32 logits equal ours (tests/lib/dump_logits.c of the same build) within 1e-4 (FP32) or 5e-2
#     (BF16) of each position's largest logit; import(export(m)) is m bit for bit;
#  2. greedy generation of 32 tokens by train_gpt --prompt (FP32) equals transformers' generate;
#  3. a GPT-2 made and initialised by transformers (GPT2Config L 2, C 64, NH 4, T 64) imports (from
#     model.safetensors, and to the same bits from a pytorch_model.bin), trains one step, and its first
#     loss equals transformers' loss of the same batch within 1e-5 (FP32).
# Usage: BUILD=dir GPU_ARCH=90 tests/gpu/test_hf_gpu.sh   (needs a GPU; scripts/get_data.sh fetches the data)
# TRAINER=cpu runs the same with train_gpt_cpu and tests/dump_logits_cpu of BUILD (the FP32 checks only),
# where there is no GPU; MODEL (default d12) and STEPS (default 30) make it shorter there, PRECISIONS (default
# "FP32 BF16") picks the GPU builds; the checks 2 and 3 run with FP32.
set -euo pipefail
"$(dirname "$0")/../../scripts/get_data.sh" # before any cd: a relative GPT_DATA_DIR is the caller's
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-.}
ARCH=${GPU_ARCH:-90}
MODEL=${MODEL:-d12}
STEPS=${STEPS:-30}
DATA=data/tinyshakespeare
val=$DATA/tiny_shakespeare_val.bin
tmp=$(mktemp -d -p "${TMPDIR:-/tmp}")
trap 'rm -rf "$tmp"' EXIT
failed=0
fail() { echo "FAIL $*"; failed=1; }
check() { python3 tests/lib/hf_transformers_check.py "$@" || failed=1; }

# The builds: name, trainer, logits dumper, logits tolerance.
if [ "${TRAINER:-gpu}" = cpu ]; then
    make -j"$(nproc)" --no-print-directory -s BUILD="$BUILD" "$BUILD/train_gpt_cpu" "$BUILD/tests/dump_logits_cpu"
    builds=("FP32 $BUILD/train_gpt_cpu $BUILD/tests/dump_logits_cpu 1e-4")
else
    builds=()
    for p in ${PRECISIONS:-FP32 BF16}; do
        dir=$BUILD/hf-$p
        make -j"$(nproc)" --no-print-directory -s BUILD="$dir" PRECISION=$p GPU_ARCH="$ARCH" \
            "$dir/train_gpt" "$dir/tests/dump_logits"
        builds+=("$p $dir/train_gpt $dir/tests/dump_logits $([ $p = FP32 ] && echo 1e-4 || echo 5e-2)")
    done
fi
train_args=(-i "$DATA/tiny_shakespeare_train.bin" -j "$val" -t 64 -b 8 -v 0 -s 0 -l 6e-4 -u 5 -c 0.1)

for build in "${builds[@]}"; do
    read -r p trainer dump rtol <<< "$build"
    # 1. a trained d12 out to transformers
    "$trainer" -e "$MODEL" -x "$STEPS" "${train_args[@]}" -o "$tmp/$p" > "$tmp/$p.log" 2>&1 ||
        { fail "$p: training $MODEL: $(tail -3 "$tmp/$p.log")"; continue; }
    model=$(printf '%s/%s/model_%08d.bin' "$tmp" "$p" "$STEPS")
    python3 scripts/model_to_hf.py "$model" -o "$tmp/$p-hf" > /dev/null
    "$dump" "$model" "$val" 64 "$tmp/$p.logits" > /dev/null 2>&1 || { fail "$p: $dump"; continue; }
    echo "$p: $MODEL trained $STEPS steps, exported"
    check logits "$tmp/$p-hf" "$val" 64 "$tmp/$p.logits" "$rtol"
    python3 scripts/hf_to_model.py "$tmp/$p-hf" -o "$tmp/$p-again.bin" > /dev/null
    # The trainer's checksums (header slots 8..25) are not the scripts' to write: the rest is compared.
    if cmp -s -n 32 "$model" "$tmp/$p-again.bin" && cmp -s -i 104 "$model" "$tmp/$p-again.bin"; then
        echo "PASS $p: import(export(m)) == m bit for bit but the trainer's checksums ($MODEL)"
    else fail "$p: import(export(m)) differs from m ($MODEL)"; fi
    [ "$p" = FP32 ] || continue

    # 2. greedy generation
    prompt="ROMEO:"
    "$trainer" -e "$model" -x 0 --prompt "$prompt" -g 32 --temperature 0 > "$tmp/ours.txt" 2> "$tmp/gen.log" ||
        fail "$p: generation: $(tail -3 "$tmp/gen.log")"
    check generate "$tmp/$p-hf" "$prompt" 32 "$tmp/ours.txt"

    # 3. a transformers-made GPT-2 in
    check random "$tmp/random-hf" 2 64 4 64
    python3 scripts/hf_to_model.py "$tmp/random-hf" -o "$tmp/random.bin" > /dev/null
    python3 scripts/hf_to_model.py "$tmp/random-hf-bin" -o "$tmp/random-bin.bin" > /dev/null
    if cmp -s "$tmp/random.bin" "$tmp/random-bin.bin"; then echo "PASS pytorch_model.bin imports as model.safetensors"
    else fail "pytorch_model.bin imports to other bits than model.safetensors"; fi
    "$trainer" -e "$tmp/random.bin" -x 1 "${train_args[@]}" -o "$tmp/random" > "$tmp/random.log" 2>&1 ||
        fail "$p: training the imported model: $(tail -3 "$tmp/random.log")"
    first=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i } $1 == 1 { print $c["train_loss"] }' \
        "$tmp/random/log.csv")
    check loss "$tmp/random-hf" "$DATA/tiny_shakespeare_train.bin" 8 64 "$first"
done

[ "$failed" -eq 0 ] && echo "test_hf_gpu: all passed" || { echo "test_hf_gpu: FAILED"; exit 1; }
