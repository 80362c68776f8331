"""The generic Mistral builders: Llama's decoder, with v0.1's sliding attention window (transformers'
``modeling_mistral.py``), and the classifier of torchtune's reward models."""

from __future__ import annotations

from typing import Optional

from torchtune.models.llama2._component_builders import llama2_mlp, llama_decoder
from torchtune.modules import FeedForward, RotaryPositionalEmbeddings, TransformerDecoder

__all__ = ["mistral", "mistral_classifier", "mistral_mlp"]


def mistral_mlp(dim: int, hidden_dim: int) -> FeedForward:
    """Mistral's SwiGLU feed-forward block (Llama's)."""
    return llama2_mlp(dim, hidden_dim)


def mistral(
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
    num_classes: Optional[int] = None,
) -> TransformerDecoder:
    """Build a Mistral decoder (torchtune's ``mistral``: its arguments, order and defaults; the keyword
    arguments after them are ours).

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
        rope_base: RoPE base (``rope_theta``; 10000 in v0.1, 1000000 in v0.2/v0.3).
        head_dim: channels per head (``head_dim``); default ``embed_dim // num_heads``.
        tie_word_embeddings: output projection shares the embedding.
        sliding_window: attention window (``sliding_window``): a token sees the last ``sliding_window``
            tokens, itself included; ``None`` for full causal attention.
        num_classes: an output of ``num_classes`` scores per position instead of the vocabulary's logits.
    """
    head_dim = head_dim if head_dim is not None else embed_dim // num_heads
    return llama_decoder(
        vocab_size=vocab_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        embed_dim=embed_dim,
        max_seq_len=max_seq_len,
        intermediate_dim=intermediate_dim,
        attn_dropout=attn_dropout,
        norm_eps=norm_eps,
        rope=RotaryPositionalEmbeddings(dim=head_dim, max_seq_len=max_seq_len, base=rope_base),
        tie_word_embeddings=tie_word_embeddings,
        head_dim=head_dim,
        sliding_window=sliding_window,
        output_dim=num_classes,
    )


def mistral_classifier(
    num_classes: int,
    *,
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
) -> TransformerDecoder:
    """A Mistral decoder whose output gives ``num_classes`` scores per position (torchtune's
    ``mistral_classifier``, the body of its reward model). Other arguments as :func:`mistral`."""
    return mistral(
        vocab_size=vocab_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        embed_dim=embed_dim,
        intermediate_dim=intermediate_dim,
        max_seq_len=max_seq_len,
        attn_dropout=attn_dropout,
        norm_eps=norm_eps,
        rope_base=rope_base,
        num_classes=num_classes,
    )
