"""The generic Llama 3 builder: Llama2's decoder with grouped-query attention and RoPE base 500000 (no
RoPE scaling: that is Llama 3.1's)."""

from __future__ import annotations

from typing import Optional

from torchtune.config._types import checked_by
from torchtune.models.llama2._component_builders import check_llama_args, llama2_mlp, llama_decoder
from torchtune.models.llama2._model_utils import scale_hidden_dim_for_mlp
from torchtune.modules import RotaryPositionalEmbeddings, TransformerDecoder

__all__ = ["llama3", "llama3_mlp"]

llama3_mlp = llama2_mlp


@checked_by(check_llama_args)
def llama3(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    rope_base: float = 500_000,
    intermediate_dim: Optional[int] = None,
    norm_eps: float = 1e-5,
    tie_word_embeddings: bool = False,
) -> TransformerDecoder:
    """Build a Llama 3 decoder (torchtune's ``llama3``: its arguments, order and defaults).

    Args:
        vocab_size: tokens in the vocabulary (128256 for the released models).
        num_layers: decoder layers.
        num_heads: query heads.
        num_kv_heads: key/value heads.
        embed_dim: model width; ``head_dim = embed_dim // num_heads``.
        max_seq_len: longest sequence (RoPE and KV cache size).
        attn_dropout: attention dropout during training.
        rope_base: RoPE frequency base (``rope_theta``).
        intermediate_dim: feed-forward width; default :func:`scale_hidden_dim_for_mlp`.
        norm_eps: RMSNorm epsilon.
        tie_word_embeddings: share the token embedding with the output projection.
    """
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
        rope=RotaryPositionalEmbeddings(dim=embed_dim // num_heads, max_seq_len=max_seq_len, base=rope_base),
        tie_word_embeddings=tie_word_embeddings,
    )
