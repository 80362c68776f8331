"""Fixed-size Gemma 2 models (torchtune's ``gemma2_2b``, ``gemma2_9b``, ``gemma2_27b``) with the published
config.json's settings; the tokenizer is Gemma's."""

from __future__ import annotations

from typing import Any

from torchtune.models.gemma2._component_builders import gemma2
from torchtune.modules import TransformerDecoder

# The published config.json values. torchtune 0.6.1's builders pass these two swapped (attention 30, final 50).
_CAPS = dict(hidden_capping_value=50.0, final_capping_value=30.0)


def gemma2_2b(**overrides: Any) -> TransformerDecoder:
    """Gemma 2 2B: 26 layers (local and global alternating, window 4096), 8 query / 4 key-value heads of 256,
    width 2304, feed-forward 9216, vocab 256000, 8192 tokens, attention logits capped at 50, output logits
    at 30. ``overrides`` replace any argument."""
    kwargs = dict(
        vocab_size=256_000,
        num_layers=26,
        num_heads=8,
        head_dim=256,
        num_kv_heads=4,
        embed_dim=2304,
        intermediate_dim=9216,
        max_seq_len=8192,
        attn_dropout=0.0,
        norm_eps=1e-6,
        sliding_window_size=4096,
        **_CAPS,
    )
    return gemma2(**{**kwargs, **overrides})


def gemma2_9b(**overrides: Any) -> TransformerDecoder:
    """Gemma 2 9B: 42 layers (window 4096), 16 query / 8 key-value heads of 256, width 3584, feed-forward
    14336, vocab 256000, 8192 tokens, caps 50 / 30. ``overrides`` replace any argument."""
    kwargs = dict(
        vocab_size=256_000,
        num_layers=42,
        num_heads=16,
        head_dim=256,
        num_kv_heads=8,
        embed_dim=3584,
        intermediate_dim=14_336,
        max_seq_len=8192,
        attn_dropout=0.0,
        norm_eps=1e-6,
        sliding_window_size=4096,
        **_CAPS,
    )
    return gemma2(**{**kwargs, **overrides})


def gemma2_27b(**overrides: Any) -> TransformerDecoder:
    """Gemma 2 27B: 46 layers (window 4096), 32 query / 16 key-value heads of 128, width 4608, feed-forward
    36864, vocab 256000, 8192 tokens, ``query_pre_attn_scalar`` 144, caps 50 / 30. ``overrides`` replace any
    argument."""
    kwargs = dict(
        vocab_size=256_000,
        num_layers=46,
        num_heads=32,
        head_dim=128,
        num_kv_heads=16,
        embed_dim=4608,
        intermediate_dim=36_864,
        max_seq_len=8192,
        attn_dropout=0.0,
        norm_eps=1e-6,
        sliding_window_size=4096,
        query_pre_attn_scalar=144,
        **_CAPS,
    )
    return gemma2(**{**kwargs, **overrides})
