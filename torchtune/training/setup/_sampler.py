"""A resumable, seeded sampler: the data order depends only on (seed, epoch), also across ranks."""

from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import Sampler


class ResumableSampler(Sampler[int]):
    """Yields dataset indices, reshuffled per epoch from ``seed + epoch``.

    ``set_epoch(epoch, start_index)`` makes the next iteration skip the first ``start_index``
    indices of that epoch's order, so a mid-epoch resume continues with the next batch without
    loading (or tokenizing) the batches already trained on.

    With ``num_replicas`` > 1 (one per rank) every rank draws the same order and takes every
    ``num_replicas``-th index of it, starting at its ``rank``; ``start_index`` counts examples of the
    whole order (all ranks together). So the k-th batches of all ranks are together exactly the k-th
    batch of one process with a ``num_replicas`` times larger batch, whatever the number of ranks:
    that is what lets a run resume on another world size. The tail that does not split evenly
    (fewer than ``num_replicas`` examples) is left out, so every rank yields as many batches (a rank
    with one more would wait forever in a collective).
    """

    def __init__(self, num_samples: int, shuffle: bool = True, seed: int = 0, num_replicas: int = 1, rank: int = 0):
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, num_replicas={num_replicas})")
        self.num_samples = num_samples
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
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
        remaining = self._order()[self.start_index :]
        if self.num_replicas == 1:
            return iter(remaining)
        even = len(remaining) - len(remaining) % self.num_replicas
        return iter(remaining[self.rank : even : self.num_replicas])

    def __len__(self) -> int:
        return max(0, self.num_samples - self.start_index) // self.num_replicas
