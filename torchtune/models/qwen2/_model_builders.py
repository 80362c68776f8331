"""Fixed-size Qwen2 models (torchtune's ``qwen2_0_5b``, ``qwen2_1_5b``, ``qwen2_7b``) and the tokenizer."""

from __future__ import annotations

from typing import Any

from torchtune.models.qwen2._component_builders import qwen2
from torchtune.modules import TransformerDecoder


def qwen2_0_5b(**overrides: Any) -> TransformerDecoder:
    """Qwen2 0.5B: 24 layers, 14 query / 2 key-value heads, width 896, feed-forward 4864, tied embeddings,
    32768 tokens. ``overrides`` replace any argument."""
    kwargs = dict(
        vocab_size=151_936,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        embed_dim=896,
        intermediate_dim=4_864,
        max_seq_len=32_768,
        attn_dropout=0.0,
        norm_eps=1e-6,
        rope_base=1_000_000.0,
        tie_word_embeddings=True,
    )
    return qwen2(**{**kwargs, **overrides})


def qwen2_1_5b(**overrides: Any) -> TransformerDecoder:
    """Qwen2 1.5B: 28 layers, 12 query / 2 key-value heads, width 1536, feed-forward 8960, tied embeddings,
    32768 tokens. ``overrides`` replace any argument."""
    kwargs = dict(
        vocab_size=151_936,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        embed_dim=1_536,
        intermediate_dim=8_960,
        max_seq_len=32_768,
        attn_dropout=0.0,
        norm_eps=1e-6,
        rope_base=1_000_000.0,
        tie_word_embeddings=True,
    )
    return qwen2(**{**kwargs, **overrides})


def qwen2_7b(**overrides: Any) -> TransformerDecoder:
    """Qwen2 7B: 28 layers, 28 query / 4 key-value heads, width 3584, feed-forward 18944, untied embeddings,
    32768 tokens. ``overrides`` replace any argument."""
    kwargs = dict(
        vocab_size=152_064,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        embed_dim=3_584,
        intermediate_dim=18_944,
        max_seq_len=32_768,
        attn_dropout=0.0,
        norm_eps=1e-6,
        rope_base=1_000_000.0,
    )
    return qwen2(**{**kwargs, **overrides})
