"""A resumable, seeded sampler: the data order depends only on (seed, epoch)."""

from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import Sampler


class ResumableSampler(Sampler[int]):
    """Yields dataset indices, reshuffled per epoch from ``seed + epoch``.

    ``set_epoch(epoch, start_index)`` makes the next iteration skip the first ``start_index``
    indices of that epoch's order, so a mid-epoch resume continues with the next batch without
    loading (or tokenizing) the batches already trained on.
    """

    def __init__(self, num_samples: int, shuffle: bool = True, seed: int = 0) -> None:
        self.num_samples = num_samples
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.start_index = 0

    def set_epoch(self, epoch: int, start_index: int = 0) -> None:
        self.epoch = epoch
        self.start_index = start_index

    def _order(self) -> list:
        if not self.shuffle:
            return list(range(self.num_samples))
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.num_samples, generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(self._order()[self.start_index :])

    def __len__(self) -> int:
        return max(0, self.num_samples - self.start_index)
