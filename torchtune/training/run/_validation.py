"""Validation loss during training: ``validation_dataset`` every ``eval_every_n_steps`` steps and at
the end of each epoch, logged as ``val_loss``."""

from __future__ import annotations

import logging
import math
from typing import Any, Dict, Iterator, Optional, Tuple

import torch
from torch import nn
from torch.utils.data import DataLoader, Subset

from torchtune import config
from torchtune._errors import ConfigError, TuneError
from torchtune.datasets import collate_for
from torchtune.modules.loss import CROSS_ENTROPY_IGNORE_IDX
from torchtune.training.run._step import forward_loss
from torchtune.training.setup._checks import positive_int
from torchtune.training.setup._data import check_data_head, padding_id

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
    """The validation batches (this rank's share of them) and when to run them.

    Args:
        dataloader: batches in a fixed order (no shuffling: every evaluation sees the same data).
        every_n_steps: evaluate after every this many optimizer steps; None: only at the end of each epoch.
        num_batches: forward passes each rank runs (the largest share's batches); a rank with fewer runs
            its first batch again for the rest without counting it, so that a sharded model's
            collectives match on every rank. Default: ``len(dataloader)``.
        info: the ``DistributedInfo`` of a run of several processes: the loss sums and token counts of
            the ranks' shares are added up (one all-reduce per evaluation).
    """

    def __init__(
        self,
        dataloader: DataLoader,
        every_n_steps: Optional[int],
        *,
        num_batches: Optional[int] = None,
        info: Any = None,
    ) -> None:
        self.dataloader = dataloader
        self.every_n_steps = every_n_steps
        self.num_batches = len(dataloader) if num_batches is None else num_batches
        self.info = info
        self.last_step: Optional[int] = None

    def due(self, global_step: int, end_of_epoch: bool = False) -> bool:
        """Whether to evaluate now: every ``every_n_steps`` steps, and once at the end of each epoch."""
        if global_step == self.last_step:
            return False
        if end_of_epoch:
            return True
        return self.every_n_steps is not None and global_step % self.every_n_steps == 0

    def batches(self) -> Iterator[Tuple[Dict[str, torch.Tensor], bool]]:
        """``(batch, counted)`` for each of this rank's ``num_batches`` forward passes: its share, then
        (uncounted) its first batch again until it has run as many as the largest share."""
        first = None
        for batch in self.dataloader:
            first = batch if first is None else first
            yield batch, True
        for _ in range(self.num_batches - len(self.dataloader)):
            yield (first if first is not None else self._filler()), False

    def _filler(self) -> Dict[str, torch.Tensor]:
        # a rank whose share is empty (fewer examples than ranks) runs the first example, uncounted
        return self.dataloader.collate_fn([self.dataloader.dataset.dataset[0]])

    @torch.no_grad()
    def loss(self, model: nn.Module, loss_fn: nn.Module, *, device: torch.device, global_step: int) -> float:
        """Mean next-token loss over every labelled token of the validation set (token-weighted, so the
        value depends neither on the batch size nor on the number of ranks sharing the set). Uses the
        training loss (chunked: no full fp32 logits)."""
        was_training = model.training
        model.eval()
        sums = torch.zeros(2, device=device, dtype=torch.float64)  # loss sum, label tokens
        try:
            for batch, counted in self.batches():
                n = int((batch["labels"][:, 1:] != CROSS_ENTROPY_IGNORE_IDX).sum())  # on the host: no sync
                loss = forward_loss(model, loss_fn, batch, device=device)
                if counted:
                    sums[0] += loss.double() * n
                    sums[1] += n
        finally:
            model.train(was_training)
        if self.info is not None and self.info.world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(sums)  # every rank's share: one all-reduce on the device's group
        self.last_step = global_step
        total, count = sums.tolist()
        if count == 0:
            raise TuneError("validation_dataset has no labelled tokens to compute a loss on; check its data.")
        return total / count


def build_validation(
    cfg_dataset: Any, tokenizer: Any, *, batch_size: int, every_n_steps: Optional[int], info: Any = None
) -> Optional[Validation]:
    """The validation set of ``cfg_dataset`` (a dataset node, or None for none) in batches of ``batch_size``.

    With ``info`` (a run of several processes) each rank takes every ``world_size``-th example, starting
    at its rank, and the loss is that of the whole set, as one process computes it.

    Raises:
        TuneError: the dataset has no examples (or any error building it, as for the training set).
    """
    if cfg_dataset is None:
        return None
    dataset = config.instantiate(cfg_dataset, tokenizer)
    if len(dataset) == 0:
        raise TuneError("validation_dataset has no examples. Check validation_dataset.data_files / source.")
    check_data_head(dataset, "validation_dataset")
    world, rank = (info.world_size, info.rank) if info is not None else (1, 0)
    dataloader = DataLoader(
        Subset(dataset, range(rank, len(dataset), world)),
        batch_size=batch_size,
        shuffle=False,
        collate_fn=collate_for(dataset, padding_idx=padding_id(tokenizer), ignore_idx=CROSS_ENTROPY_IGNORE_IDX),
    )
    num_batches = math.ceil(math.ceil(len(dataset) / world) / batch_size)  # rank 0's share is the largest
    log.info("Validation set: %d examples, %d batches%s", len(dataset), num_batches, " per rank" if world > 1 else "")
    return Validation(dataloader, every_n_steps, num_batches=num_batches, info=info)
