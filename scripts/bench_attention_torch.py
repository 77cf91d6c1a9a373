"""PyTorch's causal scaled_dot_product_attention (flash and cuDNN backends) on the shapes of
scripts/bench_attention.cu, and one table with our numbers beside them. scripts/bench_attention.sh
runs both for one length at a time, then the table:

    python3 scripts/bench_attention_torch.py --measure T          prints "T flash_fwd flash_fwdbwd
                                                                  cudnn_fwd cudnn_fwdbwd" (TFLOP/s,
                                                                  - where a backend cannot run)
    python3 scripts/bench_attention_torch.py --table OURS TORCH   the table of both files' lines

OURS holds bench_attention's lines (T B fwd_ms fwd_tflops fwdbwd_ms fwdbwd_tflops fwdbwd_atomic_ms
fwdbwd_atomic_tflops), TORCH the --measure lines. FLOPs are counted the same way: 4 B NH T^2 HS / 2
forward, 3.5 times that forward + backward; median of 15 timed runs after 3 warm-up runs, CUDA
events, random bf16 inputs. NH and the tokens per call come from $HEADS and $TOKENS as for
bench_attention.cu (defaults 12 and 65536).
"""
import os
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

TOKENS, NH, HS = int(os.environ.get("TOKENS") or 65536), int(os.environ.get("HEADS") or 12), 64
WARMUP, REPEATS = 3, 15


def median_ms(work):
    for _ in range(WARMUP):
        work()
    times = []
    for _ in range(REPEATS):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return sorted(times)[REPEATS // 2]


def torch_tflops(backend, T):
    """(forward, forward + backward) TFLOP/s of one backend, or None when it cannot run."""
    B = TOKENS // T
    q, k, v = ((torch.rand(B, NH, T, HS, device="cuda", dtype=torch.bfloat16) * 2 - 1).requires_grad_()
               for _ in range(3))
    grad = torch.rand(B, NH, T, HS, device="cuda", dtype=torch.bfloat16) * 2 - 1
    flops = 4 * B * NH * T * T * HS / 2
    try:
        with sdpa_kernel(backend):
            def forward():
                with torch.no_grad():
                    torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

            def forward_backward():
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                torch.autograd.grad(out, (q, k, v), grad)

            fwd_ms = median_ms(forward)
            both_ms = median_ms(forward_backward)
    except RuntimeError as e:
        print(f"# {backend.name} at T {T}: {str(e).splitlines()[0]}", file=sys.stderr)
        return None
    return flops / fwd_ms / 1e9, 3.5 * flops / both_ms / 1e9


def measure(T):
    cells = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        result = torch_tflops(backend, T)
        cells += [f"{x:.1f}" for x in result] if result else ["-", "-"]
    print(T, *cells)


def read_table(path, columns):
    """{T: the floats of the given columns} of a file of whitespace-separated lines ('-': None)."""
    rows = {}
    with open(path) as f:
        for line in f:
            fields = line.split()
            if fields and fields[0].isdigit():
                rows[int(fields[0])] = [None if fields[i] == "-" else float(fields[i]) for i in columns]
    return rows


def table(ours_path, torch_path):
    ours = read_table(ours_path, (3, 5, 7))
    theirs = read_table(torch_path, (1, 2, 3, 4))
    print(f"causal attention, {TOKENS} tokens per call, NH {NH}, HS {HS}, bf16, TFLOP/s "
          f"(fwd: 4*B*NH*T^2*HS/2 FLOPs, fwd+bwd: 3.5x), {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("ours f+b: deterministic dQ (the default); atomic: FLASH_ATTN_DETERMINISTIC=0; each T timed on its own")
    print(f"{'T':>6} {'B':>4} | {'ours fwd':>9} {'flash fwd':>9} {'cudnn fwd':>9} | "
          f"{'ours f+b':>9} {'atomic':>9} {'flash f+b':>9} {'cudnn f+b':>9} | "
          f"{'/flash':>6} {'atomic':>6} {'/cudnn':>6} {'atomic':>6} {'fwd/cudnn':>9}")
    for T in sorted(set(ours) | set(theirs)):
        mine = ours.get(T, [None] * 3)
        flash_fwd, flash_both, cudnn_fwd, cudnn_both = theirs.get(T, [None] * 4)
        cell = lambda x: f"{x:9.1f}" if x is not None else f"{'-':>9}"
        ratio = lambda x, ref, w=6: f"{x / ref:{w}.2f}" if x is not None and ref else f"{'-':>{w}}"
        print(f"{T:>6} {TOKENS // T:>4} | {cell(mine[0])} {cell(flash_fwd)} {cell(cudnn_fwd)} | "
              f"{cell(mine[1])} {cell(mine[2])} {cell(flash_both)} {cell(cudnn_both)} | "
              f"{ratio(mine[1], flash_both)} {ratio(mine[2], flash_both)} {ratio(mine[1], cudnn_both)} "
              f"{ratio(mine[2], cudnn_both)} {ratio(mine[0], cudnn_fwd, 9)}")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--measure":
        measure(int(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "--table":
        table(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
