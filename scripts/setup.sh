#!/usr/bin/env bash
# What `make test` needs, on Debian or Ubuntu with the CUDA toolkit, each piece probed for real (a
# compile, a link, an import, a run):
#   scripts/setup.sh --check   one line per missing piece on stderr, naming the package that provides
#                              it; exit 1 if any is missing (tests/run_cpu_tests.sh runs this first)
#   scripts/setup.sh           (make setup) installs the missing packages with apt-get, and pip for a
#                              Python other than Debian's, when run as root; otherwise prints the one
#                              command that does, and exits 1
# The CUDA toolkit (nvcc, cuRAND, cuBLAS) comes from NVIDIA and is only checked here, never installed.
# The probes use the Makefile's variables: CC (default cc), CUDA_HOME (default /usr/local/cuda),
# STB_INCLUDE (default /usr/include/stb); tests/e2e/test_setup.sh points them at nothing to simulate a
# missing piece. curl or wget is needed only when GPT_DATA_DIR is unset and data/ lacks a raw file,
# that is when scripts/get_data.sh must download.
set -euo pipefail
case "$*" in
    --check) check_only=1 ;;
    "") check_only=0 ;;
    *) echo "usage: scripts/setup.sh [--check]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
CC=${CC:-cc}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
STB_INCLUDE=${STB_INCLUDE:-/usr/include/stb}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

missing=0
apt=() # Debian/Ubuntu packages to install
pip=() # pip packages to install
# lack WHAT PROBLEM KIND PACKAGE: one line for a missing piece and what provides it. KIND apt or pip:
# this script installs PACKAGE as root; cuda: NVIDIA's package, for the user to install.
lack() {
    local what=$1 problem=$2 kind=$3 package=$4
    missing=$((missing + 1))
    case $kind in
        apt) apt+=("$package"); echo "missing: $what ($problem): package $package" >&2 ;;
        pip) pip+=("$package"); echo "missing: $what ($problem): pip package $package" >&2 ;;
        cuda) echo "missing: $what ($problem): package $package of NVIDIA's CUDA toolkit" \
            "(https://developer.nvidia.com/cuda-downloads), or set CUDA_HOME to where it is" >&2 ;;
    esac
}
# lack_pip WHAT PROBLEM PACKAGES: a missing piece that only pip provides. Debian's python3 takes a pip
# package only with --break-system-packages (PEP 668), and needs pip itself from apt.
lack_pip() {
    if [ "$(python3 -c 'import sys; print(sys.prefix)')" = /usr ]; then
        python3 -m pip --version > /dev/null 2>&1 || lack pip "python3 -m pip fails" apt python3-pip
        pip_flags=" --break-system-packages"
    fi
    lack "$1" "$2" pip "$3"
}
# builds FILE COMPILER ARGS...: writes standard input to $tmp/FILE, compiles and links it (the
# arguments after the file, so that libraries come after the code that needs them).
builds() {
    local file=$tmp/$1 compiler=$2; shift 2
    cat > "$file"
    "$compiler" "$file" "$@" -o "$file.out" > /dev/null 2>&1
}

command -v make > /dev/null || lack make "not found" apt make

omp_program=$'#include <omp.h>\nint main(void) { return omp_get_max_threads() < 1; }'
have_cc=0
if ! command -v "$CC" > /dev/null; then
    lack "C compiler $CC" "not found" apt gcc
elif ! builds omp.c "$CC" -fopenmp <<< "$omp_program"; then
    lack "C compiler $CC with OpenMP" "cannot build a program with -fopenmp" apt gcc
else
    have_cc=1
fi

[ -f "$STB_INCLUDE/stb_ds.h" ] || lack stb_ds.h "not in $STB_INCLUDE" apt libstb-dev

# The sanitizer build and the fuzzers (tests/e2e/test_bad_input.sh, tests/fuzz/fuzz_*.c) use clang.
if ! command -v clang > /dev/null; then # with the runtimes of the distribution's default clang
    lack clang "not found" apt "clang libclang-rt-dev libomp-dev"
else
    llvm=$(clang -dumpversion)
    llvm=${llvm%%.*}
    builds fuzz.c clang -fsanitize=fuzzer,address,undefined <<< $'#include <stddef.h>\n#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { (void)data; (void)size; return 0; }' ||
        lack "clang's sanitizers and libFuzzer" "cannot link -fsanitize=fuzzer,address,undefined" apt "libclang-rt-$llvm-dev"
    builds omp.c clang -fopenmp <<< "$omp_program" ||
        lack "OpenMP for clang" "cannot build a program with clang -fopenmp" apt "libomp-$llvm-dev"
fi

# Every build links cuRAND (initial weights); `make test` compiles every CUDA variant (cuBLAS).
nvcc=$CUDA_HOME/bin/nvcc
have_nvcc=0
if ! "$nvcc" --version > /dev/null 2>&1; then
    lack nvcc "cannot run $nvcc" cuda cuda-toolkit
