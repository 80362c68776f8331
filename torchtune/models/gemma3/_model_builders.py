"""Fixed-size Gemma 3 text models (the published 1B, 4B, 12B and 27B shapes), a tiny one, and the tokenizer.

The shapes are those of the published ``config.json`` files (for 4B/12B/27B, the ``text_config`` of
``Gemma3ForConditionalGeneration``): every fifth-plus-one layer global, the rest local, tied embeddings.
"""

from __future__ import annotations

from typing import Any, Optional

from torchtune.models.gemma3._component_builders import gemma3
from torchtune.modules import TransformerDecoder


def gemma3_1b(**overrides: Any) -> TransformerDecoder:
    """Gemma 3 1B: 26 layers (5 local : 1 global, window 512), 4 query / 1 key-value heads of 256, width
    1152, feed-forward 6912, vocab 262144, 32768 tokens, RoPE bases 10000 local / 1000000 global
    (999,885,952 parameters)."""
    kwargs = dict(
        vocab_size=262_144,
        num_layers=26,
        num_heads=4,
        num_kv_heads=1,
        embed_dim=1152,
        head_dim=256,
        intermediate_dim=6912,
        max_seq_len=32_768,
        sliding_window_size=512,
        query_pre_attn_scalar=256,
        rope_base=1_000_000,
        rope_scale_factor=1.0,
    )
    return gemma3(**{**kwargs, **overrides})


def gemma3_4b(**overrides: Any) -> TransformerDecoder:
    """Gemma 3 4B (text): 34 layers (5 local : 1 global, window 1024), 8 query / 4 key-value heads of
    256, width 2560, feed-forward 10240, vocab 262208, 131072 tokens, global RoPE base 1000000 scaled
    linearly by 8 (3,880,263,168 parameters)."""
    kwargs = dict(
        vocab_size=262_208,
        num_layers=34,
        num_heads=8,
        num_kv_heads=4,
        embed_dim=2560,
        head_dim=256,
        intermediate_dim=10_240,
        max_seq_len=131_072,
        sliding_window_size=1024,
        query_pre_attn_scalar=256,
        rope_base=1_000_000,
        rope_scale_factor=8.0,
    )
    return gemma3(**{**kwargs, **overrides})


def gemma3_12b(**overrides: Any) -> TransformerDecoder:
    """Gemma 3 12B (text): 48 layers (window 1024), 16 query / 8 key-value heads of 256, width 3840,
    feed-forward 15360, vocab 262208, 131072 tokens, global RoPE scaled linearly by 8
    (11,766,034,176 parameters)."""
    kwargs = dict(
        vocab_size=262_208,
        num_layers=48,
        num_heads=16,
        num_kv_heads=8,
        embed_dim=3840,
        head_dim=256,
        intermediate_dim=15_360,
        max_seq_len=131_072,
        sliding_window_size=1024,
        query_pre_attn_scalar=256,
        rope_base=1_000_000,
        rope_scale_factor=8.0,
    )
    return gemma3(**{**kwargs, **overrides})


def gemma3_27b(**overrides: Any) -> TransformerDecoder:
    """Gemma 3 27B (text): 62 layers (window 1024), 32 query / 16 key-value heads of 128, width 5376,
    feed-forward 21504, vocab 262208, 131072 tokens, ``query_pre_attn_scalar`` 168, global RoPE scaled
    linearly by 8 (27,009,346,304 parameters)."""
    kwargs = dict(
        vocab_size=262_208,
        num_layers=62,
        num_heads=32,
        num_kv_heads=16,
        embed_dim=5376,
        head_dim=128,
        intermediate_dim=21_504,
        max_seq_len=131_072,
        sliding_window_size=1024,
        query_pre_attn_scalar=168,
        rope_base=1_000_000,
        rope_scale_factor=8.0,
    )
    return gemma3(**{**kwargs, **overrides})


def gemma3_tiny(
    vocab_size: int = 512,
    num_layers: int = 3,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    embed_dim: int = 64,
    head_dim: int = 32,
    intermediate_dim: int = 128,
    max_seq_len: int = 256,
    sliding_window_size: int = 16,
    sliding_window_pattern: int = 3,
    query_pre_attn_scalar: Optional[float] = 24,
    rope_base: float = 1_000_000,
    rope_scale_factor: float = 8.0,
    local_rope_base: float = 10_000,
    norm_eps: float = 1e-6,
    tie_word_embeddings: bool = True,
) -> TransformerDecoder:
    """A tiny Gemma 3 for CPU tests: every shape feature on (two local layers with a 16-token window
    and a global one with linearly scaled RoPE, ``head_dim`` not ``embed_dim / num_heads``, grouped
    key/value heads, a ``query_pre_attn_scalar`` that is not ``head_dim``, tied embeddings)."""
    return gemma3(
        vocab_size=vocab_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        embed_dim=embed_dim,
        head_dim=head_dim,
        intermediate_dim=intermediate_dim,
        max_seq_len=max_seq_len,
        sliding_window_size=sliding_window_size,
        sliding_window_pattern=sliding_window_pattern,
        query_pre_attn_scalar=query_pre_attn_scalar,
        rope_base=rope_base,
        rope_scale_factor=rope_scale_factor,
        local_rope_base=local_rope_base,
        norm_eps=norm_eps,
        tie_word_embeddings=tie_word_embeddings,
    )


def gemma3_tokenizer(path: str, max_seq_len: Optional[int] = None):
    """Gemma 3's own tokenizer from its Hugging Face folder: ``tokenizer.json`` (262,144 tokens; ``<bos>``
    put before each text as transformers does), the special tokens and chat template of the folder's
    ``tokenizer_config.json`` / ``chat_template.jinja`` (``<start_of_turn>user`` / ``<start_of_turn>model``
    turns, each closed by ``<end_of_turn>``).

    Args:
        path: the folder's ``tokenizer.json``.
        max_seq_len: stored as ``tokenizer.max_seq_len`` (datasets truncate to it); ``None`` for no limit.
    """
    # Imported here so building a model never pulls in the tokenizers library.
    from torchtune.modules.tokenizers import HFModelTokenizer

    return HFModelTokenizer(path, max_seq_len=max_seq_len)
