"""Validation loss during training: ``validation_dataset`` every ``eval_every_n_steps`` steps and at
the end of each epoch, logged as ``val_loss``."""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader

from torchtune import config
from torchtune._errors import ConfigError, TuneError
from torchtune.datasets import collate_for
from torchtune.modules.loss import CROSS_ENTROPY_IGNORE_IDX
from torchtune.training._checks import positive_int
from torchtune.training._data import check_data_head, padding_id
from torchtune.training._step import forward_loss

log = logging.getLogger("torchtune")

__all__ = ["Validation", "build_validation", "check_validation_settings"]


def check_validation_settings(cfg: Any) -> None:
    """``eval_every_n_steps`` is null or >= 1, and needs a ``validation_dataset``.

    Raises:
        ConfigError: naming the key to change.
    """
    every = positive_int(cfg, "eval_every_n_steps", allow_none=True)
    if every is not None and cfg.validation_dataset is None:
        raise ConfigError(
            f"eval_every_n_steps={every} is set but validation_dataset is null, so there is nothing to evaluate. "
            "Set validation_dataset to a dataset node (e.g. the dataset node with data_files pointing at a held-out "
            "file), or set eval_every_n_steps=null."
        )


class Validation:
    """The validation batches and when to run them.

    Args:
        dataloader: batches in a fixed order (no shuffling: every evaluation sees the same data).
        every_n_steps: evaluate after every this many optimizer steps; None: only at the end of each epoch.
    """

    def __init__(self, dataloader: DataLoader, every_n_steps: Optional[int]) -> None:
        self.dataloader = dataloader
        self.every_n_steps = every_n_steps
        self.last_step: Optional[int] = None

    def due(self, global_step: int, end_of_epoch: bool = False) -> bool:
        """Whether to evaluate now: every ``every_n_steps`` steps, and once at the end of each epoch."""
        if global_step == self.last_step:
            return False
        if end_of_epoch:
            return True
        return self.every_n_steps is not None and global_step % self.every_n_steps == 0

    @torch.no_grad()
    def loss(self, model: nn.Module, loss_fn: nn.Module, *, device: torch.device, global_step: int) -> float:
        """Mean next-token loss over every labelled token of the validation set (token-weighted, so the
        value does not depend on the batch size). Uses the training loss (chunked: no full fp32 logits)."""
        was_training = model.training
        model.eval()
        total = torch.zeros((), device=device, dtype=torch.float64)
        count = 0
        try:
            for batch in self.dataloader:
                n = int((batch["labels"][:, 1:] != CROSS_ENTROPY_IGNORE_IDX).sum())  # on the host: no sync
                total += forward_loss(model, loss_fn, batch, device=device).double() * n
                count += n
        finally:
            model.train(was_training)
        self.last_step = global_step
        if count == 0:
            raise TuneError("validation_dataset has no labelled tokens to compute a loss on; check its data.")
        return float(total) / count


def build_validation(
    cfg_dataset: Any, tokenizer: Any, *, batch_size: int, every_n_steps: Optional[int]
) -> Optional[Validation]:
    """The validation set of ``cfg_dataset`` (a dataset node, or None for none) in batches of ``batch_size``.

    Raises:
        TuneError: the dataset has no examples (or any error building it, as for the training set).
    """
    if cfg_dataset is None:
        return None
    dataset = config.instantiate(cfg_dataset, tokenizer)
    if len(dataset) == 0:
        raise TuneError("validation_dataset has no examples. Check validation_dataset.data_files / source.")
    check_data_head(dataset, "validation_dataset")
    dataloader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=False,
        collate_fn=collate_for(dataset, padding_idx=padding_id(tokenizer), ignore_idx=CROSS_ENTROPY_IGNORE_IDX),
    )
    log.info("Validation set: %d examples, %d batches", len(dataset), len(dataloader))
    return Validation(dataloader, every_n_steps)
