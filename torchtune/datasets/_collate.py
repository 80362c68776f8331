"""Batching for the recipes: right padding for plain examples, a block-causal tensor mask for packed ones.
The implementations are torchtune's collate functions in ``torchtune.data``; these names are ours."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Sequence

import torch

from torchtune.data._collate import _collate_packs, padded_collate_sft
from torchtune.modules.loss import CROSS_ENTROPY_IGNORE_IDX

# Right-pad ``tokens`` with ``padding_idx`` and ``labels`` with ``ignore_idx``: torchtune's function.
padded_collate = padded_collate_sft

__all__ = ["CROSS_ENTROPY_IGNORE_IDX", "block_causal_mask", "packed_collate", "padded_collate"]


def block_causal_mask(seq_lens: Sequence[int]) -> torch.Tensor:
    """Bool ``[sum(seq_lens), sum(seq_lens)]``: True where a position may attend, i.e. to itself and
    earlier positions of its own segment (each row has at least its diagonal, so no NaN softmax)."""
    from torchtune.modules.attention_utils import create_block_causal_mask  # imports flex attention: on use only

    return create_block_causal_mask([torch.as_tensor(seq_lens, dtype=torch.long)])[0]


def packed_collate(batch: Sequence[Mapping[str, Any]]) -> Dict[str, torch.Tensor]:
    """Stack packs from ``PackedDataset``: ``tokens``, ``labels``, ``input_pos`` as ``Long[b, s]`` and
    ``mask`` as ``Bool[b, s, s]``, the block-diagonal causal "may attend" mask (True = attend) that
    keeps attention inside each example of a pack. ``torchtune.data.padded_collate_packed`` is the same
    with a flex-attention mask where the GPU runs it; the recipes' attention takes this tensor."""
    from torchtune.modules.attention_utils import create_block_causal_mask  # imports flex attention: on use only

    return _collate_packs(batch, create_block_causal_mask)
