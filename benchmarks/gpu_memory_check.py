"""Measure the real GPU memory of the low-memory 7B recipe on random weights (no download).

Builds Llama2-7B with random weights straight on the GPU in bf16 as the recipe does
(``torchtune.training.TrainStep.from_config``), runs ``--steps`` steps of the
``llama2/7B_full_low_memory`` settings (optimizer in backward, activation checkpointing and
offloading, chunked loss) on synthetic batches, and prints the memory statistics of
``torchtune.training.memory`` and tokens/s for each sequence length, next to
``tune estimate-memory``'s figure when ``--estimate`` is given.

    python benchmarks/gpu_memory_check.py --cap-gb 16                  # 7B, seq 512 and 2048
    python benchmarks/gpu_memory_check.py --model tiny --device cpu --steps 2   # CPU smoke test

Running it on a machine with PyTorch but without network access: the recipe needs omegaconf (and
its antlr4-python3-runtime, PyYAML) and tqdm, and the shipped config's optimizer needs bitsandbytes.
Carry them as wheels, made on a machine with network access:

    pip download omegaconf antlr4-python3-runtime PyYAML tqdm bitsandbytes -d wheels/ \
        --only-binary=:all: --python-version 3.11 --platform manylinux2014_x86_64
    # on the GPU machine, from the repository root:
    pip install --no-index --find-links wheels/ omegaconf tqdm bitsandbytes
    PYTHONPATH=. python benchmarks/gpu_memory_check.py --cap-gb 16

Without bitsandbytes pass ``--optimizer torch.optim.AdamW`` (its state is on the GPU: 27 GB for 7B,
so only with a large card and no cap).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

MODELS = {"7b": "torchtune.models.llama2.llama2_7b", "tiny": "torchtune.models.llama2.llama2_tiny"}


def _load_recipe_config(args: argparse.Namespace):
    try:
        from omegaconf import OmegaConf  # noqa: F401

        from torchtune.config import load_config
    except ImportError as exc:
        raise SystemExit(f"{exc}: carry omegaconf/tqdm as wheels, see the top of {__file__}.") from exc
    overrides = [
        f"model._component_={MODELS[args.model]}",
        f"device={args.device}",
        f"dtype={args.dtype}",
        f"optimizer._component_={args.optimizer}",
        f"batch_size={args.batch_size}",
        "compile=False",
    ]
    return load_config("llama2/7B_full_low_memory", overrides)


def run(args: argparse.Namespace) -> list[dict]:
    """Run the check; returns one result dict per sequence length (also printed as JSON lines)."""
    from torchtune.training import memory

    if args.device.startswith("cuda"):
        memory.set_cuda_alloc_conf()  # before the first CUDA allocation, as the recipe does
    from torchtune import training, utils

    cfg = _load_recipe_config(args)
    device = utils.get_device(args.device)
    if args.cap_gb is not None and device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gb * 1e9 / total), device)
    train_step = training.TrainStep.from_config(cfg, device=device, dtype=utils.get_dtype(cfg.dtype, device))
    model = train_step.model
    memory.log_memory_stats(memory.get_memory_stats(device), title="after setup")
    print(memory.format_memory_stats(memory.get_memory_stats(device), "Memory after setup"), flush=True)
    vocab = model.tok_embeddings.num_embeddings
    generator = torch.Generator().manual_seed(0)
    results = []
    for seq_len in args.seq_lens:
        seq_len = min(seq_len, model.max_seq_len)
        batch = {
            "tokens": torch.randint(0, vocab, (args.batch_size, seq_len), generator=generator),
            "labels": torch.randint(0, vocab, (args.batch_size, seq_len), generator=generator),
        }
        memory.reset_peak_memory_stats(device)
        losses, start = [], None
        for step in range(args.steps):
            if step == 1:  # the first step warms up kernels and allocates the optimizer state
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                start = time.perf_counter()
            losses.append(train_step(batch))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        timed = max(args.steps - 1, 1)
        elapsed = time.perf_counter() - start if start is not None else float("nan")
        result = {
            "seq_len": seq_len,
            "batch_size": args.batch_size,
            "steps": args.steps,
            "optimizer": args.optimizer,
            "model": args.model,
            "device": str(device),
            "tokens_per_second": args.batch_size * seq_len * timed / elapsed if start else None,
            "last_loss": float(losses[-1]),
            **memory.get_memory_stats(device),
        }
        if args.estimate:
            from torchtune.training._memory_estimator import estimate_recipe_memory

            result["estimated_peak"] = (
                estimate_recipe_memory(cfg, seq_len=seq_len, batch_size=args.batch_size).peak_bytes / 1e9
            )
        print(
            memory.format_memory_stats(
                {
                    k: v
                    for k, v in result.items()
                    if isinstance(v, float) and k not in ("tokens_per_second", "last_loss")
                },
                f"Memory, batch {args.batch_size} x {seq_len} tokens",
            )
        )
        print(json.dumps(result), flush=True)
        results.append(result)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="7b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--optimizer", default="bitsandbytes.optim.PagedAdamW")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument(
        "--cap-gb", type=float, default=None, help="cap the process at this many GB (1e9) of GPU memory, e.g. 16"
    )
    parser.add_argument("--estimate", action="store_true", help="also print tune estimate-memory's figure")
    run(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
