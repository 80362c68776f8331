"""Fixed-size Gemma (1) models (torchtune's ``gemma_2b``, ``gemma_7b``) and the tokenizer."""

from __future__ import annotations

from typing import Any

from torchtune.models.gemma._component_builders import gemma
from torchtune.modules import TransformerDecoder


def gemma_2b(**overrides: Any) -> TransformerDecoder:
    """Gemma 2B: 18 layers, 8 query heads and 1 key-value head of 256, width 2048, feed-forward 16384, vocab
    256000, 8192 tokens, tied embeddings. ``overrides`` replace any argument."""
    kwargs = dict(
        vocab_size=256_000,
        num_layers=18,
        num_heads=8,
        head_dim=256,
        num_kv_heads=1,
        embed_dim=2048,
        intermediate_dim=16_384,
        max_seq_len=8192,
        attn_dropout=0.0,
        norm_eps=1e-6,
    )
    return gemma(**{**kwargs, **overrides})


def gemma_7b(**overrides: Any) -> TransformerDecoder:
    """Gemma 7B: 28 layers, 16 heads of 256, width 3072, feed-forward 24576, vocab 256000, 8192 tokens, tied
    embeddings. ``overrides`` replace any argument."""
    kwargs = dict(
        vocab_size=256_000,
        num_layers=28,
        num_heads=16,
        head_dim=256,
        num_kv_heads=16,
        embed_dim=3072,
        intermediate_dim=24_576,
        max_seq_len=8192,
        attn_dropout=0.0,
        norm_eps=1e-6,
    )
    return gemma(**{**kwargs, **overrides})
