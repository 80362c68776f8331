"""Qwen2's rotary embeddings at torchtune's path: RoPE over the halves of each head (Hugging Face's
layout, which torchtune's Qwen2 state dicts assume), base 1000000 by default."""

from __future__ import annotations

from torchtune.modules.position_embeddings import RotaryPositionalEmbeddings


class Qwen2RotaryPositionalEmbeddings(RotaryPositionalEmbeddings):
    """:class:`~torchtune.modules.RotaryPositionalEmbeddings` with ``interleaved=False`` (channel ``i``
    pairs with ``i + dim/2``) and torchtune's Qwen2 defaults.

    Args:
        dim: channels per head.
        max_seq_len: positions cached.
        base: the frequency base (``rope_theta``).
    """

    def __init__(self, dim: int, max_seq_len: int = 4096, base: float = 1_000_000.0) -> None:
        super().__init__(dim=dim, max_seq_len=max_seq_len, base=base, interleaved=False)
