"""Our Qwen2.5 component builder: torchtune's :func:`~torchtune.models.qwen2.qwen2` (Qwen2.5 is Qwen2's
architecture) with Qwen2.5's RMSNorm epsilon 1e-6 as the default."""

from __future__ import annotations

from typing import Optional

from torchtune.models.qwen2._component_builders import qwen2
from torchtune.modules import TransformerDecoder


def qwen2_5(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    head_dim: Optional[int] = None,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-6,
    rope_base: float = 1_000_000.0,
    tie_word_embeddings: bool = False,
) -> TransformerDecoder:
    """Build a Qwen2.5 decoder: :func:`~torchtune.models.qwen2.qwen2` (same arguments; ``norm_eps``
    defaults to Qwen2.5's 1e-6, ``head_dim`` may be given by position after ``max_seq_len``)."""
    return qwen2(
        vocab_size=vocab_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        embed_dim=embed_dim,
        intermediate_dim=intermediate_dim,
        max_seq_len=max_seq_len,
        attn_dropout=attn_dropout,
        norm_eps=norm_eps,
        rope_base=rope_base,
        tie_word_embeddings=tie_word_embeddings,
        head_dim=head_dim,
    )
