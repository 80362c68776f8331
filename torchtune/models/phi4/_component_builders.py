"""Our Phi-4 component builder: torchtune's :func:`~torchtune.models.phi3.phi3` (Phi-4 is Phi-3's
architecture) with Phi-4's RoPE base 250000 as the default."""

from __future__ import annotations

from typing import Optional, Sequence

from torchtune.models.phi3._component_builders import phi3
from torchtune.modules import TransformerDecoder


def phi4(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    head_dim: Optional[int] = None,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-5,
    rope_base: float = 250_000.0,
    tie_word_embeddings: bool = False,
    sliding_window: Optional[int] = None,
    rotary_dim: Optional[int] = None,
    rope_short_factor: Optional[Sequence[float]] = None,
    rope_long_factor: Optional[Sequence[float]] = None,
    rope_original_max_seq_len: Optional[int] = None,
    rope_scale_factor: Optional[float] = None,
    rope_attention_factor: Optional[float] = None,
) -> TransformerDecoder:
    """Build a Phi-4 decoder: :func:`~torchtune.models.phi3.phi3` (same arguments; ``rope_base`` defaults
    to Phi-4's 250000, ``head_dim`` may be given by position after ``max_seq_len``)."""
    return phi3(
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
        head_dim=head_dim,
        tie_word_embeddings=tie_word_embeddings,
        sliding_window=sliding_window,
        rotary_dim=rotary_dim,
        rope_short_factor=rope_short_factor,
        rope_long_factor=rope_long_factor,
        rope_original_max_seq_len=rope_original_max_seq_len,
        rope_scale_factor=rope_scale_factor,
        rope_attention_factor=rope_attention_factor,
    )
