#!/usr/bin/env bash
# Bad input, run under AddressSanitizer + UndefinedBehaviorSanitizer (the clang build in $BUILD/san):
# every case must print one clear message naming the file or option and the problem, exit non-zero,
# and produce no sanitizer report. Also: a full disk while checkpointing loses no data.
set -euo pipefail
BUILD=${BUILD:-.}
DATA=$(cd "${1:?usage: tests/e2e/test_bad_input.sh DATA_DIR (the directory scripts/get_data.sh fills)}" && pwd)
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1
san=$BUILD/san/train_gpt_cpu
train_bin=$DATA/tinyshakespeare/tiny_shakespeare_train.bin
val_bin=$DATA/tinyshakespeare/tiny_shakespeare_val.bin
small=(--layers 1 --channels 32 --heads 2 --max-seq 32 -t 32 -b 2 -x 1 -v 0 -s 0)
count=0
expect_error() { # expect_error "PATTERN" ARGS... (runs the sanitizer build of train_gpt_cpu)
    local pattern=$1; shift
    local status=0
    "$san" "$@" > "$tmp/out" 2>&1 || status=$?
    if [ "$status" -eq 0 ]; then echo "FAIL (exit 0) $*"; cat "$tmp/out"; exit 1; fi
    if grep -qE "Sanitizer|runtime error" "$tmp/out"; then echo "FAIL (sanitizer report) $*"; cat "$tmp/out"; exit 1; fi
    if ! grep -q -- "$pattern" "$tmp/out"; then echo "FAIL (message lacks '$pattern') $*"; cat "$tmp/out"; exit 1; fi
    echo "PASS exit $status: $(grep -m1 error "$tmp/out")"
    count=$((count + 1))
}

# a small valid model file to break in various ways
"$san" "${small[@]}" -x 0 -i "$train_bin" -o "$tmp/m" > /dev/null
model=$tmp/m/model_00000000.bin

