#!/usr/bin/env python3
"""Hugging Face GPT-2 checkpoints made without transformers, and a float64 NumPy GPT-2 that reads them, for
tests/e2e/test_hf.sh. Independent of scripts/hf_gpt2.py: it knows Hugging Face's layout (Conv1D weights
(in, out), applied as x @ W + b; the head tied to wte) and nothing of our model file.

    hf_reference.py make DIR --layers L --channels C --heads NH --max-seq T [--vocab V] [--seed S]
        config.json as transformers writes a GPT2Config and model.safetensors with GPT2LMHeadModel's names,
        random weights (biases and layer norms too, so that a mix-up of any two tensors shows)
    hf_reference.py logits DIR TOKENS N DUMP [--rtol X] [--swap-c-proj]
        the logits of the first N tokens of a token file against DUMP (N x V fp32, tests/lib/dump_logits.c):
        every row's largest |difference| within X (default 1e-5) of the row's largest |logit|.
        --swap-c-proj: the reference reads attn.c_proj's weight as (out, in), the mistake a converter makes
        when it forgets to transpose that square Conv1D (the check must then fail)
    hf_reference.py same DIR1 DIR2
        the two model.safetensors hold the same names, shapes, types and bits
    hf_reference.py edit SRC DST ACTION...
        a copy of a checkpoint, changed: drop=NAME, add=NAME (a copy of wte), shape=NAME (one row less),
        config=FIELD=JSON, unprefix (GPT2Model's names, without transformer., and attn.bias masks)
    hf_reference.py variants SRC DIR ACTION...
        copies of a checkpoint changed by one ACTION each, as DIR/1, DIR/2, ... (one process for many)
Exits 1 with a line starting FAIL when a check fails.
"""
import json
import math
import os
import sys

import numpy as np
from safetensors.numpy import load_file, save_file


def gpt2_config(L, C, NH, max_t, V):
    """The fields transformers 4.x writes for GPT2Config (dropouts and summary fields included)."""
    return {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
            "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
            "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": max_t, "n_embd": C, "n_head": NH,
            "n_inner": None, "n_layer": L, "n_positions": max_t, "reorder_and_upcast_attn": False,
            "resid_pdrop": 0.1, "scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True,
            "summary_activation": None, "summary_first_dropout": 0.1, "summary_proj_to_labels": True,
            "summary_type": "cls_index", "summary_use_proj": True, "torch_dtype": "float32",
            "transformers_version": "4.46.3", "use_cache": True, "vocab_size": V}


def make(out, L, C, NH, max_t, V, seed):
    rng = np.random.default_rng(seed)
    normal = lambda *shape, std=0.02: rng.normal(0.0, std, shape).astype(np.float32)
    t = {"transformer.wte.weight": normal(V, C), "transformer.wpe.weight": normal(max_t, C, std=0.01)}
    for l in range(L):
        h = f"transformer.h.{l}."
        t[h + "ln_1.weight"], t[h + "ln_1.bias"] = 1 + normal(C, std=0.1), normal(C, std=0.1)
        t[h + "attn.c_attn.weight"], t[h + "attn.c_attn.bias"] = normal(C, 3 * C, std=0.2), normal(3 * C)
        t[h + "attn.c_proj.weight"], t[h + "attn.c_proj.bias"] = normal(C, C, std=0.1), normal(C)
        t[h + "ln_2.weight"], t[h + "ln_2.bias"] = 1 + normal(C, std=0.1), normal(C, std=0.1)
        t[h + "mlp.c_fc.weight"], t[h + "mlp.c_fc.bias"] = normal(C, 4 * C, std=0.1), normal(4 * C)
        t[h + "mlp.c_proj.weight"], t[h + "mlp.c_proj.bias"] = normal(4 * C, C, std=0.05), normal(C)
    t["transformer.ln_f.weight"], t["transformer.ln_f.bias"] = 1 + normal(C, std=0.1), normal(C, std=0.1)
    save(out, t, gpt2_config(L, C, NH, max_t, V))


def save(out, tensors, config):
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def load(path):
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    return load_file(os.path.join(path, "model.safetensors")), config


def layernorm(x, w, b):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * w + b


