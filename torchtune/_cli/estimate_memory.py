"""``tune estimate-memory --config CONFIG [--seq-len N] [--batch-size B] [--world-size N[,M...]] [key=value ...]``.

Runs the training step a recipe runs (torchtune.training.TrainStep: model, optimizer, loss) twice on fake tensors,
with no weights and no GPU, and prints the peak device memory split into weights, gradients,
optimizer state, activations and temporaries, plus what lives outside the device peak (paged
optimizer state, offloaded activations) and the host RAM that needs. Then one line per phase of the
whole run: set-up (loading the weights), training steps, step checkpoint save and resume load, each
run through the recipe's checkpointer and training-layer code on fake tensors, with its device peak
and host RAM.

A config of ``full_finetune_distributed`` (one with ``fsdp_*`` keys) is estimated per GPU for each
``--world-size`` (default 1): rank 0 of that many processes, FSDP2-sharded, on a fake process group
(``torchtune.training._distributed_memory``).
"""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``tune estimate-memory``."""
    parser = subparsers.add_parser(
        "estimate-memory",
        allow_abbrev=False,
        help="estimate a config's peak GPU memory without weights or a GPU",
        description="Estimate the peak device memory and host RAM of `tune run full_finetune_single_device` "
        "for a config, phase by phase: set-up, training steps (the recipe's own model, optimizer and loss, "
        "two steps), step checkpoint save and resume load, all on fake tensors (nothing is downloaded or "
        "allocated for real). For a full_finetune_distributed config, the per-GPU peak of the training "
        "steps at each --world-size, simulated on one CPU process with a fake process group. "
        "See docs/memory.md and docs/distributed.md.",
    )
    parser.add_argument(
        "--config",
        required=True,
        metavar="CONFIG",
        help="built-in config name (e.g. llama2/7B_full_low_memory) or path to a YAML file",
    )
    parser.add_argument(
        "--seq-len",
        type=int,
        default=None,
        metavar="N",
        help="tokens per sequence (default: the config's dataset.max_seq_len)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        metavar="B",
        help="sequences per batch (default: the config's batch_size)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=2,
        metavar="S",
        help="training steps to run (default 2: the second has all optimizer state)",
    )
    parser.add_argument(
        "--world-size",
        default=None,
        metavar="N[,M...]",
        help="distributed configs: number of GPUs (processes) to estimate per-GPU memory for, or a "
        "comma-separated list, e.g. 1,2,8 (default 1); batch_size is the global batch split over them",
    )
    parser.add_argument(
        "--steps-only",
        action="store_true",
        help="only the training steps: skip the set-up, step checkpoint save and resume load phases (faster)",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    parser.set_defaults(func=estimate_memory_command, accepts_overrides=True)
    return parser


def estimate_memory_command(args: argparse.Namespace) -> int:
    """Handler of ``tune estimate-memory``: prints the estimate table."""
    import time

    from torchtune._errors import UsageError
    from torchtune.config import load_config
    from torchtune.training._checkpoint_memory import estimate_run_memory
    from torchtune.training._memory_estimator import default_seq_len, estimate_recipe_memory

    for name in ("seq_len", "batch_size", "steps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {value}.")
    cfg = load_config(args.config, args.overrides)
    seq_len = args.seq_len or default_seq_len(cfg)
    batch_size = args.batch_size or int(cfg.batch_size)
    if is_distributed_config(cfg):
        return _estimate_distributed(args, cfg, seq_len, batch_size)
    if args.world_size is not None:
        raise UsageError(
            f"--world-size estimates full_finetune_distributed configs (they have fsdp_* keys), but {args.config} "
            "is a single-device config. Estimate a distributed one, e.g. --config llama2/7B_full_distributed "
            "--world-size 8, or drop --world-size."
        )
    start = time.perf_counter()
    if args.steps_only:
        estimate = estimate_recipe_memory(cfg, seq_len=seq_len, batch_size=batch_size, steps=args.steps)
    else:
        estimate = estimate_run_memory(cfg, seq_len=seq_len, batch_size=batch_size, steps=args.steps)
    optimizer = cfg.optimizer._component_
    title = (
        f"Estimated peak device memory for {args.config}: batch {batch_size} x {seq_len} tokens, "
        f"{optimizer}, optimizer_in_bwd={cfg.optimizer_in_bwd}, activation checkpointing="
        f"{cfg.enable_activation_checkpointing}, offloading={cfg.enable_activation_offloading}"
    )
    print(estimate.format(title))
    what = f"{args.steps} steps" + ("" if args.steps_only else " and the checkpoint phases")
    print(f"({what} on fake tensors in {time.perf_counter() - start:.0f} s)")
    return 0


def is_distributed_config(cfg: object) -> bool:
    """A config of ``full_finetune_distributed``: the one recipe whose configs carry FSDP keys."""
    return "fsdp_cpu_offload" in cfg


def _estimate_distributed(args: argparse.Namespace, cfg: object, seq_len: int, batch_size: int) -> int:
    """Per-GPU estimate at each ``--world-size``: a table each, then one summary line per world size."""
    import time

    from torchtune._errors import UsageError
    from torchtune.training._distributed_memory import (
        estimate_distributed_memory,
        estimate_host_memory,
        parse_world_sizes,
    )

    try:
        world_sizes = parse_world_sizes(args.world_size if args.world_size is not None else "1")
    except Exception as exc:
        raise UsageError(str(exc)) from exc
    summary = []
    for world_size in world_sizes:
        start = time.perf_counter()
        estimate = estimate_distributed_memory(
            cfg, world_size, seq_len=seq_len, batch_size=batch_size, steps=args.steps
        )
        title = (
            f"Estimated peak memory per GPU for {args.config} on {world_size} GPU{'s' if world_size > 1 else ''}: "
            f"global batch {batch_size} x {seq_len} tokens ({batch_size // world_size} per GPU), "
            f"{cfg.optimizer._component_}, optimizer_in_bwd={cfg.optimizer_in_bwd}, activation checkpointing="
            f"{cfg.enable_activation_checkpointing}, offloading={cfg.enable_activation_offloading}, "
            f"fsdp_cpu_offload={cfg.fsdp_cpu_offload}"
        )
        print(estimate.format(title))
        host = estimate_host_memory(cfg, world_size, estimate)
        print(host.format())
        print(f"({args.steps} steps on fake tensors in {time.perf_counter() - start:.0f} s)\n")
        if cfg.fsdp_cpu_offload:
            print(_offload_plan_text(cfg, world_size, estimate.peak_bytes) + "\n")
        label = f"on {world_size} GPU{'s' if world_size > 1 else ''}:"
        summary.append(
            f"  {label:<13}{estimate.peak_bytes / 1e9:7.2f} GB per GPU; host RAM per process: load "
            f"{host.load / 1e9:.2f} GB, steps {host.steps / 1e9:.2f} GB, step save {host.step_save / 1e9:.2f} GB, "
            f"final save {host.full_save_rank0 / 1e9:.2f} GB (rank 0)"
        )
    print(f"{args.config}, estimated (fake tensors), batch {batch_size} x {seq_len} tokens in all:")
    print("\n".join(summary))
    return 0


def _offload_plan_text(cfg: object, world_size: int, device_steps: int) -> str:
    """Host RAM per phase, pinned memory, PCIe bytes and an estimated step time of an offloaded config,
    with the CPU optimizer's throughput measured on this machine (``torchtune.training._offload_memory``)."""
    import torch

    from torchtune import training
    from torchtune.training._offload_memory import format_offload_plan, measure_cpu_optimizer_throughput, offload_plan
    from torchtune.utils import get_dtype

    dtype = get_dtype(cfg.dtype, torch.device("cpu"))
    model = training.build_model(cfg.model, device=torch.device("meta"), dtype=dtype)
    plan = offload_plan(
        model,
        cfg.optimizer,
        world_size=world_size,
        dtype=dtype,
        reshard_after_forward=bool(cfg.fsdp_reshard_after_forward),
        async_checkpoint=bool(cfg.async_checkpoint),
    )
    trainable = sum(-(-p.numel() // world_size) for p in model.parameters() if p.requires_grad)
    throughput = measure_cpu_optimizer_throughput(cfg.optimizer, dtype=dtype)
    return format_offload_plan(plan, trainable=trainable, device_steps=device_steps, throughput=throughput)
