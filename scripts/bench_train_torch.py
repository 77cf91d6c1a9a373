"""GPT-2 124M (d12) trained in PyTorch with torch.compile and causal scaled_dot_product_attention:
the reference that scripts/bench_train.sh prints beside train_gpt's rows.

    python3 scripts/bench_train_torch.py --batch 64 --seq 1024 --steps 12 --sdpa-backend flash

The same model and step as train_gpt's BF16 build: pre-LN blocks with biases, GELU (tanh), vocabulary
padded to 50304 with the embedding tied to the classifier, cross-entropy over the real 50257, init
N(0, 0.02) with residual projections N(0, 0.02 / sqrt(2 L)); bf16 autocast over fp32 weights, fused
AdamW (betas 0.9/0.95, eps 1e-8, weight decay on 2-D weights only) at a constant LR, global-norm
clipping at 1.0. Batches are consecutive B x T windows of an llm.c token file (wrapping at its end).
Each step is timed on the wall clock between two torch.cuda.synchronize() calls, batch copy included.
The last line is for scripts (the median and the mean of steps --first..N, default 3..N, whose first
steps include compilation):
    RESULT ms_per_step MS tokens_per_s TPS max_allocated_MiB A max_reserved_MiB R mean_ms M
(the two torch.cuda.max_memory_* figures; 0 on the CPU).
"""
import argparse
import contextlib
import math
import os
import struct
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError as e:
    sys.exit(f"bench_train_torch.py needs PyTorch 2.3 or newer: {e}")

VOCAB, PADDED_VOCAB = 50257, 50304
TOKEN_MAGIC, TOKEN_VERSION, HEADER_INTS = 20240520, 1, 256
BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "default": None}


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.attproj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        # (B, T, 3, NH, HS) as our QKV matmul lays it out, then (3, B, NH, T, HS) for SDPA
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.NH, C // self.NH).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scale 1/sqrt(HS)
        x = x + self.attproj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, C, NH, max_T):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(PADDED_VOCAB, C), nn.Embedding(max_T, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.lnf = nn.LayerNorm(C)
        for name, p in self.named_parameters():  # LayerNorms keep weight 1, bias 0
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                residual = name.endswith("attproj.weight") or name.endswith("fcproj.weight")
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L) if residual else 0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.lnf(x), self.wte.weight)  # tied classifier over the padded vocabulary
        return F.cross_entropy(logits[..., :VOCAB].float().flatten(0, 1), targets.flatten())


def read_tokens(path):
    """The tokens of an llm.c token file: 256 int32 header (magic, version, count), then uint16."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        magic, version, count = struct.unpack("<3i", f.read(12))
    if magic != TOKEN_MAGIC or version != TOKEN_VERSION:
        sys.exit(f"{path}: not a token file (magic {magic}, version {version}; "
                 f"expected {TOKEN_MAGIC}, {TOKEN_VERSION})")
    if size != 4 * HEADER_INTS + 2 * count:
        sys.exit(f"{path}: header says {count} tokens but the file has {size} bytes")
    return torch.from_file(path, size=2 * HEADER_INTS + count, dtype=torch.uint16)[2 * HEADER_INTS:]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.join(here, "../data/tinyshakespeare/tiny_shakespeare_train.bin"))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--first", type=int, default=3, help="the first step timed")
    ap.add_argument("--sdpa-backend", choices=BACKENDS, default="flash")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16", help="bf16: autocast")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--channels", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if not 2 <= a.first <= a.steps:
        sys.exit(f"--first {a.first} must be in 2..--steps ({a.steps}): the median is of steps --first..N")
    if a.channels % a.heads:
        sys.exit(f"--channels {a.channels} is not a multiple of --heads {a.heads}")
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"--device {a.device}: CUDA is not available to torch {torch.__version__} "
                 f"(built for CUDA {torch.version.cuda}); use --device cpu --no-compile for a small test")
    tokens = read_tokens(a.data)
    B, T = a.batch, a.seq
    if len(tokens) < B * T + 1:
        sys.exit(f"{a.data}: {len(tokens)} tokens, fewer than one batch of B*T+1 = {B * T + 1}")

    torch.manual_seed(a.seed)
    torch.set_float32_matmul_precision("high")  # TF32 for any fp32 matmul, as llm.c's PyTorch script
    model = GPT(a.layers, a.channels, a.heads, max(1024, T)).to(dev)
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=dev.type == "cuda")
    step_fn = model if a.no_compile else torch.compile(model)
    backend = BACKENDS[a.sdpa_backend]
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"GPT-2 L {a.layers} C {a.channels} NH {a.heads}, {sum(p.numel() for p in params)} parameters, "
          f"B {B} T {T}, {a.precision}, sdpa {a.sdpa_backend}, compile {not a.no_compile}, "
          f"{name}, torch {torch.__version__}", flush=True)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    times, pos = [], 0
    with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
        for step in range(1, a.steps + 1):
            if pos + B * T + 1 > len(tokens):
                pos = 0
            sync()
            t0 = time.perf_counter()
            window = tokens[pos:pos + B * T + 1].to(torch.int64).to(dev)
            pos += B * T
            x, y = window[:-1].view(B, T), window[1:].view(B, T)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
                loss = step_fn(x, y)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            times.append(1000 * (time.perf_counter() - t0))
            print(f"step {step:4d}/{a.steps} | loss {loss.item():.6f} | norm {norm.item():.4f} | "
                  f"{times[-1]:.1f} ms", flush=True)

    timed = times[a.first - 1:]  # steps --first..N
    ms = sorted(timed)[(len(timed) - 1) // 2]  # the lower middle, as bench_train.sh
    mib = lambda f: f(dev) / 2**20 if dev.type == "cuda" else 0.0
    print(f"RESULT ms_per_step {ms:.3f} tokens_per_s {B * T / (ms / 1000):.0f} "
          f"max_allocated_MiB {mib(torch.cuda.max_memory_allocated):.0f} "
          f"max_reserved_MiB {mib(torch.cuda.max_memory_reserved):.0f} mean_ms {sum(timed) / len(timed):.3f}")


if __name__ == "__main__":
    main()
