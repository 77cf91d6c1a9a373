#!/bin/bash
# Where one training step's time goes, kernel call by kernel call: builds profile_step
# (scripts/profile_step.cu) for BF16 with naive and with flash attention and prints one table each,
# GPT-2 124M (d12) at B = 64, T = 1024 unless options say otherwise. Compare each table's last line
# with train_gpt's ms/step at the same B and T (scripts/bench_train.sh). Expect the summed step to be
# shorter: each call here runs in a short burst at full clock, while sustained training holds the
# GPU at its power cap (an H200 at 700 W ran its SMs at 1635-1740 MHz instead of 1980 in a d12 B=64
# run, nvidia-smi; the summed step was 118.5 ms against 126.8 measured). `--at-cap 500` adds a table
# of every call timed again at the sustained clock, whose sum is the one to compare on such a card,
# and the forward and backward replayed back to back at that clock (in training, twelve layers cost
# more energy than this replay of one: 108.2 against 102.7 ms on an H200, docs/performance.md).
# The token ids are uniform random unless `--tokens FILE` gives a token file: text repeats its
# frequent tokens far more, which sets the encoder backward's length.
#
#   scripts/profile_step.sh [profile_step options]   from the repository root, on a GPU machine
#   e.g. scripts/profile_step.sh -b 32   or   scripts/profile_step.sh --layers 24 --channels 1024 --heads 16
#   or   ATTNS=flash scripts/profile_step.sh --at-cap 500 --tokens data/tinyshakespeare/tiny_shakespeare_train.bin
#
# Environment: GPU_ARCH (default 90) the SASS to build; BUILD (default build/profile) where the
# builds go, one directory per attention; PRECISION (default BF16); ATTNS (default "naive flash").
set -euo pipefail
cd "$(dirname "$0")/.."
GPU_ARCH=${GPU_ARCH:-90}
BUILD=${BUILD:-build/profile}
PRECISION=${PRECISION:-BF16}
ATTNS=${ATTNS:-naive flash}

for attn in $ATTNS; do
    echo "building $BUILD/$attn/profile_step (ATTN=$attn PRECISION=$PRECISION GPU_ARCH=$GPU_ARCH)" >&2
    make --no-print-directory -s BUILD="$BUILD/$attn" ATTN="$attn" PRECISION="$PRECISION" GPU_ARCH="$GPU_ARCH" \
        "$BUILD/$attn/profile_step"
done
for attn in $ATTNS; do
    "$BUILD/$attn/profile_step" -b 64 -t 1024 "$@"
    echo
done
