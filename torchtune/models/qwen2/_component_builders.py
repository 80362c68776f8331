"""The generic Qwen2 builder (Qwen2 and Qwen2.5): Llama's decoder with biases on the q/k/v projections and
RoPE over the halves of each head (transformers' ``modeling_qwen2.py``; torchtune's ``qwen2``)."""

from __future__ import annotations

from typing import Optional

from torchtune.models.llama2._component_builders import llama2_mlp, llama_decoder
from torchtune.models.qwen2._positional_embeddings import Qwen2RotaryPositionalEmbeddings
from torchtune.modules import FeedForward, TransformerDecoder

__all__ = ["qwen2", "qwen2_mlp"]


def qwen2_mlp(dim: int, hidden_dim: int) -> FeedForward:
    """Qwen2's SwiGLU feed-forward block (Llama's, no biases)."""
    return llama2_mlp(dim, hidden_dim)


def qwen2(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-5,
    rope_base: float = 1_000_000.0,
    tie_word_embeddings: bool = False,
    *,
    head_dim: Optional[int] = None,
) -> TransformerDecoder:
    """Build a Qwen2 / Qwen2.5 decoder (torchtune's ``qwen2``: its arguments, order and defaults).

    Its state dict is torchtune's Qwen2 one: the same keys, and q/k weights and biases in Hugging Face's
    row order (RoPE pairs channel ``i`` with ``i + head_dim/2``), so torchtune's checkpoints load unchanged.

    Args:
        vocab_size: embedding rows.
        num_layers: decoder layers.
        num_heads: query heads.
        num_kv_heads: key/value heads (0 or ``None``: ``num_heads``).
        embed_dim: model width (``hidden_size``).
        intermediate_dim: feed-forward width (``intermediate_size``).
        max_seq_len: longest sequence (RoPE cache size).
        attn_dropout: attention dropout during training.
        norm_eps: RMSNorm epsilon (``rms_norm_eps``).
        rope_base: RoPE base (``rope_theta``).
        tie_word_embeddings: output projection shares the embedding (0.5B-3B).
        head_dim: channels per head (``head_dim``); default ``embed_dim // num_heads``.
    """
    head_dim = head_dim if head_dim is not None else embed_dim // num_heads
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
        rope=Qwen2RotaryPositionalEmbeddings(dim=head_dim, max_seq_len=max_seq_len, base=rope_base),
        tie_word_embeddings=tie_word_embeddings,
        head_dim=head_dim,
        qkv_bias=True,
    )
