"""The generic Gemma 3 (text) builder: every architectural knob of transformers' ``Gemma3TextConfig``."""

from __future__ import annotations

from typing import Optional, Sequence

from torchtune.models.gemma._component_builders import gemma_decoder
from torchtune.modules import LinearScaledRoPE, RotaryPositionalEmbeddings, TransformerDecoder

SLIDING = "sliding_attention"
FULL = "full_attention"


def gemma3_layer_types(num_layers: int, sliding_window_pattern: int = 6) -> list[str]:
    """transformers' default ``layer_types``: every ``sliding_window_pattern``-th layer is global
    (``full_attention``), the others local (``sliding_attention``): 5 local, 1 global, ..."""
    if sliding_window_pattern < 1:
        raise ValueError(f"sliding_window_pattern must be at least 1, got {sliding_window_pattern}")
    return [SLIDING if (i + 1) % sliding_window_pattern else FULL for i in range(num_layers)]


def gemma3(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    head_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-6,
    rope_base: float = 1_000_000,
    rope_scale_factor: float = 1.0,
    local_rope_base: float = 10_000,
    sliding_window_size: int = 4096,
    sliding_window_pattern: int = 6,
    layer_types: Optional[Sequence[str]] = None,
    query_pre_attn_scalar: Optional[float] = None,
    hidden_capping_value: Optional[float] = None,
    tie_word_embeddings: bool = True,
) -> TransformerDecoder:
    """Build a Gemma 3 text decoder, computing what transformers' ``Gemma3ForCausalLM`` computes.

    Per layer: ``h = x + post_attn_norm(attn(pre_attn_norm(x)))`` and ``out = h +
    post_mlp_norm(mlp(pre_mlp_norm(h)))`` (``sa_norm``, ``sa_scale``, ``mlp_norm``, ``mlp_scale``), every
    norm a :class:`~torchtune.modules.GemmaRMSNorm` (``1 + scale``, in fp32); attention with per-head
    q/k norms before RoPE and logits scaled by ``query_pre_attn_scalar ** -0.5``; a GeGLU feed-forward
    (tanh GELU); the token embedding multiplied by ``sqrt(embed_dim)``; a final norm. Local layers
    attend within ``sliding_window_size`` tokens with RoPE base ``local_rope_base``; global layers see
    every earlier token, with RoPE base ``rope_base`` whose frequencies are divided by
    ``rope_scale_factor`` (transformers' ``linear`` scaling; 1 for none).

    Works under ``with torch.device("meta"):`` and with ``torch.set_default_dtype``.

    Args:
        vocab_size: tokens in the vocabulary (embedding rows).
        num_layers: decoder layers.
        num_heads: query heads.
        num_kv_heads: key/value heads.
        embed_dim: model width (``hidden_size``).
        head_dim: channels per head (independent of ``embed_dim / num_heads`` in Gemma 3).
        intermediate_dim: feed-forward width.
        max_seq_len: longest sequence (RoPE cache and KV cache size).
        attn_dropout: attention dropout during training.
        norm_eps: RMSNorm epsilon (``rms_norm_eps``).
        rope_base: RoPE base of the global layers (``rope_theta``).
        rope_scale_factor: linear RoPE scaling of the global layers (``rope_scaling.factor``; 8 for 4B+).
        local_rope_base: RoPE base of the local layers (``rope_local_base_freq``).
        sliding_window_size: the local layers' window (``sliding_window``).
        sliding_window_pattern: every n-th layer is global, when ``layer_types`` is not given.
        layer_types: ``"sliding_attention"`` / ``"full_attention"`` per layer (config.json's ``layer_types``).
        query_pre_attn_scalar: attention logits are scaled by its inverse square root; default ``head_dim``.
        hidden_capping_value: soft cap of the attention logits (``attn_logit_softcapping``); ``None`` for
            none, as in every published Gemma 3.
        tie_word_embeddings: the output projection is the token embedding (every published Gemma 3).
    """
    if layer_types is None:
        layer_types = gemma3_layer_types(num_layers, sliding_window_pattern)
    layer_types = list(layer_types)
    if len(layer_types) != num_layers:
        raise ValueError(f"layer_types has {len(layer_types)} entries for {num_layers} layers")
    unknown = sorted(set(layer_types) - {SLIDING, FULL})
    if unknown:
        raise ValueError(f"layer_types may hold '{SLIDING}' and '{FULL}' only, got {unknown}")
    scalar = head_dim if query_pre_attn_scalar is None else query_pre_attn_scalar
    # One RoPE module per kind, shared by the layers of that kind: identical caches, one copy each.
    local_rope = RotaryPositionalEmbeddings(dim=head_dim, max_seq_len=max_seq_len, base=local_rope_base)
    if rope_scale_factor == 1.0:
        global_rope = RotaryPositionalEmbeddings(dim=head_dim, max_seq_len=max_seq_len, base=rope_base)
    else:
        global_rope = LinearScaledRoPE(
            dim=head_dim, max_seq_len=max_seq_len, base=rope_base, scale_factor=rope_scale_factor
        )
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
        ropes=[local_rope if t == SLIDING else global_rope for t in layer_types],
        sliding_windows=[sliding_window_size if t == SLIDING else None for t in layer_types],
        scale=float(scalar) ** -0.5,
        hidden_capping_value=hidden_capping_value,
        qk_norm=True,
        post_norms=True,
        tie_word_embeddings=tie_word_embeddings,
    )
