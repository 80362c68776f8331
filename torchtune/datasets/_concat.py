"""Several datasets as one."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from torch.utils.data import Dataset

from torchtune._errors import TuneValueError
from torchtune.datasets._packed import PackedDataset

__all__ = ["ConcatDataset"]


class ConcatDataset(Dataset):
    """The examples of ``datasets``, one after the other (config: a list of dataset nodes).

    ``packed`` is True when every dataset is a ``PackedDataset`` (then the batches are packs). As torchtune's,
    an index outside ``[0, len)`` gives None, and the datasets are all held (a Hugging Face dataset reads its
    rows from disk as they are asked for).

    Raises:
        TuneValueError: packed and unpacked datasets mixed (their batches differ).
    """

    def __init__(self, datasets: Sequence[Dataset]) -> None:
        self._datasets: List[Dataset] = list(datasets)
        is_packed = [isinstance(dataset, PackedDataset) for dataset in self._datasets]
        if any(is_packed) and not all(is_packed):
            raise TuneValueError(
                "ConcatDataset can't process a mix of packed and non-packed datasets: set packed the same in "
                "every dataset node."
            )
        self.packed = bool(is_packed) and all(is_packed)
        self._indexes: List[Tuple[int, int, int]] = []
        start = 0
        for position, dataset in enumerate(self._datasets):
            self._indexes.append((start, start + len(dataset), position))
            start += len(dataset)
        self._len = start

    @property
    def dropped(self) -> Dict[str, int]:
        """Rows the datasets left out for having nothing to learn, per reason, summed."""
        total: Dict[str, int] = {}
        for dataset in self._datasets:
            for reason, count in (getattr(dataset, "dropped", None) or {}).items():
                total[reason] = total.get(reason, 0) + count
        return total

    def __getitem__(self, index: int) -> Any:
        for start, stop, position in self._indexes:
            if start <= index < stop:
                return self._datasets[position][index - start]
        return None

    def __len__(self) -> int:
        return self._len
