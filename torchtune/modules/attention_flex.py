"""Packed batches on a GPU through FlexAttention with a block-causal document mask.

A packed row holds several examples; each position attends to the earlier positions of its own example.
The dense form of that mask (``packed_collate``'s ``[b, s, s]`` booleans) keeps SDPA off the flash kernel:
the memory-efficient kernel then reads an additive ``b x s x s`` bias and computes every block of the
square. ``torch.nn.attention.flex_attention`` takes the mask as a ``BlockMask`` instead: which 128 x 128
blocks of the square are empty (skipped), full (no mask applied) or partial (the mask function evaluated
inside the kernel), so the kernel computes only the blocks under the diagonal of each example.

``block_causal_block_mask(document_ids)`` builds that ``BlockMask`` from each position's example index
(``document_ids``: counted from ``input_pos``, which ``PackedDataset`` restarts at 0 for every segment,
padding included) with a few operations on per-block summaries: no ``s x s`` tensor exists and nothing is
compiled. ``flex_attention`` runs the kernel compiled by ``torch.compile`` (once per shape, ``dynamic=False``:
packed rows always have ``max_seq_len`` tokens, so a run compiles for its batch size and, at most, a smaller
last batch); inside a compiled layer the plain function is traced into that layer's graph instead.

Which path a batch takes (``uses_flex_attention``): FlexAttention for a packed batch on CUDA (or under
``window_kernel_device("cuda")``, through which the memory estimator and the launch counter count the CUDA
path) on a model whose attention has no soft cap and no sliding window; otherwise the dense mask and SDPA
(the CPU path, and the reference the tests hold FlexAttention to). Without packing there is no mask and SDPA
picks flash attention.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.nn.attention.flex_attention import BlockMask

__all__ = [
    "BLOCK_SIZE",
    "BlockMask",
    "block_causal_block_mask",
    "document_ids",
    "flex_attention",
    "uses_flex_attention",
]

BLOCK_SIZE = 128  # FlexAttention's default block: the mask's granularity
_COMPILED: dict[str, Callable[..., torch.Tensor]] = {}
_SUPPORTED: "weakref.WeakKeyDictionary[nn.Module, bool]" = weakref.WeakKeyDictionary()
# the memory estimator and the launch counter replace the kernel by a stand-in of what it allocates and saves
STAND_IN: Optional[Callable[..., torch.Tensor]] = None


def document_ids(input_pos: torch.Tensor) -> torch.Tensor:
    """``[b, s]`` int32: the index of the segment (example, or padding) of each position of a packed batch,
    counted from ``input_pos`` restarting at 0 at each segment's first position."""
    return (input_pos == 0).to(torch.int32).cumsum(dim=1, dtype=torch.int32) - 1


def _flex_supported(model: nn.Module) -> bool:
    if model not in _SUPPORTED:
        _SUPPORTED[model] = not any(
            getattr(m, "softcap", None) is not None or getattr(m, "sliding_window", None) is not None
            for m in model.modules()
        )
    return _SUPPORTED[model]


def uses_flex_attention(device: torch.device, model: nn.Module) -> bool:
    """Whether a packed batch for ``model`` on ``device`` goes through FlexAttention (see the module docstring)."""
    from torchtune.modules.sliding_window import target_device_type

    return target_device_type(device) == "cuda" and _flex_supported(model)


def block_causal_block_mask(doc: torch.Tensor, block_size: int = BLOCK_SIZE) -> BlockMask:
    """The ``BlockMask`` of a block-causal document mask: position ``q`` attends to ``k`` when ``k <= q`` and
    both lie in the same segment (``doc``: ``[b, s]`` segment indices, non-decreasing along each row).

    Per block pair (query block ``i``, key block ``j``): empty when ``j > i`` or when the key block's last
    segment ends before the query block's first begins; full when ``j < i`` and one segment covers both blocks
    whole; partial otherwise (the mask function decides inside the kernel, as it does past the sequence's end).
    """
    b, s = doc.shape
    blocks = -(-s // block_size)
    padded = blocks * block_size
    if padded != s:  # positions past the end get a segment of their own: their blocks are partial, never full
        doc = torch.cat([doc, doc.new_full((b, padded - s), torch.iinfo(doc.dtype).max)], dim=1)
    first, last = doc[:, ::block_size], doc[:, block_size - 1 :: block_size]  # [b, blocks]
    q_first, q_last = first[:, :, None], last[:, :, None]
    kv_first, kv_last = first[:, None, :], last[:, None, :]
    index = torch.arange(blocks, device=doc.device)
    below = index[None, :, None] > index[None, None, :]  # j < i
    on_or_below = index[None, :, None] >= index[None, None, :]
    seen = on_or_below & (kv_last >= q_first)
    full = below & (kv_first == q_last)
    partial = seen & ~full

    def kv_blocks(selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        count = selected.sum(dim=-1, dtype=torch.int32)
        # the selected blocks first, in order; what follows a row's count is never read
        order = torch.argsort(selected.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
        return count[:, None], order[:, None]

    kv_num, kv_index = kv_blocks(partial)
    full_num, full_index = kv_blocks(full)

    def mask_mod(batch: Any, head: Any, q_idx: Any, kv_idx: Any) -> Any:
        return (q_idx >= kv_idx) & (doc[batch, q_idx] == doc[batch, kv_idx])

    return BlockMask.from_kv_blocks(
        kv_num, kv_index, full_num, full_index, BLOCK_SIZE=block_size, mask_mod=mask_mod, seq_lengths=(s, s)
    )


def flex_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: BlockMask, scale: Optional[float] = None
) -> torch.Tensor:
    """``softmax(q k^T * scale + mask) v`` over ``[b, h, s, d]`` tensors with ``block_mask``, through the compiled
    FlexAttention kernel (traced into the graph instead inside ``torch.compile``).

    Raises:
        TuneError: the kernel cannot be compiled here (with the reason): the run stops rather than fall back
            to attention over the whole square.
    """
    from torch.nn.attention.flex_attention import flex_attention as flex

    if STAND_IN is not None:
        return STAND_IN(q, k, v, block_mask)
    if torch.compiler.is_compiling() or q.device.type == "cpu":
        # a compiled layer traces it into its own graph; a CPU (the tests) runs the unfused reference
        return flex(q, k, v, block_mask=block_mask, scale=scale)
    try:
        if "flex" not in _COMPILED:
            _COMPILED["flex"] = torch.compile(flex, dynamic=False)
        return _COMPILED["flex"](q, k, v, block_mask=block_mask, scale=scale)
    except Exception as error:  # noqa: BLE001 - a compiler missing or failing on this machine
        from torchtune._errors import TuneError

        raise TuneError(
            f"FlexAttention, which packed batches use on {q.device}, could not be compiled "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}). Without it the "
            "attention of a packed batch would be computed over the whole s x s square, so the run stops. Fix "
            "the compiler (a Triton matching this torch), or train without packing (dataset.packed=False)."
        ) from error
