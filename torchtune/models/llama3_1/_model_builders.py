"""Fixed-size Llama 3.1 models: the published 8B, 70B and 405B shapes."""

from __future__ import annotations

from typing import Any

from torchtune.models.llama3_1._component_builders import llama3_1
from torchtune.modules import TransformerDecoder


def llama3_1_8b(**overrides: Any) -> TransformerDecoder:
    """Llama 3.1 8B: 32 layers, 32 query / 8 key-value heads, width 4096, feed-forward 14336, vocab
    128256, 131072 tokens, RoPE base 500000 scaled by 8, untied output (8,030,261,248 parameters)."""
    kwargs = dict(
        vocab_size=128_256,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        embed_dim=4096,
        max_seq_len=131_072,
        intermediate_dim=14_336,
        attn_dropout=0.0,
        norm_eps=1e-5,
        rope_base=500_000,
        scale_factor=8,
    )
    return llama3_1(**{**kwargs, **overrides})


def llama3_1_70b(**overrides: Any) -> TransformerDecoder:
    """Llama 3.1 70B: 80 layers, 64 query / 8 key-value heads, width 8192, feed-forward 28672, vocab
    128256, RoPE scaled by 8, untied output (70,553,706,496 parameters)."""
    kwargs = dict(
        vocab_size=128_256,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        embed_dim=8192,
        max_seq_len=131_072,
        intermediate_dim=28_672,
        attn_dropout=0.0,
        norm_eps=1e-5,
        rope_base=500_000,
        scale_factor=8,
    )
    return llama3_1(**{**kwargs, **overrides})


def llama3_1_405b(**overrides: Any) -> TransformerDecoder:
    """Llama 3.1 405B: 126 layers, 128 query / 8 key-value heads, width 16384, feed-forward 53248, vocab
    128256, RoPE scaled by 8, untied output. ``overrides`` replace any argument."""
    kwargs = dict(
        vocab_size=128_256,
        num_layers=126,
        num_heads=128,
        num_kv_heads=8,
        embed_dim=16_384,
        max_seq_len=131_072,
        intermediate_dim=53_248,
        attn_dropout=0.0,
        norm_eps=1e-5,
        rope_base=500_000,
        scale_factor=8,
    )
    return llama3_1(**{**kwargs, **overrides})
