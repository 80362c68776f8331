"""The generic Llama 3.2 (text) builder: Llama 3.1's architecture, RoPE scaled by 32, tied embeddings."""

from __future__ import annotations

from typing import Optional

from torchtune.config._types import checked_by
from torchtune.models.llama2._component_builders import check_llama_args
from torchtune.models.llama3_1._component_builders import llama3_1
from torchtune.modules import TransformerDecoder


@checked_by(check_llama_args)
def llama3_2(
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
    scale_factor: float = 32,
    tie_word_embeddings: bool = True,
    *,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    old_context_len: int = 8192,
) -> TransformerDecoder:
    """Build a Llama 3.2 text decoder (argument names and order as torchtune's ``llama3_2``).

    The same network as :func:`torchtune.models.llama3_1.llama3_1` with Llama 3.2's defaults: RoPE
    ``scale_factor`` 32 and the output projection tied to the token embedding (one
    ``[vocab_size, embed_dim]`` tensor, saved as ``model.embed_tokens.weight`` only). Arguments as for
    ``llama3_1``.
    """
    return llama3_1(
        vocab_size=vocab_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        embed_dim=embed_dim,
        max_seq_len=max_seq_len,
        attn_dropout=attn_dropout,
        rope_base=rope_base,
        intermediate_dim=intermediate_dim,
        norm_eps=norm_eps,
        scale_factor=scale_factor,
        tie_word_embeddings=tie_word_embeddings,
        low_freq_factor=low_freq_factor,
        high_freq_factor=high_freq_factor,
        old_context_len=old_context_len,
    )
