#!/usr/bin/env bash
# The documented path from FineWeb's parquet files to shards: scripts/fineweb_to_jsonl.py piped into
# prepare_data. The test writes two parquet files shaped like FineWeb's (text, id, token_count, ...;
# several row groups; non-ASCII text, emoji, empty and multi-line texts); the shards joined must equal
# prepare_data's plain-text encoding of the same texts, one file per document, in order.
# Skips (exit 0, a SKIP line) only when python3 cannot import pyarrow: scripts/setup.sh installs it
# except for Debian's python3, which has no package of it.
# Usage: tests/e2e/test_fineweb_parquet.sh DATA_DIR (the directory scripts/get_data.sh fills)
set -euo pipefail
DATA=${1:?usage: tests/e2e/test_fineweb_parquet.sh DATA_DIR (the directory scripts/get_data.sh fills)}
BUILD=${BUILD:-.}
root=$(dirname "$0")/../..
if ! python3 -c 'import pyarrow.parquet' 2> /dev/null; then
    echo "SKIP python3 cannot import pyarrow (scripts/setup.sh installs it where it can)"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; exit 1; }

python3 - "$tmp" "$DATA/tinyshakespeare/input.txt" <<'EOF'
import os, sys
import pyarrow as pa, pyarrow.parquet as pq
d, input_txt = sys.argv[1], sys.argv[2]
sections = open(input_txt, encoding="utf-8").read().split("\n\n")[:3000]
texts = [s + f"\ncaf\u00e9 \U0001F600 {i}" for i, s in enumerate(sections)] + ["", "line\r\nbreaks\n\n\"quoted\" \\ \t"]
os.makedirs(f"{d}/docs")
for i, t in enumerate(texts):
    with open(f"{d}/docs/{i:05d}.txt", "wb") as f:
        f.write(t.encode("utf-8"))
half = len(texts) // 2
for name, part in (("000_00000", texts[:half]), ("000_00001", texts[half:])):
    table = pa.table({"text": part, "id": [f"<urn:uuid:{i}>" for i in range(len(part))],
                      "language_score": [0.9] * len(part), "token_count": list(range(len(part)))})
    pq.write_table(table, f"{d}/{name}.parquet", row_group_size=500)  # several row groups per file
EOF

"$BUILD/prepare_data" --vocab "$DATA/gpt2" -o "$tmp/ref" "$tmp"/docs/*.txt > /dev/null
python3 "$root/scripts/fineweb_to_jsonl.py" "$tmp"/000_0000[01].parquet |
    "$BUILD/prepare_data" --vocab "$DATA/gpt2" --format jsonl --shard-tokens 50000 -o "$tmp/fw" - > "$tmp/log"
grep -q "3001 documents" "$tmp/log" || fail "prepare_data said: $(cat "$tmp/log")"
shards=("$tmp"/fw_val_000000.bin "$tmp"/fw_train_*.bin)
[ "${#shards[@]}" -ge 3 ] || fail "only ${#shards[@]} shards: $(ls "$tmp")"
for s in "${shards[@]}"; do tail -c +1025 "$s"; done > "$tmp/joined"
tail -c +1025 "$tmp/ref_train.bin" > "$tmp/ref"
cmp -s "$tmp/joined" "$tmp/ref" || fail "the parquet rows' shards differ from the texts' encoding"
echo "PASS 2 parquet files (3002 rows, one empty: 3001 documents) -> ${#shards[@]} shards equal the texts' encoding"

python3 "$root/scripts/fineweb_to_jsonl.py" --text-column body "$tmp/000_00000.parquet" > "$tmp/out" 2>&1 &&
    fail "a missing column was accepted"
grep -q "000_00000.parquet: no column 'body'" "$tmp/out" || fail "a missing column: $(cat "$tmp/out")"
echo "PASS a missing column is refused: $(cat "$tmp/out")"