# token files
head -c 3000 "$train_bin" > "$tmp/truncated.bin"
expect_error "truncated.bin" "${small[@]}" -i "$tmp/truncated.bin" -o "$tmp/o"
{ printf '\x39\x30\x00\x00'; tail -c +5 "$train_bin"; } > "$tmp/magic.bin"
expect_error "magic.bin" "${small[@]}" -i "$tmp/magic.bin" -o "$tmp/o"
cp "$train_bin" "$tmp/badtoken.bin"
printf '\x60\xea' | dd of="$tmp/badtoken.bin" bs=1 seek=2048 conv=notrunc 2> /dev/null # token 60000
expect_error "badtoken.bin" "${small[@]}" -i "$tmp/badtoken.bin" -o "$tmp/o"
expect_error "nonexistent" "${small[@]}" -i "$tmp/nonexistent_*.bin" -o "$tmp/o"
expect_error "truncated.bin" "${small[@]}" -v 1 -j "$tmp/truncated.bin" -i "$train_bin" -o "$tmp/o"
mkdir "$tmp/dir.bin"
expect_error "dir.bin" "${small[@]}" -i "$tmp/dir.bin" -o "$tmp/o"
# model files
head -c 5000 "$model" > "$tmp/truncated_model.bin"
expect_error "truncated_model.bin" -e "$tmp/truncated_model.bin" -t 32 -b 2 -x 1 -v 0 -s 0 -i "$train_bin" -o "$tmp/o"
{ printf '\x01\x02\x03\x04'; tail -c +5 "$model"; } > "$tmp/magic_model.bin"
expect_error "magic_model.bin" -e "$tmp/magic_model.bin" -t 32 -b 2 -x 1 -v 0 -s 0 -i "$train_bin" -o "$tmp/o"
expect_error "has layers = 1, but the options ask for 3" -e "$model" --layers 3 -t 32 -b 2 -x 1 -v 0 -s 0 -i "$train_bin" -o "$tmp/o"
expect_error "maximum" -e "$model" -t 64 -b 2 -x 1 -v 0 -s 0 -i "$train_bin" -o "$tmp/o"
# options
expect_error "divide" --layers 1 --channels 10 --heads 3 -t 8 -x 1 -i "$train_bin" -o "$tmp/o"
expect_error "total batch" "${small[@]}" -d 1000 -i "$train_bin" -o "$tmp/o"
expect_error "--bogus" "${small[@]}" --bogus
expect_error "-b" "${small[@]}" -b abc
expect_error "-t" "${small[@]}" -t 0
expect_error "--layers" --layers 2 -x 1
expect_error "schedule" "${small[@]}" -k sawtooth
expect_error "-x" "${small[@]}" -x
expect_error "--inject-nan-loss" "${small[@]}" --inject-nan-loss 4-2
expect_error "--skip-loss-z" "${small[@]}" --skip-loss-z -1
# output directory
touch "$tmp/afile"
expect_error "afile" "${small[@]}" -i "$train_bin" -o "$tmp/afile/sub"
expect_error "afile" "${small[@]}" -i "$train_bin" -o "$tmp/afile"
# resume from a corrupt training state
mkdir -p "$tmp/corrupt"
"$san" "${small[@]}" -i "$train_bin" -o "$tmp/corrupt" > /dev/null
state=$(ls "$tmp/corrupt"/state_*.bin)
head -c 100 "$state" > "$state.cut" && mv "$state.cut" "$state"
expect_error "$(basename "$state")" "${small[@]}" -i "$train_bin" -o "$tmp/corrupt" -y 1
# generation from a prompt
gen=(-x 0 --vocab "$DATA/gpt2")
printf 'Hi' > "$tmp/prompt.txt"
: > "$tmp/empty.txt"
expect_error "prompt is empty" "${gen[@]}" -e "$model" --prompt ""
expect_error "empty.txt is empty" "${gen[@]}" -e "$model" --prompt-file "$tmp/empty.txt"
expect_error "missing.txt" "${gen[@]}" -e "$model" --prompt-file "$tmp/missing.txt"
expect_error "no_such_model.bin" "${gen[@]}" -e "$tmp/no_such_model.bin" --prompt "Hi"
expect_error "has none" "${gen[@]}" -o "$tmp/empty_dir" --prompt "Hi"
expect_error "maximum sequence length of 32" "${gen[@]}" -e "$model" --prompt "$(printf 'word %.0s' $(seq 40))"
expect_error "use -x 0" -x 5 --vocab "$DATA/gpt2" -e "$model" --prompt "Hi"
expect_error "not both" "${gen[@]}" -e "$model" --prompt "Hi" --prompt-file "$tmp/prompt.txt"
expect_error "encoder.json" -x 0 -e "$model" --prompt "Hi" --vocab "$tmp"
# HellaSwag evaluation files (llm.c's format: a 1024-byte header, then example 0's values: delimiter,
# bytes, index, label at byte 1030, 4, the context's length and its first token at byte 1036)
printf '%s\n' '{"ctx": "A man is on a roof. He", "label": 1, "endings": ["sits.", "falls off.", "waves.", "sings a song."]}' \
    '{"ctx": "Then", "label": 3, "endings": ["a", "b", "c", "d"]}' > "$tmp/hs.jsonl"
