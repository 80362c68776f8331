"""The generic Llama2 builder (every architectural knob is an argument) and the decoder all Llama families share."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from torch import nn

from torchtune._errors import ConfigError
from torchtune.config._types import checked_by, whole_number
from torchtune.models.llama2._model_utils import scale_hidden_dim_for_mlp
from torchtune.modules import (
    FeedForward,
    MultiHeadAttention,
    RMSNorm,
    RotaryPositionalEmbeddings,
    TiedLinear,
    TransformerDecoder,
    TransformerSelfAttentionLayer,
)


def llama2_mlp(dim: int, hidden_dim: int) -> FeedForward:
    """The SwiGLU feed-forward block of the Llama decoders (``dim -> hidden_dim -> dim``, no biases)."""
    return FeedForward(
        gate_proj=nn.Linear(dim, hidden_dim, bias=False),
        down_proj=nn.Linear(hidden_dim, dim, bias=False),
        up_proj=nn.Linear(dim, hidden_dim, bias=False),
    )


def check_llama_args(key: str, fields: Mapping[str, Any]) -> None:
    """The value checks of the Llama builders' arguments, run by ``config.validate`` before anything is
    built: sizes are whole numbers >= 1, the heads split the width evenly into even head sizes (RoPE
    rotates pairs of features), and the key/value heads divide the query heads."""
    for name in ("vocab_size", "num_layers", "num_heads", "num_kv_heads", "embed_dim", "max_seq_len"):
        if name in fields:
            whole_number(f"{key}.{name}", fields[name])
    whole_number(f"{key}.intermediate_dim", fields.get("intermediate_dim"), allow_none=True)
    heads, kv_heads, dim = fields.get("num_heads"), fields.get("num_kv_heads"), fields.get("embed_dim")
    if heads and dim and (dim % heads or (dim // heads) % 2):
        raise ConfigError(
            f"{key}.embed_dim={dim} does not split into {key}.num_heads={heads} heads of an even size (each head "
            f"gets embed_dim / num_heads features, rotated in pairs by RoPE). Set {key}.embed_dim to a multiple of "
            f"2 x {key}.num_heads, or use the builder of the model whose weights you load."
        )
    if heads and kv_heads and heads % kv_heads:
        raise ConfigError(
            f"{key}.num_kv_heads={kv_heads} does not divide {key}.num_heads={heads}: each key/value head serves "
            f"the same number of query heads. Set {key}.num_kv_heads to a divisor of {heads}."
        )
    for name in ("norm_eps", "rope_base", "scale_factor"):
        value = fields.get(name)
        if value is not None and value <= 0:
            raise ConfigError(f"{key}.{name} must be a positive number, got {value!r}.")
    dropout = fields.get("attn_dropout")
    if dropout is not None and not 0 <= dropout < 1:
        raise ConfigError(f"{key}.attn_dropout must be in [0, 1), got {dropout!r}. Set {key}.attn_dropout=0.0.")


@checked_by(check_llama_args)
def llama2(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    intermediate_dim: Optional[int] = None,
    norm_eps: float = 1e-5,
    rope_base: float = 10_000.0,
    tie_word_embeddings: bool = False,
) -> TransformerDecoder:
    """Build a Llama2 decoder (torchtune's ``llama2``: its arguments, order and defaults).

    Works under ``with torch.device("meta"):`` and with ``torch.set_default_dtype`` (everything but
    the fp32 RoPE cache takes the default dtype and device).

    Args:
        vocab_size: tokens in the vocabulary.
        num_layers: decoder layers.
        num_heads: query heads.
        num_kv_heads: key/value heads (``num_heads`` for multi-head, fewer for grouped-query).
        embed_dim: model width; ``head_dim = embed_dim // num_heads``.
        max_seq_len: longest sequence (RoPE and KV cache size).
        attn_dropout: attention dropout during training.
        intermediate_dim: feed-forward width; default torchtune's rule (:func:`scale_hidden_dim_for_mlp`).
        norm_eps: RMSNorm epsilon.
        rope_base: RoPE frequency base.
        tie_word_embeddings: share the token embedding with the output projection (no published
            Llama2 does; small Hugging Face Llama-architecture models sometimes do).
    """
    head_dim = embed_dim // num_heads  # llama_decoder checks that it divides
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
        rope=RotaryPositionalEmbeddings(dim=head_dim, max_seq_len=max_seq_len, base=rope_base),
        tie_word_embeddings=tie_word_embeddings,
    )


def llama2_classifier(
    num_classes: int,
    *,
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    intermediate_dim: Optional[int] = None,
    norm_eps: float = 1e-5,
    rope_base: float = 10_000.0,
) -> TransformerDecoder:
    """A Llama2 decoder whose output projection gives ``num_classes`` scores per position instead of the
    vocabulary's logits (torchtune's ``llama2_classifier``, the body of its reward models). Other
    arguments as :func:`llama2`."""
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
        tie_word_embeddings=False,
        output_dim=num_classes,
    )


def llama_decoder(
    *,
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    max_seq_len: int,
    intermediate_dim: int,
    attn_dropout: float,
    norm_eps: float,
    rope: nn.Module,
    tie_word_embeddings: bool,
    head_dim: Optional[int] = None,
    qkv_bias: bool = False,
    output_bias: bool = False,
    qk_norm: bool = False,
    sliding_window: Optional[int] = None,
    output_dim: Optional[int] = None,
) -> TransformerDecoder:
    """The Llama-shaped decoder every family builder shares: pre-norm layers of grouped-query attention
    and a SwiGLU feed-forward, RMSNorm. Llama2 and Llama 3.x differ only in the ``rope`` module given
    here, the sizes, and whether the output projection is tied to the embedding. The other families
    switch on what transformers' modelling files add to that shape:

    - ``head_dim``: channels per head when it is not ``embed_dim // num_heads`` (Qwen3: 1024 wide, 16
      heads of 128); default ``embed_dim // num_heads``.
    - ``qkv_bias`` / ``output_bias``: biases on the q/k/v and the output projections (Qwen2.5: q/k/v;
      Qwen3's ``attention_bias``: all four).
    - ``qk_norm``: Qwen3's per-head RMSNorm of queries and keys before RoPE.
    - ``sliding_window``: Mistral v0.1's attention window (see ``MultiHeadAttention``).
    - ``output_dim``: the output projection's width when it is not ``vocab_size`` (a classifier's
      ``num_classes``; never tied).

    The RoPE module decides the channel layout of q and k (interleaved for Llama and Mistral, halves for
    Qwen2 and Phi-3, as torchtune's builders of each family): it is what the family's state dicts assume.
    """
    if head_dim is None:
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        head_dim = embed_dim // num_heads
    layers = nn.ModuleList()
    for _ in range(num_layers):
        attn = MultiHeadAttention(
            embed_dim=embed_dim,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            q_proj=nn.Linear(embed_dim, num_heads * head_dim, bias=qkv_bias),
            k_proj=nn.Linear(embed_dim, num_kv_heads * head_dim, bias=qkv_bias),
            v_proj=nn.Linear(embed_dim, num_kv_heads * head_dim, bias=qkv_bias),
            output_proj=nn.Linear(num_heads * head_dim, embed_dim, bias=output_bias),
            # One RoPE module shared by every layer: its cache is identical, so keep one copy.
            pos_embeddings=rope,
            max_seq_len=max_seq_len,
            attn_dropout=attn_dropout,
            q_norm=RMSNorm(head_dim, eps=norm_eps) if qk_norm else None,
            k_norm=RMSNorm(head_dim, eps=norm_eps) if qk_norm else None,
            sliding_window=sliding_window,
        )
        layers.append(
            TransformerSelfAttentionLayer(
                attn=attn,
                mlp=llama2_mlp(embed_dim, intermediate_dim),
                sa_norm=RMSNorm(embed_dim, eps=norm_eps),
                mlp_norm=RMSNorm(embed_dim, eps=norm_eps),
            )
        )
    tok_embeddings = nn.Embedding(vocab_size, embed_dim)
    # Tied: one Parameter for both ends, so it gets one optimizer and one in-backward hook, which
    # fires once both gradient contributions (embedding lookup and output projection) are summed.
    if output_dim is not None:
        output = nn.Linear(embed_dim, output_dim, bias=False)
    elif tie_word_embeddings:
        output = TiedLinear(tok_embeddings)
    else:
        output = nn.Linear(embed_dim, vocab_size, bias=False)
    return TransformerDecoder(
        tok_embeddings=tok_embeddings,
        layers=layers,
        norm=RMSNorm(embed_dim, eps=norm_eps),
        output=output,
        max_seq_len=max_seq_len,
        num_heads=num_heads,
        head_dim=head_dim,
    )
