#!/bin/bash
# The big models on small cards at llm.c's 1.5B batch (-d 1048576, T 1024): each run on the whole
# GPU and under --memory-limit, -b auto choosing B, -r and --offload, one row each: the choice, the
# step time, tokens/s and the peak GPU memory (nvidia-smi's memory.used, sampled every 0.2 s, less
# what was in use before the run; the CUDA context counts). Each run is stopped (SIGKILL, so no
# checkpoint is written: d48's would be 25 GB) once step STOP is logged; steps 2..STOP are timed
# (step 1 holds cuBLAS's first heuristics). The data: tinyshakespeare's training tokens repeated 16
# times (5.4M tokens, in WORK), since one step takes 1M.
#   scripts/bench_offload.sh                       the table of docs/options.md
#   RUNS="d24|8|--memory-limit 8,d24||" scripts/bench_offload.sh   other rows: model|name|options
# First it measures what the offloaded update's copies can move (with PyTorch, where it is there):
# pinned host to GPU and back at once, on two streams, as the update's two copy streams do; an
# offloaded step moves 12 bytes a parameter each way, so its transfer time is 12 N / that rate, to
# set beside the step's compute (a row of RUNS with the same B and -r and --offload 0).
# BUILD (default build/bench-offload), GPU_ARCH (default 90), GRADS (default FP32: the build's
# gradients, as make's GRADS), STOP (default 2). Needs a GPU and numpy; about 8 minutes on an H200 for
# the default rows.
set -eu
"$(dirname "$0")/get_data.sh" > /dev/null # before any cd: a relative GPT_DATA_DIR is the caller's
cd "$(dirname "$0")/.."
. tests/lib/stop_at_step.sh
BUILD=${BUILD:-build/bench-offload} ARCH=${GPU_ARCH:-90} STOP=${STOP:-2} GRADS=${GRADS:-FP32}
RUNS=${RUNS:-"d24|whole|,d24|8|--memory-limit 8,d24|8 no offload|--memory-limit 8 --offload 0,d36|whole|,d36|12|--memory-limit 12,d48|whole|,d48|24|--memory-limit 24,d48|24 -r 0|--memory-limit 24 -r 0"}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
make -j"$(nproc)" --no-print-directory BUILD="$BUILD" PRECISION=BF16 GRADS="$GRADS" GPU_ARCH="$ARCH" \
    "$BUILD/train_gpt" > /dev/null
python3 - <<'PY' || echo "PCIe: not measured (no PyTorch)"
import torch
n = 1 << 28  # 1 GiB of fp32 each way
host_up, host_down = torch.empty(n, pin_memory=True), torch.empty(n, pin_memory=True)
dev_up, dev_down = torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
up, down = torch.cuda.Stream(), torch.cuda.Stream()
for _ in range(2):  # a warm-up, then the copies timed
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    with torch.cuda.stream(up):
        dev_up.copy_(host_up, non_blocking=True)
    with torch.cuda.stream(down):
        host_down.copy_(dev_down, non_blocking=True)
    torch.cuda.current_stream().wait_stream(up)
    torch.cuda.current_stream().wait_stream(down)
    end.record()
    torch.cuda.synchronize()
print(f"PCIe: {4 * n / start.elapsed_time(end) / 1e6:.1f} GB/s each way, pinned host memory up and down at once")
PY
python3 - "$WORK/repeated.bin" <<'PY'
import sys, numpy as np
tokens = np.tile(np.fromfile("data/tinyshakespeare/tiny_shakespeare_train.bin", dtype=np.uint16)[512:], 16)
header = np.zeros(256, dtype=np.int32)
header[:3] = 20240520, 1, len(tokens)  # docs/formats.md: magic, version, number of tokens
with open(sys.argv[1], "wb") as f:
    f.write(header.tobytes())
    f.write(tokens.tobytes())
PY
used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -n 1; }
sample() { local m; m=$(used); [ "$m" -gt "$(cat "$WORK/peak")" ] && echo "$m" > "$WORK/peak"; return 0; }
printf "%-5s %-14s %10s %10s %10s  %s\n" model run ms/step tokens/s peak_MiB choice
IFS=, read -ra rows <<< "$RUNS"
for row in "${rows[@]}"; do
    IFS='|' read -r model name options <<< "$row"
    base=$(used)
    echo 0 > "$WORK/peak"
    rm -rf "$WORK/out"
    # shellcheck disable=SC2086 # the options are words
    (exec "$BUILD/train_gpt" -e "$model" -i "$WORK/repeated.bin" -t 1024 -d 1048576 -x 50 -v 0 -s 0 \
        -o "$WORK/out" $options > "$WORK/run.out" 2>&1) &
    pid=$!
    stop_at_step "$pid" "$WORK/out/log.csv" "$STOP" sample || { tail -n 5 "$WORK/run.out"; exit 1; }
    wait "$pid" 2>/dev/null || true
    ms=$(awk -F, -v s="$STOP" 'NR > 1 && $1 >= 2 && $1 <= s { t += $6; n++ } END { printf "%.0f", t / n }' \
        "$WORK/out/log.csv")
    choice=$(sed -n 's/^-b auto: \(.*\) for .*/\1/p' "$WORK/run.out")
    printf "%-5s %-14s %10s %10.0f %10d  %s\n" "$model" "${name:-whole}" "$ms" "$(awk -v m="$ms" 'BEGIN { print 1048576000 / m }')" \
        $(($(cat "$WORK/peak") - base)) "$choice"
done
