"""GFLOPS of the two matmul layouts a linear layer's training runs, in fp32 and bf16, on this machine.

    .venv/bin/python benchmarks/bench_matmul.py                   # 128 x 1024 x 2816: the 168M model's MLP
    .venv/bin/python benchmarks/bench_matmul.py --m 64 --k 32000 --n 1024 --device cuda

Forward is ``x @ W.T`` (``[m, k] @ [n, k].T``); the input gradient is ``g @ W`` (``[m, n] @ [n, k]``). On a
CPU without native bf16 (AVX2 only: no AVX512-BF16/AMX) PyTorch emulates bf16 matmuls, and the two
layouts slow down by very different factors: this is why the CPU benchmarks run fp32 there.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def gflops(fn, flops: float, repeats: int, device: torch.device) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return flops / statistics.median(times) / 1e9


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--m", type=int, default=128, help="rows (tokens)")
    parser.add_argument("--k", type=int, default=1024, help="input features")
    parser.add_argument("--n", type=int, default=2816, help="output features")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    flops = 2.0 * args.m * args.k * args.n
    native = device.type == "cuda" or torch.ops.mkldnn._is_mkldnn_bf16_supported()
    print(
        f"{args.m} x {args.k} x {args.n} on {device} ({torch.get_num_threads()} threads), bf16 "
        f"{'native' if native else 'emulated (no AVX512-BF16/AMX)'}; median of {args.repeats}"
    )
    result = {}
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(args.m, args.k, device=device, dtype=dtype)
        w = torch.randn(args.n, args.k, device=device, dtype=dtype)
        g = torch.randn(args.m, args.n, device=device, dtype=dtype)
        name = str(dtype).removeprefix("torch.")
        result[name] = {
            "forward x @ W.T": gflops(lambda x=x, w=w: x @ w.t(), flops, args.repeats, device),
            "input grad g @ W": gflops(lambda g=g, w=w: g @ w, flops, args.repeats, device),
        }
        for layout, value in result[name].items():
            print(f"  {name:<9} {layout:<17} {value:8.1f} GFLOPS")
    return result


if __name__ == "__main__":
    main()
