#!/usr/bin/env python3
"""An independent writer of llm.c's HellaSwag evaluation file, for tests/e2e/test_hellaswag.sh.

The layout as llm.c's dev/data/data_common.py (write_evalfile) defines it: 256 little-endian int32
(20240522, version 1, the number of examples, the longest example in bytes), then per example the
uint16 values 65535, the example's bytes, its index, its label, 4, the context's token count and
tokens, and each ending's token count and tokens. Written here from Python's own reading of the
HellaSwag JSONL, with struct, so that prepare_data --hellaswag can be compared with it byte for byte.

The tokens come from prepare_data's plain JSONL path (one document per text, each after an
<|endoftext|>), not from its HellaSwag path, and are checked on their own: every text's tokens
decode, through encoder.json and GPT-2's byte-to-character table, to exactly the text's UTF-8 bytes,
and the first example's context has the ids that encoder.json gives its words.

    hellaswag_writer.py texts EXAMPLES.jsonl TEXTS.jsonl
        the context and " " + each ending of every example, one {"text": ...} per line
    hellaswag_writer.py write VOCAB_DIR EXAMPLES.jsonl TOKENS.bin OUT.bin
        checks TOKENS.bin (prepare_data's encoding of TEXTS.jsonl) and writes OUT.bin
"""
import json
import struct
import sys

EOT = 50256


def examples(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def texts_of(example):
    # hellaswag.py's render_example: the context as it is, each ending after a space
    return [example["ctx"]] + [" " + e for e in example["endings"]]


def byte_of_char():
    """GPT-2's table from the characters of encoder.json's keys to bytes: the printable bytes stand for
    themselves, the other 68 for the characters from U+0100 on, in byte order."""
    printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
    table = {chr(b): b for b in printable}
    others = [b for b in range(256) if b not in table.values()]
    table.update({chr(256 + i): b for i, b in enumerate(others)})
    return table


def read_tokens(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, n = struct.unpack_from("<3i", data)
    assert magic == 20240520 and version == 1 and len(data) == 1024 + 2 * n, f"{path}: not a token file"
    return list(struct.unpack_from(f"<{n}H", data, 1024))


def split_documents(tokens):
    docs = []
    for t in tokens:
        if t == EOT:
            docs.append([])
        else:
            docs[-1].append(t)
    return docs


def evalfile(rows):
    """rows: (label, context tokens, [ending tokens] * 4) per example."""
    stream, longest = [], 0
    for index, (label, context, endings) in enumerate(rows):
        values = [65535, 0, index, label, len(endings), len(context)] + context
        for e in endings:
            values += [len(e)] + e
        values[1] = 2 * len(values)
        longest = max(longest, values[1])
        stream += values
    header = struct.pack("<4i", 20240522, 1, len(rows), longest) + bytes(4 * 252)
    return header + struct.pack(f"<{len(stream)}H", *stream)


def main():
    if sys.argv[1] == "texts":
        _, _, examples_path, out = sys.argv
        with open(out, "w", encoding="utf-8") as f:
            for ex in examples(examples_path):
                for text in texts_of(ex):
                    f.write(json.dumps({"text": text}) + "\n")
        return
    _, _, vocab, examples_path, tokens_path, out = sys.argv
    with open(f"{vocab}/encoder.json", encoding="utf-8") as f:
        encoder = json.load(f)
    decoder = {i: s for s, i in encoder.items()}
    table = byte_of_char()
    exs = examples(examples_path)
    docs = split_documents(read_tokens(tokens_path))
    assert len(docs) == 5 * len(exs), f"{len(docs)} documents for {len(exs)} examples"
    for i, ex in enumerate(exs):
        for k, text in enumerate(texts_of(ex)):
            got = bytes(table[c] for t in docs[5 * i + k] for c in decoder[t])
            if got != text.encode("utf-8"):
                sys.exit(f"FAIL example {i} text {k}: the tokens decode to {got!r}, not {text!r}")
    words = ["A", "Ġman", "Ġis", "Ġsitting", "Ġon", "Ġa", "Ġroof", ".", "Ġhe"]
    assert exs[0]["ctx"] == "A man is sitting on a roof. he"
    if docs[0] != [encoder[w] for w in words]:
        sys.exit(f"FAIL the first context's tokens {docs[0]} are not encoder.json's ids of {words}")
    print(f"PASS the tokens of {len(docs)} texts decode to exactly their UTF-8 bytes, and the first context "
          f"has encoder.json's ids {docs[0]}")
    rows = [(ex["label"], docs[5 * i], docs[5 * i + 1 : 5 * i + 5]) for i, ex in enumerate(exs)]
    with open(out, "wb") as f:
        f.write(evalfile(rows))


if __name__ == "__main__":
    main()
