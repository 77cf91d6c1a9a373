#!/bin/bash
# Flash attention speed on the GPU beside PyTorch's scaled_dot_product_attention (flash and cuDNN
# backends), measured in the same run: causal, NH 12, HS 64, bf16, 65536 tokens per call, T from
# 1024 to 16384 (HEADS and TOKENS set others: HEADS=16 TOKENS=16384 SEQ_LENS=1024 is GPT-2 350M's
# attention at B 16, HEADS=25 the 1.5B's). Prints one table of TFLOP/s (forward, forward + backward
# with deterministic and with atomic dQ) and our fractions of both. Each length is timed in processes
# of its own (below).
#
#   scripts/bench_attention.sh            from the repository root, on a GPU machine
#
# Environment: GPU_ARCH (default 90) the SASS to build; BUILD (default build/bench-attention) where
# the binary (make's $BUILD/bench_attention, BF16) and our raw numbers go; SEQ_LENS to time other
# lengths (divisors of TOKENS); HEADS (default 12) the heads and TOKENS (default 65536) the tokens per
# call, for both programs.
set -euo pipefail
cd "$(dirname "$0")/.."
GPU_ARCH=${GPU_ARCH:-90}
BUILD=${BUILD:-build/bench-attention}
SEQ_LENS=${SEQ_LENS:-1024 2048 4096 8192 16384}

mkdir -p "$BUILD"
make --no-print-directory -s BUILD="$BUILD" ATTN=flash PRECISION=BF16 GPU_ARCH="$GPU_ARCH" "$BUILD/bench_attention"
# Each length is timed by its own processes, ours and then PyTorch's, before the next length, so
# that both meet the card in the same state. (Ours for all lengths first and PyTorch's after, as
# this script did until 2026-11-26, put our T 16384 forward after a few seconds of back-to-back
# kernels at the shorter lengths, and it came out up to 8% below its speed timed alone:
# PERFORMANCE.md.)
have_torch=0
python3 -c "import torch" 2>/dev/null && have_torch=1
: > "$BUILD/ours.txt"
: > "$BUILD/torch.txt"
for T in $SEQ_LENS; do
    "$BUILD/bench_attention" "$T" | tee -a "$BUILD/ours.txt"
    if [ "$have_torch" = 1 ]; then python3 scripts/bench_attention_torch.py --measure "$T" >> "$BUILD/torch.txt"; fi
done
if [ "$have_torch" = 1 ]; then
    python3 scripts/bench_attention_torch.py --table "$BUILD/ours.txt" "$BUILD/torch.txt"
else
    echo "PyTorch not found: our numbers only (T B fwd_ms fwd_TFLOP/s fwdbwd_ms fwdbwd_TFLOP/s, then the same with atomic dQ) above"
fi
