"""Fixed-size Llama 3.2 text models: the published 1B and 3B shapes (tied embeddings)."""

from __future__ import annotations

from typing import Any

from torchtune.models.llama3_2._component_builders import llama3_2
from torchtune.modules import TransformerDecoder


def llama3_2_1b(**overrides: Any) -> TransformerDecoder:
    """Llama 3.2 1B: 16 layers, 32 query / 8 key-value heads, width 2048, feed-forward 8192, vocab
    128256, 131072 tokens, RoPE base 500000 scaled by 32, tied embeddings (1,235,814,400 parameters)."""
    kwargs = dict(
        vocab_size=128_256,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        embed_dim=2048,
        max_seq_len=131_072,
        intermediate_dim=8192,
        attn_dropout=0.0,
        norm_eps=1e-5,
        rope_base=500_000,
        scale_factor=32,
        tie_word_embeddings=True,
    )
    return llama3_2(**{**kwargs, **overrides})


def llama3_2_3b(**overrides: Any) -> TransformerDecoder:
    """Llama 3.2 3B: 28 layers, 24 query / 8 key-value heads, width 3072, feed-forward 8192, vocab
    128256, 131072 tokens, RoPE base 500000 scaled by 32, tied embeddings (3,212,749,824 parameters)."""
    kwargs = dict(
        vocab_size=128_256,
        num_layers=28,
        num_heads=24,
        num_kv_heads=8,
        embed_dim=3072,
        max_seq_len=131_072,
        intermediate_dim=8192,
        attn_dropout=0.0,
        norm_eps=1e-5,
        rope_base=500_000,
        scale_factor=32,
        tie_word_embeddings=True,
    )
    return llama3_2(**{**kwargs, **overrides})
