"""PyTorch's causal scaled_dot_product_attention (flash and cuDNN backends) on the shapes of
scripts/bench_attention.cu, and one table with our numbers beside them.

    python3 scripts/bench_attention_torch.py OURS_FILE T [T ...]

OURS_FILE holds bench_attention's lines (T B fwd_ms fwd_tflops fwdbwd_ms fwdbwd_tflops
fwdbwd_atomic_ms fwdbwd_atomic_tflops). FLOPs are
counted the same way: 4 B NH T^2 HS / 2 forward, 3.5 times that forward + backward; median of 15
timed runs after 3 warm-up runs, CUDA events, random bf16 inputs.
"""
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

TOKENS, NH, HS = 65536, 12, 64
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


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    ours = {}
    with open(sys.argv[1]) as f:
        for line in f:
            fields = line.split()
            if len(fields) == 8:
                ours[int(fields[0])] = (float(fields[3]), float(fields[5]), float(fields[7]))
    print(f"causal attention, {TOKENS} tokens per call, NH {NH}, HS {HS}, bf16, TFLOP/s "
          f"(fwd: 4*B*NH*T^2*HS/2 FLOPs, fwd+bwd: 3.5x), {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("ours f+b: deterministic dQ (the default); atomic: FLASH_ATTN_DETERMINISTIC=0")
    print(f"{'T':>6} {'B':>4} | {'ours fwd':>9} {'flash fwd':>9} {'cudnn fwd':>9} | "
          f"{'ours f+b':>9} {'atomic':>9} {'flash f+b':>9} {'cudnn f+b':>9} | "
          f"{'/flash':>6} {'atomic':>6} {'/cudnn':>6} {'atomic':>6}")
    for T in map(int, sys.argv[2:]):
        flash = torch_tflops(SDPBackend.FLASH_ATTENTION, T)
        cudnn = torch_tflops(SDPBackend.CUDNN_ATTENTION, T)
        mine = ours.get(T)
        cell = lambda r, i: f"{r[i]:9.1f}" if r else f"{'-':>9}"
        ratio = lambda i, ref: f"{mine[i] / ref[1]:6.2f}" if mine and ref else f"{'-':>6}"
        print(f"{T:>6} {TOKENS // T:>4} | {cell(mine, 0)} {cell(flash, 0)} {cell(cudnn, 0)} | "
              f"{cell(mine, 1)} {cell(mine, 2)} {cell(flash, 1)} {cell(cudnn, 1)} | "
              f"{ratio(1, flash)} {ratio(2, flash)} {ratio(1, cudnn)} {ratio(2, cudnn)}")


if __name__ == "__main__":
    main()
