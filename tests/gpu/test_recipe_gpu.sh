#!/bin/bash
# The shakespeare recipe (recipes/shakespeare-d12.conf: GPT-2 124M, T 1024, 64K tokens per step,
# 300 steps, -b auto) on a GPU, five ways, each judged against the committed reference curve and its
# envelope by scripts/compare_curves.py:
#   (a) the whole GPU;
#   (b) --memory-limit 8 with FLASH_ATTN_CONFIG=sm86: an 8 GB consumer card's memory and tiles;
#   (c) --memory-limit 24 with FLASH_ATTN_CONFIG=sm86: a 24 GB consumer card's;
#   (d) --memory-limit 8 with KERNEL_PATH=sm86: every kernel an 8 GB RTX 30xx/40xx card runs;
#   (e) a learning rate 10% high, stopped after step 30 and judged through it (--through-step).
# Then the CPU recipe ci-tiny on the FP32 build, against the reference train_gpt_cpu wrote:
#   (f) every kernel of an RTX 30xx/40xx (KERNEL_PATH=sm86) must be REPRODUCED;
#   (g) weight decay 0 (which the shakespeare recipe cannot see) must FAIL.
# Then the shakespeare recipe as a T4 runs it, against the BF16 reference:
#   (h) a T4's run: the FP16 build for sm_75 alone, whose PTX the driver compiles for this GPU, at
#       --memory-limit 16, judged by the envelope's FP16 runs (compare_curves.py reads the run's
#       precision from its run.conf): must be REPRODUCED;
#   (i) the same with a learning rate 10% high, stopped after step 10: must FAIL.
# The recipe sets batch-invariant 8, so on the reference's GPU model (a), (b) and (c) must be
# IDENTICAL to it; (d) sums in another order and must be REPRODUCED; (e) must FAIL. Each prints the
# B and -r that -b auto picked, the plan against what the run held at its end (the program's
# "memory:" line), and the peak the GPU reported while it ran (nvidia-smi memory.used, less what was
# in use before it started; polled every 0.2 s, so the CUDA context counts) against the limit; (b),
# (c) and (d) fail when the peak exceeds it.
#   tests/gpu/test_recipe_gpu.sh                    judge (a) to (e) against the committed reference
#   tests/gpu/test_recipe_gpu.sh --write-reference  run (a) and write it as the reference
#                                                   (recipes/reference/shakespeare-d12.csv, .txt: GPU,
#                                                   precision, commit, date) and its envelope
#                                                   (scripts/write_envelope.sh: 16 runs, then 8 FP16
#                                                   runs with --precision FP16), then (b) to (i)
# A datacenter GPU (A100/H100/H200) must write the reference. (a) to (g) take about 4 minutes on an
# H200 after the builds, (h) and (i) under 2 more ((h)'s sm_75 kernels, compiled by the driver, take
# about 130 ms a step there); the envelope 9 more, its FP16 runs about 6. BUILD (default .) and
# GPU_ARCH (default: this GPU's) as in the Makefile.
set -eu
"$(dirname "$0")/../../scripts/get_data.sh" # before any cd: a relative GPT_DATA_DIR is the caller's
cd "$(dirname "$0")/../.."
. tests/lib/stop_at_step.sh
BUILD=${BUILD:-.}
ARCH=${GPU_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d .)}
write=0
case "${1:-}" in
    --write-reference) write=1 ;;
    "") ;;
    *) echo "usage: tests/gpu/test_recipe_gpu.sh [--write-reference]" >&2; exit 2 ;;
esac
RECIPE=recipes/shakespeare-d12.conf
REF=recipes/reference/shakespeare-d12.csv
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failed=0
fail() { echo "FAIL $1"; failed=1; }

for p in BF16 FP32 FP16; do
    make -j"$(nproc)" --no-print-directory BUILD="$BUILD/recipe-$p" PRECISION=$p GPU_ARCH="$ARCH" "$BUILD/recipe-$p/train_gpt" >/dev/null
done
make -j"$(nproc)" --no-print-directory BUILD="$BUILD/recipe-FP16-sm75" PRECISION=FP16 GPU_ARCH=75 "$BUILD/recipe-FP16-sm75/train_gpt" >/dev/null
bin=$BUILD/recipe-BF16/train_gpt
gpu=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader -i "${CUDA_VISIBLE_DEVICES:-0}" | head -n 1)
echo "GPU: $gpu, sm_$ARCH, BF16"

used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "${CUDA_VISIBLE_DEVICES:-0}" | head -n 1; }
# sample_peak: raises peak, a local of run, to the GPU memory in use now above run's base
sample_peak() {
    used=$(used_mib)
    if [ "$((used - base))" -gt "$peak" ]; then peak=$((used - base)); fi
}

