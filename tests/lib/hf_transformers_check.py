#!/usr/bin/env python3
"""transformers' side of tests/gpu/test_hf_gpu.sh (needs torch and transformers; runs on the GPU when there is one).

    hf_transformers_check.py logits DIR TOKENS N DUMP RTOL
        AutoModelForCausalLM.from_pretrained(DIR) loads with no missing, unexpected or mismatched tensor
        (GPT2LMHeadModel's head tied to wte), AutoTokenizer.from_pretrained(DIR) decodes the first N tokens
        of the token file TOKENS to text that it encodes back to the same tokens, and the model's fp32
        logits of those tokens are within RTOL of DUMP's (N x V fp32, tests/lib/dump_logits.c): every row's
        largest |difference| at most RTOL times the row's largest |logit|
    hf_transformers_check.py generate DIR PROMPT N OURS
        greedy generation of N tokens after <|endoftext|> and PROMPT (as train_gpt --prompt starts)
        gives the text in the file OURS (train_gpt's standard output: the prompt, the continuation, a
        newline)
    hf_transformers_check.py random DIR L C NH T
        a GPT2LMHeadModel of GPT2Config(n_layer L, n_embd C, n_head NH, n_positions T) with transformers'
        own random init (seed 0), saved with save_pretrained (model.safetensors, config.json), and its
        state_dict saved by torch.save as DIR-bin/pytorch_model.bin
    hf_transformers_check.py loss DIR TOKENS B T LOSS
        transformers' mean cross-entropy of train_gpt's first batch (B sequences of T tokens from the
        start of the token file, targets shifted by one) within 1e-5 relative of LOSS
Exits 1 with a line starting FAIL when a check fails.
"""
import os
import shutil
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel

torch.backends.cuda.matmul.allow_tf32 = False  # fp32 products in fp32, as the FP32 build computes them
torch.backends.cudnn.allow_tf32 = False
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def tokens_of(path, n):
    raw = np.fromfile(path, dtype=np.uint8)
    assert raw[:4].view(np.int32)[0] == 20240520, f"{path}: not a token file"
    return raw[1024:].view(np.uint16)[:n].astype(np.int64)


def load(path):
    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, dtype=torch.float32)
    # The causal masks (attn.bias, attn.masked_bias) are buffers that transformers makes, not weights.
    masks = ("attn.bias", "attn.masked_bias")
    info["missing_keys"] = [k for k in info.get("missing_keys", []) if not k.endswith(masks)]
    problems = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if problems:
        sys.exit(f"FAIL from_pretrained({path}): {problems}")
    return model.to(DEVICE).eval()


def logits(path, token_file, n, dump, rtol):
    tokens = tokens_of(token_file, n)
    tokenizer = AutoTokenizer.from_pretrained(path)
    text = tokenizer.decode(tokens.tolist())
    again = tokenizer(text).input_ids
    if again != tokens.tolist():
        sys.exit(f"FAIL AutoTokenizer({path}) encodes its own decoding of {n} tokens to other tokens")
    model = load(path)
    with torch.no_grad():
        ref = model(torch.tensor(tokens[None], device=DEVICE)).logits[0].double().cpu().numpy()
    got = np.fromfile(dump, dtype=np.float32).astype(np.float64)
    if got.size != ref.size:
        sys.exit(f"FAIL {dump}: {got.size} logits, transformers gives {ref.size}")
    got = got.reshape(ref.shape)
    rel = (np.abs(got - ref).max(-1) / np.abs(ref).max(-1)).max()
    agree = (got.argmax(-1) == ref.argmax(-1)).mean()
    if not rel <= rtol:
        sys.exit(f"FAIL logits of {path}: largest difference {rel:.2e} of a row's largest logit, above {rtol:g} "
                 f"(argmax agrees at {agree:.0%} of the positions)")
    print(f"PASS transformers loads {path} (no missing or unexpected tensor), its tokenizer round-trips {n} tokens, "
          f"and its logits are within {rel:.2e} (<= {rtol:g}) of ours; argmax agrees at {agree:.0%} of the positions")


def generate(path, prompt, n, ours_file):
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = load(path)
    ids = torch.tensor([[tokenizer.eos_token_id] + tokenizer(prompt).input_ids], device=DEVICE)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=tokenizer.eos_token_id)
        scores = model(out[:, :-1]).logits[0, ids.shape[1] - 1 :]
    new = out[0, ids.shape[1] :].tolist()
    if tokenizer.eos_token_id in new:
        new = new[: new.index(tokenizer.eos_token_id)]  # train_gpt stops there too
    theirs = prompt + tokenizer.decode(new) + "\n"
    with open(ours_file, encoding="utf-8", errors="replace") as f:
        ours = f.read()
    top2 = scores.topk(2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1]).min().item()
    if ours != theirs:
        sys.exit(f"FAIL greedy generation: ours {ours!r}, transformers' {theirs!r} "
                 f"(smallest top-2 margin {margin:.3g})")
    print(f"PASS greedy generation of {len(new)} tokens equal token for token: {theirs.strip()!r} "
          f"(smallest top-2 logit margin {margin:.3g})")


def random_model(path, L, C, NH, T):
    torch.manual_seed(0)
    config = GPT2Config(n_layer=L, n_embd=C, n_head=NH, n_positions=T, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    model.save_pretrained(path)
    # The same weights as PyTorch's pickle, as older checkpoints have them (with the tied lm_head.weight).
    os.makedirs(f"{path}-bin", exist_ok=True)
    shutil.copyfile(f"{path}/config.json", f"{path}-bin/config.json")
    torch.save(model.state_dict(), f"{path}-bin/pytorch_model.bin")
    print(f"made {path} and {path}-bin (pytorch_model.bin): GPT2LMHeadModel(L {L}, C {C}, NH {NH}, T {T}) "
          "with transformers' init")


def loss(path, token_file, B, T, ours):
    tokens = torch.tensor(tokens_of(token_file, B * T + 1), device=DEVICE)
    model = load(path)
    with torch.no_grad():
        out = model(tokens[:-1].view(B, T)).logits.float()
        ref = torch.nn.functional.cross_entropy(out.view(B * T, -1), tokens[1:]).item()
    rel = abs(ours - ref) / ref
    if not rel <= 1e-5:
        sys.exit(f"FAIL first loss: ours {ours:.7f}, transformers' {ref:.7f} (relative difference {rel:.2e} > 1e-5)")
    print(f"PASS first loss of the imported transformers model: ours {ours:.7f}, transformers' {ref:.7f} "
          f"(relative difference {rel:.2e} <= 1e-5)")


def main():
    cmd, a = sys.argv[1], sys.argv[2:]
    if cmd == "logits":
        logits(a[0], a[1], int(a[2]), a[3], float(a[4]))
    elif cmd == "generate":
        generate(a[0], a[1], int(a[2]), a[3])
    elif cmd == "random":
        random_model(a[0], *(int(x) for x in a[1:5]))
    elif cmd == "loss":
        loss(a[0], a[1], int(a[2]), int(a[3]), float(a[4]))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
