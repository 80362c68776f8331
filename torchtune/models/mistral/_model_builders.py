"""Fixed-size Mistral models (the published shapes, as their config.json files give them) and the tokenizer."""

from __future__ import annotations

from typing import Any

from torchtune.models.mistral._component_builders import mistral, mistral_classifier
from torchtune.modules import TransformerDecoder


def mistral_7b_v0_1(**overrides: Any) -> TransformerDecoder:
    """Mistral 7B v0.1: 32 layers, 32 query / 8 key-value heads, width 4096, feed-forward 14336, vocab 32000,
    RoPE base 10000, a 4096-token sliding window, untied embeddings. ``overrides`` replace any argument."""
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


def mistral_7b(**overrides: Any) -> TransformerDecoder:
    """torchtune's ``mistral_7b``: Mistral 7B v0.1 (the weights torchtune's configs load), as
    :func:`mistral_7b_v0_1`. torchtune 0.6.1 builds it without v0.1's 4096-token window; here the window is
    there, as in transformers and the published config.json (the same numbers up to 4096 tokens). For
    v0.3 use :func:`mistral_7b_v0_3`."""
    return mistral_7b_v0_1(**overrides)


def mistral_7b_v0_3(**overrides: Any) -> TransformerDecoder:
    """Mistral 7B v0.3: 32 layers, 32 query / 8 key-value heads, width 4096, feed-forward 14336, vocab
    32768, RoPE base 1000000, no sliding window, untied embeddings. ``overrides`` replace any argument."""
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


def mistral_reward_7b(**overrides: Any) -> TransformerDecoder:
    """torchtune's Mistral 7B reward model: the v0.1 body (no window, as torchtune builds it) with one score
    per position. ``overrides`` replace any argument."""
    kwargs = dict(
        num_classes=1,
        vocab_size=32_000,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        embed_dim=4096,
        intermediate_dim=14336,
        max_seq_len=32768,
        attn_dropout=0.0,
        norm_eps=1e-5,
    )
    return mistral_classifier(**{**kwargs, **overrides})
