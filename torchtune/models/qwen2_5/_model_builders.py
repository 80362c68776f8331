"""Fixed-size Qwen2.5 models (torchtune's builders: the published shapes, base and instruct where their
config.json files differ) and the tokenizer. Our shorter names (``qwen2_5_1_5b``, ``qwen2_5_7b``,
``qwen2_5_14b``, ``qwen2_5_32b``) are the instruct builders."""

from __future__ import annotations

from typing import Any

from torchtune.models.qwen2._component_builders import qwen2
from torchtune.modules import TransformerDecoder


def qwen2_5_0_5b(**overrides: Any) -> TransformerDecoder:
    """Qwen2.5 0.5B (base and instruct): 24 layers, 14 query / 2 key-value heads, width 896,
    feed-forward 4864, tied embeddings, 32768 tokens, RMSNorm epsilon 1e-06. ``overrides``
    replace any argument."""
    kwargs = dict(
        vocab_size=151_936,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        embed_dim=896,
        intermediate_dim=4_864,
        max_seq_len=32_768,
        attn_dropout=0.0,
        norm_eps=1e-06,
        rope_base=1_000_000.0,
        tie_word_embeddings=True,
    )
    return qwen2(**{**kwargs, **overrides})


def qwen2_5_1_5b_base(**overrides: Any) -> TransformerDecoder:
    """Qwen2.5 1.5B base: 28 layers, 12 query / 2 key-value heads, width 1536,
    feed-forward 8960, tied embeddings, 131072 tokens, RMSNorm epsilon 1e-06. ``overrides``
    replace any argument."""
    kwargs = dict(
        vocab_size=151_936,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        embed_dim=1_536,
        intermediate_dim=8_960,
        max_seq_len=131_072,
        attn_dropout=0.0,
        norm_eps=1e-06,
        rope_base=1_000_000.0,
        tie_word_embeddings=True,
    )
    return qwen2(**{**kwargs, **overrides})


def qwen2_5_1_5b_instruct(**overrides: Any) -> TransformerDecoder:
    """Qwen2.5 1.5B Instruct: 28 layers, 12 query / 2 key-value heads, width 1536,
    feed-forward 8960, tied embeddings, 32768 tokens, RMSNorm epsilon 1e-06. ``overrides``
    replace any argument."""
    kwargs = dict(
        vocab_size=151_936,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        embed_dim=1_536,
        intermediate_dim=8_960,
        max_seq_len=32_768,
        attn_dropout=0.0,
        norm_eps=1e-06,
        rope_base=1_000_000.0,
        tie_word_embeddings=True,
    )
    return qwen2(**{**kwargs, **overrides})


def qwen2_5_3b(**overrides: Any) -> TransformerDecoder:
    """Qwen2.5 3B (base and instruct): 36 layers, 16 query / 2 key-value heads, width 2048,
    feed-forward 11008, tied embeddings, 32768 tokens, RMSNorm epsilon 1e-06. ``overrides``
    replace any argument."""
    kwargs = dict(
        vocab_size=151_936,
        num_layers=36,
        num_heads=16,
        num_kv_heads=2,
        embed_dim=2_048,
        intermediate_dim=11_008,
        max_seq_len=32_768,
        attn_dropout=0.0,
        norm_eps=1e-06,
        rope_base=1_000_000.0,
        tie_word_embeddings=True,
    )
    return qwen2(**{**kwargs, **overrides})


def qwen2_5_7b_base(**overrides: Any) -> TransformerDecoder:
    """Qwen2.5 7B base: 28 layers, 28 query / 4 key-value heads, width 3584,
    feed-forward 18944, untied embeddings, 131072 tokens, RMSNorm epsilon 1e-06. ``overrides``
    replace any argument."""
    kwargs = dict(
        vocab_size=152_064,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        embed_dim=3_584,
        intermediate_dim=18_944,
        max_seq_len=131_072,
        attn_dropout=0.0,
        norm_eps=1e-06,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
    )
    return qwen2(**{**kwargs, **overrides})


def qwen2_5_7b_instruct(**overrides: Any) -> TransformerDecoder:
    """Qwen2.5 7B Instruct: 28 layers, 28 query / 4 key-value heads, width 3584,
    feed-forward 18944, untied embeddings, 32768 tokens, RMSNorm epsilon 1e-06. ``overrides``
    replace any argument."""
    kwargs = dict(
        vocab_size=152_064,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        embed_dim=3_584,
        intermediate_dim=18_944,
        max_seq_len=32_768,
        attn_dropout=0.0,
        norm_eps=1e-06,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
    )
    return qwen2(**{**kwargs, **overrides})


