#!/usr/bin/env python3
"""Our model file (llm.c's format) to a Hugging Face GPT-2 directory, for transformers and the tools built on it.

    scripts/model_to_hf.py model.bin -o DIR [--vocab data/gpt2]

Writes into DIR (made if missing):
  config.json              a GPT2Config of the model's sizes (model_type gpt2, GPT2LMHeadModel)
  model.safetensors        fp32 tensors named as GPT2LMHeadModel saves them (transformer.h.N.attn.c_attn.weight
                           and so on), Conv1D weights (in, out), wte unpadded to V rows; no lm_head.weight,
                           which transformers ties to wte. A bf16 model file widens to fp32 exactly.
  vocab.json, merges.txt   GPT-2's tokenizer: --vocab DIR's encoder.json and vocab.bpe, as they are
  tokenizer_config.json, generation_config.json
so that AutoModelForCausalLM.from_pretrained(DIR) and AutoTokenizer.from_pretrained(DIR) load it, and
lm-evaluation-harness runs on it: lm_eval --model hf --model_args pretrained=DIR --tasks hellaswag
The rows of wte past V (the padding to a multiple of 128, which no token reaches) are not exported.
"""
import argparse
import json
import os
import shutil

import numpy as np

from hf_gpt2 import Refused, hf_names, main_guard, read_model, shapes

EOT = 50256  # <|endoftext|>


def gpt2_config(cfg):
    """config.json with GPT2Config's fields. Dropout 0: the model was trained without it."""
    return {
        "activation_function": "gelu_new",
        "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.0,
        "bos_token_id": EOT,
        "dtype": "float32",
        "embd_pdrop": 0.0,
        "eos_token_id": EOT,
        "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05,
        "model_type": "gpt2",
        "n_ctx": cfg["max_t"],
        "n_embd": cfg["C"],
        "n_head": cfg["NH"],
        "n_inner": None,
        "n_layer": cfg["L"],
        "n_positions": cfg["max_t"],
        "reorder_and_upcast_attn": False,
        "resid_pdrop": 0.0,
        "scale_attn_by_inverse_layer_idx": False,
        "scale_attn_weights": True,
        "summary_activation": None,
        "summary_first_dropout": 0.0,
        "summary_proj_to_labels": True,
        "summary_type": "cls_index",
        "summary_use_proj": True,
        "tie_word_embeddings": True,
        "use_cache": True,
        "vocab_size": cfg["V"],
    }


def tokenizer_config(max_t):
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "errors": "replace",
        "model_max_length": max_t,
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": "<|endoftext|>",
    }


def hf_tensors(cfg, tensors):
    """Hugging Face name -> fp32 array (contiguous) of our tensors."""
    out = {}
    for ours, _, hf_name, transpose, _ in shapes(cfg["max_t"], cfg["V"], cfg["Vp"], cfg["L"], cfg["C"]):
        value = tensors[ours][: cfg["V"]] if ours == "wte" else tensors[ours]
        names = hf_names(hf_name, cfg["L"])
        parts = list(value) if hf_name.startswith("h.N.") else [value]
        for name, part in zip(names, parts):
            out["transformer." + name] = np.ascontiguousarray(part.T if transpose else part, dtype=np.float32)
    return out


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=2)
        f.write("\n")


def main():
    parser = argparse.ArgumentParser(description="Our model file to a Hugging Face GPT-2 directory.")
    parser.add_argument("model", help="model file (fp32 or bf16)")
    parser.add_argument("-o", "--out", required=True, help="directory to write (made if missing)")
    parser.add_argument("--vocab", default="data/gpt2",
                        help="directory of encoder.json and vocab.bpe (default data/gpt2)")
    args = parser.parse_args()
    cfg, tensors, _ = read_model(args.model)
    vocab_files = [(os.path.join(args.vocab, src), dst) for src, dst in
                   (("encoder.json", "vocab.json"), ("vocab.bpe", "merges.txt"))]
    for src, _ in vocab_files:
        if not os.path.isfile(src):
            raise Refused(f"{src}: no such file (the GPT-2 tokenizer: --vocab DIR, filled by scripts/get_data.sh)")
    from safetensors.numpy import save_file

    try:
        os.makedirs(args.out, exist_ok=True)
        # transformers refuses a safetensors file whose metadata does not name its format.
        save_file(hf_tensors(cfg, tensors), os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
        write_json(os.path.join(args.out, "config.json"), gpt2_config(cfg))
        write_json(os.path.join(args.out, "tokenizer_config.json"), tokenizer_config(cfg["max_t"]))
        write_json(os.path.join(args.out, "generation_config.json"), {"bos_token_id": EOT, "eos_token_id": EOT})
        for src, dst in vocab_files:
            shutil.copyfile(src, os.path.join(args.out, dst))
    except OSError as e:
        raise Refused(f"cannot write {e.filename or args.out}: {e.strerror}") from None
    print(f"wrote {args.out}: L {cfg['L']}, C {cfg['C']}, NH {cfg['NH']}, max T {cfg['max_t']}, V {cfg['V']}, "
          f"fp32 safetensors, GPT-2 tokenizer")


if __name__ == "__main__":
    main_guard(main)
