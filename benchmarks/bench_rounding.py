"""The optimizer step of a bf16 model, one parameter at a time (as optimizer in backward steps it), per
way of keeping small bf16 updates: ours (``step_parameter`` with stochastic rounding), torchao's AdamW
with ``bf16_stochastic_round``, torch-optimi's AdamW with Kahan summation, and plain bf16 AdamW (updates
rounded to nearest: the cost floor, torch's single-tensor and fused kernels). On a CPU ``ours`` runs the C
kernels; ``ours_pool`` the C kernels with a large tensor's ranges on a thread pool of their own instead of
torch's OpenMP threads (what they do where torch does not run on ``libgomp.so.1``); ``ours_inductor`` is ours
with them off (Inductor's compiled kernel: a GPU's path, or a CPU's without a C compiler) and
``ours_plain_path`` ours without either (plain PyTorch on chunks). Median wall and CPU seconds of a whole
model's step. ``--torch-op-between`` runs a bf16 matmul (2048 x 1024 x 1024) before each parameter's step,
as backward runs its ops before each in-backward step (torch's OpenMP workers are then still spinning for
work); its time is in every variant's figure.

    .venv/bin/python benchmarks/bench_rounding.py                      # the mini model (168M), every variant
    .venv/bin/python benchmarks/bench_rounding.py --variants ours,plain --steps 3
    .venv/bin/python benchmarks/bench_rounding.py --variants ours,ours_pool,plain_fused --torch-op-between

Each variant gets its own copy of the same random bf16 weights and gradients, and is warmed up (torchao
compiles its step per parameter shape) before the timed steps; variants run round-robin.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from a checkout without installing
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from torchtune.modules import _native_kernels  # noqa: E402
from torchtune.training import StochasticRounding, step_parameter  # noqa: E402

SIZES = {
    "168m": dict(vocab_size=32000, num_layers=8, num_heads=16, num_kv_heads=16, embed_dim=1024, max_seq_len=1024),
    "tiny": dict(vocab_size=2048, num_layers=2, num_heads=4, num_kv_heads=4, embed_dim=128, max_seq_len=1024),
}
ADAMW = dict(lr=2e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


@contextlib.contextmanager
def _kernel_threads_of_their_own() -> Iterator[None]:
    lib = _native_kernels.library()
    threaded = getattr(lib, "threaded", False)
    if lib is not None:
        lib.threaded = False
    try:
        yield
    finally:
        if lib is not None:
            lib.threaded = threaded


def _stepper(variant: str, params: List[torch.nn.Parameter], between: Callable[[], None]) -> Callable[[], None]:
    """A function that steps every parameter once (its gradient already set), one at a time, ``between()``
    before each."""
    rounding = None
    ours = ("ours", "ours_pool", "ours_inductor", "ours_plain_path")
    if variant in ours:
        rounding = StochasticRounding(0, torch.device("cpu"), fused=variant != "ours_plain_path")
    if variant in (*ours, "plain", "plain_fused"):
        opts = [torch.optim.AdamW([p], fused=variant == "plain_fused", **ADAMW) for p in params]
        setting = {"ours_inductor": _native_kernels.disabled, "ours_pool": _kernel_threads_of_their_own}

        def step_ours() -> None:
            with setting.get(variant, contextlib.nullcontext)():
                for o, p in zip(opts, params):
                    between()
                    step_parameter(o, p, rounding=rounding)

        return step_ours
    if variant == "torchao":
        from torchao.optim import _AdamW  # torchao 0.18 keeps its bf16-state AdamW private

        opts = [_AdamW([p], bf16_stochastic_round=True, **ADAMW) for p in params]
    elif variant in ("optimi_kahan", "optimi"):
        import optimi

        opts = [optimi.AdamW([p], kahan_sum=variant == "optimi_kahan", foreach=False, **ADAMW) for p in params]
    else:
        raise SystemExit(f"unknown variant {variant!r}")

    def step() -> None:
        for o, p in zip(opts, params):
            between()
            o.step()
            p.grad = None

    return step


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="168m", choices=sorted(SIZES))
    parser.add_argument("--variants", default="ours,ours_inductor,torchao,optimi_kahan,plain,plain_fused")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--torch-op-between", action="store_true", help="a bf16 matmul before each parameter's step")
    args = parser.parse_args(argv)
    a, b = torch.randn(2048, 1024, dtype=torch.bfloat16), torch.randn(1024, 1024, dtype=torch.bfloat16)
    between = (lambda: torch.mm(a, b)) if args.torch_op_between else (lambda: None)

    from torchtune.models.llama2 import llama2

    torch.manual_seed(0)
    model = llama2(**SIZES[args.size]).to(torch.bfloat16)
    weights = [p.detach().clone() for p in model.parameters()]
    grads = [torch.randn_like(w) * 1e-3 for w in weights]
    del model
    variants = args.variants.split(",")
    states: Dict[str, tuple] = {}
    for v in variants:
        params = [torch.nn.Parameter(w.clone()) for w in weights]
        states[v] = (params, _stepper(v, params, between))
    times: Dict[str, List[tuple]] = {v: [] for v in variants}
    for i in range(args.warmup + args.steps):
        for v in variants:
            params, step = states[v]
            for p, g in zip(params, grads):
                p.grad = g.clone()
            wall, cpu = time.perf_counter(), time.process_time()
            step()
            if i >= args.warmup:
                times[v].append((time.perf_counter() - wall, time.process_time() - cpu))
    n = sum(w.numel() for w in weights)
    print(f"{n / 1e6:.0f}M bf16 parameters, {len(weights)} tensors, {torch.get_num_threads()} threads")
    if args.torch_op_between:
        print(f"(each step includes {len(weights)} bf16 matmuls of 2048 x 1024 x 1024, one before each parameter)")
    print("| variant | step wall s | step CPU s |")
    print("|---|---|---|")
    for v in variants:
        wall = statistics.median(t[0] for t in times[v])
        cpu = statistics.median(t[1] for t in times[v])
        print(f"| {v} | {wall:.2f} | {cpu:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
