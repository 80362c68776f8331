"""Fixed-size Llama 3 models: the published 8B and 70B shapes (8192 tokens, RoPE base 500000, no scaling)."""

from __future__ import annotations

from typing import Any

from torchtune.models.llama3._component_builders import llama3
from torchtune.modules import TransformerDecoder


def llama3_8b(**overrides: Any) -> TransformerDecoder:
    """Llama 3 8B: 32 layers, 32 query / 8 key-value heads, width 4096, feed-forward 14336, vocab 128256,
    8192 tokens, RoPE base 500000 (8,030,261,248 parameters). ``overrides`` replace any argument."""
    kwargs = dict(
        vocab_size=128_256,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        embed_dim=4096,
        max_seq_len=8192,
        intermediate_dim=14_336,
        attn_dropout=0.0,
        norm_eps=1e-5,
        rope_base=500_000,
    )
    return llama3(**{**kwargs, **overrides})


def llama3_70b(**overrides: Any) -> TransformerDecoder:
    """Llama 3 70B: 80 layers, 64 query / 8 key-value heads, width 8192, feed-forward 28672, vocab 128256,
    8192 tokens, RoPE base 500000. ``overrides`` replace any argument."""
    kwargs = dict(
        vocab_size=128_256,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        embed_dim=8192,
        max_seq_len=8192,
        intermediate_dim=28_672,
        attn_dropout=0.0,
        norm_eps=1e-5,
        rope_base=500_000,
    )
    return llama3(**{**kwargs, **overrides})
