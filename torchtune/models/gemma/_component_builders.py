"""The decoder every Gemma generation shares (:func:`gemma_decoder`), and the Gemma (1) builder.

Gemma: Llama's pre-norm decoder with the token embedding multiplied by ``sqrt(embed_dim)``, RMSNorms that
scale by ``1 + weight`` in fp32, a GeGLU feed-forward (tanh GELU) and tied embeddings. Gemma 2 adds norms
after attention and after the feed-forward, attention-logit soft-capping, a logit scale of its own,
local (sliding-window) layers and a final logit soft-cap; Gemma 3 adds per-head q/k norms and a RoPE
base per layer kind. Each is what transformers' ``modeling_gemma*.py`` computes.
"""

from __future__ import annotations

from typing import Optional, Sequence

from torch import nn

from torchtune.modules import (
    FeedForward,
    GemmaRMSNorm,
    MultiHeadAttention,
    RotaryPositionalEmbeddings,
    ScaledEmbedding,
    TiedLinear,
    TransformerDecoder,
    TransformerSelfAttentionLayer,
)

__all__ = ["gemma", "gemma_decoder", "gemma_mlp"]


def gemma_mlp(dim: int, hidden_dim: int) -> FeedForward:
    """Gemma's GeGLU feed-forward block: tanh GELU on the gate (transformers' ``gelu_pytorch_tanh``), no biases."""
    return FeedForward(
        gate_proj=nn.Linear(dim, hidden_dim, bias=False),
        down_proj=nn.Linear(hidden_dim, dim, bias=False),
        up_proj=nn.Linear(dim, hidden_dim, bias=False),
        activation=nn.GELU(approximate="tanh"),
    )


def gemma_decoder(
    *,
    vocab_size: int,
    embed_dim: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    norm_eps: float,
    attn_dropout: float,
    ropes: Sequence[nn.Module],
    sliding_windows: Sequence[Optional[int]],
    scale: Optional[float] = None,
    hidden_capping_value: Optional[float] = None,
    final_capping_value: Optional[float] = None,
    qk_norm: bool = False,
    post_norms: bool = False,
    tie_word_embeddings: bool = True,
) -> TransformerDecoder:
    """The Gemma decoder, one layer per entry of ``ropes`` / ``sliding_windows``.

    Args:
        ropes: each layer's rotary embeddings (modules shared between layers of a kind keep one cache).
        sliding_windows: each layer's attention window, ``None`` for a global layer.
        scale: the attention-logit scale (``query_pre_attn_scalar ** -0.5``); ``None``: ``head_dim ** -0.5``.
        hidden_capping_value: soft cap of the attention logits; ``None`` for none.
        final_capping_value: soft cap of the output logits (Gemma 2); ``None`` for none. Needs
            ``tie_word_embeddings``, as every Gemma has.
        qk_norm: per-head RMSNorm of queries and keys before RoPE (Gemma 3).
        post_norms: norms of the attention and feed-forward outputs before the residual adds (Gemma 2, 3).
        Others: the sizes, as the family builders name them.

    Raises:
        ValueError: ``ropes`` and ``sliding_windows`` of different lengths, or a final cap on an untied output.
    """
    if len(ropes) != len(sliding_windows):
        raise ValueError(f"{len(ropes)} RoPE modules for {len(sliding_windows)} layers")
    if final_capping_value is not None and not tie_word_embeddings:
        raise ValueError("the final logit soft-cap is implemented on the tied output projection (every Gemma's)")
    layers = nn.ModuleList()
    for rope, window in zip(ropes, sliding_windows):
        attn = MultiHeadAttention(
            embed_dim=embed_dim,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            q_proj=nn.Linear(embed_dim, num_heads * head_dim, bias=False),
            k_proj=nn.Linear(embed_dim, num_kv_heads * head_dim, bias=False),
            v_proj=nn.Linear(embed_dim, num_kv_heads * head_dim, bias=False),
            output_proj=nn.Linear(num_heads * head_dim, embed_dim, bias=False),
            pos_embeddings=rope,
            q_norm=GemmaRMSNorm(head_dim, eps=norm_eps) if qk_norm else None,
            k_norm=GemmaRMSNorm(head_dim, eps=norm_eps) if qk_norm else None,
            max_seq_len=max_seq_len,
            attn_dropout=attn_dropout,
            scale=scale,
            softcap=hidden_capping_value,
            sliding_window=window,
        )
        layers.append(
            TransformerSelfAttentionLayer(
                attn=attn,
                mlp=gemma_mlp(embed_dim, intermediate_dim),
                sa_norm=GemmaRMSNorm(embed_dim, eps=norm_eps),
                mlp_norm=GemmaRMSNorm(embed_dim, eps=norm_eps),
                sa_scale=GemmaRMSNorm(embed_dim, eps=norm_eps) if post_norms else None,
                mlp_scale=GemmaRMSNorm(embed_dim, eps=norm_eps) if post_norms else None,
            )
        )
    tok_embeddings = ScaledEmbedding(vocab_size, embed_dim, embed_scale=embed_dim**0.5)
    if tie_word_embeddings:
        output = TiedLinear(tok_embeddings, softcap=final_capping_value)
    else:
        output = nn.Linear(embed_dim, vocab_size, bias=False)
    return TransformerDecoder(
        tok_embeddings=tok_embeddings,
        layers=layers,
        norm=GemmaRMSNorm(embed_dim, eps=norm_eps),
        output=output,
        max_seq_len=max_seq_len,
        num_heads=num_heads,
        head_dim=head_dim,
    )


def gemma(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    head_dim: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-6,
    rope_base: float = 10_000,
) -> TransformerDecoder:
    """Build a Gemma (1) decoder (torchtune's ``gemma``: its arguments, order and defaults; transformers'
    ``GemmaForCausalLM``): tied embeddings, every layer global.

    Args:
        vocab_size: tokens in the vocabulary.
        num_layers: decoder layers.
        num_heads: query heads.
        head_dim: channels per head (256 in Gemma 2B and 7B, not ``embed_dim / num_heads``).
        num_kv_heads: key/value heads (1 in 2B: multi-query attention).
        embed_dim: model width (``hidden_size``).
        intermediate_dim: feed-forward width.
        max_seq_len: longest sequence (RoPE and KV cache size).
        attn_dropout: attention dropout during training.
        norm_eps: RMSNorm epsilon.
        rope_base: RoPE base (``rope_theta``).
    """
    rope = RotaryPositionalEmbeddings(dim=head_dim, max_seq_len=max_seq_len, base=rope_base)
    return gemma_decoder(
        vocab_size=vocab_size,
        embed_dim=embed_dim,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_dim=intermediate_dim,
        max_seq_len=max_seq_len,
        norm_eps=norm_eps,
        attn_dropout=attn_dropout,
        ropes=[rope] * num_layers,
        sliding_windows=[None] * num_layers,
    )
