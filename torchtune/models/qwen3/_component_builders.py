"""The generic Qwen3 builder: Llama's decoder with per-head q/k RMSNorm before RoPE and a ``head_dim``
of its own (transformers' ``modeling_qwen3.py``)."""

from __future__ import annotations

from typing import Optional

from torchtune.models.llama2._component_builders import llama_decoder
from torchtune.modules import RotaryPositionalEmbeddings, TransformerDecoder


def qwen3(
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
    attention_bias: bool = False,
) -> TransformerDecoder:
    """Build a Qwen3 dense decoder.

    Args:
        vocab_size: embedding rows (151936 for every published size; the tokenizer has fewer tokens).
        num_layers: decoder layers.
        num_heads: query heads.
        num_kv_heads: key/value heads.
        embed_dim: model width (``hidden_size``).
        intermediate_dim: feed-forward width (``intermediate_size``).
        max_seq_len: longest sequence (RoPE cache size).
        head_dim: channels per head; Qwen3 sets it apart from ``embed_dim // num_heads`` (0.6B: 1024
            wide, 16 heads of 128). Default ``embed_dim // num_heads``.
        attn_dropout: attention dropout during training.
        norm_eps: RMSNorm epsilon of every norm, the q/k norms included (``rms_norm_eps``).
        rope_base: RoPE base (``rope_theta``).
        tie_word_embeddings: output projection shares the embedding (0.6B, 1.7B, 4B).
        attention_bias: biases on the q/k/v and output projections (``attention_bias``; false in every
            published size).
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
        qkv_bias=attention_bias,
        output_bias=attention_bias,
        qk_norm=True,
    )