# [OPTIONS=...] run NAME LIMIT_GIB|- [STOP] ENV... : the recipe (and OPTIONS) with -o $WORK/NAME,
# the peak GPU memory it held; with STOP (a number), stopped once step STOP is logged
run() {
    local name=$1 limit=$2 stop=0; shift 2
    case ${1:-} in [0-9]*) stop=$1; shift ;; esac
    local extra=() base peak=0 used
    [ "$limit" != - ] && extra=(--memory-limit "$limit")
    base=$(used_mib)
    # shellcheck disable=SC2086 # OPTIONS are words
    env "$@" "$bin" -f "$RECIPE" "${extra[@]}" ${OPTIONS:-} -o "$WORK/$name" > "$WORK/$name.out" 2>&1 &
    local pid=$!
    if [ "$stop" -gt 0 ] && stop_at_step "$pid" "$WORK/$name/log.csv" "$stop" sample_peak; then
        wait "$pid" 2>/dev/null || true
        echo "=== ($name) $* ${OPTIONS:-} stopped after step $stop"
        return
    fi
    while kill -0 "$pid" 2>/dev/null; do
        sample_peak
        sleep 0.2
    done
    local status=0
    wait "$pid" || status=$?
    echo "=== ($name) ${extra[*]} $*"
    grep -E "^-b auto:|^batch:|^memory:|^step +300/" "$WORK/$name.out" || true
    if [ "$status" -ne 0 ]; then
        tail -n 5 "$WORK/$name.out"
        fail "($name) exited with status $status"
        return
    fi
    echo "peak GPU memory while it ran: $peak MiB (nvidia-smi, less the $base MiB in use before)"
    if [ "$limit" != - ]; then
        local limit_mib=$((limit * 1024))
        if [ "$peak" -le "$limit_mib" ]; then echo "PASS ($name) peak $peak MiB <= --memory-limit $limit_mib MiB"
        else fail "($name) peak $peak MiB > --memory-limit $limit_mib MiB"; fi
    fi
}

# compare NAME VERDICT [ARGS...]: the run's verdict against the reference must be VERDICT
compare() {
    local name=$1 want=$2; shift 2
    python3 scripts/compare_curves.py "$WORK/$name" "$REF" "$@" -o "$WORK/$name.png" > "$WORK/$name.cmp" 2>&1 || true
    local got
    got=$(sed -n 's/^\(IDENTICAL\|REPRODUCED\|FAIL\): .*/\1/p' "$WORK/$name.cmp")
    grep -E "^(IDENTICAL|REPRODUCED|FAIL|error):" "$WORK/$name.cmp" || true
    if [ "$got" = "$want" ]; then echo "PASS ($name) judged $want"
    else tail -n 15 "$WORK/$name.cmp"; fail "($name) judged ${got:-nothing} where $want was expected"; fi
}

run a -
if [ "$write" -eq 1 ]; then
    cp "$WORK/a/log.csv" "$REF"
    commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
    git diff --quiet HEAD 2>/dev/null || commit="$commit plus uncommitted work of $(date +%F)"
    cat > "${REF%.csv}.txt" <<EOF
machine: $gpu, sm_$ARCH
build: train_gpt, PRECISION=BF16, ATTN=flash, $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'CUDA ?')
command: ./train_gpt -f $RECIPE (-b auto picked $(sed -n 's/^-b auto: \(B [0-9]*, -r [0-9]\).*/\1/p' "$WORK/a.out"))
commit: $commit
date: $(date +%F)
EOF
    echo "wrote $REF and ${REF%.csv}.txt:"
    cat "${REF%.csv}.txt"
    scripts/write_envelope.sh "$RECIPE" "$bin"
    scripts/write_envelope.sh --precision FP16 "$RECIPE" "$BUILD/recipe-FP16/train_gpt"
fi
[ -f "$REF" ] || { echo "FAIL no reference $REF: run tests/gpu/test_recipe_gpu.sh --write-reference on a datacenter GPU"; exit 1; }
compare a IDENTICAL
run b 8 FLASH_ATTN_CONFIG=sm86
compare b IDENTICAL
run c 24 FLASH_ATTN_CONFIG=sm86
compare c IDENTICAL
run d 8 KERNEL_PATH=sm86
compare d REPRODUCED
lr=$(python3 -c "print($(sed -n 's/^lr  *//p' "$RECIPE") * 1.1)")
OPTIONS="-l $lr" run e - 30
compare e FAIL --through-step 30
# RECIPE, REF and bin set for one call of a function are that call's (bash)
RECIPE=recipes/ci-tiny.conf REF=recipes/reference/ci-tiny.csv bin=$BUILD/recipe-FP32/train_gpt run f - KERNEL_PATH=sm86
REF=recipes/reference/ci-tiny.csv compare f REPRODUCED
RECIPE=recipes/ci-tiny.conf bin=$BUILD/recipe-FP32/train_gpt OPTIONS="-c 0" run g -
REF=recipes/reference/ci-tiny.csv compare g FAIL
bin=$BUILD/recipe-FP16-sm75/train_gpt run h 16
grep -q "the sm_75 kernels (compiled from PTX by the driver)" "$WORK/h.out" || fail "(h) does not say it runs the sm_75 kernels"
compare h REPRODUCED
bin=$BUILD/recipe-FP16-sm75/train_gpt OPTIONS="-l $lr" run i 16 10
compare i FAIL --through-step 10
[ "$failed" -eq 0 ] && echo "test_recipe_gpu: all passed" || echo "test_recipe_gpu: FAILED"
exit "$failed"
