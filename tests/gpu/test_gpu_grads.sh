#!/bin/bash
# The whole model's loss and every gradient tensor of the CUDA builds against the CPU reference: one
# forward + backward of a small GPT-2 on the first batch of tinyshakespeare from the same seed,
# dumped by tests/lib/dump_grads.c and compared tensor by tensor (loss and 16 gradients) for FP32,
# BF16 and FP16, ATTN=naive and ATTN=flash (the BF16 flash build under every tile configuration, and
# with dQ summed by atomics, FLASH_ATTN_DETERMINISTIC=0; the FP16 one also with the sm75 tiles). Per
# tensor:
#   FP32: ||gpu - cpu|| / ||cpu|| <= 1e-5 and every element within 1e-4 of the tensor's largest |cpu|
#   BF16: ||gpu - cpu|| / ||cpu|| <= 3e-2 and every element within 1e-1 of it (bf16 storage, see
#         tests/lib/dump_grads.c)
#   FP16: 4e-3 and 1.25e-2 (fp16 storage, 8 times finer than bf16; the dump scales the loss by 2^16)
# and no NaN or inf (the dump fills its buffers with NaN first, so an element never copied fails).
# Awkward sizes: C 96 with 3 heads (head size 32, the smallest the BF16 flash kernels take), T 67 (no
# multiple of a tile) below max T 80 (wpe rows that the batch never reaches get no gradient), B 3.
# Then C 128 with 2 heads (head size 64, where H100/H200 take the wgmma kernels) for the flash BF16
# build under its default and the sm80 tiles.
# Usage: BUILD=dir GPU_ARCH=90 tests/gpu/test_gpu_grads.sh   (needs a GPU; scripts/get_data.sh fetches the data)
set -euo pipefail
"$(dirname "$0")/../../scripts/get_data.sh" # before any cd: a relative GPT_DATA_DIR is the caller's
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-.}
ARCH=${GPU_ARCH:-90}
TOKENS=data/tinyshakespeare/tiny_shakespeare_train.bin
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failed=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; failed=1; }

# The naive builds share test_gpu_model.sh's build directories (the same flags, so the same objects).
gpu_dir() { if [ "$1" = naive ]; then echo "$BUILD/model-$2"; else echo "$BUILD/model-$1-$2"; fi; }
make -j"$(nproc)" --no-print-directory BUILD="$BUILD/model-cpu" ATTN=naive "$BUILD/model-cpu/tests/dump_grads_cpu" >/dev/null
for a in naive flash; do
    for p in FP32 BF16 FP16; do
        dir=$(gpu_dir $a $p)
        make -j"$(nproc)" --no-print-directory BUILD="$dir" ATTN=$a PRECISION=$p GPU_ARCH="$ARCH" \
            "$dir/tests/dump_grads" >/dev/null
    done
done

MODEL=(--layers 2 --channels 96 --heads 3 --max-seq 80 -b 3 -t 67 --seed 1337)
REF=$BUILD/model-cpu/tests/dump_grads_cpu
"$REF" "$TOKENS" "${MODEL[@]}" -o "$WORK/cpu.bin" | tail -n 1
# check compares with the CPU's dump of MODEL in $WORK/cpu.bin.
# check NAME ATTN PRECISION [FLASH_ATTN_CONFIG [FLASH_ATTN_DETERMINISTIC]]
check() {
    local name=$1 bin
    bin=$(gpu_dir "$2" "$3")/tests/dump_grads
    if ! FLASH_ATTN_CONFIG=${4:-} FLASH_ATTN_DETERMINISTIC=${5:-} "$bin" "$TOKENS" "${MODEL[@]}" -o "$WORK/$name.bin" > "$WORK/$name.out" 2>&1; then
        fail "$name: dump_grads failed: $(tail -n 3 "$WORK/$name.out")"
        return
    fi
    tail -n 1 "$WORK/$name.out" # its backend, loss and sizes
    local status=0
    "$REF" --compare "$WORK/cpu.bin" "$WORK/$name.bin" --precision "$3" > "$WORK/$name.cmp" 2>&1 || status=$?
    sed 's/^/    /' "$WORK/$name.cmp"
    local summary
    summary=$(tail -n 1 "$WORK/$name.cmp" | sed 's/^[A-Z]*: //')
    if [ $status = 0 ]; then pass "$name vs CPU: $summary"; else fail "$name vs CPU: $summary"; fi
}
check naive-FP32 naive FP32
check naive-BF16 naive BF16
check flash-FP32 flash FP32
check flash-BF16 flash BF16
check flash-BF16-sm80-tiles flash BF16 sm80
check flash-BF16-sm86-tiles flash BF16 sm86
check flash-BF16-atomic-dQ flash BF16 "" 0
check naive-FP16 naive FP16
check flash-FP16 flash FP16
check flash-FP16-sm75-tiles flash FP16 sm75
MODEL=(--layers 2 --channels 128 --heads 2 --max-seq 80 -b 3 -t 67 --seed 1337)
"$REF" "$TOKENS" "${MODEL[@]}" -o "$WORK/cpu.bin" | tail -n 1
check flash-BF16-hs64 flash BF16
check flash-BF16-hs64-sm80-tiles flash BF16 sm80
check flash-FP16-hs64 flash FP16
check flash-FP16-hs64-sm75-tiles flash FP16 sm75
[ $failed = 0 ] && echo "test_gpu_grads: all passed" || { echo "test_gpu_grads: FAILED"; exit 1; }
