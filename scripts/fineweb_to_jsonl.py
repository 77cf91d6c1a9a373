#!/usr/bin/env python3
"""Streams the text column of parquet files (FineWeb, FineWeb-Edu) to standard output as JSONL, one
{"text": ...} object per row, for prepare_data to encode:

    python3 scripts/fineweb_to_jsonl.py fineweb/sample/10BT/*.parquet |
        ./prepare_data --vocab data/gpt2 --format jsonl --shard-tokens 100000000 -o fineweb10B/fineweb -

The files are read in order, one record batch at a time (never a whole file), so memory stays small
whatever the size of the corpus. Needs pyarrow (scripts/setup.sh installs it where it can).
"""
import argparse
import json
import sys

import pyarrow.parquet as pq


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="parquet files, read in the order given")
    parser.add_argument("--text-column", default="text", help="the column holding the text (default: text)")
    args = parser.parse_args()
    out = sys.stdout
    for path in args.files:
        parquet = pq.ParquetFile(path)
        if args.text_column not in parquet.schema_arrow.names:
            sys.exit(f"error: {path}: no column '{args.text_column}' (it has: {', '.join(parquet.schema_arrow.names)})")
        row = 0
        for batch in parquet.iter_batches(batch_size=8192, columns=[args.text_column]):
            for text in batch.column(0).to_pylist():
                if not isinstance(text, str):
                    sys.exit(f"error: {path}: row {row}: the '{args.text_column}' value is {text!r}, not a string")
                # ensure_ascii (the default) writes every non-ASCII character as a \u escape.
                out.write(json.dumps({"text": text}) + "\n")
                row += 1


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # the reader stopped (prepare_data refused a line): its message says why
        sys.exit(1)