else
    have_nvcc=1
    cuda=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\),.*/\1-\2/p')
    echo '__global__ void k() {}' > "$tmp/k.cu"
    "$nvcc" -c "$tmp/k.cu" -o "$tmp/k.o" > /dev/null 2>&1 ||
        lack "nvcc's host compiler" "$nvcc cannot compile a kernel" apt g++
    if [ "$have_cc" = 1 ]; then
        cuda_link=("$CC" -I"$CUDA_HOME/include" -L"$CUDA_HOME/lib64")
        builds curand.c "${cuda_link[@]}" -lcurand <<< $'#include <curand.h>
int main(void) { curandGenerator_t g; return curandCreateGeneratorHost(&g, CURAND_RNG_PSEUDO_PHILOX4_32_10); }' ||
            lack cuRAND "cannot link -lcurand from $CUDA_HOME" cuda "libcurand-dev-$cuda"
        builds cublas.c "${cuda_link[@]}" -lcublasLt -lcublas -lcudart <<< $'#include <cublasLt.h>\n#include <cublas_v2.h>
int main(void) { cublasHandle_t h; cublasLtHandle_t lt; return cublasCreate(&h) + cublasLtCreate(&lt); }' ||
            lack cuBLAS "cannot link -lcublasLt -lcublas from $CUDA_HOME" cuda "libcublas-dev-$cuda"
    fi
fi

# scripts/plot_loss.py draws the loss curves of tests/e2e/test_train_cpu.sh; tests/lib/hellaswag_reference.py
# (tests/e2e/test_hellaswag.sh) is a GPT-2 forward in NumPy; scripts/hf_to_model.py and model_to_hf.py
# (tests/e2e/test_hf.sh) read and write Hugging Face's model.safetensors with safetensors.
pip_flags="" # " --break-system-packages" for Debian's python3 (lack_pip)
if ! command -v python3 > /dev/null; then
    lack python3 "not found" apt python3
else
    for module in numpy matplotlib safetensors; do
        python3 -c "import $module" 2> /dev/null && continue
        if [ "$(python3 -c 'import sys; print(sys.prefix)')" != /usr ]; then
            # a Python of its own (pyenv, venv, conda): Debian's package would not reach it
            lack $module "$(command -v python3) cannot import it" pip $module
        elif [ $module = safetensors ]; then # Debian 12 has no package of it
            lack_pip $module "python3 cannot import it and Debian has no package of it" $module
        else
            lack $module "python3 cannot import it" apt python3-$module
        fi
    done
    # scripts/check_wgmma_sass.py (tests/e2e/test_wgmma_sass.sh) reads the compiled wgmma kernels
    # with cuobjdump and nvdisasm: the toolkit's, or NVIDIA's pip packages where it came without them.
    if [ "$have_nvcc" = 1 ] && ! CUDA_HOME=$CUDA_HOME python3 scripts/check_wgmma_sass.py --cuobjdump > /dev/null 2>&1; then
        lack_pip "cuobjdump and nvdisasm" "not in $CUDA_HOME/bin, on the PATH or among python3's packages" \
            "nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"
    fi
fi

# scripts/fineweb_to_jsonl.py reads parquet files with pyarrow (tests/e2e/test_fineweb_parquet.sh).
# Debian 12 has no pyarrow package, so with Debian's python3 it is optional and that test skips.
if command -v python3 > /dev/null && ! python3 -c 'import pyarrow.parquet' 2> /dev/null; then
    if [ "$(python3 -c 'import sys; print(sys.prefix)')" != /usr ]; then
        lack pyarrow "$(command -v python3) cannot import it" pip pyarrow
    elif [ "$check_only" = 0 ]; then
        echo "setup.sh: optional pyarrow (scripts/fineweb_to_jsonl.py) has no Debian package:" \
            "pip install it in a virtual environment to read FineWeb's parquet files" >&2
    fi
fi

if [ -z "${GPT_DATA_DIR:-}" ] && ! command -v curl > /dev/null && ! command -v wget > /dev/null; then
    while read -r _ name; do
        if [ ! -e "data/$name" ]; then
            lack "curl or wget" "scripts/get_data.sh must download data/$name: GPT_DATA_DIR is unset" apt curl
            break
        fi
    done < <(grep -v '^#' scripts/data.sha256)
fi

if [ "$missing" -eq 0 ]; then
    [ "$check_only" = 1 ] || echo "setup.sh: everything make test needs is installed"
    exit 0
fi
[ "$check_only" = 0 ] || exit 1
sudo="sudo "
[ "$(id -u)" -ne 0 ] || sudo=""
cmd=""
[ ${#apt[@]} -eq 0 ] || cmd="${sudo}apt-get update && ${sudo}apt-get install -y ${apt[*]}"
[ ${#pip[@]} -eq 0 ] || cmd="${cmd:+$cmd && }python3 -m pip install$pip_flags ${pip[*]}"
[ -n "$cmd" ] || exit 1 # only NVIDIA's pieces are missing: nothing here can install them
if [ -n "$sudo" ]; then
    echo "setup.sh: to install them, run: $cmd" >&2
    exit 1
fi
echo "setup.sh: $cmd"
DEBIAN_FRONTEND=noninteractive bash -c "$cmd"
"$0" --check
echo "setup.sh: everything make test needs is installed"
