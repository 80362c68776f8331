"""Learning-rate schedules, and building the one a config names."""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from torchtune import config
from torchtune._errors import TuneRuntimeError
from torchtune.config._types import checked_by, whole_number

__all__ = ["build_lr_scheduler", "get_cosine_schedule_with_warmup", "get_lr"]


def build_lr_scheduler(
    cfg_lr_scheduler: Any,
    optimizer: Optimizer,
    *,
    num_training_steps: int,
    state_dict: Optional[Mapping[str, Any]] = None,
) -> Optional[LRScheduler]:
    """The schedule of ``cfg_lr_scheduler`` (``None``: constant LR) on ``optimizer``, restored from ``state_dict``.

    ``optimizer`` is what the recipe holds in either mode: with optimizer in backward, the
    ``OptimInBackwardWrapper``, whose ``param_groups`` are every per-parameter optimizer's groups.
    """
    if cfg_lr_scheduler is None:
        return None
    scheduler = config.instantiate(cfg_lr_scheduler, optimizer, num_training_steps=num_training_steps)
    if state_dict is not None:
        scheduler.load_state_dict(state_dict)
        # A freshly built scheduler has already written its step-0 LR into the optimizer; put back
        # the LR the interrupted run was at. A base LR changed on resume (optimizer.lr=...) is each group's
        # initial_lr (configured_hyperparameters_kept put it there): the schedule goes on from it, at the
        # same point, every LR scaled by new / old base (a schedule is a factor of its base LR).
        last = list(scheduler.get_last_lr())
        for i, group in enumerate(optimizer.param_groups):
            base, saved_base = group.get("initial_lr"), scheduler.base_lrs[i]
            if base is not None and base != saved_base:
                last[i] = last[i] * base / saved_base
                scheduler.base_lrs[i] = base
            group["lr"] = last[i]
        scheduler._last_lr = last  # what get_last_lr() reports until the next step
    return scheduler


def _check_cosine_args(key: str, fields: Mapping[str, Any]) -> None:
    whole_number(f"{key}.num_warmup_steps", fields.get("num_warmup_steps", 0), minimum=0)
    cycles = fields.get("num_cycles")
    if cycles is not None and cycles <= 0:
        raise config.ConfigError(f"{key}.num_cycles must be a positive number (0.5 decays once), got {cycles!r}.")


@checked_by(_check_cosine_args)
def get_cosine_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
    warmup_from_zero: bool = True,
) -> LambdaLR:
    """Linear warm-up to the optimizer's LR, then a cosine decay to 0 (torchtune's and transformers' schedule).

    With ``W = num_warmup_steps``, the LR factor of step ``s`` (0 for the first step) is ``s / W`` while
    ``s < W``, then ``0.5 * (1 + cos(2 pi num_cycles p))`` with ``p = (s - W) / (num_training_steps - W)``.
    The first step trains at LR 0: it costs a full step and changes no weight. ``warmup_from_zero=False``
    (this library's schedule before torchtune's API was adopted) shifts the warm-up by one step: steps
    ``0 .. W-1`` train at ``1/(W+1) .. W/(W+1)`` of the LR, and the cosine part is the same.

    Args:
        optimizer: the optimizer to schedule (with optimizer in backward, the
            ``OptimInBackwardWrapper``).
        num_warmup_steps: steps of linear warm-up.
        num_training_steps: total optimizer steps of the run (the recipe fills this in).
        num_cycles: cosine periods over the decay; 0.5 decays once from the peak to 0.
        last_epoch: index of the last step taken, for resuming (-1 for a new run).
        warmup_from_zero: True: the warm-up starts at LR 0 (torchtune's formula); False: one step above it.
    """
    if num_warmup_steps < 0 or num_training_steps < 1:
        raise ValueError("num_warmup_steps must be >= 0 and num_training_steps >= 1")

    def lr_lambda(step: int) -> float:
        if step < num_warmup_steps:
            return step / num_warmup_steps if warmup_from_zero else (step + 1) / (num_warmup_steps + 1)
        progress = (step - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress)))

    return LambdaLR(optimizer, lr_lambda, last_epoch)


def get_lr(optimizer: Optimizer) -> float:
    """The LR of ``optimizer`` (with optimizer in backward, the ``OptimInBackwardWrapper``: its groups are every
    inner optimizer's), which the full-finetune recipes keep the same in every parameter group.

    Raises:
        RuntimeError: the optimizer has no parameter group, or its groups have different LRs.
    """
    groups = optimizer.param_groups
    if len(groups) < 1:
        raise TuneRuntimeError(f"Invalid optimizer param groups with len of: {len(groups)}")
    lr = groups[0]["lr"]
    if any(group["lr"] != lr for group in groups):
        raise TuneRuntimeError(
            "LR Schedulers are different across all param groups: get_lr reports one LR, and the groups have "
            f"{sorted({group['lr'] for group in groups})}."
        )
    return lr
