"""Fixed-size Qwen3 models (the published shapes, as their config.json files give them) and the tokenizer."""

from __future__ import annotations

from typing import Any, Optional

from torchtune.models.qwen3._component_builders import qwen3
from torchtune.modules import TransformerDecoder


def qwen3_0_6b(**overrides: Any) -> TransformerDecoder:
    """Qwen3 0.6B: 28 layers, 16 query / 8 key-value heads, width 1024, feed-forward
    3072, tied embeddings, RoPE base 1000000, 40960 tokens. ``overrides`` replace any argument."""
    kwargs = dict(
        vocab_size=151_936,
        max_seq_len=40_960,
        norm_eps=1e-06,
        rope_base=1000000.0,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        embed_dim=1_024,
        intermediate_dim=3_072,
        head_dim=128,
        tie_word_embeddings=True,
    )
    return qwen3(**{**kwargs, **overrides})


def qwen3_1_7b(**overrides: Any) -> TransformerDecoder:
    """Qwen3 1.7B: 28 layers, 16 query / 8 key-value heads, width 2048, feed-forward
    6144, tied embeddings, RoPE base 1000000, 40960 tokens. ``overrides`` replace any argument."""
    kwargs = dict(
        vocab_size=151_936,
        max_seq_len=40_960,
        norm_eps=1e-06,
        rope_base=1000000.0,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        embed_dim=2_048,
        intermediate_dim=6_144,
        head_dim=128,
        tie_word_embeddings=True,
    )
    return qwen3(**{**kwargs, **overrides})


def qwen3_4b(**overrides: Any) -> TransformerDecoder:
    """Qwen3 4B: 36 layers, 32 query / 8 key-value heads, width 2560, feed-forward
    9728, tied embeddings, RoPE base 1000000, 40960 tokens. ``overrides`` replace any argument."""
    kwargs = dict(
        vocab_size=151_936,
        max_seq_len=40_960,
        norm_eps=1e-06,
        rope_base=1000000.0,
        num_layers=36,
        num_heads=32,
        num_kv_heads=8,
        embed_dim=2_560,
        intermediate_dim=9_728,
        head_dim=128,
        tie_word_embeddings=True,
    )
    return qwen3(**{**kwargs, **overrides})


def qwen3_8b(**overrides: Any) -> TransformerDecoder:
    """Qwen3 8B: 36 layers, 32 query / 8 key-value heads, width 4096, feed-forward
    12288, untied embeddings, RoPE base 1000000, 40960 tokens. ``overrides`` replace any argument."""
    kwargs = dict(
        vocab_size=151_936,
        max_seq_len=40_960,
        norm_eps=1e-06,
        rope_base=1000000.0,
        num_layers=36,
        num_heads=32,
        num_kv_heads=8,
        embed_dim=4_096,
        intermediate_dim=12_288,
        head_dim=128,
        tie_word_embeddings=False,
    )
    return qwen3(**{**kwargs, **overrides})


def qwen3_14b(**overrides: Any) -> TransformerDecoder:
    """Qwen3 14B: 40 layers, 40 query / 8 key-value heads, width 5120, feed-forward
    17408, untied embeddings, RoPE base 1000000, 40960 tokens. ``overrides`` replace any argument."""
    kwargs = dict(
        vocab_size=151_936,
        max_seq_len=40_960,
        norm_eps=1e-06,
        rope_base=1000000.0,
        num_layers=40,
        num_heads=40,
        num_kv_heads=8,
        embed_dim=5_120,
        intermediate_dim=17_408,
        head_dim=128,
        tie_word_embeddings=False,
    )
    return qwen3(**{**kwargs, **overrides})


def qwen3_32b(**overrides: Any) -> TransformerDecoder:
    """Qwen3 32B: 64 layers, 64 query / 8 key-value heads, width 5120, feed-forward
    25600, untied embeddings, RoPE base 1000000, 40960 tokens. ``overrides`` replace any argument."""
    kwargs = dict(
        vocab_size=151_936,
        max_seq_len=40_960,
        norm_eps=1e-06,
        rope_base=1000000.0,
        num_layers=64,
        num_heads=64,
        num_kv_heads=8,
        embed_dim=5_120,
        intermediate_dim=25_600,
        head_dim=128,
        tie_word_embeddings=False,
    )
    return qwen3(**{**kwargs, **overrides})


def qwen3_tokenizer(path: str, max_seq_len: Optional[int] = None):
    """Qwen3's tokenizer from the model folder's ``tokenizer.json`` (``path``), with the special tokens,
    BOS/EOS behaviour and chat template of the folder's ``tokenizer_config.json`` / ``chat_template.jinja``.
    No BOS; ``<|im_end|>`` ends a chat turn.

    Args:
        path: the ``tokenizer.json`` file (config key ``tokenizer.path``).
        max_seq_len: stored as ``tokenizer.max_seq_len`` (datasets truncate to it); ``None`` for no limit.
    """
    from torchtune.modules.tokenizers import HFModelTokenizer

    return HFModelTokenizer(path, max_seq_len=max_seq_len)
