"""Phi-3's rotary embeddings at torchtune's path: RoPE over the halves of each head (Hugging Face's layout,
which torchtune's Phi-3 state dicts assume)."""

from __future__ import annotations

from torchtune.modules.position_embeddings import RotaryPositionalEmbeddings


class Phi3RotaryPositionalEmbeddings(RotaryPositionalEmbeddings):
    """:class:`~torchtune.modules.RotaryPositionalEmbeddings` with ``interleaved=False`` (channel ``i``
    pairs with ``i + dim/2``), torchtune's Phi-3 RoPE.

    Args:
        dim: channels per head.
        max_seq_len: positions cached.
        base: the frequency base (``rope_theta``).
    """

    def __init__(self, dim: int, max_seq_len: int = 4096, base: float = 10_000) -> None:
        super().__init__(dim=dim, max_seq_len=max_seq_len, base=base, interleaved=False)