def qwen2_5_14b_base(**overrides: Any) -> TransformerDecoder:
    """Qwen2.5 14B base: 48 layers, 40 query / 8 key-value heads, width 5120,
    feed-forward 13824, untied embeddings, 131072 tokens, RMSNorm epsilon 1e-05. ``overrides``
    replace any argument."""
    kwargs = dict(
        vocab_size=152_064,
        num_layers=48,
        num_heads=40,
        num_kv_heads=8,
        embed_dim=5_120,
        intermediate_dim=13_824,
        max_seq_len=131_072,
        attn_dropout=0.0,
        norm_eps=1e-05,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
    )
    return qwen2(**{**kwargs, **overrides})


def qwen2_5_14b_instruct(**overrides: Any) -> TransformerDecoder:
    """Qwen2.5 14B Instruct: 48 layers, 40 query / 8 key-value heads, width 5120,
    feed-forward 13824, untied embeddings, 32768 tokens, RMSNorm epsilon 1e-06. ``overrides``
    replace any argument."""
    kwargs = dict(
        vocab_size=152_064,
        num_layers=48,
        num_heads=40,
        num_kv_heads=8,
        embed_dim=5_120,
        intermediate_dim=13_824,
        max_seq_len=32_768,
        attn_dropout=0.0,
        norm_eps=1e-06,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
    )
    return qwen2(**{**kwargs, **overrides})


def qwen2_5_32b_base(**overrides: Any) -> TransformerDecoder:
    """Qwen2.5 32B base: 64 layers, 40 query / 8 key-value heads, width 5120,
    feed-forward 27648, untied embeddings, 131072 tokens, RMSNorm epsilon 1e-05. ``overrides``
    replace any argument."""
    kwargs = dict(
        vocab_size=152_064,
        num_layers=64,
        num_heads=40,
        num_kv_heads=8,
        embed_dim=5_120,
        intermediate_dim=27_648,
        max_seq_len=131_072,
        attn_dropout=0.0,
        norm_eps=1e-05,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
    )
    return qwen2(**{**kwargs, **overrides})


def qwen2_5_32b_instruct(**overrides: Any) -> TransformerDecoder:
    """Qwen2.5 32B Instruct: 64 layers, 40 query / 8 key-value heads, width 5120,
    feed-forward 27648, untied embeddings, 32768 tokens, RMSNorm epsilon 1e-06. ``overrides``
    replace any argument."""
    kwargs = dict(
        vocab_size=152_064,
        num_layers=64,
        num_heads=40,
        num_kv_heads=8,
        embed_dim=5_120,
        intermediate_dim=27_648,
        max_seq_len=32_768,
        attn_dropout=0.0,
        norm_eps=1e-06,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
    )
    return qwen2(**{**kwargs, **overrides})


def qwen2_5_72b_base(**overrides: Any) -> TransformerDecoder:
    """Qwen2.5 72B base: 80 layers, 64 query / 8 key-value heads, width 8192,
    feed-forward 29568, untied embeddings, 131072 tokens, RMSNorm epsilon 1e-05. ``overrides``
    replace any argument."""
    kwargs = dict(
        vocab_size=152_064,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        embed_dim=8_192,
        intermediate_dim=29_568,
        max_seq_len=131_072,
        attn_dropout=0.0,
        norm_eps=1e-05,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
    )
    return qwen2(**{**kwargs, **overrides})


def qwen2_5_72b_instruct(**overrides: Any) -> TransformerDecoder:
    """Qwen2.5 72B Instruct: 80 layers, 64 query / 8 key-value heads, width 8192,
    feed-forward 29568, untied embeddings, 32768 tokens, RMSNorm epsilon 1e-06. ``overrides``
    replace any argument."""
    kwargs = dict(
        vocab_size=152_064,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        embed_dim=8_192,
        intermediate_dim=29_568,
        max_seq_len=32_768,
        attn_dropout=0.0,
        norm_eps=1e-06,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
    )
    return qwen2(**{**kwargs, **overrides})


# Our names, from before the base/instruct split: the instruct shapes.
qwen2_5_1_5b = qwen2_5_1_5b_instruct
qwen2_5_7b = qwen2_5_7b_instruct
qwen2_5_14b = qwen2_5_14b_instruct
qwen2_5_32b = qwen2_5_32b_instruct
