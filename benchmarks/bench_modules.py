"""Forward + backward of the modules with hand-written backwards (RMSNorm's ``_RMSNormFn``; RoPE's C kernel on a
CPU, ``_RotateOnCPU``) against autograd through the composite formulas they replace, on the activations of one
layer of the 168M model's training step.

    .venv/bin/python benchmarks/bench_modules.py                       # batch 4 x 512, 16 heads of 64, width 1024, bf16
    .venv/bin/python benchmarks/bench_modules.py --dtype fp32 --repeats 21

Each case runs forward and backward of one call on the same input and output gradient; cases run
round-robin (the first rotating each round), median wall and CPU milliseconds over ``--repeats`` rounds
after one warm-up. Also printed: the bytes each saves for backward (``saved_tensors_hooks``), and whether
its output and input gradient equal the composite's (bit for bit, or the largest difference).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from a checkout without installing
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from torchtune.modules import (  # noqa: E402
    RMSNorm,
    RotaryPositionalEmbeddings,
    _native_kernels,  # noqa: E402
)

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def composite_rms_norm(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    return norm.scale * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.eps)).type_as(x)


def composite_rope(rope: RotaryPositionalEmbeddings, x: torch.Tensor) -> torch.Tensor:
    with _native_kernels.disabled():  # the PyTorch ops (the C kernels off)
        return rope(x)


def _saved_bytes(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> int:
    seen: Dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(x.detach().requires_grad_(True))
    return sum(seen.values())


def _run(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, grad: torch.Tensor) -> tuple:
    leaf = x.detach().requires_grad_(True)
    out = fn(leaf)
    out.backward(grad)
    return out.detach(), leaf.grad


def main(argv: List[str] | None = None) -> Dict[str, Dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args(argv)

    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)
    rope = RotaryPositionalEmbeddings(args.head_dim, args.seq_len)
    norm = RMSNorm(args.dim, eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.scale.copy_(torch.randn(args.dim))
    q = torch.randn(args.batch_size, args.seq_len, args.heads, args.head_dim).to(dtype)
    h = (torch.randn(args.batch_size, args.seq_len, args.dim) * 4).to(dtype)
    cases = {
        "RoPE (q), composite": (lambda t: composite_rope(rope, t), q),
        "RoPE (q), ours": (rope, q),  # the C kernel on a CPU (the composite where it does not apply)
        "RMSNorm, composite": (lambda t: composite_rms_norm(norm, t), h),
        "RMSNorm, ours": (norm, h),
    }
    grads = {name: torch.randn_like(x) for name, (_, x) in cases.items()}
    times: Dict[str, List[tuple]] = {name: [] for name in cases}
    names = list(cases)
    for round_ in range(args.repeats + 1):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            fn, x = cases[name]
            norm.scale.grad = None
            wall, cpu = time.perf_counter(), time.process_time()
            _run(fn, x, grads[name])
            if round_:  # the first round warms up
                times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    results: Dict[str, Dict[str, float]] = {}
    print(
        f"{args.batch_size} x {args.seq_len} tokens, {args.dtype}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, median of {args.repeats}"
    )
    print("| module | forward + backward wall (ms) | CPU (ms) | saved for backward (MB) | same as the composite |")
    print("|---|---|---|---|---|")
    for name in names:
        fn, x = cases[name]
        wall = statistics.median(t[0] for t in times[name]) * 1e3
        cpu = statistics.median(t[1] for t in times[name]) * 1e3
        saved = _saved_bytes(fn, x) / 1e6
        reference = f"{name.split(',')[0]}, composite"
        reference = reference if reference in cases and name.endswith("ours") else None
        same = ""
        if reference is not None:
            out, grad = _run(fn, x, grads[name])
            ref_out, ref_grad = _run(cases[reference][0], x, grads[name])
            diff = (grad.float() - ref_grad.float()).abs().max().item()
            same = "output bitwise" if torch.equal(out, ref_out) else "output differs"
            same += ", gradient bitwise" if torch.equal(grad, ref_grad) else f", gradient max diff {diff:.3g}"
        results[name] = {"wall_ms": wall, "cpu_ms": cpu, "saved_mb": saved}
        print(f"| {name} | {wall:.2f} | {cpu:.2f} | {saved:.1f} | {same} |")
    return results


if __name__ == "__main__":
    main()
