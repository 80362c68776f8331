"""The generic Llama 3.1 builder: Llama2's decoder with grouped-query attention and scaled RoPE."""

from __future__ import annotations

from typing import Optional

from torchtune.config._types import checked_by
from torchtune.models.llama2._component_builders import (
    check_llama_args,
    llama2_mlp,
    llama_decoder,
    scale_hidden_dim_for_mlp,
)
from torchtune.modules import Llama3ScaledRoPE, TransformerDecoder

# torchtune's name for the SwiGLU block at this path
llama3_mlp = llama2_mlp


@checked_by(check_llama_args)
def llama3_1(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    rope_base: int = 500_000,
    intermediate_dim: Optional[int] = None,
    norm_eps: float = 1e-5,
    scale_factor: float = 8,
    tie_word_embeddings: bool = False,
    *,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    old_context_len: int = 8192,
) -> TransformerDecoder:
    """Build a Llama 3.1 decoder (argument names and order as torchtune's ``llama3_1``).

    Works under ``with torch.device("meta"):`` and ``torch.set_default_dtype``, like ``llama2``.

    Args:
        vocab_size: tokens in the vocabulary (128256 for the released models).
        num_layers: decoder layers.
        num_heads: query heads.
        num_kv_heads: key/value heads (grouped-query attention: 8 in every Llama 3.x).
        embed_dim: model width; ``head_dim = embed_dim // num_heads``.
        max_seq_len: longest sequence (RoPE and KV cache size).
        attn_dropout: attention dropout during training.
        rope_base: RoPE frequency base (``rope_theta``).
        intermediate_dim: feed-forward width; default ``8/3 * embed_dim`` rounded up to 256
            (Llama2's rule; the released models set it explicitly).
        norm_eps: RMSNorm epsilon.
        scale_factor: RoPE ``factor`` (8 for Llama 3.1, 32 for 3.2); see ``Llama3ScaledRoPE``.
        tie_word_embeddings: share the token embedding with the output projection.
        low_freq_factor: RoPE ``low_freq_factor``.
        high_freq_factor: RoPE ``high_freq_factor``.
        old_context_len: RoPE ``original_max_position_embeddings`` (Llama 3's pretraining context).
    """
    rope = Llama3ScaledRoPE(
        dim=embed_dim // num_heads,
        max_seq_len=max_seq_len,
        base=rope_base,
        scale_factor=scale_factor,
        low_freq_factor=low_freq_factor,
        high_freq_factor=high_freq_factor,
        old_context_len=old_context_len,
    )
    return llama_decoder(
        vocab_size=vocab_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        embed_dim=embed_dim,
        max_seq_len=max_seq_len,
        intermediate_dim=intermediate_dim if intermediate_dim is not None else scale_hidden_dim_for_mlp(embed_dim),
        attn_dropout=attn_dropout,
        norm_eps=norm_eps,
        rope=rope,
        tie_word_embeddings=tie_word_embeddings,
    )
