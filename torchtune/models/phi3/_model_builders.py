"""Phi-3 Mini (4K) and its tokenizer (torchtune's ``phi3_mini``, ``phi3_mini_tokenizer``)."""

from __future__ import annotations

from typing import Any

from torchtune.models.phi3._component_builders import phi3
from torchtune.modules import TransformerDecoder


def phi3_mini(**overrides: Any) -> TransformerDecoder:
    """Phi-3 Mini 4K: 32 layers, 32 heads, width 3072, feed-forward 8192, vocab 32064, 4096 tokens, RoPE base
    10000, and the published config.json's 2047-token sliding window (torchtune 0.6.1 builds it without:
    the same numbers up to 2047 tokens). ``overrides`` replace any argument."""
    kwargs = dict(
        vocab_size=32_064,
        num_layers=32,
        num_heads=32,
        num_kv_heads=32,
        embed_dim=3072,
        intermediate_dim=8192,
        max_seq_len=4096,
        attn_dropout=0.0,
        norm_eps=1e-5,
        sliding_window=2047,
    )
    return phi3(**{**kwargs, **overrides})
