"""The generic Qwen2.5 builder: Llama's decoder with biases on the q/k/v projections (transformers'
``modeling_qwen2.py``)."""

from __future__ import annotations

from typing import Optional

from torchtune.models.llama2._component_builders import llama_decoder
from torchtune.modules import RotaryPositionalEmbeddings, TransformerDecoder


def qwen2_5(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    head_dim: Optional[int] = None,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-6,
    rope_base: float = 1_000_000.0,
    tie_word_embeddings: bool = False,
) -> TransformerDecoder:
    """Build a Qwen2.5 decoder.

    Args:
        vocab_size: embedding rows.
        num_layers: decoder layers.
        num_heads: query heads.
        num_kv_heads: key/value heads.
        embed_dim: model width (``hidden_size``).
        intermediate_dim: feed-forward width (``intermediate_size``).
        max_seq_len: longest sequence (RoPE cache size).
        head_dim: channels per head (``head_dim``); default ``embed_dim // num_heads``.
        attn_dropout: attention dropout during training.
        norm_eps: RMSNorm epsilon (``rms_norm_eps``).
        rope_base: RoPE base (``rope_theta``).
        tie_word_embeddings: output projection shares the embedding.
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
        qkv_bias=True,
    )
