"""The generic Phi-3 builder (Phi-3, Phi-4, Phi-4-mini): Llama's decoder with RoPE over the halves of each
head (transformers' ``modeling_phi3.py``; torchtune's ``phi3``). The checkpoint's fused ``qkv_proj`` and
``gate_up_proj`` are split by the converter (``torchtune.models._hf_convert``), so the model has Llama's
separate projections, as torchtune's. Phi-4-mini rotates part of each head, with LongRoPE."""

from __future__ import annotations

from typing import Optional, Sequence

from torchtune.models.llama2._component_builders import llama2_mlp, llama_decoder
from torchtune.modules import (
    FeedForward,
    LongRoPE,
    PartialRotaryEmbeddings,
    RotaryPositionalEmbeddings,
    TransformerDecoder,
)

__all__ = ["phi3", "phi3_mlp"]


def phi3_mlp(dim: int, hidden_dim: int) -> FeedForward:
    """Phi-3's SwiGLU feed-forward block (Llama's; HF stores its gate and up rows fused)."""
    return llama2_mlp(dim, hidden_dim)


def phi3(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-5,
    rope_base: float = 10_000,
    *,
    head_dim: Optional[int] = None,
    tie_word_embeddings: bool = False,
    sliding_window: Optional[int] = None,
    rotary_dim: Optional[int] = None,
    rope_short_factor: Optional[Sequence[float]] = None,
    rope_long_factor: Optional[Sequence[float]] = None,
    rope_original_max_seq_len: Optional[int] = None,
    rope_scale_factor: Optional[float] = None,
    rope_attention_factor: Optional[float] = None,
) -> TransformerDecoder:
    """Build a Phi-3 decoder (torchtune's ``phi3``: its arguments, order and defaults; the keyword arguments
    after them are ours). Its state dict is torchtune's Phi-3 one: q/k rows in Hugging Face's order.

    Args:
        vocab_size: embedding rows.
        num_layers: decoder layers.
        num_heads: query heads.
        num_kv_heads: key/value heads.
        embed_dim: model width (``hidden_size``).
        intermediate_dim: feed-forward width (``intermediate_size``).
        max_seq_len: longest sequence (RoPE cache size).
        attn_dropout: attention dropout during training.
        norm_eps: RMSNorm epsilon (``rms_norm_eps``).
        rope_base: RoPE base (``rope_theta``).
        head_dim: channels per head (``head_dim``); default ``embed_dim // num_heads``.
        tie_word_embeddings: output projection shares the embedding.
        sliding_window: attention window (``sliding_window``): a token sees the last ``sliding_window``
            tokens, itself included; ``None`` for full causal attention.
        rotary_dim: channels of each head that RoPE rotates, the first ones (``partial_rotary_factor *
            head_dim``); ``None`` for all.
        rope_short_factor: LongRoPE's ``rotary_dim // 2`` rescale factors up to
            ``rope_original_max_seq_len`` tokens (``rope_scaling.short_factor``); ``None`` for plain RoPE.
        rope_long_factor: its factors beyond that (``rope_scaling.long_factor``).
        rope_original_max_seq_len: the pretraining context (``original_max_position_embeddings``).
        rope_scale_factor: the context extension (``max_position_embeddings /
            original_max_position_embeddings``), which sets the default cos/sin scale.
        rope_attention_factor: the cos/sin scale (``rope_scaling.attention_factor``); ``None`` for LongRoPE's
            default.
    """
    head_dim = head_dim if head_dim is not None else embed_dim // num_heads
    rotary_dim = rotary_dim if rotary_dim is not None else head_dim
    if rope_short_factor is None:
        rope = RotaryPositionalEmbeddings(dim=rotary_dim, max_seq_len=max_seq_len, base=rope_base, interleaved=False)
    else:
        if rope_long_factor is None or rope_original_max_seq_len is None or rope_scale_factor is None:
            raise ValueError(
                "LongRoPE needs rope_long_factor, rope_original_max_seq_len and rope_scale_factor besides "
                "rope_short_factor (config.json's rope_scaling and original_max_position_embeddings)"
            )
        rope = LongRoPE(
            dim=rotary_dim,
            max_seq_len=max_seq_len,
            base=rope_base,
            short_factor=rope_short_factor,
            long_factor=rope_long_factor,
            original_max_seq_len=rope_original_max_seq_len,
            scale_factor=rope_scale_factor,
            attention_factor=rope_attention_factor,
            interleaved=False,
        )
    if rotary_dim != head_dim:
        rope = PartialRotaryEmbeddings(rope, head_dim=head_dim)
    return llama_decoder(
        vocab_size=vocab_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads or num_heads,
        embed_dim=embed_dim,
        max_seq_len=max_seq_len,
        intermediate_dim=intermediate_dim,
        attn_dropout=attn_dropout,
        norm_eps=norm_eps,
        rope=rope,
        tie_word_embeddings=tie_word_embeddings,
        head_dim=head_dim,
        sliding_window=sliding_window,
    )
