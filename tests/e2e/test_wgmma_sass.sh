#!/usr/bin/env bash
# scripts/check_wgmma_sass.py: on hand-written SASS listings it finds a register of a product in
# flight written or read before the wait that retires it (also at a loop's start, against the product
# its end issued) and passes the same accesses after the wait, and finds a function whose every
# product is waited for alone (serialised); then every wgmma kernel that
# `make test-cuda-compile` built for sm_90a (the directory given) is checked, and must be clean.
# usage: tests/e2e/test_wgmma_sass.sh CUDA_COMPILE_DIR
set -euo pipefail
check=$(dirname "$0")/../../scripts/check_wgmma_sass.py
dir=${1:?usage: test_wgmma_sass.sh CUDA_COMPILE_DIR}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; exit 1; }

# listing NAME LINE...: a one-function listing in cuobjdump's layout, an instruction a line.
listing() {
    local name=$1 address=0
    shift
    { printf '\t\tFunction : %s\n' "$name"
      for line in "$@"; do
          printf '        /*%04x*/                   %s ;                  /* 0x0 */\n' $address "$line"
          address=$((address + 16))
      done; } > "$tmp/$name.sass"
}
# expect STATUS NAME WHAT: the checker's exit status on listing NAME.
expect() {
    local status=0
    python3 "$check" --sass "$tmp/$2.sass" > "$tmp/out" 2>&1 || status=$?
    [ "$status" -eq "$1" ] || fail "$3: exit $status, not $1: $(cat "$tmp/out")"
    echo "PASS $3: $(tail -1 "$tmp/out")"
}
issue_pv='HGMMA.64x64x16.F32.BF16 R24, R100, gdesc[UR4].tnspB, R24, gsb0'
listing a_written 'WARPGROUP.ARRIVE' "$issue_pv" 'FFMA R101, R56, 0.5, -R4' 'WARPGROUP.DEPBAR.LE gsb0, 0x0'
expect 1 a_written "an A operand register written before the wait"
listing acc_read 'WARPGROUP.ARRIVE' "$issue_pv" 'FMUL R2, R55, R3' 'WARPGROUP.DEPBAR.LE gsb0, 0x0'
expect 1 acc_read "an accumulator read before the wait"
listing after_wait 'WARPGROUP.ARRIVE' "$issue_pv" 'WARPGROUP.DEPBAR.LE gsb0, 0x0' 'FFMA R101, R56, 0.5, -R4' \
    'FMUL R24, R55, R3'
expect 0 after_wait "the same accesses after the wait"
# Two groups, S (R56..R87) then P V; DEPBAR.LE 1 retires S only.
listing two_groups 'WARPGROUP.ARRIVE' 'HGMMA.64x64x16.F32.BF16 R56, gdesc[UR4], RZ, !UPT, gsb0' "$issue_pv" \
    'WARPGROUP.DEPBAR.LE gsb0, 0x1' 'FMUL R56, R56, 0.5' 'F2FP.BF16.F32.PACK_AB R100, R57, R56' \
    'WARPGROUP.DEPBAR.LE gsb0, 0x0'
expect 1 two_groups "the newer of two groups still in flight after a wait that keeps one"
# A loop (0x10 .. 0x50) whose end issues P V, waited for after the loop's start has written its A.
listing loop 'MOV R1, R2' 'F2FP.BF16.F32.PACK_AB R100, R57, R56' 'WARPGROUP.DEPBAR.LE gsb0, 0x0' \
    'WARPGROUP.ARRIVE' "$issue_pv" '@P0 BRA 0x10' 'WARPGROUP.DEPBAR.LE gsb0, 0x0'
expect 1 loop "a loop's start against the product its end issued"
listing serialised 'WARPGROUP.ARRIVE' 'HGMMA.64x64x16.F32.BF16 R56, gdesc[UR4], RZ, !UPT, gsb0' \
    'WARPGROUP.DEPBAR.LE gsb0, 0x0' "$issue_pv" 'NOP' 'WARPGROUP.DEPBAR.LE gsb0, 0x0'
expect 1 serialised "every product waited for alone (wgmma serialised by ptxas)"
listing none 'FFMA R101, R56, 0.5, -R4' 'EXIT'
expect 2 none "a listing without wgmma is an error, not a pass"

status=0
python3 "$check" "$dir" > "$tmp/out" 2>&1 || status=$?
[ "$status" -eq 0 ] || fail "the sm_90a kernels in $dir: exit $status: $(cat "$tmp/out")"
echo "PASS the sm_90a kernels built in $dir: $(tail -1 "$tmp/out")"
