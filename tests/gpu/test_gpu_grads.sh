#!/bin/bash
# The whole model's loss and every gradient tensor of the CUDA builds against the CPU reference: one
# forward + backward of a small GPT-2 on the first batch of tinyshakespeare from the same seed,
# dumped by tests/lib/dump_grads.c and compared tensor by tensor (loss and 16 gradients) for FP32,
# BF16 and FP16, ATTN=naive and ATTN=flash (the BF16 flash build under every tile configuration, and
# with dQ summed by atomics, FLASH_ATTN_DETERMINISTIC=0; the FP16 one also with the sm75 tiles), and
# flash BF16 with bf16 gradients (GRADS=BF16). Per tensor:
#   FP32: ||gpu - cpu|| / ||cpu|| <= 1e-5 and every element within 1e-4 of the tensor's largest |cpu|
#   BF16: ||gpu - cpu|| / ||cpu|| <= 3e-2 and every element within 1e-1 of it (bf16 storage, see
#         tests/lib/dump_grads.c)
#   FP16: 4e-3 and 1.25e-2 (fp16 storage, 8 times finer than bf16; the dump scales the loss by 2^16)
# and no NaN or inf (the dump fills its buffers with NaN first, so an element never copied fails).
# Awkward sizes: C 96 with 3 heads (head size 32, the smallest the BF16 flash kernels take), T 67 (no
# multiple of a tile) below max T 80 (wpe rows that the batch never reaches get no gradient), B 3.
# Then C 128 with 2 heads (head size 64, where H100/H200 take the wgmma kernels) for the flash BF16
# build under its default and the sm80 tiles.
# BF16-grads is the flash BF16 build made with GRADS=BF16 (bf16 parameter gradients, each rounded once
# from its fp32 scratch), at BF16's tolerance; its dump reads the bf16 gradients back as floats. The
# same kernels write the same fp32 gradients into its scratch, so with one micro-step its dump must
# also be the flash BF16 build's rounded to bf16 (to nearest even), bit for bit: every gradient
# lands in its place, once, from a zeroed start.
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
# A build's PRECISION argument is BF16-grads for PRECISION=BF16 GRADS=BF16.
gpu_dir() { if [ "$1" = naive ]; then echo "$BUILD/model-$2"; else echo "$BUILD/model-$1-$2"; fi; }
make -j"$(nproc)" --no-print-directory BUILD="$BUILD/model-cpu" ATTN=naive "$BUILD/model-cpu/tests/dump_grads_cpu" >/dev/null
for build in naive-FP32 naive-BF16 naive-FP16 flash-FP32 flash-BF16 flash-FP16 flash-BF16-grads; do
    a=${build%%-*} p=${build#*-}
    grads=FP32
    [ "$p" = BF16-grads ] && grads=BF16
    dir=$(gpu_dir "$a" "$p")
    make -j"$(nproc)" --no-print-directory BUILD="$dir" ATTN="$a" PRECISION="${p%-grads}" GRADS=$grads GPU_ARCH="$ARCH" \
        "$dir/tests/dump_grads" >/dev/null
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
    "$REF" --compare "$WORK/cpu.bin" "$WORK/$name.bin" --precision "${3%-grads}" > "$WORK/$name.cmp" 2>&1 || status=$?
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
check flash-BF16-grads flash BF16-grads
# same_rounded NAME FP32_GRADIENTS_DUMP BF16_GRADIENTS_DUMP: the second is the first rounded to bf16.
same_rounded() {
    local out status=0
    out=$(python3 - "$2" "$3" <<'PY'
import sys
from array import array
HEADER = 304  # dump_grads.c's GradsHeader: 12 int32, 16 int64 sizes, 128 bytes of description
def values(path):
    with open(path, "rb") as f:
        f.seek(HEADER)
        bits = array("I")
        bits.frombytes(f.read())
    return bits[1:]  # the loss first: the gradients after it
full, rounded = values(sys.argv[1]), values(sys.argv[2])
if len(full) != len(rounded):
    sys.exit(f"{len(full)} and {len(rounded)} gradients")
wrong = [i for i, (b, r) in enumerate(zip(full, rounded)) if (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000 != r]
print(f"{len(wrong)} of {len(full)} gradients differ" + (f", the first at {wrong[0]}" if wrong else ""))
sys.exit(1 if wrong else 0)
PY
) || status=$?
    if [ $status = 0 ]; then pass "$1: $out"; else fail "$1: $out"; fi
}
same_rounded "flash-BF16-grads is flash-BF16 rounded to bf16, bit for bit" "$WORK/flash-BF16.bin" "$WORK/flash-BF16-grads.bin"
check naive-FP16 naive FP16
check flash-FP16 flash FP16
check flash-FP16-sm75-tiles flash FP16 sm75
MODEL=(--layers 2 --channels 128 --heads 2 --max-seq 80 -b 3 -t 67 --seed 1337)
"$REF" "$TOKENS" "${MODEL[@]}" -o "$WORK/cpu.bin" | tail -n 1
check flash-BF16-hs64 flash BF16
check flash-BF16-hs64-sm80-tiles flash BF16 sm80
check flash-BF16-grads-hs64 flash BF16-grads
same_rounded "flash-BF16-grads-hs64 is flash-BF16-hs64 rounded to bf16, bit for bit" "$WORK/flash-BF16-hs64.bin" \
    "$WORK/flash-BF16-grads-hs64.bin"
check flash-FP16-hs64 flash FP16
check flash-FP16-hs64-sm75-tiles flash FP16 sm75
[ $failed = 0 ] && echo "test_gpu_grads: all passed" || { echo "test_gpu_grads: FAILED"; exit 1; }
