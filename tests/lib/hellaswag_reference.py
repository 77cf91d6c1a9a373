#!/usr/bin/env python3
"""An independent HellaSwag scorer in NumPy float64, for tests/e2e/test_hellaswag.sh: reads a model file in
our (llm.c's) format and an evaluation file in llm.c's format, runs GPT-2's forward over each row
(context + ending) on its own, scores each ending by the mean loss of its tokens (llm.c's acc_norm),
and compares with the scores train_gpt_cpu --hellaswag-dump wrote.

    hellaswag_reference.py MODEL.bin HELLASWAG.bin DUMP.csv [RTOL]

Every ending's score must be within RTOL (default 1e-4) relative of ours and every predicted ending
(the lowest score, the first of equal ones) the same; prints one line per example; exits 1 if not.
"""
import csv
import math
import sys

import numpy as np


def read_model(path):
    """The parameters as float64 arrays, from the header (256 int32: magic 20240326, version 3 fp32 or
    5 bf16, max T, V, L, NH, C, Vp) and the tensors in the model file's order."""
    raw = np.fromfile(path, dtype=np.uint8)
    header = raw[:1024].view(np.int32)
    magic, version, max_t, V, L, NH, C, Vp = (int(x) for x in header[:8])
    assert magic == 20240326 and version in (3, 5), f"{path}: not a model file"
    if version == 3:
        values = raw[1024:].view(np.float32).astype(np.float64)
    else:  # bf16: the top half of an fp32
        values = (raw[1024:].view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    shapes = [("wte", (Vp, C)), ("wpe", (max_t, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
              ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)),
              ("ln2w", (L, C)), ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)),
              ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,))]
    p, at = {}, 0
    for name, shape in shapes:
        n = math.prod(shape)
        p[name] = values[at : at + n].reshape(shape)
        at += n
    assert at == len(values), f"{path}: {len(values)} parameters, the header gives {at}"
    return p, V, L, NH, C


def read_examples(path):
    """(label, context, [4 endings]) per example of llm.c's evaluation file."""
    raw = np.fromfile(path, dtype=np.uint8)
    magic, version, n = (int(x) for x in raw[:12].view(np.int32))
    assert magic == 20240522 and version == 1, f"{path}: not a HellaSwag file"
    v = raw[1024:].view(np.uint16).astype(int)
    out, at = [], 0
    for i in range(n):
        assert v[at] == 65535 and v[at + 2] == i and v[at + 4] == 4
        end, label = at + v[at + 1] // 2, v[at + 3]
        at += 5
        seqs = []
        for _ in range(5):
            seqs.append(list(v[at + 1 : at + 1 + v[at]]))
            at += 1 + v[at]
        assert at == end
        out.append((label, seqs[0], seqs[1:]))
    return out


def layernorm(x, w, b):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * w + b


def gelu(x):  # the tanh approximation, as GPT-2
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def token_losses(p, V, L, NH, C, tokens, targets):
    """The cross-entropy of each target given the tokens up to its position."""
    T, hs = len(tokens), C // NH
    x = p["wte"][tokens] + p["wpe"][:T]
    causal = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(L):
        h = layernorm(x, p["ln1w"][l], p["ln1b"][l])
        qkv = h @ p["qkvw"][l].T + p["qkvb"][l]
        q, k, v = (qkv[:, i * C : (i + 1) * C].reshape(T, NH, hs).transpose(1, 0, 2) for i in range(3))
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(hs) + causal
        att = np.exp(scores - scores.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(1, 0, 2).reshape(T, C)
        x = x + y @ p["attprojw"][l].T + p["attprojb"][l]
        h = layernorm(x, p["ln2w"][l], p["ln2b"][l])
        x = x + gelu(h @ p["fcw"][l].T + p["fcb"][l]) @ p["fcprojw"][l].T + p["fcprojb"][l]
    logits = layernorm(x, p["lnfw"], p["lnfb"]) @ p["wte"][:V].T  # the real vocabulary only
    top = logits.max(-1, keepdims=True)
    logsumexp = (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))[:, 0]
    return logsumexp - logits[np.arange(T), targets]


def score(p, V, L, NH, C, context, ending):
    row = context + ending
    losses = token_losses(p, V, L, NH, C, row[:-1], row[1:])
    return losses[len(context) - 1 :].mean()  # the ending's tokens


def main():
    model, hellaswag, dump = sys.argv[1:4]
    rtol = float(sys.argv[4]) if len(sys.argv) > 4 else 1e-4
    p, V, L, NH, C = read_model(model)
    examples = read_examples(hellaswag)
    with open(dump) as f:
        ours = list(csv.DictReader(f))
    failed, worst, right = 0, 0.0, 0
    for row in ours:
        i = int(row["example"])
        label, context, endings = examples[i]
        ref = [score(p, V, L, NH, C, context, e) for e in endings]
        got = [float(row[f"loss{j}"]) for j in range(4)]
        pred = min(range(4), key=lambda j: (ref[j], j))
        rel = max(abs(g - r) / abs(r) for g, r in zip(got, ref))
        worst = max(worst, rel)
        ok = rel <= rtol and int(row["prediction"]) == pred and int(row["label"]) == label
        failed += not ok
        right += pred == label
        print(f"{'ok  ' if ok else 'FAIL'} example {i}: label {label}, predicted {row['prediction']} "
              f"(reference {pred}); scores {' '.join(f'{g:.6f}' for g in got)}, worst relative difference {rel:.2e}")
    if failed or not ours:
        sys.exit(f"FAIL {failed} of {len(ours)} examples differ from the float64 reference (rtol {rtol:g})")
    print(f"PASS {len(ours)} examples: every ending's score within {worst:.2e} relative (<= {rtol:g}) of the "
          f"float64 reference, the same predictions; accuracy {right}/{len(ours)}")


if __name__ == "__main__":
    main()
