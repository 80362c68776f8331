"""Time and memory of the three output-projection losses on one shape, interleaved, in one process.

    .venv/bin/python benchmarks/bench_loss.py                                   # CPU: 168M mini model's head
    .venv/bin/python benchmarks/bench_loss.py --device cuda --dtype bf16 --rows 4096 --dim 4096 --vocab 128256

Each loss gets the same hidden states, output weight and labels (a share ``--labelled`` of the rows
labelled, as after prompt masking and label selection the recipe passes only labelled rows, so here all
rows are labelled by default) and runs forward + backward ``--repeats`` times, the losses in a rotating
order. Reported per loss: median wall time and CPU time of a forward + backward, and the peak bytes the
loss itself allocates on top of its inputs (the weight and input gradients included): on CUDA
``torch.cuda.max_memory_allocated`` (measured); on the CPU the storages its ops create, counted by
``torchtune.training.estimate._memory_estimator.StorageCounter`` on real tensors (measured by counting the
loss's own allocations, not the process's RSS).

Losses: ``plain`` (``CrossEntropyLoss``: the whole fp32 logits), ``rows`` (``ChunkedCrossEntropyLoss``,
``--chunks`` row chunks), ``vocab`` (``VocabChunkedCrossEntropyLoss``, ``--chunks`` vocabulary slices).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from a checkout without installing
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from torchtune.modules.loss import (  # noqa: E402
    ChunkedCrossEntropyLoss,
    CrossEntropyLoss,
    VocabChunkedCrossEntropyLoss,
)

LOSSES: Dict[str, Callable[[int], nn.Module]] = {
    "plain": lambda chunks: CrossEntropyLoss(),
    "rows": lambda chunks: ChunkedCrossEntropyLoss(chunks),
    "vocab": lambda chunks: VocabChunkedCrossEntropyLoss(chunks),
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_bytes(run: Callable[[], None], device: torch.device, inputs: tuple) -> int:
    """Bytes the loss allocates at its peak beyond its inputs (the weight gradient included)."""
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        run()
        _sync(device)
        return torch.cuda.max_memory_allocated(device) - base
    from torchtune.training.estimate._memory_estimator import StorageCounter

    counter = StorageCounter()
    with counter:
        for t in inputs:  # views of the inputs (weight[a:b], .t()) would otherwise count their storage
            counter.track(t)
        base = counter.current
        run()
    return counter.peak - base


def main(argv=None) -> Dict[str, Dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--rows", type=int, default=2048, help="labelled positions of one step (batch x length)")
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--chunks", type=int, default=8, help="row chunks (rows) / vocabulary slices (vocab)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--losses", default=",".join(LOSSES))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    if dtype == torch.bfloat16 and device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        print("note: this CPU has no native bf16 matmul (no AVX512-BF16/AMX): bf16 runs emulated, many times slower")
    names = [n.strip() for n in args.losses.split(",") if n.strip()]
    torch.manual_seed(0)
    proj = nn.Linear(args.dim, args.vocab, bias=False, device=device, dtype=dtype)
    hidden = torch.randn(args.rows, args.dim, device=device, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, args.vocab, (args.rows,), device=device)
    losses = {name: LOSSES[name](args.chunks) for name in names}

    def step(name: str) -> None:
        proj.weight.grad = None
        hidden.grad = None
        losses[name](proj, hidden, labels).backward()

    for name in names:  # warm-up, and the memory figure
        step(name)
    peaks = {name: _peak_bytes(lambda n=name: step(n), device, (proj.weight, hidden, labels)) for name in names}
    wall: Dict[str, list] = {n: [] for n in names}
    cpu: Dict[str, list] = {n: [] for n in names}
    for r in range(args.repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotating order
            _sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            step(name)
            _sync(device)
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    base = statistics.median(wall[names[0]])
    result = {}
    print(
        f"{args.rows} rows x {args.dim} dim x {args.vocab} vocab, {args.dtype}, {args.chunks} chunks, "
        f"{device}, median of {args.repeats} (forward + backward)"
    )
    print(f"{'loss':<6} {'wall ms':>9} {'CPU ms':>9} {'vs ' + names[0]:>9} {'peak MB':>9}")
    for name in names:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        result[name] = {"wall_s": w, "cpu_s": c, "peak_bytes": peaks[name], "vs_first": w / base}
        print(f"{name:<6} {w * 1e3:>9.1f} {c * 1e3:>9.1f} {w / base:>8.3f}x {peaks[name] / 1e6:>9.1f}")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "results": result}, indent=1))
    return result


if __name__ == "__main__":
    main()