def forward(tensors, config, tokens, swap_c_proj=False):
    """GPT2LMHeadModel's logits (T x V) in float64."""
    p = {name.removeprefix("transformer."): v.astype(np.float64) for name, v in tensors.items()}
    C, NH, T = config["n_embd"], config["n_head"], len(tokens)
    hs = C // NH
    conv1d = lambda x, name: x @ p[name + ".weight"] + p[name + ".bias"]
    x = p["wte.weight"][tokens] + p["wpe.weight"][:T]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(config["n_layer"]):
        h = f"h.{l}."
        a = conv1d(layernorm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"]), h + "attn.c_attn")
        q, k, v = (a[:, i * C : (i + 1) * C].reshape(T, NH, hs).transpose(1, 0, 2) for i in range(3))
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(hs) + mask
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        y = (weights @ v).transpose(1, 0, 2).reshape(T, C)
        if swap_c_proj:
            y = y @ p[h + "attn.c_proj.weight"].T + p[h + "attn.c_proj.bias"]
        else:
            y = conv1d(y, h + "attn.c_proj")
        x = x + y
        m = conv1d(layernorm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"]), h + "mlp.c_fc")
        m = 0.5 * m * (1 + np.tanh(math.sqrt(2 / math.pi) * (m + 0.044715 * m**3)))
        x = x + conv1d(m, h + "mlp.c_proj")
    return layernorm(x, p["ln_f.weight"], p["ln_f.bias"]) @ p["wte.weight"].T


def read_tokens(path, n):
    raw = np.fromfile(path, dtype=np.uint8)
    header = raw[:1024].view(np.int32)
    assert header[0] == 20240520 and header[2] >= n, f"{path}: not a token file of {n} tokens or more"
    return raw[1024:].view(np.uint16)[:n].astype(np.int64)


def logits(args):
    path, token_file, n, dump = args[:4]
    rtol = float(args[args.index("--rtol") + 1]) if "--rtol" in args else 1e-5
    tensors, config = load(path)
    ref = forward(tensors, config, read_tokens(token_file, int(n)), swap_c_proj="--swap-c-proj" in args)
    got = np.fromfile(dump, dtype=np.float32).astype(np.float64)
    if got.size != ref.size:
        sys.exit(f"FAIL {dump}: {got.size} logits, the reference has {ref.size}")
    got = got.reshape(ref.shape)
    rel = (np.abs(got - ref).max(-1) / np.abs(ref).max(-1)).max()
    if not rel <= rtol:
        sys.exit(f"FAIL logits of {path}: largest difference {rel:.2e} of a row's largest logit, above {rtol:g}")
    print(f"PASS logits of {path} ({ref.shape[0]} positions x {ref.shape[1]}) within {rel:.2e} of the float64 "
          f"Hugging Face GPT-2 (<= {rtol:g} of each row's largest logit)")


def same(a, b):
    ta, tb = (load_file(os.path.join(d, "model.safetensors")) for d in (a, b))
    if sorted(ta) != sorted(tb):
        sys.exit(f"FAIL {a} and {b} hold other tensors: {sorted(set(ta) ^ set(tb))}")
    for name in ta:
        x, y = ta[name], tb[name]
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            sys.exit(f"FAIL tensor {name} differs: {x.dtype} {x.shape} and {y.dtype} {y.shape}")
    print(f"PASS {a} and {b}: the same {len(ta)} tensors, bit for bit")


def edit(src, dst, actions):
    tensors, config = load(src)
    for action in actions:
        kind, _, what = action.partition("=")
        if kind == "drop":
            del tensors[what]
        elif kind == "add":
            tensors[what] = tensors["transformer.wte.weight"].copy()
        elif kind == "shape":
            tensors[what] = tensors[what][:-1].copy()
        elif kind == "unprefix":  # as GPT2Model saves, with the causal masks that older transformers saved
            tensors = {n.removeprefix("transformer."): v for n, v in tensors.items()}
            T = config["n_positions"]
            for l in range(config["n_layer"]):
                tensors[f"h.{l}.attn.bias"] = np.tril(np.ones((T, T), dtype=np.float32)).reshape(1, 1, T, T)
        elif kind == "config":
            field, _, value = what.partition("=")
            config[field] = json.loads(value)
        else:
            sys.exit(f"edit: unknown action {action}")
    save(dst, tensors, config)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "make":
        opt = lambda name, default=None: int(args[args.index(name) + 1]) if name in args else default
        make(args[0], opt("--layers"), opt("--channels"), opt("--heads"), opt("--max-seq"), opt("--vocab", 50257),
             opt("--seed", 0))
    elif cmd == "logits":
        logits(args)
    elif cmd == "same":
        same(*args)
    elif cmd == "edit":
        edit(args[0], args[1], args[2:])
    elif cmd == "variants":
        for i, action in enumerate(args[2:], 1):
            edit(args[0], os.path.join(args[1], str(i)), [action])
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
