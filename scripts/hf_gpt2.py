"""What scripts/hf_to_model.py and scripts/model_to_hf.py share: our model file (llm.c's format) and how its
tensors map to Hugging Face's GPT-2 names.

Model file: a header of 256 int32 ([0] 20240326, [1] 3 for fp32 or 5 for bf16, [2] max T, [3] V, [4] L,
[5] NH, [6] C, [7] Vp), then the 16 tensors in the order of TENSORS, weights (out, in). Hugging Face's GPT-2
keeps one tensor per layer, its Conv1D weights (in, out), and wte unpadded (V rows).
"""
import math
import os
import sys

import numpy as np

MAGIC, VERSION_FP32, VERSION_BF16 = 20240326, 3, 5
HEADER_INTS = 256


class Refused(Exception):
    """A problem with an input that the user must fix: the message names the file and the problem."""


def padded_vocab(V):
    """Vp as the trainer derives it (model/config.c, gpt2_padded_vocab): V rounded up to 128."""
    return (V + 127) // 128 * 128


def shapes(max_t, V, Vp, L, C):
    """Our 16 tensors: name, shape in the model file, Hugging Face name (N: the layer), whether the Hugging
    Face tensor is the transpose (Conv1D, (in, out)), shape of one Hugging Face tensor."""
    return [
        ("wte", (Vp, C), "wte.weight", False, (V, C)),
        ("wpe", (max_t, C), "wpe.weight", False, (max_t, C)),
        ("ln1w", (L, C), "h.N.ln_1.weight", False, (C,)),
        ("ln1b", (L, C), "h.N.ln_1.bias", False, (C,)),
        ("qkvw", (L, 3 * C, C), "h.N.attn.c_attn.weight", True, (C, 3 * C)),
        ("qkvb", (L, 3 * C), "h.N.attn.c_attn.bias", False, (3 * C,)),
        ("attprojw", (L, C, C), "h.N.attn.c_proj.weight", True, (C, C)),
        ("attprojb", (L, C), "h.N.attn.c_proj.bias", False, (C,)),
        ("ln2w", (L, C), "h.N.ln_2.weight", False, (C,)),
        ("ln2b", (L, C), "h.N.ln_2.bias", False, (C,)),
        ("fcw", (L, 4 * C, C), "h.N.mlp.c_fc.weight", True, (C, 4 * C)),
        ("fcb", (L, 4 * C), "h.N.mlp.c_fc.bias", False, (4 * C,)),
        ("fcprojw", (L, C, 4 * C), "h.N.mlp.c_proj.weight", True, (4 * C, C)),
        ("fcprojb", (L, C), "h.N.mlp.c_proj.bias", False, (C,)),
        ("lnfw", (C,), "ln_f.weight", False, (C,)),
        ("lnfb", (C,), "ln_f.bias", False, (C,)),
    ]


def hf_names(hf_name, L):
    """The Hugging Face tensor names of one of ours: one per layer for h.N.*."""
    return [hf_name.replace("N", str(l), 1) for l in range(L)] if hf_name.startswith("h.N.") else [hf_name]


def to_bf16(values):
    """fp32 to bf16 bits (uint16), rounded to the nearest, ties to even; NaN stays NaN."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    rounded[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def write_model(path, max_t, V, L, NH, C, tensors, bf16=False):
    """Writes the model file: tensors maps our names to fp32 arrays of the shapes above (Vp rows of wte).
    Written beside PATH and renamed, so an error leaves no half-written model file."""
    Vp = padded_vocab(V)
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:8] = [MAGIC, VERSION_BF16 if bf16 else VERSION_FP32, max_t, V, L, NH, C, Vp]
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(header.tobytes())
            for name, shape, _, _, _ in shapes(max_t, V, Vp, L, C):
                values = tensors[name]
                assert values.shape == shape and values.dtype == np.float32, name
                f.write(to_bf16(values).tobytes() if bf16 else values.tobytes())
        os.replace(tmp, path)
    except OSError as e:
        raise Refused(f"cannot write {path}: {e.strerror}") from None


def read_model(path):
    """Reads a model file: (config dict with max_t, V, Vp, L, NH, C; our tensors as fp32 arrays; version).
    bf16 values widen to fp32 exactly."""
    try:
        raw = np.fromfile(path, dtype=np.uint8)
    except OSError as e:
        raise Refused(f"cannot read {path}: {e.strerror}") from None
    if len(raw) < HEADER_INTS * 4:
        raise Refused(f"{path}: {len(raw)} bytes, too short for the {HEADER_INTS * 4}-byte header of a model file")
    magic, version, max_t, V, L, NH, C, Vp = (int(x) for x in raw[: HEADER_INTS * 4].view(np.int32)[:8])
    if magic != MAGIC:
        raise Refused(f"{path}: wrong magic number {magic} (expected {MAGIC}): not a model file")
    if version not in (VERSION_FP32, VERSION_BF16):
        raise Refused(f"{path}: unsupported model file version {version} (expected {VERSION_FP32} for fp32 or "
                      f"{VERSION_BF16} for bf16)")
    if min(max_t, V, L, NH, C) < 1 or Vp < V or C % NH:
        raise Refused(f"{path}: impossible sizes in the header (max T {max_t}, V {V}, L {L}, NH {NH}, C {C}, Vp {Vp})")
    layout = shapes(max_t, V, Vp, L, C)
    count = sum(math.prod(shape) for _, shape, _, _, _ in layout)
    width = 4 if version == VERSION_FP32 else 2
    if len(raw) != HEADER_INTS * 4 + count * width:
        raise Refused(f"{path}: the header's sizes give {count} parameters ({HEADER_INTS * 4 + count * width} bytes "
                      f"with the header) but the file has {len(raw)} bytes")
    body = raw[HEADER_INTS * 4 :]
    if version == VERSION_FP32:
        values = body.view(np.float32)
    else:
        values = (body.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    tensors, at = {}, 0
    for name, shape, _, _, _ in layout:
        n = math.prod(shape)
        tensors[name] = values[at : at + n].reshape(shape)
        at += n
    config = dict(max_t=max_t, V=V, Vp=Vp, L=L, NH=NH, C=C)
    return config, tensors, version


def main_guard(main):
    """Runs main(), printing a Refused problem as 'error: ...' on stderr with exit status 1."""
    try:
        main()
    except Refused as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
