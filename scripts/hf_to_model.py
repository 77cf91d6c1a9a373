#!/usr/bin/env python3
"""A Hugging Face GPT-2 checkpoint to our model file (llm.c's format), for fine-tuning with -e FILE.

    scripts/hf_to_model.py DIR|FILE -o model.bin [--bf16]

DIR holds config.json and model.safetensors (or model.safetensors.index.json and its shards, or
pytorch_model.bin where PyTorch is installed); FILE is one of those weight files, its config.json beside it.
Any size works (gpt2, gpt2-medium, -large, -xl, or other L/C/NH/max T). Conv1D weights, stored (in, out),
are transposed to our (out, in); the head is tied to wte; the vocabulary is padded to a multiple of 128
(50257 to 50304) with rows of zeros. The model file is fp32 (version 3), or bf16 (version 5) with --bf16.

Refused, naming the file and the field or tensor, with exit status 1: a config.json of another model type
or architecture, or with settings our GPT-2 does not compute (activation, layer norm epsilon, attention
scaling, inner size, untied head), a missing or unexpected tensor, a tensor of the wrong shape or type.
"""
import argparse
import json
import math
import os

import numpy as np

from hf_gpt2 import Refused, hf_names, main_guard, padded_vocab, shapes, write_model

ARCHITECTURES = ("GPT2LMHeadModel", "GPT2Model")
# Buffers that older transformers saved: the causal mask and its fill value, not parameters.
BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias")


def find_files(path):
    """(config.json, weight file) of a directory or of a weight file."""
    if os.path.isdir(path):
        for name in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"):
            if os.path.isfile(os.path.join(path, name)):
                return os.path.join(path, "config.json"), os.path.join(path, name)
        raise Refused(f"{path}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin in it")
    if not os.path.isfile(path):
        raise Refused(f"{path}: no such file or directory")
    return os.path.join(os.path.dirname(path) or ".", "config.json"), path


def read_config(path):
    """The sizes of the model that config.json describes, after checking that our GPT-2 computes it."""
    try:
        with open(path) as f:
            config = json.load(f)
    except OSError as e:
        raise Refused(f"cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise Refused(f"{path}: not JSON: {e}") from None
    if not isinstance(config, dict):
        raise Refused(f"{path}: not a JSON object")

    def field(name, default=None, required=True):
        if name not in config:
            if required:
                raise Refused(f"{path}: field {name} is missing")
            return default
        return config[name]

    def size(name, limit):
        value = field(name)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
            raise Refused(f"{path}: field {name} is {value!r}, not a whole number in 1..{limit}")
        return value

    def expect(name, default, allowed, why):
        value = field(name, default, required=False)
        if value not in allowed:
            raise Refused(f"{path}: field {name} is {value!r}: {why}")

    if field("model_type") != "gpt2":
        raise Refused(f"{path}: field model_type is {config['model_type']!r}, not 'gpt2'")
    architectures = field("architectures", [], required=False)
    if not isinstance(architectures, list) or any(a not in ARCHITECTURES for a in architectures):
        raise Refused(f"{path}: field architectures is {architectures!r}: only {' and '.join(ARCHITECTURES)} "
                      "are GPT-2 language models")
    L, NH, C = size("n_layer", 1024), size("n_head", 65536), size("n_embd", 65536)
    max_t, V = size("n_positions", 1 << 20), size("vocab_size", 65536)  # tokens are uint16 here
    if C % NH:
        raise Refused(f"{path}: field n_head {NH} does not divide n_embd {C}")
    expect("activation_function", "gelu_new", ("gelu_new", "gelu_pytorch_tanh"),
           "our GPT-2 computes GELU's tanh approximation (gelu_new) only")
    epsilon = field("layer_norm_epsilon", 1e-5, required=False)
    if epsilon != 1e-5:
        raise Refused(f"{path}: field layer_norm_epsilon is {epsilon!r}: our layer norms use 1e-05")
    expect("n_inner", None, (None, 4 * C), f"our MLP's inner size is 4 n_embd ({4 * C})")
    expect("scale_attn_weights", True, (True,), "our attention scales by 1/sqrt(head size)")
    expect("scale_attn_by_inverse_layer_idx", False, (False,), "our attention does not scale by the layer")
    expect("add_cross_attention", False, (False,), "our GPT-2 has no cross-attention")
    expect("tie_word_embeddings", True, (True,), "our output head is wte")
    return dict(max_t=max_t, V=V, L=L, NH=NH, C=C)


def load_safetensors(path):
    """name -> numpy array of one .safetensors file. bfloat16, which numpy lacks, widens to fp32."""
    from safetensors import SafetensorError, safe_open

    out = {}
    try:
        with safe_open(path, framework="numpy") as f:
            for name in f.keys():
                part = f.get_slice(name)
                if part.get_dtype() == "BF16":
                    raw = read_raw_tensor(path, name)
                    out[name] = (raw.astype(np.uint32) << 16).view(np.float32).reshape(part.get_shape())
                else:
                    out[name] = f.get_tensor(name)
    except (SafetensorError, OSError) as e:
        raise Refused(f"{path}: cannot read it as safetensors: {e}") from None
    return out


def read_raw_tensor(path, name):
    """The 16-bit values of one tensor of a safetensors file, from its header (8-byte size, JSON)."""
    with open(path, "rb") as f:
        header_bytes = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_bytes))
        start, end = header[name]["data_offsets"]
        f.seek(8 + header_bytes + start)
        return np.frombuffer(f.read(end - start), dtype=np.uint16)