"$BUILD/prepare_data" --vocab "$DATA/gpt2" --hellaswag "$tmp/hs.jsonl" -o "$tmp/hs.bin" > /dev/null
hs() { cp "$tmp/hs.bin" "$tmp/$1"; }
head -c 1100 "$tmp/hs.bin" > "$tmp/hs_truncated.bin"
expect_error "hs_truncated.bin: truncated" "${small[@]}" -i "$train_bin" -o "$tmp/o" --hellaswag "$tmp/hs_truncated.bin"
hs hs_magic.bin && printf '\x39\x30\x00\x00' | dd of="$tmp/hs_magic.bin" conv=notrunc 2> /dev/null
expect_error "hs_magic.bin: wrong magic number 12345" "${small[@]}" -i "$train_bin" -o "$tmp/o" --hellaswag "$tmp/hs_magic.bin"
expect_error "tiny_shakespeare_val.bin: wrong magic number 20240520" "${small[@]}" -i "$train_bin" -o "$tmp/o" --hellaswag "$val_bin"
hs hs_label.bin && printf '\x07\x00' | dd of="$tmp/hs_label.bin" bs=1 seek=1030 conv=notrunc 2> /dev/null
expect_error "hs_label.bin: example 0 (byte 1024): label 7 is not 0..3" "${small[@]}" -i "$train_bin" -o "$tmp/o" --hellaswag "$tmp/hs_label.bin"
hs hs_token.bin && printf '\x60\xea' | dd of="$tmp/hs_token.bin" bs=1 seek=1036 conv=notrunc 2> /dev/null # token 60000
expect_error "hs_token.bin: example 0: token 0 of the context (byte 1036) is 60000, outside the vocabulary" "${small[@]}" -i "$train_bin" -o "$tmp/o" --hellaswag "$tmp/hs_token.bin"
hs hs_count.bin && printf '\x03' | dd of="$tmp/hs_count.bin" bs=1 seek=8 conv=notrunc 2> /dev/null # 3 examples
expect_error "hs_count.bin: truncated: the file ends at byte" "${small[@]}" -i "$train_bin" -o "$tmp/o" --hellaswag "$tmp/hs_count.bin"
{ cat "$tmp/hs.bin"; printf '\xff\xff'; } > "$tmp/hs_trailing.bin"
expect_error "hs_trailing.bin: 2 bytes after the last of the header's 2 examples" "${small[@]}" -i "$train_bin" -o "$tmp/o" --hellaswag "$tmp/hs_trailing.bin"
expect_error "hs.bin: example 0 needs 11 positions" "${small[@]}" -t 8 -i "$train_bin" -o "$tmp/o" --hellaswag "$tmp/hs.bin"
expect_error "no_such_hellaswag.bin" "${small[@]}" -i "$train_bin" -o "$tmp/o" --hellaswag "$tmp/no_such_hellaswag.bin"
expect_error "--hellaswag-dump needs --hellaswag" "${small[@]}" -i "$train_bin" -o "$tmp/o" --hellaswag-dump "$tmp/dump.csv"
# the TCP rendezvous's variables, checked before anything waits on them
RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=99999 expect_error "MASTER_PORT=99999 is not a port" "${small[@]}" -i "$train_bin" -o "$tmp/o"
RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 expect_error "MASTER_PORT is not" "${small[@]}" -i "$train_bin" -o "$tmp/o"

# a disk that fills up while a checkpoint is written: the write fails cleanly, the previous
# checkpoint stays intact and no temporary file is left behind
mkdir -p "$tmp/full"
"$san" "${small[@]}" -i "$train_bin" -o "$tmp/full" > /dev/null
before=$(md5sum "$tmp/full/model_00000001.bin")
status=0
( trap '' XFSZ; ulimit -f 200; exec "$san" "${small[@]}" -x 2 -y 1 --allow-change steps -i "$train_bin" -o "$tmp/full" ) > "$tmp/out" 2>&1 || status=$?
[ "$status" -ne 0 ] || { echo "FAIL a full disk went unnoticed"; exit 1; }
grep -qE "Sanitizer|runtime error" "$tmp/out" && { echo "FAIL sanitizer report on a full disk"; cat "$tmp/out"; exit 1; }
grep -q "cannot write" "$tmp/out" || { echo "FAIL no clear message on a full disk"; cat "$tmp/out"; exit 1; }
[ "$(md5sum "$tmp/full/model_00000001.bin")" = "$before" ] || { echo "FAIL previous checkpoint changed"; exit 1; }
ls "$tmp/full" | grep -q tmp && { echo "FAIL temporary file left behind: $(ls "$tmp/full")"; exit 1; }
echo "PASS full disk: $(grep -m1 error "$tmp/out"); previous checkpoint intact"
echo "PASS $count bad inputs rejected cleanly"
