"""Fixed-size Phi-4 models (the published shapes, as their config.json files give them) and the tokenizer."""

from __future__ import annotations

from typing import Any

from torchtune.models.phi4._component_builders import phi4
from torchtune.modules import TransformerDecoder


def phi4_14b(**overrides: Any) -> TransformerDecoder:
    """Phi-4 14B: 40 layers, 40 query / 10 key-value heads, width 5120, feed-forward
    17920, untied embeddings, RoPE base 250000, 16384 tokens; the folder's fused ``qkv_proj`` /
    ``gate_up_proj`` are split on load. ``overrides`` replace any argument."""
    kwargs = dict(
        vocab_size=100_352,
        num_layers=40,
        num_heads=40,
        num_kv_heads=10,
        embed_dim=5_120,
        intermediate_dim=17_920,
        max_seq_len=16_384,
        norm_eps=1e-05,
        rope_base=250000.0,
        tie_word_embeddings=False,
    )
    return phi4(**{**kwargs, **overrides})


# Phi-4-mini-instruct's config.json: rope_scaling.long_factor (short_factor is 48 x 1.0).
_PHI4_MINI_LONG_FACTOR = (
    1.0, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817, 2.187582649,
    2.446418898, 2.735880826, 3.059592084, 3.421605075, 3.826451687, 4.279200023, 4.785517845, 5.351743533,
    5.984965424, 6.693110555, 7.485043894, 8.370679318, 9.36110372, 10.4687158, 11.70738129, 13.09260651,
    14.64173252, 16.37415215, 18.31155283, 20.47818807, 22.90118105, 25.61086418, 28.64115884, 32.03,
    32.1, 32.13, 32.23, 32.6, 32.61, 32.64, 32.66, 32.7, 32.71, 32.93, 32.97, 33.28, 33.49, 33.5, 44.16, 47.77,
)  # fmt: skip


def phi4_mini(**overrides: Any) -> TransformerDecoder:
    """Phi-4-mini (3.8B): 32 layers, 24 query / 8 key-value heads of 128, width 3072, feed-forward 8192,
    tied embeddings, 200064 tokens; RoPE (base 10000) on the first 96 channels of each head
    (``partial_rotary_factor`` 0.75) with LongRoPE from 4096 to 131072 tokens. ``overrides`` replace any
    argument (``max_seq_len=8192`` shrinks the two RoPE tables; the scaling keeps the published factor 32)."""
    kwargs = dict(
        vocab_size=200_064,
        num_layers=32,
        num_heads=24,
        num_kv_heads=8,
        embed_dim=3_072,
        intermediate_dim=8_192,
        max_seq_len=131_072,
        norm_eps=1e-05,
        rope_base=10_000.0,
        tie_word_embeddings=True,
        sliding_window=262_144,  # config.json's; longer than any sequence, so attention is plain causal
        rotary_dim=96,
        rope_short_factor=(1.0,) * 48,
        rope_long_factor=_PHI4_MINI_LONG_FACTOR,
        rope_original_max_seq_len=4_096,
        rope_scale_factor=131_072 / 4_096,
    )
    return phi4(**{**kwargs, **overrides})