def load_weights(path):
    """name -> numpy array of a weight file: safetensors, a sharded safetensors index, or PyTorch's."""
    if path.endswith(".index.json"):
        try:
            with open(path) as f:
                weight_map = json.load(f)["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise Refused(f"{path}: not a safetensors index with a weight_map: {e}") from None
        out = {}
        for shard in sorted(set(weight_map.values())):
            out.update(load_safetensors(os.path.join(os.path.dirname(path), shard)))
        return out
    if path.endswith(".bin"):
        try:
            import torch
        except ImportError:
            raise Refused(f"{path}: a PyTorch file needs torch, which is not installed; use the checkpoint's "
                          "model.safetensors instead") from None
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises many kinds for a file that is not its own
            raise Refused(f"{path}: cannot read it as a PyTorch checkpoint: {e}") from None
        return {name: t.float().numpy() for name, t in state.items()}
    return load_safetensors(path)


def convert(weights, cfg, path):
    """Our tensors (fp32, model-file shapes) from the Hugging Face tensors, every one checked."""
    max_t, V, L, C = cfg["max_t"], cfg["V"], cfg["L"], cfg["C"]
    # GPT2LMHeadModel's names start with transformer., GPT2Model's (the gpt2 repository's) do not.
    prefix = "transformer." if any(n.startswith("transformer.") for n in weights) else ""
    used = set()

    def take(name, shape, transpose):
        full = prefix + name
        if full not in weights:
            raise Refused(f"{path}: tensor {full} is missing (config.json: n_layer {L}, n_embd {C})")
        value = weights[full]
        if not np.issubdtype(value.dtype, np.floating):
            raise Refused(f"{path}: tensor {full} has type {value.dtype}, not floating point")
        if value.shape != shape:
            raise Refused(f"{path}: tensor {full} has shape {tuple(value.shape)}, config.json's n_layer {L}, "
                          f"n_embd {C}, n_positions {max_t}, vocab_size {V} give {shape}")
        used.add(full)
        return value.T if transpose else value

    tensors = {}
    for ours, shape, hf_name, transpose, hf_shape in shapes(max_t, V, padded_vocab(V), L, C):
        parts = [take(n, hf_shape, transpose) for n in hf_names(hf_name, L)]
        value = np.stack(parts) if hf_name.startswith("h.N.") else parts[0]
        tensors[ours] = np.zeros(shape, dtype=np.float32)
        tensors[ours][: value.shape[0]] = value  # wte: rows V..Vp stay zero
    head = weights.get("lm_head.weight")
    if head is not None:
        if head.shape != (V, C) or not np.array_equal(head, weights[prefix + "wte.weight"]):
            raise Refused(f"{path}: tensor lm_head.weight differs from {prefix}wte.weight: our head is tied to wte")
        used.add("lm_head.weight")
    for name in sorted(weights):
        if name not in used and not name.endswith(BUFFER_SUFFIXES):
            raise Refused(f"{path}: unexpected tensor {name} (config.json: n_layer {L}); not a GPT-2 of this "
                          "configuration")
    for name, value in tensors.items():
        if not np.isfinite(value).all():
            raise Refused(f"{path}: the tensor that becomes our {name} has values that are not finite")
    return tensors


def main():
    parser = argparse.ArgumentParser(description="Hugging Face GPT-2 checkpoint to our model file.")
    parser.add_argument("checkpoint", help="directory with config.json and model.safetensors, or a weight file")
    parser.add_argument("-o", "--out", required=True, help="model file to write")
    parser.add_argument("--bf16", action="store_true", help="write bf16 (version 5) instead of fp32 (version 3)")
    args = parser.parse_args()
    config_path, weights_path = find_files(args.checkpoint)
    cfg = read_config(config_path)
    tensors = convert(load_weights(weights_path), cfg, weights_path)
    write_model(args.out, cfg["max_t"], cfg["V"], cfg["L"], cfg["NH"], cfg["C"], tensors, bf16=args.bf16)
    count = sum(math.prod(value.shape) for value in tensors.values())
    print(f"wrote {args.out}: L {cfg['L']}, C {cfg['C']}, NH {cfg['NH']}, max T {cfg['max_t']}, V {cfg['V']} "
          f"(padded {padded_vocab(cfg['V'])}), {count} parameters, {'bf16' if args.bf16 else 'fp32'}")


if __name__ == "__main__":
    main_guard(main)
