#!/bin/bash
# Where a trained step's GPU time goes, kernel by kernel, in train_gpt and, where LLMC names one, in
# llm.c's train_gpt2cu on the same model, data, batch and steps: each program trained from scratch
# (BF16, flash attention for ours) under scripts/trace_step.cpp, a CUPTI library that CUDA loads
# into it (CUDA_INJECTION64_PATH), which prints each kernel's time a step, calls a step and mean
# call over the steps after the first SKIP, the step's span, its kernels' sum and its time with no
# kernel running, that time by the length of its gaps and the kernel pairs with the most of it
# between them. Unlike profile_step's bursts, the kernels run as in training: at the power cap's
# clock, one after the other, ours with the weight gradients on a second stream beside the calls
# that follow them where the rows are many (matmul.cu: 256 rows for every SM; two kernels sharing the
# GPU both count their whole time, so their sum exceeds the span). docs/performance.md has the
# tables it gave.
#
#   GPU_ARCH=90 MODEL=d48 B=16 scripts/trace_step.sh          ours alone
#   MODEL=d24 B=16 LLMC=/path/to/llm.c/train_gpt2cu LLMC_ARGS="-ge 2" scripts/trace_step.sh
#
# MODEL d12 (default), d24, d36 or d48 (-e of both programs); B (default 16) the micro-batch, at
# T 1024 and one micro-batch a step; R (default 0) the recompute level (-r of both); STEPS (default
# 20) steps trained, SKIP (default 5) left out of the table. CUPTI's headers and library come from
# CUPTI_HOME, else CUDA's extras/CUPTI, else the Python packages of NVIDIA's (nvidia-cuda-cupti).
# llm.c is run as scripts/llmc_options.sh says. BUILD (default build/trace).
set -eu
MODEL=${MODEL:-d12} B=${B:-16} R=${R:-0} STEPS=${STEPS:-20} SKIP=${SKIP:-5} BUILD=${BUILD:-build/trace}
case $MODEL in d12 | d24 | d36 | d48) ;; *) echo "trace_step.sh: MODEL=$MODEL is none of d12, d24, d36, d48" >&2; exit 1 ;; esac
[ "$STEPS" -ge $((SKIP + 2)) ] || { echo "trace_step.sh: STEPS=$STEPS must be at least SKIP + 2 = $((SKIP + 2))" >&2; exit 1; }
"$(dirname "$0")/get_data.sh" # before any cd: a relative GPT_DATA_DIR is the caller's
cd "$(dirname "$0")/.."

# CUPTI: the first of these folders with its header, then its library beside it (lib64 or lib).
cupti_dirs=("${CUPTI_HOME:-}" "${CUDA_HOME:-/usr/local/cuda}/extras/CUPTI")
if python_nvidia=$(python3 -c "import nvidia, os; print(' '.join(nvidia.__path__))" 2>/dev/null); then
    for p in $python_nvidia; do cupti_dirs+=("$p"/cu13 "$p"/cu12 "$p"/cuda_cupti); done
fi
cupti=
for d in "${cupti_dirs[@]}"; do
    [ -n "$d" ] && [ -e "$d/include/cupti_activity.h" ] && { cupti=$d; break; }
done
[ -n "$cupti" ] || { echo "trace_step.sh: no CUPTI found (set CUPTI_HOME to a folder with include/cupti_activity.h)" >&2; exit 1; }
cupti_lib=
for f in "$cupti"/lib64/libcupti.so* "$cupti"/lib/libcupti.so*; do
    [ -e "$f" ] && { cupti_lib=$f; break; }
done
[ -n "$cupti_lib" ] || { echo "trace_step.sh: no libcupti.so in $cupti/lib64 or $cupti/lib" >&2; exit 1; }
mkdir -p "$BUILD"
g++ -std=c++17 -O2 -shared -fPIC -I"$cupti/include" -I"${CUDA_HOME:-/usr/local/cuda}/include" scripts/trace_step.cpp \
    -o "$BUILD/libtrace_step.so" "$cupti_lib" -Wl,-rpath,"$(dirname "$cupti_lib")"
make --no-print-directory -s BUILD="$BUILD/BF16-flash" ATTN=flash PRECISION=BF16 GPU_ARCH="${GPU_ARCH:-90}" \
    "$BUILD/BF16-flash/train_gpt" >/dev/null

DATA=$PWD/data/tinyshakespeare
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export CUDA_INJECTION64_PATH=$PWD/$BUILD/libtrace_step.so TRACE_SKIP=$SKIP
# traced NAME CMD...: CMD run with the trace, its table printed under NAME (its output in WORK/NAME.log).
traced() {
    local name=$1
    shift
    TRACE_OUT=$WORK/$name.trace "$@" > "$WORK/$name.log" 2>&1 || { tail -20 "$WORK/$name.log"; exit 1; }
    echo "== $name, $MODEL, B $B, T 1024, -r $R"
    cat "$WORK/$name.trace"
    echo
}
traced train_gpt "$BUILD/BF16-flash/train_gpt" -e "$MODEL" -i "$DATA/tiny_shakespeare_train.bin" \
    -j "$DATA/tiny_shakespeare_val.bin" -b "$B" -t 1024 -r "$R" -x "$STEPS" -v 0 -s 0 -n 0 -o "$WORK/ours"
if [ -n "${LLMC:-}" ]; then
    # shellcheck source=scripts/llmc_options.sh
    . scripts/llmc_options.sh
    llmc=$(realpath "$LLMC")
    set_llmc_options "$MODEL" "$B" 1024 "$R" "$STEPS" "$DATA/tiny_shakespeare_train.bin" "$WORK/llmc"
    (cd "$WORK" && traced llm.c "$llmc" "${llmc_options[@]}")
fi
