"""Learning-rate schedules."""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def get_cosine_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
) -> LambdaLR:
    """Linear warm-up from 0 to the optimizer's LR, then a cosine decay to 0.

    Args:
        optimizer: the optimizer to schedule (with optimizer in backward, the wrapper's
            ``scheduler_optimizer``).
        num_warmup_steps: steps of linear warm-up.
        num_training_steps: total optimizer steps of the run (the recipe fills this in).
        num_cycles: cosine periods over the decay; 0.5 decays once from the peak to 0.
        last_epoch: index of the last step taken, for resuming (-1 for a new run).
    """
    if num_warmup_steps < 0 or num_training_steps < 1:
        raise ValueError("num_warmup_steps must be >= 0 and num_training_steps >= 1")

    def lr_lambda(step: int) -> float:
        if step < num_warmup_steps:
            return step / max(1, num_warmup_steps)
        progress = (step - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps)
        progress = min(progress, 1.0)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress)))

    return LambdaLR(optimizer, lr_lambda, last_epoch)
