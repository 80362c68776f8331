"""Fixed-size Llama2 models (the published 7B/13B/70B shapes) and a tiny one for tests and demos."""

from __future__ import annotations

from typing import Any, Optional

from torchtune.models.llama2._component_builders import llama2
from torchtune.modules import TransformerDecoder


def llama2_7b(**overrides: Any) -> TransformerDecoder:
    """Llama2-7B: 32 layers, 32 heads, width 4096, feed-forward 11008, 4096 tokens (6,738,415,616 parameters)."""
    kwargs = dict(
        vocab_size=32_000,
        num_layers=32,
        num_heads=32,
        num_kv_heads=32,
        embed_dim=4096,
        max_seq_len=4096,
        attn_dropout=0.0,
        norm_eps=1e-5,
    )
    return llama2(**{**kwargs, **overrides})


def llama2_13b(**overrides: Any) -> TransformerDecoder:
    """Llama2-13B: 40 layers, 40 heads, width 5120, feed-forward 13824 (13,015,864,320 parameters)."""
    kwargs = dict(
        vocab_size=32_000,
        num_layers=40,
        num_heads=40,
        num_kv_heads=40,
        embed_dim=5120,
        intermediate_dim=13824,
        max_seq_len=4096,
        attn_dropout=0.0,
        norm_eps=1e-5,
    )
    return llama2(**{**kwargs, **overrides})


def llama2_70b(**overrides: Any) -> TransformerDecoder:
    """Llama2-70B: 80 layers, 64 query / 8 key-value heads, width 8192, feed-forward 28672.

    68,976,648,192 parameters.
    """
    kwargs = dict(
        vocab_size=32_000,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        embed_dim=8192,
        intermediate_dim=28672,
        max_seq_len=4096,
        attn_dropout=0.0,
        norm_eps=1e-5,
    )
    return llama2(**{**kwargs, **overrides})


def llama2_tiny(
    vocab_size: int = 512,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    embed_dim: int = 64,
    max_seq_len: int = 256,
    intermediate_dim: Optional[int] = None,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-5,
    rope_base: float = 10_000.0,
) -> TransformerDecoder:
    """A tiny grouped-query Llama2 for CPU tests and the demo.

    Defaults: vocab 512, 2 layers, 4 heads, 2 key-value heads, width 64, 256 tokens, feed-forward
    256 (Llama2's rule for width 64). Every argument can be overridden, e.g. ``vocab_size`` to match
    a tokenizer.
    """
    return llama2(
        vocab_size=vocab_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        embed_dim=embed_dim,
        max_seq_len=max_seq_len,
        intermediate_dim=intermediate_dim,
        attn_dropout=attn_dropout,
        norm_eps=norm_eps,
        rope_base=rope_base,
    )
