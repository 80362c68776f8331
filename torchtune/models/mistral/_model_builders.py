"""Fixed-size Mistral models (the published shapes, as their config.json files give them)."""

from __future__ import annotations

from typing import Any

from torchtune.models.mistral._component_builders import mistral
from torchtune.modules import TransformerDecoder


def mistral_7b(**overrides: Any) -> TransformerDecoder:
    """Mistral 7B v0.3: 32 layers, 32 query / 8 key-value heads, width 4096, feed-forward
    14336, untied embeddings. ``overrides`` replace any argument."""
    kwargs = dict(
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        embed_dim=4_096,
        intermediate_dim=14_336,
        max_seq_len=32_768,
        norm_eps=1e-05,
        tie_word_embeddings=False,
        vocab_size=32_768,
        rope_base=1000000.0,
        sliding_window=None,
    )
    return mistral(**{**kwargs, **overrides})


def mistral_7b_v0_1(**overrides: Any) -> TransformerDecoder:
    """Mistral 7B v0.1: 32 layers, 32 query / 8 key-value heads, width 4096, feed-forward
    14336, untied embeddings. ``overrides`` replace any argument."""
    kwargs = dict(
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        embed_dim=4_096,
        intermediate_dim=14_336,
        max_seq_len=32_768,
        norm_eps=1e-05,
        tie_word_embeddings=False,
        vocab_size=32_000,
        rope_base=10000.0,
        sliding_window=4_096,
    )
    return mistral(**{**kwargs, **overrides})
