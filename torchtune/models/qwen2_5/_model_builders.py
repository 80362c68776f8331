"""Fixed-size Qwen2.5 models (the published shapes, as their config.json files give them)."""

from __future__ import annotations

from typing import Any

from torchtune.models.qwen2_5._component_builders import qwen2_5
from torchtune.modules import TransformerDecoder


def qwen2_5_0_5b(**overrides: Any) -> TransformerDecoder:
    """Qwen2.5 0.5B: 24 layers, 14 query / 2 key-value heads, width 896, feed-forward
    4864, tied embeddings, q/k/v biases, RoPE base 1000000, 32768 tokens. ``overrides`` replace any argument."""
    kwargs = dict(
        max_seq_len=32_768,
        norm_eps=1e-06,
        rope_base=1000000.0,
        vocab_size=151_936,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        embed_dim=896,
        intermediate_dim=4_864,
        tie_word_embeddings=True,
    )
    return qwen2_5(**{**kwargs, **overrides})


def qwen2_5_1_5b(**overrides: Any) -> TransformerDecoder:
    """Qwen2.5 1.5B: 28 layers, 12 query / 2 key-value heads, width 1536, feed-forward
    8960, tied embeddings, q/k/v biases, RoPE base 1000000, 32768 tokens. ``overrides`` replace any argument."""
    kwargs = dict(
        max_seq_len=32_768,
        norm_eps=1e-06,
        rope_base=1000000.0,
        vocab_size=151_936,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        embed_dim=1_536,
        intermediate_dim=8_960,
        tie_word_embeddings=True,
    )
    return qwen2_5(**{**kwargs, **overrides})


def qwen2_5_3b(**overrides: Any) -> TransformerDecoder:
    """Qwen2.5 3B: 36 layers, 16 query / 2 key-value heads, width 2048, feed-forward
    11008, tied embeddings, q/k/v biases, RoPE base 1000000, 32768 tokens. ``overrides`` replace any argument."""
    kwargs = dict(
        max_seq_len=32_768,
        norm_eps=1e-06,
        rope_base=1000000.0,
        vocab_size=151_936,
        num_layers=36,
        num_heads=16,
        num_kv_heads=2,
        embed_dim=2_048,
        intermediate_dim=11_008,
        tie_word_embeddings=True,
    )
    return qwen2_5(**{**kwargs, **overrides})


def qwen2_5_7b(**overrides: Any) -> TransformerDecoder:
    """Qwen2.5 7B: 28 layers, 28 query / 4 key-value heads, width 3584, feed-forward
    18944, untied embeddings, q/k/v biases, RoPE base 1000000, 32768 tokens. ``overrides`` replace any argument."""
    kwargs = dict(
        max_seq_len=32_768,
        norm_eps=1e-06,
        rope_base=1000000.0,
        vocab_size=152_064,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        embed_dim=3_584,
        intermediate_dim=18_944,
        tie_word_embeddings=False,
    )
    return qwen2_5(**{**kwargs, **overrides})


def qwen2_5_14b(**overrides: Any) -> TransformerDecoder:
    """Qwen2.5 14B: 48 layers, 40 query / 8 key-value heads, width 5120, feed-forward
    13824, untied embeddings, q/k/v biases, RoPE base 1000000, 32768 tokens. ``overrides`` replace any argument."""
    kwargs = dict(
        max_seq_len=32_768,
        norm_eps=1e-06,
        rope_base=1000000.0,
        vocab_size=152_064,
        num_layers=48,
        num_heads=40,
        num_kv_heads=8,
        embed_dim=5_120,
        intermediate_dim=13_824,
        tie_word_embeddings=False,
    )
    return qwen2_5(**{**kwargs, **overrides})


def qwen2_5_32b(**overrides: Any) -> TransformerDecoder:
    """Qwen2.5 32B: 64 layers, 40 query / 8 key-value heads, width 5120, feed-forward
    27648, untied embeddings, q/k/v biases, RoPE base 1000000, 32768 tokens. ``overrides`` replace any argument."""
    kwargs = dict(
        max_seq_len=32_768,
        norm_eps=1e-06,
        rope_base=1000000.0,
        vocab_size=152_064,
        num_layers=64,
        num_heads=40,
        num_kv_heads=8,
        embed_dim=5_120,
        intermediate_dim=27_648,
        tie_word_embeddings=False,
    )
    return qwen2_5(**{**kwargs, **overrides})
