#!/bin/bash
# --offload on a GPU: tests/e2e/test_offload.sh with train_gpt, FP32 and BF16. AdamW's state goes
# through the GPU in two slots, its uploads and downloads on copy streams beside the kernels; the
# test holds such a run to the bits of --offload 0 (losses, norms, model file and training state),
# resumes across the switch, kills an offloaded run with -9 and resumes it to a straight run's bits,
# and checks the refusals and --dry-run.
# Usage: BUILD=dir GPU_ARCH=90 tests/gpu/test_offload_gpu.sh   (needs a GPU; scripts/get_data.sh fetches the data)
set -eu
"$(dirname "$0")/../../scripts/get_data.sh" # before any cd: a relative GPT_DATA_DIR is the caller's
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-.}
ARCH=${GPU_ARCH:-90}
for p in FP32 BF16; do
    make -j"$(nproc)" --no-print-directory BUILD="$BUILD/offload-$p" PRECISION=$p GPU_ARCH="$ARCH" \
        "$BUILD/offload-$p/train_gpt" > /dev/null
    echo "== $p"
    TRAIN=$BUILD/offload-$p/train_gpt tests/e2e/test_offload.sh data
done
