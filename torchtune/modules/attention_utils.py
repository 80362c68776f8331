"""Attention masks for packed sequences, and the choice between SDPA and flex attention (torchtune's
``torchtune.modules.attention_utils``).

A packed row holds several documents one after the other; each token may attend to the earlier tokens of
its own document only. On a CUDA GPU that flex attention supports (compute capability 7.5+), the mask is a
flex-attention ``BlockMask``, which stores only which blocks of the ``s x s`` mask are full, empty or
partial; elsewhere it is a boolean ``[b, s, s]`` block-diagonal causal mask for SDPA.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any, Callable, List, Optional, Union

import torch
from torch import nn

# Flex attention's module imports the compiler stack and FSDP (about a second): it is imported where a block
# mask is built or run, never when this module loads (`tune validate` and a CPU run never pay for it).
_FLEX_MODULE = "torch.nn.attention.flex_attention"

__all__ = [
    "compile_friendly_flex_attention",
    "create_block_causal_mask",
    "flex_attention_call",
    "is_block_mask",
    "packed_block_causal_mask",
]


def _flex_attention_supported() -> bool:
    """torchtune's condition: flex attention (torch >= 2.5) and a CUDA GPU of compute capability 7.5+."""
    has_flex = importlib.util.find_spec(_FLEX_MODULE) is not None
    return has_flex and torch.cuda.is_available() and torch.cuda.get_device_capability() >= (7, 5)


_SUPPORTS_FLEX_ATTENTION: bool = _flex_attention_supported()

_MaskType = Union[torch.Tensor, Any]  # a boolean / additive tensor, or a flex-attention BlockMask


def is_block_mask(mask: Any) -> bool:
    """Whether ``mask`` is a flex-attention ``BlockMask`` (rather than a tensor or ``None``)."""
    if mask is None or isinstance(mask, torch.Tensor) or _FLEX_MODULE not in sys.modules:
        return False  # no BlockMask can exist before its module is imported
    return isinstance(mask, sys.modules[_FLEX_MODULE].BlockMask)


def compile_friendly_flex_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: Any, scale: Optional[float] = None
) -> torch.Tensor:
    """Flex attention of ``[b, h, s, d]`` tensors with ``block_mask``, from compiled and eager code alike: the
    kernel compiled once per shape, traced into the graph of a compiled layer instead
    (``torchtune.modules.attention_flex.flex_attention``, which also stops a run whose kernel cannot be built)."""
    from torchtune.modules.attention_flex import flex_attention

    return flex_attention(q, k, v, block_mask, scale=scale)


def flex_attention_call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_mask: Any,
    *,
    scale: Optional[float] = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Flex attention with a ``BlockMask`` (packed batches on CUDA).

    Raises:
        ValueError: ``dropout_p > 0`` (flex attention has no dropout).
    """
    if dropout_p > 0.0:
        raise ValueError("Flex attention does not support dropout. Please set dropout to 0.0.")
    return compile_friendly_flex_attention(q, k, v, block_mask=block_mask, scale=scale)


def _get_document_ids_from_seq_lens(seq_lens: List[torch.Tensor]) -> torch.Tensor:
    """``[b, s]`` document index of every token of each packed row, from each row's document lengths
    (``[2, 3, 1]`` -> ``[0, 0, 1, 1, 1, 2]``); the lengths of a row sum to ``s``."""
    rows = []
    for lengths in seq_lens:
        ids = torch.arange(len(lengths), device=lengths.device)
        rows.append(torch.repeat_interleave(ids, lengths.to(torch.long)))
    return torch.stack(rows)


def create_block_causal_mask(seq_lens: List[torch.Tensor]) -> torch.Tensor:
    """Boolean ``[b, s, s]`` mask of packed rows: ``True`` where a token may attend to another, i.e. an
    earlier (or the same) token of its own document; the lengths of each row sum to ``s``."""
    masks = []
    for lengths in seq_lens:
        blocks = [torch.ones(n, n, dtype=torch.bool, device=lengths.device).tril() for n in lengths.tolist()]
        masks.append(torch.block_diag(*blocks))
    return torch.stack(masks)


def packed_block_causal_mask(seq_lens: List[torch.Tensor]) -> _MaskType:
    """The attention mask of packed rows: a flex-attention ``BlockMask`` on the GPU where flex attention runs
    (built on ``cuda``), else :func:`create_block_causal_mask`'s boolean tensor."""
    if not _SUPPORTS_FLEX_ATTENTION:
        return create_block_causal_mask(seq_lens)
    # the recipes' builder: block summaries, no s x s tensor and nothing compiled (create_block_mask's way)
    from torchtune.modules.attention_flex import block_causal_block_mask

    document_ids = _get_document_ids_from_seq_lens(seq_lens).to(device="cuda", dtype=torch.int32)
    return block_causal_block_mask(document_ids)


def _sdpa_or_flex_attention() -> Callable:
    """``attention(q, k, v, mask, dropout_p, is_causal)``: flex attention for a ``BlockMask`` (where flex
    attention is supported), SDPA with the ``[b, s, s]`` mask broadcast over the heads otherwise."""

    def _attention_call(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: Optional[_MaskType],
        dropout_p: float,
        is_causal: bool,
    ) -> torch.Tensor:
        if _SUPPORTS_FLEX_ATTENTION and is_block_mask(mask):
            if dropout_p > 0.0:
                raise ValueError("Flex attention does not support dropout. Please set dropout to 0.0.")
            return compile_friendly_flex_attention(q, k, v, block_mask=mask)
        if mask is not None:
            mask = mask[:, None, :, :]
        return nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal
        )

    return _attention_call
