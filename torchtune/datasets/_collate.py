"""Batching: right padding for plain examples, block-causal masks for packed ones."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Sequence

import torch
from torch.nn.utils.rnn import pad_sequence

from torchtune.modules.loss import CROSS_ENTROPY_IGNORE_IDX


def _long(x: Any) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.long)


def padded_collate(
    batch: Sequence[Mapping[str, Any]],
    padding_idx: int = 0,
    ignore_idx: int = CROSS_ENTROPY_IGNORE_IDX,
) -> Dict[str, torch.Tensor]:
    """Right-pad ``tokens`` with ``padding_idx`` and ``labels`` with ``ignore_idx`` to the longest
    example: ``{"tokens": Long[b, s], "labels": Long[b, s]}``."""
    tokens = pad_sequence([_long(x["tokens"]) for x in batch], batch_first=True, padding_value=padding_idx)
    labels = pad_sequence([_long(x["labels"]) for x in batch], batch_first=True, padding_value=ignore_idx)
    return {"tokens": tokens, "labels": labels}


def block_causal_mask(seq_lens: Sequence[int]) -> torch.Tensor:
    """Bool ``[sum(seq_lens), sum(seq_lens)]``: True where a position may attend, i.e. to itself and
    earlier positions of its own segment (each row has at least its diagonal, so no NaN softmax)."""
    blocks = [torch.tril(torch.ones(int(n), int(n), dtype=torch.bool)) for n in seq_lens if int(n) > 0]
    return torch.block_diag(*blocks)


def packed_collate(batch: Sequence[Mapping[str, Any]]) -> Dict[str, torch.Tensor]:
    """Stack packs from ``PackedDataset``: ``tokens``, ``labels``, ``input_pos`` as ``Long[b, s]`` and
    ``mask`` as ``Bool[b, s, s]``, the block-diagonal causal "may attend" mask (True = attend) that
    keeps attention inside each example of a pack."""
    out = {key: torch.stack([_long(x[key]) for x in batch]) for key in ("tokens", "labels", "input_pos")}
    out["mask"] = torch.stack([block_causal_mask(_long(x["seq_lens"]).tolist()) for x in batch])
    return out
