"""The recipe's training step of a config, counted on the CUDA code path without a GPU (``_launch_counter``).

``count_step_launches(cfg, ...)`` builds the step as ``full_finetune_single_device`` does
(``TrainStep.from_config``: the model, its activation checkpointing and offloading, the optimizer -- the real
bitsandbytes classes, their paged state simulated -- in backward or not, the loss, the rounding), with the
device played by ``meta`` tensors, and runs the loop body of the recipe around it: ``StepMetrics.start_step``
(arms the gradient norm and weight-change count on logged steps), forward and backward with the in-backward
steps, ``step_optimizer``, the NaN guard, and on a logged step ``StepMetrics.log_step`` and the guard's check.
Attention runs as the CUDA kernels (``target_attention("cuda")``); activation offloading copies through a
counting engine (streams and events as tokens); the batch comes from the host as the recipe's loader gives
it (pinned where the loader pins on CUDA).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Optional

import torch

from torchtune.training.activations import OffloadActivations, SimulatedCopies
from torchtune.training.estimate import _launch_counter as lc

__all__ = ["CountingCopies", "StepLaunches", "count_step_launches", "synthetic_batch"]


class CountingCopies(SimulatedCopies):
    """The offloading engine on meta tensors: host buffers are meta tensors marked as pinned host memory,
    copies run no op and are counted as transfers, and waits (``wait``/``wait_stream``: the GPU's) are
    counted apart from host syncs."""

    device_type = "meta"

    def host_buffer(self, t: torch.Tensor) -> torch.Tensor:
        buffer = torch.empty_like(t)
        counter = lc._ACTIVE
        if counter is not None:
            counter.mark_host(buffer, pinned=True)
        return buffer

    def device_buffer(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        return torch.empty_like(host)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = True) -> None:
        counter = lc._ACTIVE
        to_host = counter is not None and counter._is_host(dst)
        lc.note_copy("d2h" if to_host else "h2d", pinned=True, non_blocking=non_blocking)

    def wait(self, stream: Any, event: Any) -> None:
        lc.note_stream_wait()

    def wait_stream(self, stream: Any, other: Any) -> None:
        lc.note_stream_wait()


@dataclasses.dataclass
class StepLaunches:
    """The counts of one unlogged and one logged step of a config."""

    unlogged: lc.StepCount
    logged: lc.StepCount
    parameters: int  # trainable parameters (tensors)
    notes: list[str]


def synthetic_batch(
    batch_size: int, seq_len: int, vocab_size: int, *, packed: bool, seed: int = 0
) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """A host batch of ``batch_size`` x ``seq_len`` tokens and the packs it was collated from (``packed``: each
    row holds examples of Alpaca-like lengths, ~136 tokens, the rest padding, collated by ``packed_collate``).
    Every label is set, as the memory estimate assumes."""
    rng = random.Random(seed)
    packs = []
    for _ in range(batch_size):
        tokens = [rng.randrange(1, vocab_size) for _ in range(seq_len)]
        if not packed:
            packs.append({"tokens": tokens, "labels": list(tokens)})
            continue
        lengths, left = [], seq_len
        while left > 0:
            n = min(left, max(8, int(rng.lognormvariate(4.7, 0.6))))
            lengths.append(n)
            left -= n
        input_pos = [i for n in lengths for i in range(n)]
        packs.append({"tokens": tokens, "labels": list(tokens), "input_pos": input_pos, "seq_lens": lengths})
    if packed:
        from torchtune.datasets import packed_collate

        return packed_collate(packs), packs
    from torchtune.datasets import padded_collate

    return padded_collate(packs), packs


def count_step_launches(
    cfg: Any, *, seq_len: int, batch_size: int, packed: bool = False, warmup: int = 1
) -> StepLaunches:
    """One unlogged and one logged step of the recipe on ``cfg`` (after ``warmup`` steps, which make the
    optimizer state), counted on the CUDA code path (see the module docstring)."""
    from omegaconf import OmegaConf

    from torchtune import training
    from torchtune.modules.sliding_window import window_kernel_device
    from torchtune.training.estimate._attention_kernels import target_attention
    from torchtune.training.setup._data import pin_batches
    from torchtune.utils import get_dtype

    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    training.check_optimizer_settings(cfg)
    dtype = get_dtype(cfg.dtype, torch.device("cpu"))
    notes: list[str] = []
    counter = lc.LaunchCounter()
    with (
        lc.counting(counter),
        lc.simulated_bitsandbytes(),
        target_attention("cuda"),
        window_kernel_device("cuda"),
    ):
        grad_norm = training.GradNormTracker()
        weight_changes = training.WeightChangeTracker() if dtype != torch.float32 else None
        step = training.TrainStep.from_config(
            cfg,
            device=lc.DEVICE,
            dtype=dtype,
            compile_model=False,
            grad_norm=grad_norm,
            weight_changes=weight_changes,
        )
        if bool(cfg.get("compile", False)):
            notes.append("compile=True: counted as the eager step (the compiled layers' kernels are not counted)")
        if isinstance(step.activations_ctx, OffloadActivations):
            step.activations_ctx._copies = CountingCopies()
        vocab = step.model.tok_embeddings.num_embeddings
        batch, _ = synthetic_batch(batch_size, seq_len, vocab, packed=packed)
        if pin_batches(torch.device("cuda")):
            for value in batch.values():
                counter.mark_pinned(value)
        metrics = training.StepMetrics(
            OmegaConf.create({"log_every_n_steps": 1, "log_peak_memory_stats": True}),
            device=lc.DEVICE,
            grad_norm=grad_norm,
            weight_changes=weight_changes,
        )
        metrics.data, metrics.logger = _HostData(), training.MetricLoggers([], path=None)
        nan_guard = training.NonFiniteLossGuard(lc.DEVICE)
        counts = []
        for index in range(warmup + 2):
            logged = index == warmup + 1
            counter.reset()
            _loop_body(step, batch, metrics, nan_guard, global_step=index + 1, logged=logged)
            counts.append(counter.count())
    parameters = len([p for p in step.model.parameters() if p.requires_grad])
    return StepLaunches(unlogged=counts[warmup], logged=counts[warmup + 1], parameters=parameters, notes=notes)


def _loop_body(step: Any, batch: dict, metrics: Any, nan_guard: Any, *, global_step: int, logged: bool) -> None:
    """``full_finetune_single_device.train()``'s body for one step of one micro-batch (no LR schedule)."""
    metrics.every_n_steps = 1 if logged else global_step + 1
    metrics.start_step(global_step, [batch])
    loss = step(batch)  # forward_backward + step_optimizer
    nan_guard.record(loss, global_step)
    if logged:
        metrics.log_step(epoch=0, step=global_step, loss=loss, lr=0.0, bar=_NoBar(), nan_guard=nan_guard)
        nan_guard.check(0, None)


class _HostData:
    """What ``StepMetrics`` asks of the data: the non-padding tokens of a host batch."""

    packed = False

    def num_tokens(self, batch: dict) -> int:
        return int(batch["tokens"].ne(0).sum())


class _NoBar:
    def set_description(self, *args: Any, **kwargs: Any) -> None:
        pass

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass


def format_counts(rows: list[tuple[str, lc.StepCount]], parameters: Optional[int] = None) -> str:
    """A markdown table of step counts, one row per (label, count)."""
    head = (
        "| step | launches | optimizer | rounding | attention | norm | copy | other | host syncs | "
        "H2D pageable | H2D pinned | prefetches | optimizer launches / param | host us / param |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for label, c in rows:
        per = c.optimizer_launches / max(c.optimizer_params, 1)
        lines.append(
            f"| {label} | {c.total} | "
            + " | ".join(str(c.launches[k]) for k in lc.KINDS)
            + f" | {c.syncs} | {c.h2d_pageable} | {c.h2d_pinned} | {c.prefetches} | {per:.1f} | "
            f"{c.per_parameter_us():.0f} |"
        )
    return "\n".join(lines)
